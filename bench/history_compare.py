"""Comparing TrainJobs in the history server over 100,000 TrainJobs' records on a real nats-server: each
comparison's latency, side by side with the plain list's.

A comparison, unlike the list, is not answered from the index in memory: each TrainJob compared has its
history and its progress read from the streams (batched direct gets, one per stream and TrainJob, from where
the index first saw it), then ``history_server.compare.comparison`` aligns and tabulates them. So what it
costs depends on how much the streams hold, and is measured on streams that hold 100,000 TrainJobs: each
one's three events (created, running, finished) in ``TJ_EVENTS_HISTORY`` and four progress updates in
``TJ_PROGRESS``, published round by round by the admin identity, so that every TrainJob's records are spread
over the whole stream as a sweep's are. The index is then read from the streams as the server reads it
(``HistoryIndex.catch_up``, as ``reader``), and each comparison runs through
``history_server.app.compare_answer``, the code the compare handler runs once every TrainJob is
authorized, with the JSON text of the answer made as the handler makes it. The plain list
(``list_answer`` over every namespace) is timed on the same index at the same moment.

Left out, as in ``bench.history_find``: HTTP and the authorization (a cached SubjectAccessReview per
TrainJob). Each request's wall time is printed beside this process's CPU time; the nats-server's CPU time
per comparison is printed as a mean (its counters tick every 10 ms, too coarse for one request).

    python -m bench.history_compare [--trainjobs 100000] [--requests 100]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec

from bench import stats, workload
from bench.cluster import process_cpu_seconds
from contracts import subjects
from contracts.messages import ObjectKey, encode
from contracts.progress import ProgressReported, encode_progress
from contracts.trainer import Metric, TrainerStatus
from history_server.app import LIST_LIMIT, compare_answer, list_answer
from history_server.find import PAGE, query_of
from history_server.index import HistoryIndex

NAMESPACES = 20
CONCURRENCY = 2_000
UPDATES = 4
SIZES = (5, 10)


def _name(i: int) -> tuple[str, str]:
    return f"team-{i % NAMESPACES}", f"job-{i:06d}"


def _event(i: int, runtime: dict[str, Any], status: dict[str, Any], cause: str) -> bytes:
    namespace, name = _name(i)
    event = workload.observed_event(
        namespace=namespace,
        name=name,
        uid=f"00000000-0000-4000-8000-{i:012d}",
        kind="torch",
        runtime=runtime,
        num_nodes=workload.num_nodes_for(i),
        observed_at=time.time(),
    )
    if status:
        trainjob = msgspec.convert({**msgspec.to_builtins(event.trainjob), "status": status}, type(event.trainjob))
        event = msgspec.structs.replace(event, trainjob=trainjob, cause=cause)
    return encode(event)


def _progress(i: int, step: int, rng: random.Random) -> bytes:
    namespace, name = _name(i)
    report = ProgressReported(
        trainjob=ObjectKey(namespace=namespace, name=name),
        trainjob_uid=f"00000000-0000-4000-8000-{i:012d}",
        pod=f"{name}-node-0-0",
        service_account="default",
        trainer_status=TrainerStatus(
            progress_percentage=100 * step // UPDATES,
            metrics=[
                Metric(name="loss", value=f"{2.5 / step * rng.uniform(0.5, 1.5):.4f}"),
                Metric(name="accuracy", value=f"{min(0.99, 0.2 * step * rng.uniform(0.8, 1.2)):.4f}"),
            ],
        ),
        received_at=time.time(),
    )
    return encode_progress(report)


async def fill(js: Any, trainjobs: int, runtime: dict[str, Any], say: Callable[[str], None]) -> int:
    """Every TrainJob's created event, then every one's running event, its progress updates, and its finished
    event, round by round; how many messages."""
    rng = random.Random(7)
    running = {"jobsStatus": [{"name": "node", "active": 1}]}

    def finished(i: int) -> dict[str, Any]:
        kind = "Failed" if i % 7 == 0 else "Complete"
        return {"conditions": [{"type": kind, "status": "True", "reason": "JobsCompleted"}]}

    rounds: list[tuple[str, Callable[[int], tuple[str, bytes]]]] = [
        ("created", lambda i: (subjects.event_subject(*_name(i)), _event(i, runtime, {}, "TrainJob ADDED"))),
        ("running", lambda i: (subjects.event_subject(*_name(i)), _event(i, runtime, running, "TrainJob MODIFIED"))),
    ]

    def update(step: int, i: int) -> tuple[str, bytes]:
        return subjects.progress_subject(*_name(i)), _progress(i, step, rng)

    rounds += [(f"progress {step}", functools.partial(update, step)) for step in range(1, UPDATES + 1)]
    ended = "TrainJob MODIFIED"
    rounds.append(("finished", lambda i: (subjects.event_subject(*_name(i)), _event(i, runtime, finished(i), ended))))
    published = 0
    for label, make in rounds:
        started = time.monotonic()
        for start in range(0, trainjobs, CONCURRENCY):
            messages = [make(i) for i in range(start, min(trainjobs, start + CONCURRENCY))]
            await asyncio.gather(*(js.publish(subject, data) for subject, data in messages))
            published += len(messages)
        say(f"  {label}: {trainjobs:,} records in {time.monotonic() - started:.0f} s")
    return published


def _cpu_seconds(pid: int) -> float:
    """The nats-server's CPU time so far (it runs for the whole measurement)."""
    seconds = process_cpu_seconds(pid)
    if seconds is None:
        raise RuntimeError(f"the nats-server (pid {pid}) is gone")
    return seconds


