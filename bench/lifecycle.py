"""The lifecycle scenario: TrainJobs that run to completion on a simulated cluster (``--lifecycle``).

The other scenarios stop at "every component exists"; here the pods run. A stack of its own is started
with the simulated cluster (``tjpipe.local.cluster``: kube-controller-manager, kube-scheduler, JobSet's
manager with its webhooks, kwok nodes whose pods succeed after ``pod_run_seconds``), so nothing the
other scenarios left behind is in it and its controllers do not load their measurements. N torch
TrainJobs are created; each counts as done when the benchmark's watch sees its ``Complete`` (or
``Failed``) condition. Reported: time to all Complete, the pipeline's status writes per TrainJob
(``trainjobs/status``, which only the pipeline writes), API requests per TrainJob by verb, the
pipeline's own apply outcomes, and CPU per TrainJob by process.

It costs a cluster start (seconds when the binaries are cached, a Go build of kube-controller-manager,
kube-scheduler and kwok the first time) plus the run, which is bounded by how fast the simulated
controllers make and finish pods, not by the pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from bench import stats, workload
from bench.cluster import (
    CountingKube,
    Services,
    apply_object,
    bus_probe,
    counter_delta,
    cpu_delta,
    cpu_of,
    create_namespace,
    create_trainjobs,
    pids_by_name,
    scrape_apiserver,
    settle,
)
from contracts import resources
from plumbing.kube import KubeApiError

Progress = Callable[[str], None]

DONE_CONDITIONS = ("Complete", "Failed")


class _Condition(msgspec.Struct, kw_only=True):
    type: str = ""
    status: str = ""


class _Status(msgspec.Struct, kw_only=True):
    conditions: list[_Condition] | None = None


class _Name(msgspec.Struct, kw_only=True):
    name: str = ""


class _TrainJob(msgspec.Struct, kw_only=True):
    metadata: _Name = msgspec.field(default_factory=_Name)
    status: _Status = msgspec.field(default_factory=_Status)


_trainjob_decoder = msgspec.json.Decoder(_TrainJob)


def finished_condition(conditions: Sequence[tuple[str, str]]) -> str | None:
    """``Complete`` or ``Failed`` when that condition is True (the first of them found), else ``None``."""
    for kind, status in conditions:
        if kind in DONE_CONDITIONS and status == "True":
            return kind
    return None


class FinishWatch:
    """When each TrainJob of a namespace first shows ``Complete=True`` or ``Failed=True`` (one watch)."""

    def __init__(self, kube: CountingKube, namespace: str, names: Sequence[str]) -> None:
        self.kube = kube
        self.namespace = namespace
        self.pending = set(names)
        self.finished: dict[str, tuple[str, float]] = {}
        self.done = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        if not names:
            self.done.set()

    def forget(self, names: Sequence[str]) -> None:
        self.pending -= set(names)
        if not self.pending:
            self.done.set()

    async def start(self) -> None:
        rv = ""
        async for page in self.kube.list_pages(resources.TRAINJOB, namespace=self.namespace, metadata_only=True):
            rv = page.metadata.resourceVersion
        self.kube.counts[("trainjobs", "", "WATCH")] += 1
        self._task = asyncio.create_task(self._follow(rv))

    async def _follow(self, rv: str) -> None:
        while self.pending:
            with contextlib.suppress(KubeApiError):
                async for event in self.kube.watch(
                    resources.TRAINJOB, namespace=self.namespace, resource_version=rv, timeout_seconds=3600
                ):
                    if event.type not in ("ADDED", "MODIFIED"):
                        continue
                    job = _trainjob_decoder.decode(event.object)
                    name = job.metadata.name
                    if name not in self.pending:
                        continue
                    found = finished_condition([(c.type, c.status) for c in job.status.conditions or ()])
                    if found is not None:
                        self.finished[name] = (found, time.time())
                        self.pending.discard(name)
                        if not self.pending:
                            self.done.set()
                            return
            await asyncio.sleep(1.0)  # a dropped watch: start again (from the list's version)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


async def lifecycle(
    *,
    n: int,
    nodes: int,
    pod_run_seconds: float,
    runtime: Mapping[str, Any],
    concurrency: int,
    create_concurrency: int,
    quiet_seconds: float,
    keep_state: bool,
    progress: Progress,
) -> dict[str, Any]:
    """Start a simulated cluster with the pipeline, run ``n`` torch TrainJobs to completion, stop it all."""
    from tjpipe.stack import Stack, StatePaths

    state = Path(tempfile.mkdtemp(prefix="tjpipe-bench-lifecycle-"))
    stack = Stack(
        paths=StatePaths(state),
        progress=lambda line: progress(f"lifecycle stack: {line}"),
        simulate=True,
        sim_nodes=nodes,
        pod_run_seconds=pod_run_seconds,
    )
    out: dict[str, Any] = {"n": n, "nodes": nodes, "pod_run_seconds": pod_run_seconds}
    kube: CountingKube | None = None
    session: aiohttp.ClientSession | None = None
    started = time.monotonic()
    try:
        await asyncio.to_thread(stack.start_infrastructure)
        out["cluster_start_seconds"] = time.monotonic() - started
        assert stack.kubeconfig is not None
        from plumbing.kube import KubeConfig

        kube = CountingKube(KubeConfig.load(str(stack.kubeconfig)), max_connections=64)
        await apply_object(kube, resources.CLUSTER_TRAINING_RUNTIME, runtime, field_manager="tjpipe-bench")
        session = aiohttp.ClientSession()
        services = Services(
            stack=stack, session=session, progress=progress, base_args={"applier": ["--concurrency", str(concurrency)]}
        )
        await services.start_all()
        nc = await stack.connect(name="tjpipe-bench-lifecycle")
        try:
            out.update(
                await _run(
                    kube,
                    stack,
                    services,
                    nc.jetstream(),
                    n=n,
                    create_concurrency=create_concurrency,
                    quiet_seconds=quiet_seconds,
                    pod_run_seconds=pod_run_seconds,
                    progress=progress,
                )
            )
        finally:
            await nc.close()
    finally:  # the lifecycle's own simulated-cluster stack, not runner.py's
        if session is not None:
            await session.close()
        if kube is not None:
            await kube.close()
        progress("lifecycle: stopping its stack")
        await asyncio.to_thread(stack.stop)
        if not keep_state:
            shutil.rmtree(state, ignore_errors=True)
        out["total_seconds"] = time.monotonic() - started
    return out


def _processes(stack: Any) -> dict[str, int]:
    extra = []
    if stack.simulation is not None:
        extra = [*stack.simulation.processes, stack.simulation.jobset.process]
    return pids_by_name(stack, extra)


async def _run(
    kube: CountingKube,
    stack: Any,
    services: Services,
    js: Any,
    *,
    n: int,
    create_concurrency: int,
    quiet_seconds: float,
    pod_run_seconds: float,
    progress: Progress,
) -> dict[str, Any]:
    namespace = "bench-lifecycle"
    await create_namespace(kube, namespace)
    names = [f"tj-{i:05d}" for i in range(n)]
    bodies = {
        name: msgspec.json.encode(workload.trainjob_body(namespace, name, "torch", workload.num_nodes_for(i)))
        for i, name in enumerate(names)
    }
    timeout = 300.0 + 1.5 * n + 4 * pod_run_seconds
    watch = FinishWatch(kube, namespace, names)
    await watch.start()
    api_before = await scrape_apiserver(kube)
    own_before = Counter(kube.counts)
    counters_before = await services.counters()
    cpu_before = cpu_of(_processes(stack))
    progress(f"lifecycle: {n} torch TrainJobs in {namespace} on {stack.sim_nodes} simulated nodes")
    sent, created, errors, _ = await create_trainjobs(kube, namespace, bodies, concurrency=create_concurrency)
    watch.forget([name for name in names if name not in created])
    first = min(sent.values(), default=time.time())
    progress(f"lifecycle: created {len(created)}; waiting for Complete (at most {timeout:.0f}s)")
    deadline = time.monotonic() + timeout
    while not watch.done.is_set() and time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(watch.done.wait(), timeout=30.0)
        progress(f"lifecycle: {len(watch.finished)}/{len(created)} finished after {time.time() - first:.0f}s")
    settled, cpu_settled = await settle(
        bus_probe(js), quiet_seconds=quiet_seconds, timeout=120.0, cpu=lambda: cpu_of(_processes(stack))
    )
    await watch.stop()
    api_after = await scrape_apiserver(kube)
    own = Counter(kube.counts)
    own.subtract(own_before)
    moved_counters = counter_delta(await services.counters(), counters_before)

    outcomes = Counter(kind for kind, _ in watch.finished.values())
    complete_at = [at for kind, at in watch.finished.values() if kind == "Complete"]
    out: dict[str, Any] = {
        "namespace": namespace,
        "created": len(created),
        "create_errors": dict(errors),
        "outcomes": dict(outcomes),
        "complete": outcomes.get("Complete", 0),
        "complete_percent": 100.0 * outcomes.get("Complete", 0) / n if n else 0.0,
        "seconds_to_all_complete": (max(complete_at) - first) if outcomes.get("Complete", 0) == n else None,
        "seconds_to_last_finished": (max(at for _, at in watch.finished.values()) - first) if watch.finished else None,
        "time_to_finish": stats.summarize([at - created[name] for name, (_, at) in watch.finished.items()]),
        "settled_after_s": settled,
        "cpu_seconds": cpu_delta(cpu_before, cpu_settled),
        "applies": moved_counters.get("applies", {}),
        "events": moved_counters.get("events", {}),
        "plans": moved_counters.get("plans", {}),
    }
    if api_before is not None and api_after is not None:
        moved = stats.delta(api_after, api_before)
        every = sorted({k[0] for k in moved if k[0] and k[0] not in stats.APISERVER_HOUSEKEEPING})
        counts = stats.pipeline_requests(moved, {k: float(v) for k, v in own.items() if v > 0}, resources=every)
        tracked = stats.pipeline_requests(moved, {k: float(v) for k, v in own.items() if v > 0})
        status_writes = sum(
            count
            for (resource, sub, verb), count in tracked.items()
            if resource == "trainjobs" and sub == "status" and verb in stats.WRITE_VERBS
        )
        out.update(
            {
                "requests_per_trainjob_by_verb": stats.per_each(stats.by_verb(counts), len(created)),
                "tracked_requests_per_trainjob_by_verb": stats.per_each(stats.by_verb(tracked), len(created)),
                "requests_by_resource": stats.by_resource_verb(counts),
                "status_writes": status_writes,
                "status_writes_per_trainjob": status_writes / len(created) if created else None,
            }
        )
    progress(
        f"lifecycle: {out['complete']}/{n} Complete, all in "
        f"{format(out['seconds_to_all_complete'] or 0, '.1f')}s, "
        f"{out.get('status_writes_per_trainjob') or 0:.2f} status writes per TrainJob"
    )
    return out
