"""The fleet's history server at the hub: list and timeline latency over every member's TrainJobs.

A loopback fleet (``tjpipe.local.fleet``) is filled as ``bench.fleet`` fills it: ``--trainjobs`` TrainJobs'
records per member (``bench.history._fill``: an event, the plans, a result per plan, the completion) and
``--progress-points`` training progress updates per TrainJob, in every member at once. Once the hub has
copied everything, ``tjpipe history-server --fleet-clusters FILE`` runs as a subprocess at the hub, reading
as ``fleet-reader``. Every member has its own entry in the file and its own reviewer (a user whose only
right is creating TokenReviews and SubjectAccessReviews), and the server keeps a cache of answers per
entry; one kube-apiserver (with its etcd) answers for all of them, because the fleet-wide list asks every
cluster about one token, which only one API server's token file gives here (as an OIDC token every member
accepts would in a real fleet).

Measured, one request at a time by one client with the API server's admin token (cluster-wide ``list``):
the first request (the fleet-wide list, before any answer is cached), then ``--requests`` rounds of the
fleet-wide list, the list of one random cluster (``?cluster=``), a random namespace of a random cluster,
a random TrainJob's timeline and another's progress (each a SubjectAccessReview of its own, as every
TrainJob not asked about in the last ``--auth-cache-seconds`` needs; the progress is read from the hub's
stream on each request). Also how long the index takes to read the fleet streams, and the server's
memory. Printed, never asserted: ``python -m bench.fleet_history --trainjobs 2000 --members 5``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from bench import stats, workload
from bench.cluster import process_memory
from bench.history import CONCURRENCY, NAMESPACES, _fill, _timed
from contracts import subjects
from contracts.messages import ObjectKey
from contracts.progress import ProgressReported, encode_progress
from contracts.trainer import Metric, TrainerStatus

Progress = Callable[[str], None]
KINDS = ("fleet_list", "cluster_list", "namespace_list", "timeline", "progress")
REVIEWER_ROLE = "tjpipe-fleet-history-reviewer"


async def _fill_progress(js: Any, *, trainjobs: int, points: int) -> int:
    """``points`` training progress updates per TrainJob of ``bench.history._fill``, as its pod would report
    them to the status server (progress rising, loss falling); how many records."""

    async def one(i: int) -> None:
        namespace, name = f"bench-{i % NAMESPACES}", f"job-{i:05d}"
        for point in range(1, points + 1):
            now = time.time()
            status = TrainerStatus(
                progress_percentage=100 * point // points,
                estimated_remaining_seconds=30 * (points - point),
                metrics=[Metric(name="loss", value=f"{2.0 / point:.4f}")],
                last_updated_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            )
            record = ProgressReported(
                trainjob=ObjectKey(namespace=namespace, name=name),
                trainjob_uid=f"00000000-0000-4000-8000-{i:012d}",
                pod=f"{name}-node-0-0",
                service_account="default",
                trainer_status=status,
                received_at=now,
                updated_at=float(int(now)),
            )
            await js.publish(subjects.progress_subject(namespace, name), encode_progress(record))

    for start in range(0, trainjobs, CONCURRENCY):
        await asyncio.gather(*(one(i) for i in range(start, min(trainjobs, start + CONCURRENCY))))
    return trainjobs * points


def _reviewers(kube: Any, clusters: Sequence[str]) -> None:
    """One ClusterRole that may create the two reviews, bound to each member's reviewer user."""
    from kubernetes import client as k

    rbac = k.RbacAuthorizationV1Api(kube.api_client())
    rules = [
        k.V1PolicyRule(api_groups=["authentication.k8s.io"], resources=["tokenreviews"], verbs=["create"]),
        k.V1PolicyRule(api_groups=["authorization.k8s.io"], resources=["subjectaccessreviews"], verbs=["create"]),
    ]
    rbac.create_cluster_role(k.V1ClusterRole(metadata=k.V1ObjectMeta(name=REVIEWER_ROLE), rules=rules))
    for cluster in clusters:
        rbac.create_cluster_role_binding(
            k.V1ClusterRoleBinding(
                metadata=k.V1ObjectMeta(name=f"{REVIEWER_ROLE}-{cluster}"),
                role_ref=k.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=REVIEWER_ROLE),
                subjects=[
                    k.RbacV1Subject(api_group="rbac.authorization.k8s.io", kind="User", name=f"reviewer-{cluster}")
                ],
            )
        )


