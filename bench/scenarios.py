"""The scenarios that need servers: the apiserver floor, end-to-end runs, write amplification, memory.

Each returns plain data for ``report.json``; judging it against targets is the runner's job. Every wait has
a deadline and every loop a bound, so a pipeline that stalls makes a run incomplete, never endless.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext

from applier.fence import apply_body  # the exact bytes the applier sends for a fresh object
from bench import stats, workload
from bench.cluster import (
    SUCCESS_ACTIONS,
    CountingKube,
    ResultTracker,
    Services,
    counter_delta,
    cpu_delta,
    cpu_seconds,
    create_namespace,
    delete_collections,
    last_seq,
    list_items,
    process_memory,
    scrape_apiserver,
    wait_quiet,
)
from contracts import resources, streams
from contracts.messages import ApplyResult, ObjectApply, TrainJobObserved, decode_event, decode_result
from planner.core import plan
from plumbing import bus, bus_history
from plumbing.kube import KubeApiError
from tjpipe.local.stack import SERVICES

Progress = Callable[[str], None]


@dataclass
class Context:
    kube: CountingKube
    nc: NATS
    js: JetStreamContext
    services: Services
    runtimes: Mapping[str, Mapping[str, Any]]
    progress: Progress
    quiet_seconds: float = 3.0
    create_concurrency: int = 32
    present: int = 0
    """TrainJobs the benchmark has created so far (the local cluster holds no others)."""
    namespaces: list[str] = field(default_factory=list)
    run_id: str = field(default_factory=lambda: secrets.token_hex(2))


def _slug(label: str) -> str:
    out = "".join(c if c.isalnum() else "-" for c in label.lower())
    while "--" in out:
        out = out.replace("--", "-")
    return out.strip("-")[:40]


# ---------------------------------------------------------------------------------- 1. apiserver floor

_PLACEHOLDER_UID = "00000000-0000-4000-8000-{:012d}"
"""The uid each TrainJob is planned with before it exists; its real uid replaces it byte for byte."""

FLOOR_RESOURCES = (
    resources.TRAINJOB,
    resources.JOBSET,
    resources.CONFIG_MAP,
    resources.SECRET,
    resources.POD_GROUP,
)


async def floor(
    kube: CountingKube,
    runtimes: Mapping[str, Mapping[str, Any]],
    kinds: Sequence[workload.Kind],
    *,
    label: str,
    concurrency: int,
    progress: Progress,
    cpu: Callable[[], dict[str, float]] | None = None,
) -> dict[str, Any]:
    """The API server's share of the work, with no controller: each TrainJob created, then its applies sent.

    The applies are the pure planner's for a new TrainJob (``planner.core.plan``), encoded beforehand as the
    applier encodes them. Each TrainJob is planned under a placeholder uid; the uid its create returns is
    put in its place in the encoded bytes, so the owner references are real. ``concurrency`` TrainJobs are
    in flight at a time, each one create then its applies in order. Nothing watches: this is what the
    API server must do per TrainJob whoever the controller is, and end-to-end runs are stated against it.
    """
    n = len(kinds)
    namespace = f"bench-floor-{_slug(label)}-{secrets.token_hex(2)}"
    await create_namespace(kube, namespace)
    now = time.time()
    names = [f"tj-{i:05d}" for i in range(n)]
    bodies: list[bytes] = []
    payloads: list[list[tuple[ObjectApply, bytes]]] = []
    for i, (name, kind) in enumerate(zip(names, kinds, strict=True)):
        runtime = runtimes[workload.RUNTIME_OF[kind]]
        bodies.append(msgspec.json.encode(workload.trainjob_body(namespace, name, kind, workload.num_nodes_for(i))))
        event = workload.observed_event(
            namespace=namespace,
            name=name,
            uid=_PLACEHOLDER_UID.format(i),
            kind=kind,
            runtime=runtime,
            num_nodes=workload.num_nodes_for(i),
            observed_at=now,
        )
        applies = [a for a in plan(event, source_seq=i + 1).applies if isinstance(a, ObjectApply)]
        payloads.append([(a, apply_body(a)) for a in applies])
    total = sum(len(p) for p in payloads)
    progress(f"floor {label}: {n} TrainJobs, {n} creates + {total} applies, {concurrency} TrainJobs at a time")

    latencies: list[float] = []
    done_at: list[float] = []
    errors: Counter[str] = Counter()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)

    async def worker() -> None:
        while True:
            try:
                index = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            started = time.perf_counter()
            try:
                answer = await kube.create(resources.TRAINJOB, namespace=namespace, body=bodies[index])
            except KubeApiError as exc:
                errors[f"create {exc.status} {exc.reason}"] += 1
                continue
            uid = _created_uid(answer.body).encode()
            placeholder = _PLACEHOLDER_UID.format(index).encode()
            ok = True
            for message, body in payloads[index]:
                target = message.target
                try:
                    await kube.apply(
                        resources.resource_for(target.api_version, target.kind),
                        namespace=target.namespace,
                        name=target.name,
                        body=body.replace(placeholder, uid),
                        field_manager=message.field_manager,
                        force=message.force,
                        subresource=target.subresource,
                    )
                except KubeApiError as exc:
                    errors[f"{target.kind} {exc.status} {exc.reason}"] += 1
                    ok = False
            if ok:
                latencies.append(time.perf_counter() - started)
                done_at.append(time.perf_counter())

    api_before = await scrape_apiserver(kube)
    cpu_before = cpu() if cpu else {}
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = (max(done_at) if done_at else time.perf_counter()) - started
    cpu_used = cpu_delta(cpu_before, cpu()) if cpu else {}
    api_after = await scrape_apiserver(kube)
    requests: dict[str, float] = {}
    if api_before is not None and api_after is not None:
        moved = stats.delta(api_after, api_before)
        requests = stats.per_each(stats.by_verb(stats.pipeline_requests(moved, {})), n)
    result = {
        "label": label,
        "mix": workload.mix_name(kinds),
        "namespace": namespace,
        "trainjobs": n,
        "kinds": dict(Counter(kinds)),
        "applies": total,
        "applies_per_trainjob": total / n if n else 0,
        "concurrency": concurrency,
        "seconds": seconds,
        "trainjobs_per_s": stats.rate(len(latencies), seconds) if len(latencies) == n else None,
        "latency": stats.summarize(latencies),
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "cpu_seconds": cpu_used,
        "requests_per_trainjob_by_verb": requests,
    }
    progress(f"floor {label}: {result['trainjobs_per_s'] or 0:,.1f} TrainJobs/s, {result['errors']} errors")
    # Leave nothing behind: the controllers measured later must not find these TrainJobs.
    cleanup = time.perf_counter()
    left = await delete_collections(kube, namespace, FLOOR_RESOURCES)
    if left:
        result["left_behind"] = left
    result["cleanup_seconds"] = time.perf_counter() - cleanup
    return result


class _Uid(msgspec.Struct, kw_only=True):
    uid: str = ""


class _Created(msgspec.Struct, kw_only=True):
    metadata: _Uid = msgspec.field(default_factory=_Uid)


def _created_uid(body: bytes) -> str:
    return msgspec.json.decode(body, type=_Created).metadata.uid


# -------------------------------------------------------------------------------------- 2. end to end


@dataclass
class _Window:
    """Counters at the start of a measurement window; ``close`` gives what the pipeline did in it."""

    api: dict[stats.RequestKey, float] | None
    own: Counter[stats.RequestKey]
    counters: dict[str, dict[tuple[str, ...], float]]
    bus: dict[str, int]


BUS_STREAMS = (*(spec.name for spec in streams.ALL_STREAMS), f"KV_{streams.APPLIED_BUCKET}")
"""Every stream the pipeline writes to, the apply ledger's KV bucket included (claims and records)."""