async def _timed(requests: int, one: Callable[[], Awaitable[object]]) -> tuple[list[float], list[float]]:
    walls, cpus = [], []
    for _ in range(requests):
        started, cpu_started = time.perf_counter(), time.process_time()
        await one()
        walls.append((time.perf_counter() - started) * 1000)
        cpus.append((time.process_time() - cpu_started) * 1000)
    return walls, cpus


def _row(walls: list[float], cpus: list[float], server_ms: float | None) -> dict[str, float | None]:
    return {
        "p50": stats.percentile(walls, 50),
        "p99": stats.percentile(walls, 99),
        "max": max(walls),
        "cpu_p50": stats.percentile(cpus, 50),
        "cpu_p99": stats.percentile(cpus, 99),
        "server_cpu_mean": server_ms,
    }


async def measure(js: Any, index: HistoryIndex, trainjobs: int, requests: int, nats_pid: int) -> dict[str, Any]:
    rng = random.Random(11)
    now = time.time()
    out: dict[str, Any] = {}

    async def plain_list() -> object:
        query = query_of({}, now=now, most=LIST_LIMIT, default_limit=PAGE)
        return json.dumps(list_answer(index.summaries(), query, now=now, stalled_after=600.0), default=str)

    await plain_list()
    server = _cpu_seconds(nats_pid)
    walls, cpus = await _timed(requests, plain_list)
    out["the list (newest first)"] = _row(walls, cpus, (_cpu_seconds(nats_pid) - server) * 1000 / requests)
    for size in SIZES:
        # A sweep: ``size`` TrainJobs of one namespace, anywhere in the streams.
        def keys(size: int = size) -> list[tuple[str, str]]:
            namespace = rng.randrange(NAMESPACES)
            return [_name(i) for i in rng.sample(range(namespace, trainjobs, NAMESPACES), size)]

        async def compare(size: int = size) -> object:
            compared = await compare_answer(js, index, keys(size), now=time.time())
            assert len(compared["trainjobs"]) == size and compared["metrics"] == ["accuracy", "loss"], compared
            assert all(len(run["series"]) == UPDATES for run in compared["trainjobs"]), compared
            return json.dumps(compared, ensure_ascii=False)

        await compare()
        server = _cpu_seconds(nats_pid)
        walls, cpus = await _timed(requests, compare)
        out[f"compare {size} TrainJobs"] = _row(walls, cpus, (_cpu_seconds(nats_pid) - server) * 1000 / requests)
    return out


async def run(trainjobs: int, requests: int, say: Callable[[str], None]) -> None:
    from plumbing import bus
    from tjpipe.credentials import READER, generate_credentials, server_authorization
    from tjpipe.local import crds
    from tjpipe.local.natsd import start_nats
    from tjpipe.local.stack import setup_bus_as_admin

    root = Path(tempfile.mkdtemp(prefix="tjpipe-bench-compare-"))
    creds = generate_credentials(root / "creds")
    local = start_nats(store_dir=root / "nats", log_dir=root / "logs", authorization=server_authorization(creds))
    try:
        setup_bus_as_admin(local.url, creds, environ={}, tls_from_env=False)
        runtime = crds.shipped_runtimes()[workload.TORCH_RUNTIME]
        admin = await bus.connect(local.url, name="bench-compare-fill", creds=creds.seed_file("admin"))
        try:
            started = time.monotonic()
            say(f"recording {trainjobs:,} TrainJobs' events and progress")
            messages = await fill(admin.jetstream(), trainjobs, runtime, say)
            say(f"{messages:,} messages recorded in {time.monotonic() - started:.0f} s")
        finally:
            await admin.close()
        nc = await bus.connect(local.url, name="bench-compare", creds=creds.seed_file(READER))
        try:
            js = nc.jetstream()
            index = HistoryIndex()
            started = time.monotonic()
            read = await index.catch_up(js)
            say(f"index of {len(index):,} TrainJobs read from {read:,} records in {time.monotonic() - started:.0f} s")
            pid = local.process.pid
            assert pid is not None
            say(f"measuring; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
            figures = await measure(js, index, trainjobs, requests, pid)
        finally:
            await nc.close()
    finally:
        local.stop()
        shutil.rmtree(root, ignore_errors=True)
    say(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall time counts what others took)")
    print(
        f"{'request':<26} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'CPU p50':>8} {'CPU p99':>8}"
        f" {'nats mean':>9} {'p99 / list':>10}"
    )
    base = figures["the list (newest first)"]["p99"]
    for label, f in figures.items():
        print(
            f"{label:<26} {f['p50']:>8.1f} {f['p99']:>8.1f} {f['max']:>8.1f} {f['cpu_p50']:>8.1f}"
            f" {f['cpu_p99']:>8.1f} {f['server_cpu_mean']:>9.1f} {f['p99'] / base:>9.2f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainjobs", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(run(args.trainjobs, args.requests, lambda text: print(text, flush=True)))


if __name__ == "__main__":
    main()
