"""The I/O the scenarios share: a counting API client, paged lists, metric scrapes, services, quiet.

Everything here talks to loopback servers the benchmark started (or to the ones NATS_URL and KUBECONFIG
name); every loop has a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from bench import stats
from contracts import resources, streams
from contracts.resources import Resource
from plumbing.kube import KubeApiError, KubeClient, KubeConfig, Response
from tjpipe.local.stack import SERVICES, Stack

log = logging.getLogger("bench")

Progress = Callable[[str], None]


# ------------------------------------------------------------------------------------------ API client


class CountingKube(KubeClient):
    """The project's KubeClient, counting each request as the API server will label it.

    The counts are what the benchmark itself sent, so they can be taken out of the API server's own
    ``apiserver_request_total`` and what is left is the pipeline's.
    """

    def __init__(self, config: KubeConfig, *, max_connections: int = 32, timeout: float = 30.0) -> None:
        super().__init__(config, max_connections=max_connections, timeout=timeout)
        self.counts: Counter[stats.RequestKey] = Counter()

    # The signature restates KubeClient.request's, as an override must.
    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        timeout: float | None = None,
        accept: str | None = None,
    ) -> Response:
        key = stats.classify_request(method, path, params=params, content_type=content_type)
        if key is not None:
            self.counts[key] += 1
        return await super().request(
            method, path, params=params, body=body, content_type=content_type, timeout=timeout, accept=accept
        )


class _Meta(msgspec.Struct, kw_only=True):
    name: str = ""
    namespace: str = ""


class _RJSpec(msgspec.Struct, kw_only=True):
    parallelism: int | None = None


class _RJTemplate(msgspec.Struct, kw_only=True):
    spec: _RJSpec = msgspec.field(default_factory=_RJSpec)


class _RJ(msgspec.Struct, kw_only=True):
    name: str = ""
    replicas: int | None = None
    template: _RJTemplate = msgspec.field(default_factory=_RJTemplate)


class _Spec(msgspec.Struct, kw_only=True):
    replicatedJobs: list[_RJ] = []


class Item(msgspec.Struct, kw_only=True):
    """The little of a listed object the checks read: its name and, for a JobSet, its replicated jobs."""

    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec = msgspec.field(default_factory=_Spec)


_item_decoder = msgspec.json.Decoder(Item)


async def close_clients(nc: Any, session: Any, kube: KubeClient | None) -> None:
    """Close what a run opened, in the order it was opened; a part never opened is ``None``."""
    if nc is not None:
        await nc.close()
    if session is not None:
        await session.close()
    if kube is not None:
        await kube.close()


async def list_items(kube: KubeClient, resource: Resource, *, namespace: str | None) -> list[Item]:
    """Every object of ``resource`` in ``namespace``, in the few fields the verification reads."""
    return [
        _item_decoder.decode(raw) async for page in kube.list_pages(resource, namespace=namespace) for raw in page.items
    ]


async def create_namespace(kube: KubeClient, name: str) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}).encode()
    try:
        await kube.create(resources.NAMESPACE, namespace=None, body=body)
    except KubeApiError as exc:
        if exc.status != 409:
            raise


async def apply_object(kube: KubeClient, resource: Resource, obj: Mapping[str, Any], *, field_manager: str) -> None:
    meta = obj["metadata"]
    await kube.apply(
        resource,
        namespace=meta.get("namespace", ""),
        name=meta["name"],
        body=json.dumps(obj).encode(),
        field_manager=field_manager,
        force=True,
    )


async def scrape_apiserver(kube: KubeClient) -> dict[stats.RequestKey, float] | None:
    """``apiserver_request_total`` by (resource, subresource, verb); ``None`` when /metrics is refused."""
    try:
        resp = await kube.request("GET", "/metrics", timeout=60)
    except KubeApiError as exc:
        log.warning("apiserver /metrics unavailable: %s", exc)
        return None
    return stats.apiserver_requests(resp.body.decode(errors="replace"))


# -------------------------------------------------------------------------------------------- CPU time

_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of one process so far, from /proc; ``None`` when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime: fields 14 and 15 of stat


def cpu_seconds(stack: Stack) -> dict[str, float]:
    """CPU seconds used so far by every process of the run: servers, services and the benchmark itself.

    Differences of two readings say where a measurement's CPU went; on two cores that is what bounds
    throughput, so it explains the end-to-end figures next to the ceiling's.
    """
    processes = list(stack.services)
    if stack.local_nats is not None:
        processes.append(stack.local_nats.process)
    if stack.local_kube is not None:
        processes.extend(stack.local_kube.processes)
    out: dict[str, float] = {"benchmark": time.process_time()}
    for process in processes:
        used = process_cpu_seconds(process.pid)
        if used is not None:
            out[process.name] = out.get(process.name, 0.0) + used
    return out


def cpu_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {name: max(0.0, after[name] - before.get(name, 0.0)) for name in after}


# ----------------------------------------------------------------------------------------- services


@dataclass
class Services:
    """The stack's three service processes, their metrics ports, restarts and readiness."""

    stack: Stack
    session: aiohttp.ClientSession
    progress: Progress
    base_args: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """Flags a service always gets, on its first start and on every restart (e.g. the applier's concurrency)."""
    restarts: dict[str, int] = field(default_factory=dict)

    def pid(self, name: str) -> int | None:
        for process in self.stack.services:
            if process.name == name and process.is_running():
                return process.pid
        return None

    def port(self, name: str) -> int:
        return self.stack.metrics_ports[name]

    async def start(self, name: str, extra: Sequence[str] = ()) -> None:
        args = [*self.base_args.get(name, ()), *extra]
        await asyncio.to_thread(self.stack.start_service, name, extra=args)

    async def stop(self, name: str) -> None:
        for process in [p for p in self.stack.services if p.name == name]:
            await asyncio.to_thread(process.stop)
            self.stack.services.remove(process)

    async def restart(self, names: Sequence[str], *, extra: Mapping[str, Sequence[str]] | None = None) -> None:
        for name in reversed(names):  # stop downstream first, like Stack.stop
            await self.stop(name)
        for name in names:
            await self.start(name, (extra or {}).get(name, ()))
            self.restarts[name] = self.restarts.get(name, 0) + 1
        await self.wait_ready(names)

    async def start_all(self) -> None:
        for name in SERVICES:
            await self.start(name)
        await self.wait_ready(SERVICES)

    async def wait_ready(self, names: Sequence[str], *, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        pending = list(names)
        while pending:
            for name in list(pending):
                if await self._ready(name):
                    pending.remove(name)
            if not pending:
                return
            for name in pending:
                if self.pid(name) is None:
                    tail = next((p.log_tail() for p in self.stack.services if p.name == name), "")
                    raise RuntimeError(f"{name} is not running; last log lines:\n{tail}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"services not ready after {timeout:.0f}s: {', '.join(pending)}")
            await asyncio.sleep(0.2)

    async def _ready(self, name: str) -> bool:
        try:
            async with self.session.get(
                f"http://127.0.0.1:{self.port(name)}/readyz", timeout=aiohttp.ClientTimeout(total=3)
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def metrics(self, name: str) -> str:
        try:
            async with self.session.get(
                f"http://127.0.0.1:{self.port(name)}/metrics", timeout=aiohttp.ClientTimeout(total=10)
            ) as resp:
                return await resp.text()
        except (aiohttp.ClientError, TimeoutError):
            return ""

    async def counters(self) -> dict[str, dict[tuple[str, ...], float]]:
        """The pipeline's own counters that explain a situation: events, plans, apply outcomes, and what
        answered the applier's TrainJob checks."""
        watcher = await self.metrics("watcher")
        planner = await self.metrics("planner")
        applier = await self.metrics("applier")
        return {
            "events": stats.sum_by(stats.samples(watcher, "tjpipe_events_total"), "outcome"),
            "plans": stats.sum_by(stats.samples(planner, "tjpipe_plans_total"), "outcome"),
            "applies": stats.sum_by(stats.samples(applier, "tjpipe_applies_total"), "kind", "action"),
            "trainjob_checks": stats.sum_by(stats.samples(applier, "tjpipe_trainjob_checks_total"), "answer"),
        }

    def rss(self) -> list[dict[str, Any]]:
        out = []
        for name in SERVICES:
            pid = self.pid(name)
            status = ""
            if pid is not None:
                with contextlib.suppress(OSError):
                    status = Path(f"/proc/{pid}/status").read_text()
            out.append(
                {
                    "service": name,
                    "pid": pid,
                    "rss_mb": stats.kib_to_mb(stats.parse_status_kib(status, "VmRSS")),
                    "hwm_mb": stats.kib_to_mb(stats.parse_status_kib(status, "VmHWM")),
                }
            )
        return out


def counter_delta(
    after: Mapping[str, Mapping[tuple[str, ...], float]], before: Mapping[str, Mapping[tuple[str, ...], float]]
) -> dict[str, dict[str, float]]:
    """Per-counter deltas with their label tuples joined, e.g. ``{"applies": {"JobSet/created": 3}}``."""
    out: dict[str, dict[str, float]] = {}
    for name, values in after.items():
        moved = stats.delta(values, before.get(name, {}))
        out[name] = {"/".join(k): v for k, v in sorted(moved.items())}
    return out


# ---------------------------------------------------------------------------------------------- bus


async def last_seq(js: JetStreamContext, stream: str) -> int:
    info = await js.stream_info(stream)
    return int(info.state.last_seq)


async def backlog(js: JetStreamContext) -> int:
    """Messages the planner and applier consumers have not finished: pending plus unacknowledged."""
    total = 0
    for spec in (streams.PLANNER, streams.APPLIER):
        for partition in range(16):
            durable = f"{spec.durable}-p{partition}"
            try:
                info = await js.consumer_info(spec.stream, durable)
            except (nats.js.errors.NotFoundError, nats.errors.TimeoutError):
                continue
            total += int(info.num_pending or 0) + int(info.num_ack_pending or 0)
    return total


async def purge_history(js: JetStreamContext) -> None:
    """Empty the pipeline's streams and its ledger: what a run left on the bus, before another run starts.

    The consumers stay; with nothing left to deliver they start again from the next message.
    """
    for name in (*(s.name for s in streams.ALL_STREAMS), f"KV_{streams.APPLIED_BUCKET}"):
        await js.purge_stream(name)


async def signature(js: JetStreamContext) -> tuple[int, ...]:
    return tuple([await last_seq(js, s.name) for s in streams.ALL_STREAMS])


async def wait_quiet(
    js: JetStreamContext,
    *,
    quiet_seconds: float,
    timeout: float,
    min_seconds: float = 0.0,
    interval: float = 0.5,
) -> float | None:
    """Wait until no stream grows and no consumer has work for ``quiet_seconds``; seconds taken, or None.

    Quiet is measured on the bus, not on the API server: every write the pipeline makes is an apply whose
    result is published, and every observation the watcher makes that is not a duplicate is an event.
    """
    started = time.monotonic()
    deadline = started + timeout
    last = await signature(js)
    still_since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(interval)
        now_sig = await signature(js)
        pending = await backlog(js)
        now = time.monotonic()
        if now_sig != last or pending:
            last = now_sig
            still_since = now
            continue
        if now - still_since >= quiet_seconds and now - started >= min_seconds:
            return still_since - started
    return None


class ResultTracker:
    """Follows TJ_RESULTS for one namespace live (a core subscription) to know when a run is done."""

    def __init__(self, nc: NATS, namespace: str, required: Mapping[str, frozenset[str]]) -> None:
        self.nc = nc
        self.namespace = namespace
        self.required = required
        self.seen: dict[str, set[str]] = {}
        self.done_names: set[str] = set()
        self.failed = 0
        self.done = asyncio.Event()
        self._sub: Any = None
        if not required:
            self.done.set()

    async def start(self) -> None:
        from contracts.messages import decode_result

        async def on_msg(msg: Any) -> None:
            try:
                result = decode_result(msg.data)
            except msgspec.DecodeError:
                return
            name = result.trainjob.name
            if result.action == "failed":
                self.failed += 1
            if result.action not in SUCCESS_ACTIONS or name not in self.required:
                return
            seen = self.seen.setdefault(name, set())
            seen.add(result.component)
            if name not in self.done_names and self.required[name] <= seen:
                self.done_names.add(name)
                if len(self.done_names) == len(self.required):
                    self.done.set()

        self._sub = await self.nc.subscribe(f"tj.result.*.{self.namespace}.>", cb=on_msg, pending_msgs_limit=1_000_000)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None


SUCCESS_ACTIONS = frozenset({"created", "configured", "unchanged"})


# ------------------------------------------------------------------------------- any controller, any pid


def process_memory(pid: int | None) -> dict[str, float | None]:
    """VmRSS and VmHWM (the peak since the process started) of one process, in MB; ``None`` when gone."""
    status = ""
    if pid is not None:
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{pid}/status").read_text()
    return {
        "rss_mb": stats.kib_to_mb(stats.parse_status_kib(status, "VmRSS")),
        "hwm_mb": stats.kib_to_mb(stats.parse_status_kib(status, "VmHWM")),
    }


def pids_by_name(stack: Stack, extra: Sequence[Any] = ()) -> dict[str, int]:
    """The live processes of a run by name: servers, services and any ``extra`` ManagedProcess (a controller)."""
    processes = [*stack.services, *extra]
    if stack.local_nats is not None:
        processes.append(stack.local_nats.process)
    if stack.local_kube is not None:
        processes.extend(stack.local_kube.processes)
    return {p.name: p.pid for p in processes if p.is_running()}


def cpu_of(pids: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each named process, plus this benchmark process as ``benchmark``."""
    out: dict[str, float] = {"benchmark": time.process_time()}
    for name, pid in pids.items():
        used = process_cpu_seconds(pid)
        if used is not None:
            out[name] = out.get(name, 0.0) + used
    return out


async def settle(
    probe: Callable[[], Any],
    *,
    quiet_seconds: float,
    timeout: float,
    min_seconds: float = 0.0,
    interval: float = 0.5,
    cpu: Callable[[], dict[str, float]] | None = None,
) -> tuple[float | None, dict[str, float]]:
    """Wait until ``await probe()`` stops changing for ``quiet_seconds``: (seconds to the last change, CPU then).

    The CPU reading is the one taken when the probe last changed, so the quiet period itself (idle time a
    controller spends whatever its load) is not charged to the work being measured. The seconds are
    ``None`` when the deadline came first; the CPU reading is then the last one taken.
    """
    started = time.monotonic()
    deadline = started + timeout
    last = await probe()
    at_change = cpu() if cpu else {}
    still_since = time.monotonic()
    while time.monotonic() < deadline:
        await asyncio.sleep(interval)
        now_sig = await probe()
        now = time.monotonic()
        if now_sig != last:
            last = now_sig
            still_since = now
            at_change = cpu() if cpu else {}
            continue
        if now - still_since >= quiet_seconds and now - started >= min_seconds:
            return still_since - started, at_change
    return None, at_change


def bus_probe(js: JetStreamContext) -> Callable[[], Any]:
    """The pipeline is busy while a stream grows or a consumer has work (see ``wait_quiet``)."""

    async def probe() -> Any:
        return (await signature(js), await backlog(js))

    return probe


def apiserver_probe(kube: KubeClient) -> Callable[[], Any]:
    """A controller without a bus is busy while it sends requests for TrainJobs and their components.

    Only the tracked resources count, and not WATCH (a long request is counted when it ends): leader
    election leases and the API server's own housekeeping never stop.
    """

    async def probe() -> Any:
        counts = await scrape_apiserver(kube)
        if counts is None:
            return None
        return sum(n for (r, _, v), n in counts.items() if r in stats.TRACKED_RESOURCES and v != "WATCH")

    return probe


async def delete_collections(
    kube: KubeClient, namespace: str, kinds: Sequence[Resource], *, timeout: float = 600.0
) -> dict[str, int]:
    """Delete every object of each kind in ``namespace`` (no garbage collector runs); what is left, by kind.

    One DELETE of the collection per kind, repeated until a list finds none left or ``timeout`` passes: a
    collection of thousands can outlast one request's deadline, and whatever is left would be found by
    the next controller measured.
    """
    deadline = time.monotonic() + timeout
    left: dict[str, int] = {}
    for resource in kinds:
        while True:
            with contextlib.suppress(KubeApiError):
                await kube.request("DELETE", resource.path(namespace=namespace), timeout=300)
            try:
                page = await anext(kube.list_pages(resource, namespace=namespace, limit=1, metadata_only=True))
                remaining = len(page.items)
            except KubeApiError:
                remaining = 0  # e.g. a kind whose CRD is not installed
            if not remaining or time.monotonic() > deadline:
                if remaining:
                    left[resource.plural] = remaining
                break
            await asyncio.sleep(1.0)
    return left


class ComponentWatch:
    """Sees, from the benchmark's side, when each TrainJob's JobSet and runtime snapshot ConfigMap exist.

    One metadata-only watch per kind on the run's namespace; the first ADDED of a name is its time. The
    same observer serves every controller (Trainer's has no result stream), so side-by-side latencies
    and throughputs are measured the same way. Its own WATCH requests are added to ``kube.counts``.
    """

    def __init__(self, kube: CountingKube, namespace: str, names: Sequence[str]) -> None:
        self.kube = kube
        self.namespace = namespace
        self.wanted: dict[tuple[str, str], str] = {}
        for name in names:
            self.wanted[("jobsets", name)] = name
            self.wanted[("configmaps", f"{name}-runtime-snapshot")] = name
        self.pending: dict[str, int] = Counter(self.wanted.values())
        self.seen: dict[tuple[str, str], float] = {}
        self.built: dict[str, float] = {}
        self.done = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        if not names:
            self.done.set()

    def forget(self, names: Sequence[str]) -> None:
        """Stop waiting for TrainJobs that were never created."""
        for name in names:
            self.pending.pop(name, None)
        if not self.pending:
            self.done.set()

    async def start(self) -> None:
        for resource in (resources.JOBSET, resources.CONFIG_MAP):
            rv = ""
            async for page in self.kube.list_pages(resource, namespace=self.namespace, metadata_only=True):
                rv = page.metadata.resourceVersion
            self.kube.counts[(resource.plural, "", "WATCH")] += 1
            self._tasks.append(asyncio.create_task(self._follow(resource, rv)))

    async def _follow(self, resource: Resource, rv: str) -> None:
        with contextlib.suppress(KubeApiError, asyncio.CancelledError):
            async for event in self.kube.watch(
                resource, namespace=self.namespace, resource_version=rv, timeout_seconds=3600, metadata_only=True
            ):
                if event.type != "ADDED":
                    continue
                now = time.time()
                name = _meta_decoder.decode(event.object).metadata.name
                key = (resource.plural, name)
                owner = self.wanted.get(key)
                if owner is None or key in self.seen:
                    continue
                self.seen[key] = now
                if owner in self.pending:
                    self.pending[owner] -= 1
                    if self.pending[owner] == 0:
                        del self.pending[owner]
                        self.built[owner] = now
                        if not self.pending:
                            self.done.set()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    def jobset_at(self, name: str) -> float | None:
        return self.seen.get(("jobsets", name))


class _MetaOnly(msgspec.Struct, kw_only=True):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


_meta_decoder = msgspec.json.Decoder(_MetaOnly)


async def create_trainjobs(
    kube: CountingKube,
    namespace: str,
    bodies: Mapping[str, bytes],
    *,
    concurrency: int,
    rate: float | None = None,
) -> tuple[dict[str, float], dict[str, float], Counter[str], dict[str, bytes]]:
    """POST every TrainJob (paced at ``rate`` per second if given): (sent, created, errors, responses)."""
    sent: dict[str, float] = {}
    created: dict[str, float] = {}
    answers: dict[str, bytes] = {}
    errors: Counter[str] = Counter()
    sem = asyncio.Semaphore(concurrency)
    t0 = time.time()

    async def create(i: int, name: str, body: bytes) -> None:
        if rate:
            delay = t0 + i / rate - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
        async with sem:
            sent[name] = time.time()
            try:
                resp = await kube.create(resources.TRAINJOB, namespace=namespace, body=body)
            except KubeApiError as exc:
                errors[f"{exc.status} {exc.reason}"] += 1
                return
            created[name] = time.time()
            answers[name] = resp.body

    await asyncio.gather(*(create(i, name, body) for i, (name, body) in enumerate(bodies.items())))
    return sent, created, errors, answers