async def bus_sequences(js: JetStreamContext) -> dict[str, int]:
    """The last sequence of each of ``BUS_STREAMS``: differences are messages stored (NATS writes)."""
    out: dict[str, int] = {}
    for name in BUS_STREAMS:
        with contextlib.suppress(Exception):
            out[name] = await last_seq(js, name)
    return out


async def open_window(ctx: Context, *, restarted: Sequence[str] = ()) -> _Window:
    counters = await ctx.services.counters()
    # A service restarted inside the window starts its counters from zero.
    for service, counter in (("watcher", "events"), ("planner", "plans"), ("applier", "applies")):
        if service in restarted:
            counters[counter] = {}
    return _Window(
        api=await scrape_apiserver(ctx.kube),
        own=Counter(ctx.kube.counts),
        counters=counters,
        bus=await bus_sequences(ctx.js),
    )


async def close_window(ctx: Context, window: _Window, *, trainjobs: int) -> dict[str, Any]:
    api_after = await scrape_apiserver(ctx.kube)
    own = Counter(ctx.kube.counts)
    own.subtract(window.own)
    moved = counter_delta(await ctx.services.counters(), window.counters)
    bus_after = await bus_sequences(ctx.js)
    stored = {name: bus_after[name] - window.bus[name] for name in bus_after if name in window.bus}
    out: dict[str, Any] = {
        "trainjobs": trainjobs,
        "bus_messages": stored,
        "bus_messages_per_trainjob": {k: v / trainjobs for k, v in stored.items()} if trainjobs else {},
        "events": moved.get("events", {}),
        "plans": moved.get("plans", {}),
        "applies": moved.get("applies", {}),
    }
    if window.api is None or api_after is None:
        out["unavailable"] = "the API server's /metrics could not be read"
        return out
    server = stats.delta(api_after, window.api)
    pipeline = stats.pipeline_requests(server, {k: float(v) for k, v in own.items() if v > 0})
    verbs = stats.by_verb(pipeline)
    out.update(
        {
            "by_verb": verbs,
            "per_trainjob_by_verb": stats.per_each(verbs, trainjobs),
            "by_resource": stats.by_resource_verb(pipeline),
            "writes": stats.writes(pipeline),
            "writes_per_trainjob": stats.writes(pipeline) / trainjobs if trainjobs else 0.0,
            "benchmark_own": stats.by_resource_verb(
                {k: float(v) for k, v in own.items() if v > 0 and k[0] in stats.TRACKED_RESOURCES}
            ),
        }
    )
    return out


