"""Nothing stops work: full streams, TrainJobs gone mid-plan, a bus that outlived its cluster.

On real nats-server, kube-apiserver and service processes; the full-stream tests run on one nats-server
(work streams with interest retention) and on a JetStream cluster of three (every stream with 3 replicas,
work streams with limits retention and trimmed by their consumers, ``plumbing.work_trim``):

- each work stream filled (its consumer stopped while TrainJobs arrive, an operator's byte limit reached):
  once the consumer is back every TrainJob is built and new ones follow, since a work stream keeps only
  what is not yet done; each record stream (history, results, dead letters) filled: it drops its oldest
  records, says so in the log and the gauges, and new TrainJobs are built meanwhile;
- TrainJobs deleted while their plans are in flight: every such plan ends ``skipped``, no dead letter;
- a ledger made by another cluster, and one made before this cluster's etcd went back: new TrainJobs are
  built at once, not after the stale-claim grace.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from faults.support import (
    JOBSET,
    TRAINER,
    Pipeline,
    apply_filter,
    close_pipeline,
    condition_of,
    converged,
    dead_letters,
    metric,
    open_pipeline,
    quiet,
    results_of,
    services_ready,
    start_with_metrics,
    subject_count,
    trainjob,
    until,
    until_async,
)
from kubernetes import client as kube_client
from nats.js import api as js_api

from applier.epoch import ClusterMark, mark_key
from applier.ledger import ledger_key
from contracts import conditions, streams, subjects
from contracts.messages import AppliedRecord, Target
from tjpipe.local.kubeapi import LocalKube
from tjpipe.local.natsd import LocalNatsCluster
from tjpipe.local.procs import free_port

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(300)]


async def limit_stream(js: Any, stream: str, max_bytes: int) -> None:
    info = await js.stream_info(stream)
    config = info.config
    config.max_bytes = max_bytes
    await js.update_stream(config)


def stream_gauge(port: int, name: str, stream: str) -> float | None:
    return metric(port, name).get(f'{{stream="{stream}"}}')


# ------------------------------------------------------------------------------------------ work streams


@pytest.fixture(params=[1, 3], ids=["one-server", "cluster-of-3"])
def each_bus(module_kube: LocalKube, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Pipeline]:
    """The pipeline on one nats-server (interest retention) or a JetStream cluster of three (limits retention,
    the consumers trimming what is done: plumbing.work_trim)."""
    pipe = open_pipeline(module_kube, tmp_path / "pipe", runtimes=("torch-distributed",), nats_servers=request.param)
    try:
        yield pipe
    finally:
        print(close_pipeline(pipe))


@pytest.mark.parametrize(
    ("stream", "consumer", "publisher"), [("TJ_EVENTS", "planner", "watcher"), ("TJ_APPLY", "applier", "planner")]
)
async def test_a_full_work_stream_holds_work_only_until_its_consumer_is_back(
    each_bus: Pipeline, stream: str, consumer: str, publisher: str
) -> None:
    p = each_bus
    clustered = isinstance(p.nats, LocalNatsCluster)
    ports = start_with_metrics(p)
    nc = await p.connect()
    try:
        js = nc.jetstream()
        await services_ready(js)
        info = await js.stream_info(stream)
        retention = js_api.RetentionPolicy.LIMITS if clustered else js_api.RetentionPolicy.INTEREST
        assert info.config.retention == retention
        assert info.config.discard == js_api.DiscardPolicy.NEW
        # What was done is gone from the work stream; the history keeps it.
        p.create(trainjob("before", num_nodes=1))
        await until(lambda: converged(p, ["before"]), timeout=60, what="the first TrainJob")
        await quiet(p, js)

        async def emptied() -> bool:
            return (await js.stream_info(stream)).state.messages == 0

        await until_async(emptied, timeout=30, what=f"{stream} to hold nothing once its work is done")
        assert (await js.stream_info(streams.HISTORY_OF[stream])).state.messages > 0
        if clustered:
            trimmed = metric(ports[consumer], "tjpipe_work_trimmed_total").get(f'{{stream="{stream}"}}', 0)
            assert trimmed > 0, f"the {consumer} trimmed nothing from {stream}"

        # The consumer stops; the operator's byte limit leaves room for a few messages only.
        p.kill(consumer)
        await limit_stream(js, stream, 20_000 if stream == "TJ_APPLY" else 4_000)
        names = [f"full-{i}" for i in range(16)]
        for name in names:
            p.create(trainjob(name, num_nodes=1))

        async def refused() -> bool:
            return metric(ports[publisher], "tjpipe_publish_refused_total").get(f'{{stream="{stream}"}}', 0) > 0

        await until_async(refused, timeout=60, what=f"the {publisher} to meet the full stream")
        assert not converged(p, names)

        # The consumer comes back: what it finishes leaves the stream, so the waiting work gets in.
        extra = ["--metrics-port", str(free_port())]
        p.start(consumer, extra=extra)
        await until(lambda: converged(p, names), timeout=180, what="every TrainJob once the consumer is back")
        later = [f"later-{i}" for i in range(4)]
        for name in later:
            p.create(trainjob(name, num_nodes=1))
        await until(lambda: converged(p, later), timeout=60, what="new TrainJobs on the still-limited stream")
        assert (await js.stream_info(stream)).config.max_bytes > 0
        await quiet(p, js)
        await until_async(emptied, timeout=30, what=f"{stream} to hold nothing again")
    finally:
        await nc.close()


async def test_finished_work_the_server_keeps_is_swept_out(module_kube: LocalKube, tmp_path: Path) -> None:
    """A lone nats-server has kept, under load, an event that the planner had acknowledged and the history
    had copied; at a small byte limit that one event refused every later publish, for good. A durable
    that never acknowledges stands in for that lapse here, on every event: to the pipeline each is finished
    (acknowledged by its partition's durable, recorded), and the stream keeps it all the same. The planner's
    sweep (plumbing.work_trim) removes them, so every TrainJob is built, and the history misses none."""
    p = open_pipeline(module_kube, tmp_path / "pipe", runtimes=("torch-distributed",))
    nc = await p.connect()
    try:
        ports = start_with_metrics(p, planner=["--work-sweep-seconds", "1"])
        js = nc.jetstream()
        await services_ready(js)
        await js.add_consumer(
            streams.EVENTS.name, js_api.ConsumerConfig(durable_name="holdout", ack_policy=js_api.AckPolicy.EXPLICIT)
        )
        await limit_stream(js, streams.EVENTS.name, 8_000)
        names = [f"kept-{i}" for i in range(6)]
        for name in names:
            p.create(trainjob(name, num_nodes=1))

        await until(lambda: converged(p, names), timeout=120, what="every TrainJob, with finished events kept")
        refused = metric(ports["watcher"], "tjpipe_publish_refused_total").get(f'{{stream="{streams.EVENTS.name}"}}')
        assert refused, "the stream never filled: the sweep was not needed"
        swept = metric(ports["planner"], "tjpipe_work_trimmed_total").get(f'{{stream="{streams.EVENTS.name}"}}')
        assert swept, "the planner swept nothing"
        assert f"{streams.EVENTS.name} kept" in p.log_text("planner")
        await quiet(p, js)
        events = await js.stream_info(streams.EVENTS.name)
        history = await js.stream_info(streams.EVENTS_HISTORY.name)
        assert history.state.messages == events.state.last_seq, "an event swept out before the history had it"
        assert events.state.messages <= events.state.last_seq - swept  # what was swept is gone
    finally:
        await nc.close()
        print(close_pipeline(p))


# ---------------------------------------------------------------------------------------- record streams


async def dead_letter_noise(p: Pipeline, js: Any, count: int) -> None:
    """Unsigned apply messages: each is dead-lettered (``unsigned``) and writes nothing."""
    for i in range(count):
        subject = subjects.apply_subject(p.namespace, f"noise-{i}", "jobset")
        await js.publish(subject, b"x" * 600, headers={"Nats-Msg-Id": f"noise-{uuid.uuid4()}"})


# TJ_PROGRESS is left out: the pipeline writes nothing there (the status server does, tests/e2e/test_status_server.py).
@pytest.mark.parametrize("stream", [s.name for s in streams.RECORD_STREAMS if s is not streams.PROGRESS])
async def test_a_full_record_stream_costs_history_never_progress(each_bus: Pipeline, stream: str) -> None:
    p = each_bus
    ports = start_with_metrics(p)
    nc = await p.connect()
    try:
        js = nc.jetstream()
        await services_ready(js)
        assert (await js.stream_info(stream)).config.discard == js_api.DiscardPolicy.OLD
        first = [f"rec-{i}" for i in range(6)]
        for name in first:
            p.create(trainjob(name, num_nodes=1))
        await dead_letter_noise(p, js, 12)
        await until(lambda: converged(p, first), timeout=90, what="the first TrainJobs")
        await quiet(p, js)
        # The operator's byte limit, at half of what the stream holds: it is full from here on.
        limit = max(2_048, (await js.stream_info(stream)).state.bytes // 2)
        await limit_stream(js, stream, limit)

        names = [f"rec-more-{i}" for i in range(6)]
        for name in names:
            p.create(trainjob(name, num_nodes=1))
        await dead_letter_noise(p, js, 12)
        await until(lambda: converged(p, names), timeout=90, what="new TrainJobs with the record stream full")
        await quiet(p, js)
        full = await js.stream_info(stream)
        assert 0 < full.state.bytes <= limit and full.state.first_seq > 1, full.state  # the oldest went
        assert not await _publishes_refused(ports)  # and nothing waited for room

        # The gauges an alert reads, and the log line, from the applier.
        def gauges() -> bool:
            size = stream_gauge(ports["applier"], "tjpipe_stream_bytes", stream) or 0
            return stream_gauge(ports["applier"], "tjpipe_stream_max_bytes", stream) == limit and 0 < size <= limit

        await until(gauges, timeout=40, what=f"tjpipe_stream_bytes and tjpipe_stream_max_bytes for {stream}")
        await until(lambda: f"stream {stream} is full" in p.log_text("applier"), timeout=40, what="the log line")
    finally:
        await nc.close()


async def _publishes_refused(ports: dict[str, int]) -> float:
    return sum(sum(metric(port, "tjpipe_publish_refused_total").values()) for port in ports.values())


# ------------------------------------------------------------------------------- gone while being planned


async def test_trainjobs_deleted_mid_plan_are_skipped_not_dead_lettered(pipeline: Pipeline) -> None:
    p = pipeline
    ns = p.namespace
    p.start("watcher")
    p.start("planner")
    nc = await p.connect()
    try:
        js = nc.jetstream()
        names = [f"gone-{i}" for i in range(10)]
        for name in names:
            p.create(trainjob(name, num_nodes=1))
        want = 2 * len(names)  # a JobSet and a runtime snapshot each

        async def planned() -> bool:
            return await subject_count(js, streams.APPLY.name, apply_filter(ns)) >= want

        await until_async(planned, timeout=60, what="the plans of every TrainJob")
        for name in names:
            p.resource(TRAINER, "TrainJob").delete(namespace=ns, name=name)
        before = p.writes()
        p.start("applier")

        async def finished() -> bool:
            return len(await results_of(js, ns)) >= want

        await until_async(finished, timeout=60, what="a result for every plan in flight")
        await quiet(p, js)
        results = [r for r in await results_of(js, ns) if r.trainjob.name in names]
        assert results and {r.action for r in results} == {"skipped"}, [(r.action, r.reason) for r in results]
        assert all("does not exist" in r.reason for r in results), [r.reason for r in results]
        assert await dead_letters(js, ns) == []
        assert (p.writes() - before).writes("jobsets") == 0
    finally:
        await nc.close()


# ------------------------------------------------------------------------------ a bus that outlived its cluster


def kube_system_uid(p: Pipeline) -> str:
    return str(kube_client.CoreV1Api(p.api).read_namespace("kube-system").metadata.uid)


def jobset_key(p: Pipeline, name: str) -> str:
    return ledger_key(Target(api_version=JOBSET, kind="JobSet", namespace=p.namespace, name=name))


async def built_at_once(p: Pipeline, js: Any, names: list[str]) -> None:
    """The TrainJobs' JobSets are built with no condition on them; the 60 s bound only limits the wait."""
    for name in names:
        p.create(trainjob(name, num_nodes=1))
    await until(lambda: converged(p, names), timeout=60, what="the new TrainJobs' JobSets")
    for name in names:
        cond = condition_of(p.get(TRAINER, "TrainJob", name), conditions.CONDITION_COMPONENTS_APPLIED)
        assert cond is None, cond


async def test_a_ledger_from_another_cluster_holds_nothing_back(pipeline: Pipeline) -> None:
    p = pipeline
    ports = start_with_metrics(p)
    nc = await p.connect()
    try:
        js = nc.jetstream()
        await services_ready(js)
        kv = await js.key_value(streams.APPLIED_BUCKET)
        names = ["reborn-a", "reborn-b"]
        old = AppliedRecord(
            source_version=15151, source_seq=9, digest="old", state="applied", cluster=f"{uuid.uuid4()}/1"
        )
        for name in names:
            await kv.put(jobset_key(p, name), msgspec.json.encode(old))
        await built_at_once(p, js, names)  # its 60 s bound is far inside the 330 s default grace
        counted = metric(ports["applier"], "tjpipe_foreign_ledger_claims_total")
        assert counted.get('{why="other-cluster"}', 0) >= len(names), counted
        # Set aside as another cluster's, never held as a corrupt claim waiting out the grace.
        stale = metric(ports["applier"], "tjpipe_stale_ledger_claims_total")
        assert stale.get('{action="held"}', 0) == 0, stale
        assert "made by another cluster" in p.log_text("applier")
        stamp = msgspec.json.decode((await kv.get(jobset_key(p, names[0]))).value, type=AppliedRecord).cluster
        assert stamp.startswith(kube_system_uid(p) + "/"), stamp
    finally:
        await nc.close()


async def test_a_rewound_cluster_under_an_old_bus_builds_at_once(pipeline: Pipeline) -> None:
    p = pipeline
    nc = await p.connect()
    try:
        js = nc.jetstream()
        kv = await js.key_value(streams.APPLIED_BUCKET)
        uid = kube_system_uid(p)
        # What the ledger holds after etcd was restored from a backup: this cluster's mark at a revision
        # the cluster no longer reaches, and claims made then.
        await kv.put(mark_key(uid), msgspec.json.encode(ClusterMark(cluster=uid, epoch=1, high_water=10**9)))
        names = ["restored-a", "restored-b"]
        old = AppliedRecord(source_version=10**9 - 7, source_seq=9, digest="old", state="applied", cluster=f"{uid}/1")
        for name in names:
            await kv.put(jobset_key(p, name), msgspec.json.encode(old))
        ports = start_with_metrics(p)
        await services_ready(js)
        await built_at_once(p, js, names)
        rewinds = metric(ports["applier"], "tjpipe_cluster_rewinds_total").get("", 0)
        assert rewinds >= 1
        counted = metric(ports["applier"], "tjpipe_foreign_ledger_claims_total")
        assert counted.get('{why="rewound"}', 0) >= len(names), counted
        assert "etcd went back" in p.log_text("applier")
        mark = msgspec.json.decode((await kv.get(mark_key(uid))).value, type=ClusterMark)
        assert mark.epoch == 2 and mark.high_water < 10**9, mark

        # Within the new history the fence holds as before: a claim of this epoch beyond the cluster is
        # itself taken as the sign of one more rewind, and a plan older than a genuine claim still loses.
        await quiet(p, js)
        record = msgspec.json.decode((await kv.get(jobset_key(p, names[0]))).value, type=AppliedRecord)
        assert record.cluster == f"{uid}/2" and record.source_version < 10**9, record
    finally:
        await nc.close()