def _clusters_file(folder: Path, kube: Any, clusters: Sequence[str]) -> Path:
    from tjpipe.private_files import write_private_file

    entries = []
    for cluster in clusters:
        write_private_file(folder / f"{cluster}.token", kube.user_tokens[f"reviewer-{cluster}"].encode())
        entries.append(
            {
                "name": cluster,
                "server": kube.server,
                "certificateAuthority": str(kube.ca_file),
                "tokenFile": f"{cluster}.token",
            }
        )
    path = folder / "fleet-clusters.yaml"
    path.write_text(yaml.safe_dump({"clusters": entries}))
    return path


async def _get_json(session: aiohttp.ClientSession, url: str, token: str) -> Any:
    async with session.get(url, headers={"Authorization": f"Bearer {token}"}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: {resp.status}")
        return await resp.json()


async def fleet_history_figures(
    *,
    trainjobs: int,
    members: int,
    requests: int,
    progress_points: int,
    runtime: dict[str, Any],
    progress: Progress,
) -> dict[str, Any]:
    """Fill ``members`` members with ``trainjobs`` TrainJobs each; the fleet history server's figures."""
    from tjpipe import fleet_nats
    from tjpipe.local.fleet import start_fleet
    from tjpipe.local.kubeapi import start_kube
    from tjpipe.local.procs import free_port, http_ok, spawn, wait_until

    clusters = [f"c{i + 1}" for i in range(members)]
    expected = trainjobs * members
    work = Path(tempfile.mkdtemp(prefix="tjpipe-bench-fleet-history-"))
    progress(f"fleet history: a hub of 3 servers, {members} members and a kube-apiserver in {work}")
    running = start_fleet(work / "fleet", clusters)
    kube = None
    server = None
    try:
        admins = {c: await running.members[c].connect("admin") for c in clusters}
        hub = await running.hub_connect()
        try:
            started = time.monotonic()

            async def fill(cluster: str) -> int:
                js = admins[cluster].jetstream()
                records = await _fill(js, trainjobs=trainjobs, runtime=runtime, progress=progress)
                return records + await _fill_progress(js, trainjobs=trainjobs, points=progress_points)

            counts = await asyncio.gather(*(fill(c) for c in clusters))
            fill_s = time.monotonic() - started
            progress(f"fleet history: {sum(counts)} records published in {fill_s:.1f}s; waiting for the hub")
            await fleet_nats.wait_caught_up(hub.jetstream(), timeout=600)
            caught_up_s = time.monotonic() - started
        finally:
            for nc in (*admins.values(), hub):
                await nc.close()
        kube = await asyncio.to_thread(
            start_kube,
            work_dir=work / "kube",
            log_dir=work / "logs",
            kubeconfig_path=work / "kubeconfig",
            progress=progress,
            users={f"reviewer-{c}": () for c in clusters},
        )
        await asyncio.to_thread(_reviewers, kube, clusters)
        clusters_file = _clusters_file(work, kube, clusters)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        server = spawn(
            name="fleet-history-server",
            argv=[
                sys.executable,
                "-m",
                "tjpipe",
                "history-server",
                "--listen",
                f"127.0.0.1:{port}",
                "--fleet-clusters",
                str(clusters_file),
            ],
            log_dir=work / "logs",
            env={
                "NATS_URL": running.hub.url.split(",")[0],
                "NATS_CREDS": str(running.creds.hub_seed(fleet_nats.HUB_READER)),
                "KUBECONFIG": str(work / "no-such-kubeconfig"),  # each member's own reviewer only
            },
        )
        await asyncio.to_thread(
            wait_until, lambda: http_ok(f"{url}/readyz"), timeout=900, what="the fleet history server's index"
        )
        ready_s = time.monotonic() - started
        memory = process_memory(server.pid)
        api, token = f"{url}/api/v1", kube.token
        every = "&".join(f"cluster={c}" for c in clusters)  # the fleet-wide list asks the clusters it names only
        rng = random.Random(7)
        latencies: dict[str, list[float]] = {kind: [] for kind in KINDS}
        async with aiohttp.ClientSession() as session:
            first_s = await _timed(session, f"{api}/trainjobs?{every}", token)  # 5 TokenReviews, 5 SubjectAccessReviews
            deadline = time.monotonic() + 600
            one = f"{api}/trainjobs?limit=1&{every}"
            while (indexed := (await _get_json(session, one, token))["total"]) < expected:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the index holds {indexed} of {expected} TrainJobs after 600s")
                await asyncio.sleep(0.5)
            indexed_s = time.monotonic() - started
            listed = await _get_json(session, f"{api}/trainjobs?{every}", token)
            for _ in range(requests):
                cluster = rng.choice(clusters)
                latencies["fleet_list"].append(await _timed(session, f"{api}/trainjobs?{every}", token))
                latencies["cluster_list"].append(await _timed(session, f"{api}/trainjobs?cluster={cluster}", token))
                base = f"{api}/clusters/{rng.choice(clusters)}/namespaces"
                ns = f"bench-{rng.randrange(NAMESPACES)}"
                latencies["namespace_list"].append(await _timed(session, f"{base}/{ns}/trainjobs", token))
                i = rng.randrange(trainjobs)
                base = f"{api}/clusters/{rng.choice(clusters)}/namespaces"
                job = f"{base}/bench-{i % NAMESPACES}/trainjobs/job-{i:05d}/history"
                latencies["timeline"].append(await _timed(session, job, token))
                if progress_points:
                    i = rng.randrange(trainjobs)
                    base = f"{api}/clusters/{rng.choice(clusters)}/namespaces"
                    job = f"{base}/bench-{i % NAMESPACES}/trainjobs/job-{i:05d}/progress"
                    latencies["progress"].append(await _timed(session, job, token))
        after = process_memory(server.pid)
    finally:
        if server is not None:
            server.stop()
        if kube is not None:
            kube.stop()
        running.stop()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "members": members,
        "trainjobs_per_member": trainjobs,
        "trainjobs": expected,
        "progress_points_per_trainjob": progress_points,
        "records": sum(counts),
        "fill_s": round(fill_s, 2),
        "hub_caught_up_s": round(caught_up_s, 2),
        "index_ready_s": round(ready_s, 2),
        "index_all_s": round(indexed_s, 2),
        "indexed": indexed,
        "fleet_list_items": len(listed["items"]),
        "server_rss_mb": _round(memory["rss_mb"], 1),
        "server_rss_after_requests_mb": _round(after["rss_mb"], 1),
        "server_hwm_mb": _round(after["hwm_mb"], 1),
        "first_request_s": round(first_s, 4),
        "requests_per_kind": requests,
        "latency_s": {kind: _rounded(stats.summarize(values)) for kind, values in latencies.items()},
        "requests_per_s": {kind: _round(stats.rate(len(v), sum(v)), 1) for kind, v in latencies.items()},
    }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _rounded(summary: dict[str, float | int | None]) -> dict[str, float | int | None]:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in summary.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet_history", description=__doc__.splitlines()[0])
    parser.add_argument("--trainjobs", type=int, default=200, help="TrainJobs' records per member (default 200)")
    parser.add_argument("--members", type=int, default=5, help="member clusters (default 5)")
    parser.add_argument("--requests", type=int, default=200, help="requests of each kind (default 200)")
    parser.add_argument(
        "--progress-points", type=int, default=5, help="training progress updates per TrainJob (default 5; 0: none)"
    )
    args = parser.parse_args(argv)
    from tjpipe.local import crds

    figures = asyncio.run(
        fleet_history_figures(
            trainjobs=args.trainjobs,
            members=args.members,
            requests=args.requests,
            progress_points=args.progress_points,
            runtime=crds.shipped_runtimes()[workload.TORCH_RUNTIME],
            progress=lambda line: print(line, file=sys.stderr),
        )
    )
    print(json.dumps(figures, indent=2))
    print(
        f"fleet history server, {figures['trainjobs']} TrainJobs over {figures['members']} members: index ready in "
        f"{figures['index_ready_s']}s, RSS {figures['server_rss_after_requests_mb']} MB; first request (uncached) "
        f"{figures['first_request_s'] * 1000:.0f} ms"
    )
    for kind in KINDS:
        if not figures["latency_s"][kind]["count"]:
            continue
        lat, rate = figures["latency_s"][kind], figures["requests_per_s"][kind]
        print(
            f"  {kind}: p50 {stats.format_value(lat['p50'], 's')}, p99 {stats.format_value(lat['p99'], 's')}, "
            f"{rate or 0:.0f} requests/s ({lat['count']} requests)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