async def e2e_run(
    ctx: Context,
    label: str,
    kinds: Sequence[workload.Kind],
    *,
    rate: float | None = None,
    timeout: float | None = None,
    breakdown: bool = True,
) -> dict[str, Any]:
    """Create ``len(kinds)`` TrainJobs and time them through the pipeline until every component exists."""
    n = len(kinds)
    namespace = f"bench-{_slug(label)}-{ctx.run_id}"
    await create_namespace(ctx.kube, namespace)
    ctx.namespaces.append(namespace)
    names = [f"tj-{i:05d}" for i in range(n)]
    nodes = {name: workload.num_nodes_for(i) for i, name in enumerate(names)}
    kind_of = dict(zip(names, kinds, strict=True))
    required = {name: workload.required_components(kind_of[name], name) for name in names}
    timeout = timeout if timeout is not None else min(900.0, 90.0 + 0.3 * n) + (n / rate if rate else 0.0)
    ctx.progress(f"{label}: {n} TrainJobs in {namespace}" + (f" at {rate:g}/s" if rate else ""))

    tracker = ResultTracker(ctx.nc, namespace, required)
    await tracker.start()
    start_seq = await last_seq(ctx.js, streams.RESULTS.name) + 1
    event_seq = await last_seq(ctx.js, streams.EVENTS_HISTORY.name) + 1
    apply_seq = await last_seq(ctx.js, streams.APPLY_HISTORY.name) + 1
    window = await open_window(ctx)

    sent: dict[str, float] = {}
    created: dict[str, float] = {}
    create_errors: Counter[str] = Counter()
    sem = asyncio.Semaphore(ctx.create_concurrency)
    cpu_before = cpu_seconds(ctx.services.stack)
    t0 = time.time()

    async def create(i: int, name: str) -> None:
        if rate:
            delay = t0 + i / rate - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
        body = msgspec.json.encode(workload.trainjob_body(namespace, name, kind_of[name], nodes[name]))
        async with sem:
            sent[name] = time.time()
            try:
                await ctx.kube.create(resources.TRAINJOB, namespace=namespace, body=body)
            except KubeApiError as exc:
                create_errors[f"{exc.status} {exc.reason}"] += 1
                return
            created[name] = time.time()

    await asyncio.gather(*(create(i, name) for i, name in enumerate(names)))
    ctx.present += len(created)
    create_seconds = max(created.values(), default=t0) - min(sent.values(), default=t0)
    ctx.progress(f"{label}: created {len(created)} in {create_seconds:.1f}s; waiting for components")
    remaining = timeout - (time.time() - t0)
    if len(created) < n:  # wait only for the TrainJobs that exist
        tracker.required = {k: v for k, v in tracker.required.items() if k in created}
        if tracker.required.keys() <= tracker.done_names:
            tracker.done.set()
    try:
        await asyncio.wait_for(tracker.done.wait(), timeout=max(1.0, remaining))
    except TimeoutError:
        ctx.progress(f"{label}: timed out after {timeout:.0f}s with {len(tracker.done_names)}/{n} built")
    await tracker.stop()
    cpu_used = cpu_delta(cpu_before, cpu_seconds(ctx.services.stack))

    # The authoritative record: TJ_RESULTS itself, read without touching any durable.
    stored = await bus_history.read_stream(
        ctx.js, streams.RESULTS.name, f"tj.result.*.{namespace}.>", start_seq=start_seq
    )
    first: dict[tuple[str, str], float] = {}
    jobset_results: dict[str, ApplyResult] = {}
    failed: Counter[str] = Counter()
    for message in stored:
        result = decode_result(message.data)
        if result.action == "failed":
            failed[result.component.split(".")[0]] += 1
        if result.action not in SUCCESS_ACTIONS:
            continue
        key = (result.trainjob.name, result.component)
        if key not in first or result.finished_at < first[key]:
            first[key] = result.finished_at
            if result.component == "jobset":
                jobset_results[result.trainjob.name] = result
    stages = (
        await stage_breakdown(ctx, namespace, created, jobset_results, event_seq=event_seq, apply_seq=apply_seq)
        if breakdown
        else {}
    )
    latencies: list[float] = []
    built_at: list[float] = []
    for name in created:
        jobset_at = first.get((name, "jobset"))
        if jobset_at is not None:
            latencies.append(jobset_at - created[name])
        times = [first.get((name, c)) for c in required[name]]
        if all(t is not None for t in times):
            built_at.append(max(t for t in times if t is not None))
    span = (max(built_at) - min(sent.values())) if built_at and sent else None

    problems = await verify(ctx.kube, namespace, names, kind_of, nodes)
    built_names = {name for name in created if all(first.get((name, c)) is not None for c in required[name])}
    good = len(built_names - problems.keys())
    quiet = await wait_quiet(ctx.js, quiet_seconds=ctx.quiet_seconds, timeout=60.0 + 0.05 * n)
    writes = await close_window(ctx, window, trainjobs=len(created))
    writes["quiet_after_s"] = quiet
    out = {
        "label": label,
        "namespace": namespace,
        "n": n,
        "kinds": dict(Counter(kinds)),
        "rate": rate,
        "created": len(created),
        "create_errors": dict(create_errors),
        "create_seconds": create_seconds,
        "create_per_s": stats.rate(len(created), create_seconds),
        **stats.build_outcome(n, len(built_at), good, problems, span),
        "verified": not problems,
        "latency": stats.summarize(latencies),
        "stages": stages,
        "failed_results": dict(failed),
        "results_read": len(stored),
        "write_amplification": writes,
        "cpu_seconds": cpu_used,
    }
    lat = out["latency"]
    ctx.progress(
        f"{label}: {out['trainjobs_per_s'] or 0:.1f} TJ/s, p50 {(lat['p50'] or 0) * 1000:.0f} ms, "
        f"p99 {(lat['p99'] or 0) * 1000:.0f} ms, {good}/{n} built with the right spec"
    )
    return out


