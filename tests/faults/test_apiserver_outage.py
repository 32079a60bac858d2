"""(d) The apiserver goes away for 20 seconds while applies are pending, and comes back on the same port.

The kube-apiserver process group is SIGKILLed (connections reset, then refused) and a new one is started
with the same argv: the same etcd, port, certificates and token file. This module has its own apiserver
and etcd, since it restarts them.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from contracts import streams, subjects
from contracts.messages import decode_dead_letter, decode_event
from tjpipe.local.kubeapi import LocalKube
from tjpipe.local.procs import ManagedProcess

from .conftest import start_private_kube
from .support import (
    TRAINER,
    Pipeline,
    apply_filter,
    assert_ledger_holds_live,
    assert_repeats_cost_nothing,
    close_pipeline,
    converged,
    dlq_filter,
    events_filter,
    jobset_matches,
    kill_group,
    ledger_record,
    open_pipeline,
    quiet,
    report,
    results_of,
    rv,
    start_apiserver_like,
    step_of,
    step_patch,
    stream_messages,
    subject_count,
    trainjob,
    until,
    until_async,
)

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(150)]

DOWNTIME = 20.0


@pytest.fixture(scope="module")
def own_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalKube, Path, list[ManagedProcess]]]:
    root = tmp_path_factory.mktemp("outage-kube")
    kube = start_private_kube(root)
    replacements: list[ManagedProcess] = []
    try:
        yield kube, root, replacements
    finally:
        for process in reversed(replacements):
            process.stop()
        kube.stop()


@pytest.fixture
def outage_pipeline(own_kube: tuple[LocalKube, Path, list[ManagedProcess]], tmp_path: Path) -> Iterator[Pipeline]:
    kube, _, _ = own_kube
    pipe = open_pipeline(kube, tmp_path / "pipe")
    try:
        yield pipe
    finally:
        print(close_pipeline(pipe))


async def test_d_apiserver_down_20s_while_applies_are_pending(
    outage_pipeline: Pipeline, own_kube: tuple[LocalKube, Path, list[ManagedProcess]]
) -> None:
    p = outage_pipeline
    kube, root, replacements = own_kube
    n = 10
    names = [f"d-{i:02d}" for i in range(n)]
    started = time.monotonic()
    nc = await p.connect()
    try:
        bus = nc.jetstream()
        p.start("watcher")
        p.start("planner")
        await until(lambda: "watcher running" in p.log_text("watcher"), timeout=30, what="the watcher")
        # The plans are made and queued while the apiserver is up; the applier starts when it is down.
        spec_rv = rv(p.create(trainjob("d-seq", num_nodes=2, suspend=True, patches=step_patch("1"))))
        for i, name in enumerate(names):
            p.create(trainjob(name, num_nodes=1 + i % 4))
        for step in ("2", "3"):
            await asyncio.sleep(0.2)
            spec_rv = rv(p.merge_patch(TRAINER, "TrainJob", "d-seq", {"spec": {"runtimePatches": step_patch(step)}}))

        async def queued() -> bool:
            count = await subject_count(bus, streams.APPLY.name, f"{subjects.APPLY_PREFIX}.*.{p.namespace}.*.jobset")
            if count < n + 1:
                return False
            last = decode_event(
                (await stream_messages(bus, streams.EVENTS.name, events_filter(p.namespace, "d-seq")))[-1].data
            )
            return '"step":"3"' in msgspec.json.encode(last.trainjob).decode()

        await until_async(queued, timeout=30, what="the apply messages of every TrainJob and of the last d-seq spec")
        w_before = p.writes()
        assert w_before.writes("jobsets") == 0

        apiserver_argv = [str(a) for a in kube.processes[-1].popen.args]
        kill_group(kube.processes[-1])
        down_at = time.monotonic()
        p.start("applier")
        await until_async(lambda: _has_consumers(bus), timeout=30, what="the applier's consumers")
        await asyncio.sleep(DOWNTIME - (time.monotonic() - down_at))
        applier_log = p.log_text("applier")
        # While the apiserver is away: retries and naks, never a dead letter.
        assert "ConnectionError" in applier_log or "Cannot connect" in applier_log, applier_log[-2000:]
        assert not await stream_messages(bus, streams.DLQ.name, dlq_filter(p.namespace))
        assert p.processes["applier"].is_running() and p.processes["watcher"].is_running()

        new_apiserver = await asyncio.to_thread(
            start_apiserver_like, kube, argv=apiserver_argv, log_dir=root / "logs", name="kube-apiserver-2"
        )
        replacements.append(new_apiserver)
        back_at = time.monotonic()
        # The restarted apiserver counts from zero.
        await until(lambda: converged(p, [*names, "d-seq"]), timeout=100, what="every JobSet after the outage")
        await until(lambda: step_of(p, "d-seq") == ("3", "3"), timeout=60, what="d-seq at step 3")
        converged_after = time.monotonic() - back_at
        # The watcher is back too: a TrainJob created now is built.
        p.create(trainjob("d-after", num_nodes=2))
        await until(lambda: converged(p, ["d-after"]), timeout=60, what="a TrainJob created after the outage")
        # Each informer comes back on its own backoff, the JobSet one possibly half a minute after the
        # apiserver; its relist re-plans d-seq's JobSet (suspended, so it may be updated). Counting writes
        # and replaying before that would race it.
        await until(
            lambda: re.search(r"d-seq \([^)]*JobSet ADDED", p.log_text("watcher")) is not None,
            timeout=90,
            what="the JobSet informer back",
        )
        w_after = await quiet(p, bus, timeout=60)

        letters = [
            decode_dead_letter(m.data) for m in await stream_messages(bus, streams.DLQ.name, dlq_filter(p.namespace))
        ]
        assert not letters, [(dl.stage, dl.reason, dl.error) for dl in letters]
        results = await results_of(bus, p.namespace)
        assert not [r for r in results if r.action == "failed"], [r for r in results if r.action == "failed"]
        retried = [r for r in results if r.attempts > 1]
        applier_log = p.log_text("applier")
        naks = applier_log.count("handing back to JetStream")
        assert naks > 0 or retried, "the applier neither retried nor handed a message back"

        jobsets, trainjobs = p.jobsets(), p.trainjobs()
        for name in names:
            assert jobset_matches(jobsets[name], trainjobs[name])
            assert jobsets[name]["metadata"]["generation"] == 1, name
            record = await ledger_record(bus, f"{p.namespace}.jobset.{name}")
            assert record is not None and record.state == "applied", (name, record)
        await assert_ledger_holds_live(p, bus, "d-seq", spec_version=spec_rv)

        # Writes on the new apiserver: one JobSet per TrainJob (plus d-seq's re-apply and step changes),
        # nothing twice, no Warning Event.
        assert n + 1 <= w_after.writes("jobsets") <= n + 1 + 1 + 3 + 1, w_after.summary()
        assert w_after.writes("events") == 0, w_after.summary()
        apply_messages = await subject_count(bus, streams.APPLY.name, apply_filter(p.namespace))
        replayed, repeat, ambiguous = await assert_repeats_cost_nothing(p, bus)
        report(
            "d",
            seconds=round(time.monotonic() - started, 1),
            downtime=DOWNTIME,
            converged_after_back=round(converged_after, 1),
            naks=naks,
            results_with_retries=len(retried),
            max_attempts=max((r.attempts for r in results), default=0),
            writes_on_restarted_apiserver=w_after.summary(),
            apply_messages=apply_messages,
            replayed=replayed,
            repeat_writes=repeat.summary(),
            equal_version_status_plans=ambiguous,
            new_apiserver_pid=new_apiserver.pid,
        )
    finally:
        await nc.close()


async def _has_consumers(js: Any) -> bool:
    return len(await js.consumers_info(streams.APPLY.name)) > 0
