"""A 3-server JetStream cluster in containers losing a server, its stream leader, or its network, and the
scaled services losing one replica of each, while TrainJobs are created; nothing may be lost.

One rig for the module (support.Rig, on a network of its own): three nats-servers (every stream and bucket
with 3 replicas, ``tjpipe bus-setup`` run as the admin), etcd and kube-apiserver, 2 watchers, 3 planners and
3 appliers, all from the compose stack's images. Each test creates 200 TrainJobs over four of Trainer's
runtimes in a namespace of its own and, about a third of the way in, breaks one thing:

- ``test_stop_one_server``: ``docker stop`` of a member that is not the meta leader, until the work is
  done; then it starts again and must catch up;
- ``test_kill_stream_leader`` (after the next): ``docker kill`` of the leader of TJ_APPLY (where interest
  retention once lost plans, README "Streams"); started again once the work is done;
- ``test_kill_one_replica_of_each``: ``docker kill`` of one watcher, one planner and one applier chosen at
  random; the survivors must own every partition in fair shares;
- ``test_partition_one_server`` (last): ``docker network disconnect`` of the meta leader for 30 s, then
  connected again under its name.

These two failed twice in seven runs before the fix of the planners' lease rounds (``plumbing.tasks.
cancel_and_wait``: a released partition's pull loop could outlive its cancellation on Python 3.11 and the
lease round then waited for ever), once with partitions left with undelivered events after the stream
leader's kill, and once with lease rounds stopped after the partition; they have passed in every run since.

Each test ends with the same invariant (``assert_invariants``): every TrainJob is built exactly as the pure
planner plans it from its live spec and runtime (``tjpipe.history_tools.preview``, each planned object contained in
the live one); ten suspended TrainJobs whose runtime patches were changed twice during the fault end at the
second change (no stale plan wrote after a newer one); nothing is dead-lettered; once drained the pipeline
writes nothing for 15 s (``apiserver_request_total``); the live replicas hold every partition again, in fair
shares (``tj_leases``); and no message is missing from the history: each
history stream holds a copy of every message its work stream ever stored, the work streams hold nothing
of the namespace once its consumers have removed what is done (``plumbing.work_trim``), every TrainJob has its events
and results recorded, and no record stream has lost a message.

Figures (creates while the fault lasted, seconds to converge, writes once idle, messages in the history
before and after) are printed, never asserted on.
"""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest
from compose.support import engine_problem, exactly_once_problems, namespace_record
from faults.support import (
    WriteCounts,
    apply_filter,
    events_filter,
    owned_by,
    read_write_counts,
    results_filter,
    total_writes,
)
from kubernetes import client as kube_client
from kubernetes import dynamic
from needs import unavailable
from scale import test_multi_replica as scale

from contracts import streams
from contracts.messages import ApplySecret, ApplyTrainJobStatus, DeleteComponent
from contracts.subjects import PARTITIONS
from contracts.trainer import RUNTIME_SNAPSHOT_SUFFIX
from tjpipe import history_tools
from tjpipe.local.kubeapi import new_api_client

from . import support
from .support import Rig, say

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(1500)]

TRAINER = ("trainer.kubeflow.org", "v1alpha1")
JOBSET = ("jobset.x-k8s.io", "v1alpha2")
RUNTIMES = ("torch-distributed", "deepspeed-distributed", "xgboost-distributed", "jax-distributed")
TRAINJOBS = 200
PATCHED = 10
FAULT_AT = TRAINJOBS // 3
PARTITION_SECONDS = 30.0
CREATE_WORKERS = 6
CREATE_INTERVAL = 0.2
"""Seconds between two creates: 200 take about 40 s, so creates flow through every fault, the 30 s partition too."""
WATCHERS, PLANNERS, APPLIERS = 2, 3, 3
CONVERGE_TIMEOUT = 300.0
DRAIN_TIMEOUT = 120.0
IDLE_SECONDS = 15.0
HISTORY_TIMEOUT = 60.0
FINAL_REV = scale.FINAL_REV