async def stage_breakdown(
    ctx: Context,
    namespace: str,
    created: Mapping[str, float],
    jobset_results: Mapping[str, ApplyResult],
    *,
    event_seq: int,
    apply_seq: int,
) -> dict[str, dict[str, float | int | None]]:
    """Where each TrainJob's latency went, from the streams' own timestamps (the NATS server's clock).

    * ``watcher``: TrainJob created → its first event stored (as recorded in TJ_EVENTS_HISTORY, whose copy
      is stored a fraction of a millisecond after the original);
    * ``planner``: that event stored → the first JobSet apply message stored (TJ_APPLY_HISTORY);
    * ``applier wait``: that message stored → the applier started on it (fetch, batch, slot, lock);
    * ``applier work``: the applier's own ``duration_ms`` (ledger, GET, apply, ledger).
    """
    events: dict[str, float] = {}
    for message in await bus_history.read_stream(
        ctx.js, streams.EVENTS_HISTORY.name, f"tj.ev.*.{namespace}.*", start_seq=event_seq
    ):
        events.setdefault(message.subject.split(".")[4], message.time)
    applies: dict[str, float] = {}
    subject = f"tj.apply.*.{namespace}.*.jobset"
    for message in await bus_history.read_stream(ctx.js, streams.APPLY_HISTORY.name, subject, start_seq=apply_seq):
        applies.setdefault(message.subject.split(".")[4], message.time)
    parts: dict[str, list[float]] = {"watcher": [], "planner": [], "applier wait": [], "applier work": []}
    for name, created_at in created.items():
        event_at, apply_at, result = events.get(name), applies.get(name), jobset_results.get(name)
        if event_at is None or apply_at is None or result is None:
            continue
        work = result.duration_ms / 1000.0
        parts["watcher"].append(event_at - created_at)
        parts["planner"].append(apply_at - event_at)
        parts["applier wait"].append(result.finished_at - work - apply_at)
        parts["applier work"].append(work)
    return {stage: stats.summarize(values) for stage, values in parts.items()}


