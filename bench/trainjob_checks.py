"""``python -m bench.trainjob_checks``: what the applier's TrainJob check costs, by a read and by its watch.

Every apply message is justified by a live TrainJob with the message's uid. The applier used to read the
TrainJob for it (kept 5 s, shared by the components of one TrainJob); it now answers from a watch of
TrainJobs when that knows the TrainJob by the uid (``applier.trainjobs``). Whole-pipeline runs move by up
to 20% from run to run on this kind of machine, more than this change, so it is measured here on its own:
one local kube-apiserver, the same N TrainJobs, and the applier's own ``TrainJobs`` class doing N checks,
first by reads (``--trainjob-source get``, the 5 s memory off so that every check is a read, as it is for a
status whose TrainJob was last read more than 5 s ago), then by the watch. What the watch costs in return
is measured too: its list, and each TrainJob change it is sent (N creates, then N status changes, made by a
child process so that only the watch's handling is in this process's CPU).

CPU is this process's (``time.process_time``: the applier's share) and, for the checks and the list, the
API server's and etcd's (from ``/proc``), per check or per change, in microseconds; checks run 16 at a
time, as the applier's default concurrency does. For a change the servers' CPU is the change itself,
which every controller's watch sees anyway (the watcher's among them), so only this process's is given.
The run ends with what a TrainJob costs either way over the two lives the other benchmarks measure: at
creation (one check, the TrainJob's creation delivered) and over a lifecycle to Complete (four checks,
the creation and two status changes delivered).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from applier.trainjob_watch import WatchedTrainJobs
from applier.trainjobs import TrainJobs
from bench import workload
from bench.cluster import cpu_of
from contracts import resources
from contracts.kube import ConfigMap
from contracts.messages import ApplyConfigMap, ObjectKey, Target
from plumbing.kube import KubeClient, KubeConfig
from tjpipe.local.crds import crd_manifests, install_crds
from tjpipe.local.kubeapi import LocalKube, start_kube

NAMESPACE = "bench-checks"
CONCURRENCY = 16

_CHILD = """
import asyncio, json, sys
from plumbing.kube import KubeClient, KubeConfig
from contracts import resources