# ------------------------------------------------------------------------------------------------ the rig


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    problem = engine_problem()
    if problem is not None:
        unavailable(problem)
    support.ensure_images()
    started = time.monotonic()
    rig = Rig(root=tmp_path_factory.mktemp("containers"))
    try:
        rig.open()
        rig.start_nats(3)
        say(f"NATS cluster of 3 containers ready, meta leader {rig.meta_leader()} ({time.monotonic() - started:.0f}s)")
        rig.start_kube()
        say(f"kube-apiserver ready with the CRDs and Trainer's runtimes ({time.monotonic() - started:.0f}s)")
        rig.bus_setup()
        assert rig.creds is not None
        scale.ADMIN[:] = [rig.creds]  # the test's own reads connect as the admin
        facts = scale.stream_facts(rig.host_url())
        assert {replicas for replicas, _ in facts.values()} == {3}, facts
        for role, count in (("watcher", WATCHERS), ("planner", PLANNERS), ("applier", APPLIERS)):
            for i in range(count):
                rig.start_service(role, i)
        wait_spread(rig, {"planner": PLANNERS, "applier": APPLIERS}, timeout=120)
        say(f"{WATCHERS} watchers, {PLANNERS} planners, {APPLIERS} appliers up ({time.monotonic() - started:.0f}s)")
        yield rig
    except BaseException:
        print(rig.logs())
        raise
    finally:
        rig.close()
        assert rig.leftovers() == {"containers": [], "networks": []}


def wait_spread(
    rig: Rig, counts: dict[str, int], *, timeout: float, killed: set[str] | None = None
) -> tuple[float, dict[str, str]]:
    """Seconds until every partition of each role is held, by exactly ``counts[role]`` replicas, and the reading
    of the leases that showed it.

    A caller that checks more about the leases checks that reading: one taken after it can come back empty or
    partial for a moment (the lease bucket's stream just changed leader) although every lease is held."""
    started = time.monotonic()
    url = rig.host_url()
    while True:
        problems = rig.exited_services(killed or set())
        assert not problems, "\n".join(problems)
        leases = scale.read_leases(url)
        if all(
            len(held := scale.owners(leases, role)) == PARTITIONS and len(set(held.values())) == count
            for role, count in counts.items()
        ):
            return time.monotonic() - started, leases
        if time.monotonic() - started > timeout:
            lines = [
                f"{c.alias}: {line}"
                for role in counts
                for c in rig.services(role)
                if c.running()
                for line in c.logs(400).splitlines()
                if "partition" in line or "lease" in line
            ]
            raise AssertionError(
                f"partitions not spread over {counts} after {timeout:.0f}s: {leases}; the replicas' last lines "
                "about leases:\n" + "\n".join(lines[-30:])
            )
        time.sleep(1)


# ----------------------------------------------------------------------------------------------- the load


@dataclass(frozen=True)
class Job:
    name: str
    runtime: str
    num_nodes: int
    patched: bool


