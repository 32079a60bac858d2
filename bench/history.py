"""The history server on a real history: 10,000 TrainJobs' events, plans and results in the streams.

The streams are filled the way the pipeline fills them (an event per TrainJob as created, the plans
``planner.core.plan`` makes of it, an apply result per plan, then a second event once it completed), by the
admin identity on a nats-server of the scenario's own. The server then runs as a subprocess, as
``tjpipe history-server`` runs anywhere, reading as ``reader`` and authorizing against a kube-apiserver of
its own with the admin's token, whose decisions are cached after the first request as any user's are.
Measured: how long the index takes to read the streams, the server's memory once it holds them, and the
latency of a namespace's list and of one TrainJob's timeline, each asked ``requests`` times.
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from bench import stats, workload
from bench.cluster import process_memory
from contracts import subjects
from contracts.messages import ApplyResult, ObjectKey, component_of, encode
from planner.core import plan

Progress = Callable[[str], None]
NAMESPACES = 20
CONCURRENCY = 256


async def _fill(js: Any, *, trainjobs: int, runtime: dict[str, Any], progress: Progress) -> int:
    """Publish the history of ``trainjobs`` TrainJobs; how many messages."""
    published = 0
    now = time.time()

    async def one(i: int) -> int:
        namespace, name = f"bench-{i % NAMESPACES}", f"job-{i:05d}"
        event = workload.observed_event(
            namespace=namespace,
            name=name,
            uid=f"00000000-0000-4000-8000-{i:012d}",
            kind="torch",
            runtime=runtime,
            num_nodes=workload.num_nodes_for(i),
            observed_at=now,
        )
        seq = (await js.publish(subjects.event_subject(namespace, name), encode(event))).seq
        messages = plan(event, source_seq=seq).applies
        for message in messages:
            component = component_of(message)
            await js.publish(subjects.apply_subject(namespace, name, component), encode(message))
            result = ApplyResult(
                trainjob=ObjectKey(namespace=namespace, name=name),
                target=message.target,
                component=component,
                source_seq=seq,
                action="created",
                attempts=1,
                duration_ms=12.0,
                finished_at=time.time(),
            )
            await js.publish(subjects.result_subject(namespace, name, component), encode(result))
        done = msgspec.structs.replace(
            event,
            trainjob=msgspec.convert(
                {
                    **msgspec.to_builtins(event.trainjob),
                    "status": {"conditions": [{"type": "Complete", "status": "True", "reason": "JobsCompleted"}]},
                },
                type(event.trainjob),
            ),
            cause="TrainJob MODIFIED",
        )
        await js.publish(subjects.event_subject(namespace, name), encode(done))
        return 2 + 2 * len(messages)

    for start in range(0, trainjobs, CONCURRENCY):
        counts = await asyncio.gather(*(one(i) for i in range(start, min(trainjobs, start + CONCURRENCY))))
        published += sum(counts)
        if (start // CONCURRENCY) % 8 == 0:
            progress(f"history: {min(trainjobs, start + CONCURRENCY)}/{trainjobs} TrainJobs recorded")
    return published


async def _timed(session: aiohttp.ClientSession, url: str, token: str) -> float:
    started = time.perf_counter()
    async with session.get(url, headers={"Authorization": f"Bearer {token}"}) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status}")
    return time.perf_counter() - started


async def history_server(
    *, trainjobs: int, requests: int, runtime: dict[str, Any], progress: Progress, keep_state: bool = False
) -> dict[str, Any]:
    from plumbing import bus
    from tjpipe.credentials import READER, generate_credentials, server_authorization
    from tjpipe.local.kubeapi import start_kube
    from tjpipe.local.natsd import start_nats
    from tjpipe.local.procs import free_port, http_ok, spawn, wait_until
    from tjpipe.local.stack import setup_bus_as_admin

    root = Path(tempfile.mkdtemp(prefix="tjpipe-bench-history-"))
    creds = generate_credentials(root / "creds")
    local = start_nats(store_dir=root / "nats", log_dir=root / "logs", authorization=server_authorization(creds))
    kube = None
    server = None
    try:
        setup_bus_as_admin(local.url, creds, environ={}, tls_from_env=False)
        kube = start_kube(
            work_dir=root / "kube", log_dir=root / "logs", kubeconfig_path=root / "kubeconfig", progress=progress
        )
        nc = await bus.connect(local.url, name="bench-history", creds=creds.seed_file("admin"))
        try:
            started = time.monotonic()
            messages = await _fill(nc.jetstream(), trainjobs=trainjobs, runtime=runtime, progress=progress)
            fill_s = time.monotonic() - started
        finally:
            await nc.close()
        progress(f"history: {messages} messages recorded in {fill_s:.0f}s; starting the history server")
        port = free_port()
        env = {
            "NATS_URL": local.url,
            "NATS_CREDS": str(creds.seed_file(READER)),
            "KUBECONFIG": str(kube.kubeconfig),
        }
        started = time.monotonic()
        server = spawn(
            name="history-server",
            argv=[sys.executable, "-m", "tjpipe", "history-server", "--listen", f"127.0.0.1:{port}"],
            log_dir=root / "logs",
            env=env,
        )
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_ok(f"{url}/readyz"), timeout=600, what="the history server's index", process=server)
        index_s = time.monotonic() - started
        memory = process_memory(server.pid)
        rng = random.Random(7)
        lists, timelines = [], []
        async with aiohttp.ClientSession() as session:
            await _timed(session, f"{url}/api/v1/namespaces/bench-0/trainjobs", kube.token)  # decisions cached
            for _ in range(requests):
                ns = f"bench-{rng.randrange(NAMESPACES)}"
                lists.append(await _timed(session, f"{url}/api/v1/namespaces/{ns}/trainjobs", kube.token))
                i = rng.randrange(trainjobs)
                job = f"{url}/api/v1/namespaces/bench-{i % NAMESPACES}/trainjobs/job-{i:05d}/history"
                timelines.append(await _timed(session, job, kube.token))
        after = process_memory(server.pid)
        return {
            "trainjobs": trainjobs,
            "namespaces": NAMESPACES,
            "messages": messages,
            "fill_s": fill_s,
            "index_ready_s": index_s,
            "server_rss_mb": memory["rss_mb"],
            "server_rss_after_requests_mb": after["rss_mb"],
            "server_hwm_mb": after["hwm_mb"],
            "list_latency_s": stats.summarize(lists),
            "timeline_latency_s": stats.summarize(timelines),
            "requests": requests,
        }
    finally:
        if server is not None:
            server.stop()
        if kube is not None:
            kube.stop()
        local.stop()
        if not keep_state:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
        else:
            progress(f"history: state kept in {root}")
