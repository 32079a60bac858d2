"""The lifecycle scenario: TrainJobs run to completion on a simulated cluster, Trainer's controller and the
pipeline side by side (``--lifecycle``).

The other scenarios stop at "every component exists"; here the pods run, so the status path is measured
too. Each side gets a fresh stack of its own with the simulated cluster (``tjpipe.local.cluster``:
kube-controller-manager, kube-scheduler, JobSet's manager with its webhooks, kwok nodes whose pods succeed
after ``pod_run_seconds``), built the same way with the same node count: Trainer v2.3.0's controller
(``tjpipe.local.trainer_controller``, shipped settings, webhooks served but not registered as in
``bench.reference``) on the first, then the pipeline's three services on the second. A fresh cluster per
side rather than one cluster emptied between them: both start from an empty etcd, neither controller ever
sees the other's TrainJobs (both reconcile every namespace), and nothing is left to delete, which for
thousands of TrainJobs and their pods would take longer than a cluster start. The two never run at the
same time, and the other scenarios' objects are in neither.

On each side the same N torch TrainJobs are created by the same client; each counts as done when the
benchmark's watch sees its ``Complete`` (or ``Failed``) condition. Measured the same way for both, from the
first create until the controller's last activity (its requests on TrainJobs and components, and for the
pipeline its streams and consumers too): time to all Complete, create→Complete p50/p99, status writes per
TrainJob (``trainjobs/status``, which only the controller writes), API requests per TrainJob by verb
(``apiserver_request_total`` less the benchmark's own), CPU per TrainJob by process and the controller
side's RSS once everything settled; for the pipeline also its own apply outcomes.

It costs two cluster starts (seconds each when the binaries are cached; a Go build the first time) plus
the two runs, which are bounded by how fast the simulated controllers make and finish pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from bench import stats, workload
from bench.cluster import (
    CountingKube,
    Services,
    apiserver_probe,
    apply_object,
    bus_probe,
    close_clients,
    counter_delta,
    cpu_delta,
    cpu_of,
    create_namespace,
    create_trainjobs,
    pids_by_name,
    process_memory,
    scrape_apiserver,
    settle,
)
from bench.reference import PIPELINE_PROCESSES, TRAINER_PROCESS, controller_cpu_ms, controller_rss
from contracts import resources
from plumbing.kube import KubeApiError

Progress = Callable[[str], None]
Probe = Callable[[], Awaitable[Any]]
Counters = Callable[[], Awaitable[dict[str, dict[tuple[str, ...], float]]]]

DONE_CONDITIONS = ("Complete", "Failed")
JOBSET_DONE_CONDITIONS = ("Completed", "Failed")
"""What a finished JobSet says (JobSet's own condition types), so the controller's share of the wait can be
told from the simulated cluster's: a TrainJob finishes after its JobSet does, by the controller's reaction."""
TRAINER, PIPELINE = "trainer", "pipeline"
SIDES = (TRAINER, PIPELINE)
"""The order the sides run in: Trainer's first, as in ``bench.reference``."""
LABELS = {TRAINER: "Trainer v2.3.0", PIPELINE: "pipeline"}


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


def finished_condition(conditions: Sequence[tuple[str, str]], done: Sequence[str] = DONE_CONDITIONS) -> str | None:
    """``Complete`` or ``Failed`` (or the ``done`` types given) when that condition is True (the first of
    them found), else ``None``."""
    for kind, status in conditions:
        if kind in done and status == "True":
            return kind
    return None


class FinishWatch:
    """When each object of a namespace first shows one of ``done`` True (one watch): by default TrainJobs
    and ``Complete`` or ``Failed``."""

    def __init__(
        self,
        kube: CountingKube,
        namespace: str,
        names: Sequence[str],
        *,
        resource: resources.Resource = resources.TRAINJOB,
        done: Sequence[str] = DONE_CONDITIONS,
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.resource = resource
        self.done_conditions = tuple(done)
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
        async for page in self.kube.list_pages(self.resource, namespace=self.namespace, metadata_only=True):
            rv = page.metadata.resourceVersion
        self.kube.counts[(self.resource.plural, "", "WATCH")] += 1
        self._task = asyncio.create_task(self._follow(rv))

    async def _follow(self, rv: str) -> None:
        while self.pending:
            with contextlib.suppress(KubeApiError):
                async for event in self.kube.watch(
                    self.resource, namespace=self.namespace, resource_version=rv, timeout_seconds=3600
                ):
                    if event.type not in ("ADDED", "MODIFIED"):
                        continue
                    job = _trainjob_decoder.decode(event.object)
                    name = job.metadata.name
                    if name not in self.pending:
                        continue
                    found = finished_condition(
                        [(c.type, c.status) for c in job.status.conditions or ()], self.done_conditions
                    )
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
    sides: Sequence[str] = SIDES,
    into: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run ``n`` torch TrainJobs to completion under each controller in ``sides``, one after the other, each
    on a simulated cluster of its own; a side that fails keeps what it measured and says why.

    Figures land in ``into`` as they are measured, so a run stopped part way (the large one takes hours) still
    reports the sides it finished."""
    out: dict[str, Any] = {} if into is None else into
    out.update({"n": n, "nodes": nodes, "pod_run_seconds": pod_run_seconds, "sides": list(sides)})
    settings = _Settings(
        n=n,
        nodes=nodes,
        pod_run_seconds=pod_run_seconds,
        runtime=runtime,
        concurrency=concurrency,
        create_concurrency=create_concurrency,
        quiet_seconds=quiet_seconds,
        keep_state=keep_state,
    )
    for side in sides:
        measured: dict[str, Any] = {}
        out[side] = measured
        try:
            await _side(side, measured, settings, progress=progress)
        except Exception as exc:  # the other side's figures are still worth having
            progress(f"lifecycle, {LABELS[side]}: failed: {exc!r}")
            measured["error"] = repr(exc)
    return out


def _all_of(*probes: Probe) -> Probe:
    """One probe that changes whenever any of ``probes`` does."""

    async def probe() -> Any:
        return tuple([await p() for p in probes])

    return probe


@dataclass(frozen=True)
class _Settings:
    """What both sides run with (``lifecycle``'s arguments)."""

    n: int
    nodes: int
    pod_run_seconds: float
    runtime: Mapping[str, Any]
    concurrency: int
    create_concurrency: int
    quiet_seconds: float
    keep_state: bool


async def _side(side: str, out: dict[str, Any], settings: _Settings, *, progress: Progress) -> None:
    """Start a simulated cluster and ``side``'s controller on it, run the TrainJobs, stop it all (into ``out``)."""
    from plumbing.kube import KubeConfig
    from tjpipe.local.stack import Stack, StatePaths
    from tjpipe.local.trainer_controller import TrainerController

    label = LABELS[side]

    def say(line: str) -> None:
        progress(f"lifecycle, {label}: {line}")

    state = Path(tempfile.mkdtemp(prefix=f"tjpipe-bench-lifecycle-{side}-"))
    stack = Stack(
        paths=StatePaths(state),
        progress=lambda line: say(f"stack: {line}"),
        simulate=True,
        sim_nodes=settings.nodes,
        pod_run_seconds=settings.pod_run_seconds,
    )
    kube: CountingKube | None = None
    session: aiohttp.ClientSession | None = None
    nc: Any = None
    trainer: TrainerController | None = None
    started = time.monotonic()
    try:
        await asyncio.to_thread(stack.start_infrastructure)
        out["cluster_start_seconds"] = time.monotonic() - started
        assert stack.kubeconfig is not None
        kube = CountingKube(KubeConfig.load(str(stack.kubeconfig)), max_connections=64)
        await apply_object(kube, resources.CLUSTER_TRAINING_RUNTIME, settings.runtime, field_manager="tjpipe-bench")
        simulated = [*stack.simulation.processes, stack.simulation.jobset.process] if stack.simulation else []
        counters: Counters | None = None
        if side == TRAINER:
            trainer = TrainerController(
                kubeconfig=stack.kubeconfig, state_dir=state / "trainer", progress=say, register_webhooks=False
            )
            await asyncio.to_thread(trainer.start)
            controller: Sequence[str] = (TRAINER_PROCESS,)
            probe = apiserver_probe(kube)
            running = trainer

            def pids() -> dict[str, int]:
                extra = [running.process] if running.process is not None and running.is_running() else []
                # The stack's idle nats-server is not Trainer's: only the pipeline's side carries it.
                return {k: v for k, v in pids_by_name(stack, [*simulated, *extra]).items() if k != "nats"}

        else:
            session = aiohttp.ClientSession()
            services = Services(
                stack=stack,
                session=session,
                progress=progress,
                base_args={"applier": ["--concurrency", str(settings.concurrency)]},
            )
            await services.start_all()
            nc = await stack.connect(name="tjpipe-bench-lifecycle")
            controller = PIPELINE_PROCESSES
            probe = _all_of(bus_probe(nc.jetstream()), apiserver_probe(kube))
            counters = services.counters

            def pids() -> dict[str, int]:
                return pids_by_name(stack, simulated)

        out.update(
            await _run(
                kube,
                settings,
                label=label,
                pids=pids,
                controller=controller,
                probe=probe,
                counters=counters,
                progress=say,
            )
        )
    finally:  # the side's own simulated-cluster stack, not runner.py's
        if trainer is not None:
            if trainer.process is not None and not trainer.is_running():
                out["exited"] = trainer.log_tail(10)
            await asyncio.to_thread(trainer.stop)
        await close_clients(nc, session, kube)
        say("stopping its stack")
        await asyncio.to_thread(stack.stop)
        if not settings.keep_state:
            shutil.rmtree(state, ignore_errors=True)
        out["total_seconds"] = time.monotonic() - started


async def _run(
    kube: CountingKube,
    settings: _Settings,
    *,
    label: str,
    pids: Callable[[], dict[str, int]],
    controller: Sequence[str],
    probe: Probe,
    counters: Counters | None,
    progress: Progress,
) -> dict[str, Any]:
    n = settings.n
    namespace = "bench-lifecycle"
    await create_namespace(kube, namespace)
    names = [f"tj-{i:05d}" for i in range(n)]
    bodies = {
        name: msgspec.json.encode(workload.trainjob_body(namespace, name, "torch", workload.num_nodes_for(i)))
        for i, name in enumerate(names)
    }
    timeout = 300.0 + 1.5 * n + 4 * settings.pod_run_seconds
    watch = FinishWatch(kube, namespace, names)
    jobsets = FinishWatch(kube, namespace, names, resource=resources.JOBSET, done=JOBSET_DONE_CONDITIONS)
    await watch.start()
    await jobsets.start()
    api_before = await scrape_apiserver(kube)
    own_before = Counter(kube.counts)
    counters_before = await counters() if counters else {}
    cpu_before = cpu_of(pids())
    progress(f"{n} torch TrainJobs in {namespace} on {settings.nodes} simulated nodes")
    sent, created, errors, _ = await create_trainjobs(kube, namespace, bodies, concurrency=settings.create_concurrency)
    watch.forget([name for name in names if name not in created])
    jobsets.forget([name for name in names if name not in created])
    first = min(sent.values(), default=time.time())
    progress(f"created {len(created)}; waiting for Complete (at most {timeout:.0f}s)")
    deadline = time.monotonic() + timeout
    while not watch.done.is_set() and time.monotonic() < deadline:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(watch.done.wait(), timeout=30.0)
        progress(f"{len(watch.finished)}/{len(created)} finished after {time.time() - first:.0f}s")
    waited = time.time() - first
    if not watch.done.is_set():
        progress(f"gave up waiting after {waited:.0f}s with {len(watch.finished)}/{len(created)} finished")
    settled, cpu_settled = await settle(
        probe, quiet_seconds=settings.quiet_seconds, timeout=120.0 + 0.05 * n, cpu=lambda: cpu_of(pids())
    )
    memory = {name: process_memory(pid) for name, pid in pids().items()}
    await watch.stop()
    await jobsets.stop()
    api_after = await scrape_apiserver(kube)
    own = Counter(kube.counts)
    own.subtract(own_before)
    moved_counters = counter_delta(await counters(), counters_before) if counters else {}

    outcomes = Counter(kind for kind, _ in watch.finished.values())
    complete_at = [at for kind, at in watch.finished.values() if kind == "Complete"]
    out: dict[str, Any] = {
        "label": label,
        "namespace": namespace,
        "created": len(created),
        "create_errors": dict(errors),
        "outcomes": dict(outcomes),
        "complete": outcomes.get("Complete", 0),
        "complete_percent": 100.0 * outcomes.get("Complete", 0) / n if n else 0.0,
        "seconds_to_all_complete": (max(complete_at) - first) if outcomes.get("Complete", 0) == n else None,
        "seconds_waited": waited,
        "seconds_to_last_finished": (max(at for _, at in watch.finished.values()) - first) if watch.finished else None,
        "time_to_finish": stats.summarize([at - created[name] for name, (_, at) in watch.finished.items()]),
        **finish_breakdown(created, jobsets.finished, watch.finished),
        "settled_after_s": settled,
        "controller": list(controller),
        "cpu_seconds": cpu_delta(cpu_before, cpu_settled),
        "memory": memory,
    }
    out["controller_cpu_ms_per_trainjob"] = controller_cpu_ms(out["cpu_seconds"], controller, len(created))
    out["controller_rss_mb"] = controller_rss(memory, controller)
    if counters:
        out.update({key: moved_counters.get(key, {}) for key in ("applies", "events", "plans", "trainjob_checks")})
    if api_before is not None and api_after is not None:
        out.update(lifecycle_requests(stats.delta(api_after, api_before), own, len(created)))
    progress(
        f"{out['complete']}/{n} Complete, all in {format(out['seconds_to_all_complete'] or 0, '.1f')}s, "
        f"{out.get('status_writes_per_trainjob') or 0:.2f} status writes per TrainJob, controller CPU "
        f"{out['controller_cpu_ms_per_trainjob'] or 0:.2f} ms/TJ, RSS {out['controller_rss_mb']['rss_mb'] or 0:.0f} MB"
    )
    return out


def finish_breakdown(
    created: Mapping[str, float],
    jobset_finished: Mapping[str, tuple[str, float]],
    trainjob_finished: Mapping[str, tuple[str, float]],
) -> dict[str, Any]:
    """A TrainJob's wait split where the controller's part begins: create → its JobSet finished (the
    simulated cluster's pace, which the controller only slows by the CPU it takes from it) and JobSet
    finished → TrainJob finished (the controller's reaction: its watch, and for the pipeline the bus, the
    three stages and the status write). Both as seen by the benchmark's own watches, on the same clock."""
    to_jobset = [at - created[name] for name, (_, at) in jobset_finished.items() if name in created]
    reaction = [at - jobset_finished[name][1] for name, (_, at) in trainjob_finished.items() if name in jobset_finished]
    return {
        "time_to_jobset_finish": stats.summarize(to_jobset),
        "finish_reaction": stats.summarize(reaction),
    }


def lifecycle_requests(
    moved: Mapping[stats.RequestKey, float], own: Mapping[stats.RequestKey, int], trainjobs: int
) -> dict[str, Any]:
    """A lifecycle run's API requests, less the benchmark's own: every resource (so the simulated
    controllers' Jobs, Pods and JobSet status are in it), TrainJobs and their components alone, and the
    writes to ``trainjobs/status``."""
    mine = {k: float(v) for k, v in own.items() if v > 0}
    every = sorted({k[0] for k in moved if k[0] and k[0] not in stats.APISERVER_HOUSEKEEPING})
    counts = stats.pipeline_requests(moved, mine, resources=every)
    tracked = stats.pipeline_requests(moved, mine)
    status_writes = sum(
        count
        for (resource, sub, verb), count in tracked.items()
        if resource == "trainjobs" and sub == "status" and verb in stats.WRITE_VERBS
    )
    return {
        "requests_per_trainjob_by_verb": stats.per_each(stats.by_verb(counts), trainjobs),
        "tracked_requests_per_trainjob_by_verb": stats.per_each(stats.by_verb(tracked), trainjobs),
        "tracked_writes_per_trainjob": stats.writes(tracked) / trainjobs if trainjobs else None,
        "requests_by_resource": stats.by_resource_verb(counts),
        "status_writes": status_writes,
        "status_writes_per_trainjob": status_writes / trainjobs if trainjobs else None,
    }