def planned_jobs() -> list[Job]:
    jobs = [
        Job(
            name=f"tj-{i:03d}",
            runtime=RUNTIMES[i % len(RUNTIMES)],
            num_nodes=1 + i % 4,
            patched=i % (TRAINJOBS // PATCHED) == 0,
        )
        for i in range(TRAINJOBS)
    ]
    return sorted(jobs, key=lambda job: not job.patched)  # the patched ones must exist before the fault


def trainjob_body(namespace: str, job: Job) -> dict[str, Any]:
    spec: dict[str, Any] = {"runtimeRef": {"name": job.runtime}, "trainer": {"numNodes": job.num_nodes}}
    if job.patched:
        spec["suspend"] = True
        spec["runtimePatches"] = scale.runtime_patches(0)
    return {
        "apiVersion": "/".join(TRAINER),
        "kind": "TrainJob",
        "metadata": {"name": job.name, "namespace": namespace},
        "spec": spec,
    }


@dataclass
class Load:
    """200 TrainJobs created by a thread pool from the host, with the time each create returned."""

    namespace: str
    jobs: list[Job]
    api: Any
    created_at: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def create(self, job: Job) -> None:
        custom = kube_client.CustomObjectsApi(self.api)
        scale._with_retries(
            lambda: custom.create_namespaced_custom_object(
                *TRAINER, self.namespace, "trainjobs", trainjob_body(self.namespace, job), _request_timeout=30
            ),
            what=f"create {self.namespace}/{job.name}",
        )
        with self.lock:
            self.created_at.append(time.monotonic())

    def create_patched(self) -> None:
        """The patched ones first, one by one: they are patched before the fault, so they must exist."""
        for job in self.jobs:
            if job.patched:
                self.create(job)

    def start_rest(self) -> Callable[[], None]:
        """The others from a thread pool, one every ``CREATE_INTERVAL`` seconds, so that creates flow for the
        whole fault; returns what waits for them all."""
        pool = ThreadPoolExecutor(CREATE_WORKERS, thread_name_prefix="create")
        started = time.monotonic()

        def paced(i: int, job: Job) -> None:
            time.sleep(max(0.0, started + i * CREATE_INTERVAL - time.monotonic()))
            self.create(job)

        rest = [job for job in self.jobs if not job.patched]
        futures = [pool.submit(paced, i, job) for i, job in enumerate(rest)]

        def wait() -> None:
            for future in futures:
                future.result(timeout=CONVERGE_TIMEOUT)
            pool.shutdown()

        return wait

    def created(self) -> int:
        with self.lock:
            return len(self.created_at)

    def created_between(self, start: float, end: float) -> int:
        with self.lock:
            return sum(1 for t in self.created_at if start <= t <= end)

    def patch(self, custom: kube_client.CustomObjectsApi, rev: int) -> None:
        for job in self.jobs:
            if job.patched:
                scale._with_retries(
                    lambda job=job: custom.patch_namespaced_custom_object(  # type: ignore[misc]
                        *TRAINER,
                        self.namespace,
                        "trainjobs",
                        job.name,
                        {"spec": {"runtimePatches": scale.runtime_patches(rev)}},
                        _content_type="application/merge-patch+json",
                        _request_timeout=30,
                    ),
                    what=f"patch {job.name} to rev {rev}",
                )


def new_namespace(api: Any, prefix: str) -> str:
    name = f"{prefix}-{random.randrange(16**4):04x}"
    kube_client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    return name


# ------------------------------------------------------------------------------------------- convergence


def _items(call: Callable[..., Any], *args: Any) -> list[dict[str, Any]]:
    return list(scale._list(call, *args)["items"])


def not_built(api: Any, namespace: str, jobs: list[Job]) -> list[str]:
    """The cheap check while polling: a JobSet controlled by the TrainJob, a runtime snapshot, and the final
    runtime patches on the patched ones (the node counts, which depend on the runtime, are checked against
    the plan at the end)."""
    custom = kube_client.CustomObjectsApi(api)
    trainjobs = {
        o["metadata"]["name"]: o for o in _items(custom.list_namespaced_custom_object, *TRAINER, namespace, "trainjobs")
    }
    jobsets = {
        o["metadata"]["name"]: o for o in _items(custom.list_namespaced_custom_object, *JOBSET, namespace, "jobsets")
    }
    core = kube_client.CoreV1Api(api)
    snapshots = {o["metadata"]["name"] for o in _items(core.list_namespaced_config_map, namespace)}
    problems = []
    for job in jobs:
        tj, js = trainjobs.get(job.name), jobsets.get(job.name)
        if tj is None:
            problems.append(f"{job.name}: TrainJob missing")
            continue
        if job.name + RUNTIME_SNAPSHOT_SUFFIX not in snapshots:
            problems.append(f"{job.name}: no runtime snapshot")
        if js is None:
            problems.append(f"{job.name}: no JobSet")
            continue
        if not owned_by(js, tj["metadata"]["uid"]):
            problems.append(f"{job.name}: JobSet not controlled by the TrainJob")
        _, pod = scale.node_pod_template(js)
        if job.patched:
            rev = ((pod.get("metadata") or {}).get("labels") or {}).get(scale.REV_LABEL)
            if rev != str(FINAL_REV):
                problems.append(f"{job.name}: JobSet at rev {rev}, want {FINAL_REV}")
    return problems


def wait_built(rig: Rig, api: Any, namespace: str, jobs: list[Job], *, since: float, killed: set[str]) -> float:
    """Seconds from ``since`` until every TrainJob is built; fails on a dead letter or after the timeout."""
    last_report = 0.0
    while True:
        problems = rig.exited_services(killed)
        assert not problems, "\n".join(problems)
        left = not_built(api, namespace, jobs)
        if not left:
            return time.monotonic() - since
        letters = scale.dead_letters(rig.host_url(without=rig_down(rig)))
        assert not letters, f"dead letters while {len(left)} TrainJobs are not built: {dict(letters)}"
        now = time.monotonic()
        if now - since > CONVERGE_TIMEOUT:
            leases = scale.read_leases(rig.host_url(without=rig_down(rig)))
            work = scale.backlog(rig.host_url(without=rig_down(rig)))
            raise AssertionError(
                f"{len(left)} TrainJobs not built {CONVERGE_TIMEOUT:.0f}s after the fault: "
                + scale.stall_report(
                    [
                        scale.Job(namespace=namespace, name=j.name, num_nodes=j.num_nodes, patched=j.patched)
                        for j in jobs
                    ],
                    [f"{namespace}/{p}" for p in left],
                    leases,
                    work,
                )
            )
        if now - last_report > 15:
            say(f"{len(left)} TrainJobs not built yet, e.g. {left[0]}")
            last_report = now
        time.sleep(1)


def rig_down(rig: Rig) -> list[str]:
    """The NATS members the test's reads should not go to: stopped, or not answering on their port."""
    return [n for n in rig.nats_names if not rig.jsz(n)]


# ---------------------------------------------------------------------------------------------- invariant


def contained(planned: Any, live: Any, path: str = "") -> list[str]:
    """Where ``live`` lacks or differs from a value ``planned`` sets (server defaults may add more)."""
    if isinstance(planned, dict):
        if not isinstance(live, dict):
            return [f"{path}: {live!r} is not a map"]
        return [d for key, value in planned.items() for d in contained(value, live.get(key), f"{path}.{key}")]
    if isinstance(planned, list):
        if not isinstance(live, list) or len(live) != len(planned):
            return [f"{path}: {len(live) if isinstance(live, list) else live!r} items, planned {len(planned)}"]
        return [d for i, (p, v) in enumerate(zip(planned, live, strict=True)) for d in contained(p, v, f"{path}[{i}]")]
    return [] if planned == live else [f"{path}: {live!r}, planned {planned!r}"]


def built_as_planned(api: Any, namespace: str) -> tuple[int, list[str]]:
    """Each TrainJob's plan, from its live spec, runtime and JobSet, against what the cluster holds:
    (objects compared, differences)."""
    custom = kube_client.CustomObjectsApi(api)
    client = dynamic.DynamicClient(api)
    runtimes = {
        o["metadata"]["name"]: o for o in _items(custom.list_cluster_custom_object, *TRAINER, "clustertrainingruntimes")
    }
    trainjobs = _items(custom.list_namespaced_custom_object, *TRAINER, namespace, "trainjobs")
    jobsets = {
        o["metadata"]["name"]: o for o in _items(custom.list_namespaced_custom_object, *JOBSET, namespace, "jobsets")
    }
    live: dict[tuple[str, str], dict[str, dict[str, Any]]] = {("/".join(JOBSET), "JobSet"): jobsets}
    compared, problems = 0, []
    for tj in trainjobs:
        name = tj["metadata"]["name"]
        runtime = runtimes[tj["spec"]["runtimeRef"]["name"]]
        # The plan of the latest event, which carries the live JobSet; and what the first plan, made before any
        # JobSet existed, wrote besides (a later plan leaves the runtime snapshot as it was made).
        latest = history_tools.preview(tj, runtime, jobset=jobsets.get(name))
        covered = {a.target for a in latest}
        first = [a for a in history_tools.preview(tj, runtime) if a.target not in covered]
        for apply in [*latest, *first]:
            if isinstance(apply, ApplyTrainJobStatus | DeleteComponent):
                continue
            target = apply.target
            kind_key = (target.api_version, target.kind)
            if kind_key not in live:
                resource = client.resources.get(api_version=target.api_version, kind=target.kind)
                listed = resource.get(namespace=namespace).to_dict()
                live[kind_key] = {o["metadata"]["name"]: o for o in listed["items"]}
            obj = live[kind_key].get(target.name)
            where = f"{name}: {target.kind}/{target.name}"
            if obj is None:
                problems.append(f"{where} missing")
                continue
            compared += 1
            planned = msgspec.to_builtins(apply.object)
            if isinstance(apply, ApplySecret) and apply.generate is not None:
                planned = {"metadata": planned.get("metadata", {})}  # its data is generated once, by the applier
            problems += [f"{where}{d}" for d in contained(planned, obj)]
    return compared, problems


@dataclass(frozen=True)
class HistoryState:
    """Per record stream: (messages, first sequence, deleted inside the range)."""

    streams: dict[str, tuple[int, int, int]]

    def __str__(self) -> str:
        return ", ".join(f"{name} {m}" for name, (m, _, _) in self.streams.items())


def history_state(url: str) -> HistoryState:
    async def read(js: Any) -> HistoryState:
        out = {}
        for spec in streams.RECORD_STREAMS:
            info = await js.stream_info(spec.name)
            out[spec.name] = (info.state.messages, info.state.first_seq, info.state.num_deleted or 0)
        return HistoryState(out)

    state: HistoryState = scale._run(read, url)
    return state


def subject_counts(url: str, stream: str, subject: str) -> collections.Counter[str]:
    """Messages per subject of ``stream`` under ``subject`` (wildcards allowed)."""

    async def read(js: Any) -> collections.Counter[str]:
        info = await js.stream_info(stream, subjects_filter=subject)
        return collections.Counter(info.state.subjects or {})

    counts: collections.Counter[str] = scale._run(read, url)
    return counts


def work_and_history(url: str, work: str, history: str) -> tuple[int, int]:
    """How many messages ``work`` ever stored (its last sequence, on the rig's own bus) and ``history`` holds."""

    async def read(js: Any) -> tuple[int, int]:
        return (await js.stream_info(work)).state.last_seq, (await js.stream_info(history)).state.messages

    counts: tuple[int, int] = scale._run(read, url)
    return counts


def history_sources(url: str) -> dict[str, list[tuple[str, int, str]]]:
    """Each history stream's sources: (origin, lag, error)."""

    async def read(js: Any) -> dict[str, list[tuple[str, int, str]]]:
        out = {}
        for name in (streams.EVENTS_HISTORY.name, streams.APPLY_HISTORY.name):
            info = await js.stream_info(name)
            out[name] = [(src.name, src.lag or 0, str(src.error or "")) for src in info.sources or []]
        return out

    sources: dict[str, list[tuple[str, int, str]]] = scale._run(read, url)
    return sources


def pipeline_writes(counts: WriteCounts) -> int:
    """What the applier writes (and its Events); the apiserver's own Lease renewals are not counted."""
    return total_writes(counts) + counts.writes("podgroups") + counts.writes("events")


def assert_invariants(rig: Rig, api: Any, namespace: str, jobs: list[Job], before: HistoryState) -> dict[str, str]:
    """The invariant every test ends with (module docstring); returns its figures as printable strings."""
    url = rig.host_url(without=rig_down(rig))
    started = time.monotonic()
    left: dict[str, tuple[int, int]] = {}
    while time.monotonic() - started < DRAIN_TIMEOUT:
        left = scale.backlog(url)
        if not left:
            break
        time.sleep(1)
    if left:
        leases = scale.read_leases(url)
        holders = {leases.get(durable.replace("-p", ".p", 1), "-") for durable in left}
        raise AssertionError(
            f"not drained {DRAIN_TIMEOUT:.0f}s after converging (pending, unacked): {left}; partitions held by "
            f"{sorted(holders)}:\n" + "\n".join(rig.containers[h].logs(25) for h in holders if h in rig.containers)
        )
    drained = time.monotonic() - started

    assert rig.kube is not None
    idle_before = read_write_counts(rig.kube)
    time.sleep(IDLE_SECONDS)
    idle_delta = read_write_counts(rig.kube) - idle_before
    idle_writes = pipeline_writes(idle_delta)

    compared, problems = built_as_planned(api, namespace)
    assert not problems, f"{len(problems)} differences from the plan, e.g.:\n" + "\n".join(problems[:15])
    assert compared >= 2 * len(jobs), compared  # a JobSet and a snapshot ConfigMap each, at least
    assert not not_built(api, namespace, jobs)
    letters = scale.dead_letters(url)
    assert not letters, dict(letters)
    assert idle_writes == 0, {k: v for k, v in idle_delta.all_writes().items() if v}

    # No message lost from the history: each history stream must come to hold a copy of every message its
    # work stream ever stored (a source copies with some lag, more after its origin's leader changed), and,
    # once the consumers trimmed what is done (limits retention on a cluster: plumbing.work_trim), the work
    # streams hold nothing of the namespace.
    copied_started = time.monotonic()
    for work, history, subject in (
        (streams.EVENTS.name, streams.EVENTS_HISTORY.name, events_filter(namespace)),
        (streams.APPLY.name, streams.APPLY_HISTORY.name, apply_filter(namespace)),
    ):
        while True:
            stored, copies = work_and_history(url, work, history)
            left_in_work = subject_counts(url, work, subject)
            if (stored == copies and not left_in_work) or time.monotonic() - copied_started > HISTORY_TIMEOUT:
                break
            time.sleep(1)
        assert stored == copies, (
            f"{HISTORY_TIMEOUT:.0f}s after the work was drained, {work} has stored {stored} messages and {history} "
            f"holds {copies}; sources: {history_sources(url)}"
        )
        assert not left_in_work, f"{work} still holds finished work of the namespace: {dict(left_in_work)}"
    copied = time.monotonic() - copied_started
    events = subject_counts(url, streams.EVENTS_HISTORY.name, events_filter(namespace))
    results = subject_counts(url, streams.RESULTS.name, results_filter(namespace))
    named_events = {s.rsplit(".", 1)[1] for s in events}
    named_results = {s.split(".")[4] for s in results}
    assert named_events >= {j.name for j in jobs}, sorted({j.name for j in jobs} - named_events)[:10]
    assert named_results >= {j.name for j in jobs}, sorted({j.name for j in jobs} - named_results)[:10]
    # Nothing doubled, counted: each plan recorded once, written at most once, each target created once
    # (a killed replica or server may make the bus deliver a plan again, answered `unchanged`: results per
    # plan are not counted here; the compose stack's load test, with no fault, counts them exactly).
    plans, results_of_ns = scale._run(lambda nc: namespace_record(nc, namespace), url, raw=True, timeout=60)
    doubled = exactly_once_problems(plans, results_of_ns, redeliveries=True)
    assert doubled == [], doubled
    after = history_state(url)
    for name, (messages, first, deleted) in after.streams.items():
        was = before.streams[name]
        # Nothing dropped: the first record is still the stream's first (an empty stream reports 0), no gaps.
        assert first in (1, was[1]) and deleted == 0 and messages >= was[0], (
            f"{name}: was {was}, now {(messages, first, deleted)}"
        )
    return {
        "drained": f"{drained:.1f}s",
        "history caught up": f"{copied:.1f}s later",
        "writes once idle": f"{idle_writes} in {IDLE_SECONDS:.0f}s",
        "history before": str(before),
        "history after": str(after),
        "objects as planned": str(compared),
        "messages of this namespace": f"{sum(events.values())} events, {sum(results.values())} results",
        "plans recorded, each once": str(len(plans)),
    }


# ------------------------------------------------------------------------------------------------- faults


@dataclass
class Fault:
    """What a test breaks: ``begin`` when a third of the TrainJobs exist, ``end`` (heal) at the time
    ``heal_after`` says (None: once every TrainJob is built)."""

    what: str
    begin: Callable[[], None]
    end: Callable[[], None] = lambda: None
    heal_after: float | None = None
    killed: set[str] = field(default_factory=set)


def run_under_fault(rig: Rig, prefix: str, make_fault: Callable[[], Fault]) -> None:
    assert rig.kube is not None
    jobs = planned_jobs()
    with new_api_client(rig.kube.kubeconfig) as api, new_api_client(rig.kube.kubeconfig) as creator:
        custom = kube_client.CustomObjectsApi(api)
        namespace = new_namespace(api, prefix)
        before = history_state(rig.host_url())
        load = Load(namespace=namespace, jobs=jobs, api=creator)
        started = time.monotonic()
        load.create_patched()
        load.patch(custom, 1)
        wait_creates = load.start_rest()
        while load.created() < FAULT_AT:
            time.sleep(0.1)
        fault = make_fault()
        say(f"{fault.what} at {load.created()} of {TRAINJOBS} TrainJobs created")
        fault_start = time.monotonic()
        fault.begin()
        load.patch(custom, FINAL_REV)
        healed: float | None = None
        if fault.heal_after is not None:
            time.sleep(max(0.0, fault_start + fault.heal_after - time.monotonic()))
            fault.end()
            healed = time.monotonic()
            say(f"healed after {healed - fault_start:.1f}s")
        wait_creates()
        all_created = time.monotonic()
        built = wait_built(rig, api, namespace, jobs, since=fault_start, killed=fault.killed)
        if healed is None:
            healed = time.monotonic()
            fault.end()
        under_fault = load.created_between(fault_start, healed)
        rejoin = rig.wait_nats_ready(timeout=120)
        figures = assert_invariants(rig, api, namespace, jobs, before)
        # The survivors hold every partition again, in fair shares: a lease loop that stopped would leave a
        # partition with nobody to take it over at the next loss.
        live = {role: sum(c.running() for c in rig.services(role)) for role in ("planner", "applier")}
        figures["partitions held again"] = f"{wait_spread(rig, live, timeout=60, killed=fault.killed)[0]:.1f}s"
        say(
            f"{fault.what}: {under_fault} of {TRAINJOBS} creates while it lasted ({healed - fault_start:.1f}s); "
            f"all created {all_created - started:.1f}s after the first; every TrainJob built {built:.1f}s after the "
            f"fault began; NATS one cluster again {rejoin:.1f}s after it ended; "
            + "; ".join(f"{k} {v}" for k, v in figures.items())
        )


def stream_leader(rig: Rig, stream: str) -> str:
    async def read(js: Any) -> str:
        info = await js.stream_info(stream)
        return str(info.cluster.leader if info.cluster else "")

    leader: str = scale._run(read, rig.host_url())
    assert leader in rig.nats_names, f"{stream} has no leader among {rig.nats_names}: {leader!r}"
    return leader


# -------------------------------------------------------------------------------------------------- tests


def member_fault(rig: Rig, name: str, what: str, *, cut: str, heal: str, heal_after: float | None = None) -> Fault:
    """Break NATS member ``name`` with its container's ``cut`` (stop, kill, disconnect) and heal it with
    ``heal`` (start, connect), finding its published ports again."""
    member = rig.containers[name]
    return Fault(
        what=f"docker {what}",
        begin=getattr(member, cut),
        end=lambda: rig.bring_back(name, getattr(member, heal)),
        heal_after=heal_after,
    )


def test_stop_one_server(rig: Rig) -> None:
    def fault() -> Fault:
        meta = rig.meta_leader()
        victim = next(n for n in rig.nats_names if n != meta)
        return member_fault(rig, victim, f"stop {victim} (meta leader {meta})", cut="stop", heal="start")

    run_under_fault(rig, "stop-one", fault)


def test_kill_one_replica_of_each(rig: Rig) -> None:
    victims = {role: random.choice(rig.services(role)) for role in support.SERVICE_ROLES}
    killed = {c.alias for c in victims.values()}

    def kill() -> None:
        for container in victims.values():
            rig.killed.add(container.alias)
            container.kill()

    def fault() -> Fault:
        return Fault(what=f"docker kill {', '.join(sorted(killed))}", begin=kill, killed=killed)

    run_under_fault(rig, "kill-replicas", fault)
    started = time.monotonic()
    took, leases = wait_spread(rig, {"planner": PLANNERS - 1, "applier": APPLIERS - 1}, timeout=60, killed=killed)
    shares = {role: collections.Counter(scale.owners(leases, role).values()) for role in ("planner", "applier")}
    for role, counted in shares.items():
        assert not set(counted) & killed, f"{role} partitions still held by a killed replica: {counted}"
        assert sorted(counted.values()) == [PARTITIONS // 2] * 2, f"{role} shares {dict(counted)}"
        assert not any(f"{role}.member.{v}" in leases for v in killed)
    say(
        f"partitions after the kills: { ({r: dict(c) for r, c in shares.items()}) } "
        f"({took + time.monotonic() - started:.1f}s)"
    )


def test_kill_stream_leader(rig: Rig) -> None:
    def fault() -> Fault:
        leader = stream_leader(rig, streams.APPLY.name)
        return member_fault(rig, leader, f"kill {leader}, leader of {streams.APPLY.name}", cut="kill", heal="start")

    run_under_fault(rig, "kill-leader", fault)


def test_partition_one_server(rig: Rig) -> None:
    def fault() -> Fault:
        # The meta leader: every failure seen so far was with it cut off.
        leader = rig.meta_leader()
        what = (
            f"network disconnect {leader}, the meta leader (TJ_EVENTS led by {stream_leader(rig, streams.EVENTS.name)})"
        )
        return member_fault(rig, leader, what, cut="disconnect", heal="connect", heal_after=PARTITION_SECONDS)

    run_under_fault(rig, "partition", fault)