async def main(kubeconfig, namespace, what, names, bodies):
    async with KubeClient(KubeConfig.load(kubeconfig)) as kube:
        slots = asyncio.Semaphore(16)
        async def one(name):
            async with slots:
                if what == "create":
                    await kube.create(resources.TRAINJOB, namespace=namespace, body=bodies[name].encode())
                else:
                    status = {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
                              "metadata": {"name": name, "namespace": namespace},
                              "status": {"conditions": [{"type": "Complete", "status": "True", "reason": "Bench",
                                         "message": "bench", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
                    await kube.apply(resources.TRAINJOB, namespace=namespace, name=name,
                                     body=json.dumps(status).encode(), field_manager="bench",
                                     force=True, subresource="status")
        await asyncio.gather(*(one(n) for n in names))

args = json.loads(sys.stdin.read())
asyncio.run(main(**args))
"""


def _message(name: str, uid: str) -> ApplyConfigMap:
    return ApplyConfigMap(
        trainjob=ObjectKey(namespace=NAMESPACE, name=name),
        trainjob_uid=uid,
        source_seq=1,
        source_version=1,
        target=Target(api_version="v1", kind="ConfigMap", namespace=NAMESPACE, name=f"{name}-cm"),
        object=ConfigMap(api_version="v1", kind="ConfigMap"),
    )


def _server_pids(kube: LocalKube) -> dict[str, int]:
    return {p.name: p.pid for p in kube.processes if p.is_running()}


async def _measured(kube: LocalKube, work: Callable[[], Awaitable[Any]]) -> dict[str, float]:
    """CPU seconds of this process and of the servers spent on ``work``."""
    before = cpu_of(_server_pids(kube))
    await work()
    after = cpu_of(_server_pids(kube))
    return {name: after[name] - before.get(name, 0.0) for name in after}


async def _child(kubeconfig: Path, what: str, names: Sequence[str], bodies: dict[str, str]) -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", _CHILD, stdin=asyncio.subprocess.PIPE)
    payload = {"kubeconfig": str(kubeconfig), "namespace": NAMESPACE, "what": what, "names": list(names)}
    await proc.communicate(json.dumps({**payload, "bodies": bodies}).encode())
    if proc.returncode != 0:
        raise RuntimeError(f"the child process that makes the TrainJob changes ({what}) failed")


async def _checks(checks: TrainJobs, messages: Sequence[ApplyConfigMap]) -> None:
    slots = asyncio.Semaphore(CONCURRENCY)

    async def one(message: ApplyConfigMap) -> None:
        async with slots:
            await checks.verify(message)

    await asyncio.gather(*(one(m) for m in messages))


async def _until(what: Callable[[], bool], seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        if time.monotonic() > deadline:
            raise RuntimeError("the watch did not catch up")
        await asyncio.sleep(0.01)


async def measure(kube: LocalKube, n: int) -> dict[str, dict[str, float]]:
    names = [f"tj-{i:05d}" for i in range(n)]
    bodies = {
        name: json.dumps(workload.trainjob_body(NAMESPACE, name, "torch", workload.num_nodes_for(i)))
        for i, name in enumerate(names)
    }
    async with KubeClient(KubeConfig.load(str(kube.kubeconfig))) as client:
        namespace = json.dumps({"metadata": {"name": NAMESPACE}}).encode()
        await client.create(resources.NAMESPACE, namespace=None, body=namespace)
        watched = WatchedTrainJobs(client)
        following = asyncio.create_task(watched.run())
        try:
            await asyncio.wait_for(watched.synced(), 60)
            out: dict[str, dict[str, float]] = {}
            out["watch: TrainJob created"] = await _measured(
                kube, lambda: _child(kube.kubeconfig, "create", names, bodies)
            )
            await _until(lambda: len(watched.facts) == n)
            uids = {name: watched.facts[(NAMESPACE, name)].uid for name in names}
            messages = [_message(name, uids[name]) for name in names]

            reads = TrainJobs(client, cache_seconds=0.0)
            out["check by a read"] = await _measured(kube, lambda: _checks(reads, messages))
            by_watch = TrainJobs(client, cache_seconds=0.0, watched=watched)
            out["check by the watch"] = await _measured(kube, lambda: _checks(by_watch, messages))

            versions = {key: facts.resource_version for key, facts in watched.facts.items()}
            out["watch: TrainJob status changed"] = await _measured(
                kube, lambda: _child(kube.kubeconfig, "status", names, bodies)
            )
            await _until(lambda: all(watched.facts[k].resource_version != v for k, v in versions.items()))
            fresh = WatchedTrainJobs(client)
            out["watch: its list, once per start"] = await _measured(kube, lambda: _list_once(fresh))
        finally:
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
    return out


async def _list_once(watched: WatchedTrainJobs) -> None:
    task = asyncio.create_task(watched.run())
    await asyncio.wait_for(watched.synced(), 60)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _per(seconds: dict[str, float], n: int) -> tuple[float, float]:
    """(this process, API server + etcd) microseconds per item."""
    own = seconds.get("benchmark", 0.0)
    servers = sum(v for k, v in seconds.items() if k != "benchmark")
    return own / n * 1e6, servers / n * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trainjob_checks", description=__doc__.splitlines()[0])
    parser.add_argument("--trainjobs", type=int, default=1_000)
    args = parser.parse_args(argv)
    n = args.trainjobs
    with tempfile.TemporaryDirectory(prefix="tjpipe-checks-") as root:
        kube = start_kube(
            work_dir=Path(root, "kube"),
            log_dir=Path(root, "logs"),
            kubeconfig_path=Path(root, "kubeconfig"),
            progress=lambda line: print(f"[checks] {line}", file=sys.stderr),
        )
        try:
            with kube.api_client() as api:
                install_crds(api, crd_manifests())
            figures = asyncio.run(measure(kube, n))
        finally:
            kube.stop()
    per = {what: _per(seconds, n) for what, seconds in figures.items()}
    changes = ("watch: TrainJob created", "watch: TrainJob status changed")
    print(f"{n:,} TrainJobs; CPU in µs per item: this process (the applier's share) / kube-apiserver + etcd")
    for what, (own, servers) in per.items():
        print(f"  {what:<34} {own:>8.1f} / " + ("       —" if what in changes else f"{servers:>8.1f}"))
    read, watch = per["check by a read"], per["check by the watch"]
    created, changed = per[changes[0]][0], per[changes[1]][0]
    print("per TrainJob (µs): applier by reads, applier by the watch (checks + changes delivered); servers")
    for life, checks, status_changes in (("at creation", 1, 0), ("over a lifecycle to Complete", 4, 2)):
        by_read, by_watch = checks * read[0], checks * watch[0] + created + status_changes * changed
        print(
            f"  {life:<30} applier {by_read:>6.0f} → {by_watch:>6.0f} ({by_read / by_watch:.1f}x less);"
            f" servers {checks * read[1]:>6.0f} → {checks * watch[1]:>4.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