async def verify(
    kube: CountingKube,
    namespace: str,
    names: Sequence[str],
    kind_of: Mapping[str, workload.Kind],
    nodes: Mapping[str, int],
) -> dict[str, str]:
    """Every component exists, and every JobSet runs as many training nodes as its TrainJob asked for.

    Returns the first problem found per TrainJob; empty when all is well.
    """
    jobsets = {i.metadata.name: i for i in await list_items(kube, resources.JOBSET, namespace=namespace)}
    config_maps = {i.metadata.name for i in await list_items(kube, resources.CONFIG_MAP, namespace=namespace)}
    secret_names: set[str] = set()
    pod_groups: set[str] = set()
    if any(k == "mpi" for k in kind_of.values()):
        secret_names = {i.metadata.name for i in await list_items(kube, resources.SECRET, namespace=namespace)}
    if any(k == "gang" for k in kind_of.values()):
        pod_groups = {i.metadata.name for i in await list_items(kube, resources.POD_GROUP, namespace=namespace)}
    problems: dict[str, str] = {}
    for name in names:
        kind = kind_of[name]
        js = jobsets.get(name)
        found: list[str] = []
        if js is None:
            found.append("no JobSet")
        else:
            triples = [(rj.name, rj.replicas, rj.template.spec.parallelism) for rj in js.spec.replicatedJobs]
            got = workload.jobset_nodes(triples)
            if got != nodes[name]:
                found.append(f"JobSet runs {got} nodes, numNodes is {nodes[name]}")
        if f"{name}-runtime-snapshot" not in config_maps:
            found.append("no runtime snapshot")
        if kind == "mpi" and f"{name}-mpi-ssh-auth" not in secret_names:
            found.append("no MPI Secret")
        if kind == "mpi" and f"{name}-mpi-hostfile" not in config_maps:
            found.append("no MPI hostfile")
        if kind == "gang" and name not in pod_groups:
            found.append("no PodGroup")
        if found:
            problems[name] = f"{name}: {found[0]}"
    return problems


# --------------------------------------------------------------------------------- 3. amplification


async def situation(
    ctx: Context,
    name: str,
    action: Callable[[], Awaitable[str]],
    *,
    restarted: Sequence[str] = (),
    min_seconds: float = 0.0,
    timeout: float = 180.0,
) -> dict[str, Any]:
    """Requests per TrainJob from the start of ``action`` until the pipeline is quiet again."""
    ctx.progress(f"write amplification: {name}")
    window = await open_window(ctx, restarted=restarted)
    note = await action()
    quiet = await wait_quiet(ctx.js, quiet_seconds=ctx.quiet_seconds, timeout=timeout, min_seconds=min_seconds)
    out = await close_window(ctx, window, trainjobs=ctx.present)
    out.update({"name": name, "quiet_after_s": quiet, "note": note})
    if quiet is None:
        out["note"] = (note + "; " if note else "") + f"not quiet within {timeout:.0f}s"
    ctx.progress(f"write amplification: {name}: {out.get('writes', 'n/a')} writes, {out.get('by_verb', {})}")
    return out


async def resync_by_restarting_watcher(ctx: Context, *, resync_seconds: float) -> dict[str, Any]:
    async def action() -> str:
        await ctx.services.restart(["watcher"], extra={"watcher": ["--resync-seconds", f"{resync_seconds:g}"]})
        return (
            f"watcher restarted with --resync-seconds {resync_seconds:g}: one relist plus at least one periodic "
            "resync of every TrainJob"
        )

    return await situation(
        ctx,
        "resync (watcher restart + periodic resync)",
        action,
        restarted=["watcher"],
        min_seconds=2 * resync_seconds + 1.0,
    )


async def restart_all(ctx: Context) -> dict[str, Any]:
    async def action() -> str:
        await ctx.services.restart(list(SERVICES))
        return "watcher, planner and applier stopped, then started again (default settings)"

    return await situation(ctx, "restart of every service", action, restarted=list(SERVICES))


async def replay_latest_events(ctx: Context) -> dict[str, Any]:
    """A resync that gets past the stream's duplicate window: each TrainJob's latest event, republished.

    The watcher's re-publications of unchanged objects carry the same ``Nats-Msg-Id`` and the stream drops
    them within its duplicate window (10 minutes). After that window they would reach the planner; this
    sends each TrainJob's latest stored event again under a fresh id to see what the planner and applier
    then do to the API server.
    """

    async def action() -> str:
        latest: dict[str, bus_history.StoredMessage] = {}
        for namespace in ctx.namespaces:
            for message in await bus_history.read_stream(
                ctx.js, streams.EVENTS_HISTORY.name, f"tj.ev.*.{namespace}.*", last_per_subject=True
            ):
                latest[message.subject] = message
        token = secrets.token_hex(4)
        sent = 0
        for message in sorted(latest.values(), key=lambda m: m.seq):
            if not isinstance(decode_event(message.data), TrainJobObserved):
                continue
            # The watcher's signature stays: only the message id is new, as in a real re-publication.
            headers = {**message.headers, bus.MSG_ID: f"bench-resync/{token}/{message.seq}"}
            await ctx.js.publish(message.subject, message.data, headers=headers)
            sent += 1
        return f"{sent} latest events republished under fresh message ids (as after the duplicate window)"

    return await situation(ctx, "resync past the duplicate window (simulated)", action)


# ------------------------------------------------------------------------------------------ 5. memory


async def memory(ctx: Context, *, total: int) -> dict[str, Any]:
    need = max(0, total - ctx.present)
    fill: dict[str, Any] | None = None
    if need:
        # No stage breakdown: it would read every event of thousands of TrainJobs back from the stream.
        fill = await e2e_run(ctx, "memory fill", [workload.TORCH_ONLY[0]] * need, breakdown=False)
    else:
        await wait_quiet(ctx.js, quiet_seconds=ctx.quiet_seconds, timeout=120.0)
    services = ctx.services.rss()
    nats = ctx.services.stack.local_nats
    if nats is not None:  # the controller side's fourth process (the versus-Trainer RSS sums all four)
        pid = nats.process.pid if nats.process.is_running() else None
        services.append({"service": "nats", "pid": pid, **process_memory(pid)})
    return {
        "present": ctx.present,
        "created": need,
        "fill": fill,
        "services": services,
        "restarts": dict(ctx.services.restarts),
        "note": (
            "Services were restarted during section 3, so VmHWM covers the time since then."
            if ctx.services.restarts
            else ""
        ),
    }
