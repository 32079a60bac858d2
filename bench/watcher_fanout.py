"""``python -m bench.watcher_fanout``: what a runtime's change costs the watcher, by scan and by index.

A change to a runtime matters to the TrainJobs that refer to it and have not started. The watcher used to
find them by decoding every cached TrainJob (each is held compressed, see ``plumbing.informer``) and
comparing its runtimeRef; it now looks them up in ``watcher.core.TrainJobsByRuntime``. Both are timed here
in one run on the same watcher: its TrainJob cache filled through the informer's own decode and trim and
its TrainJob handler (which is what keeps the index), the JobSets cached, and a fake bus that takes every
event. ``scan`` is the old loop, kept here to be measured; ``index`` is ``Watcher._runtime_changed``.

Two shapes of cluster: TrainJobs spread over many runtimes (a change touches a few), and all on one
runtime (a change touches every one: the index cannot help there, and the ratio shows it). The TrainJobs
are running (they have a JobSet), so a change publishes nothing and what is timed is the finding; both
sides find the same TrainJobs, which the run checks. Times are the median of a few fan-outs, on one core
(``time.process_time``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, cast

import msgspec

from bench import workload
from contracts import trainer
from plumbing.informer import Informer
from plumbing.kube import KubeClient
from plumbing.signing import Signer, generate_private_key
from watcher import core
from watcher.service import Watcher
from watcher.settings import WatcherSettings

NAMESPACE = "bench-fanout"
RUNTIME_KIND = trainer.CLUSTER_TRAINING_RUNTIME_KIND


class _Bus:
    """Takes every event at once, as a JetStream that acknowledges immediately would."""

    def __init__(self) -> None:
        self.published = 0

    async def publish(self, subject: str, payload: bytes, *, headers: dict[str, str], timeout: float) -> Any:
        self.published += 1
        return SimpleNamespace(duplicate=False, seq=self.published)


def _jobset(job_name: str, uid: str) -> dict[str, Any]:
    owner = {"apiVersion": trainer.API_VERSION, "kind": "TrainJob", "name": job_name, "uid": uid, "controller": True}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": job_name, "namespace": NAMESPACE, "uid": f"js-{uid}", "ownerReferences": [owner]},
        "spec": {"suspend": False, "replicatedJobs": [{"name": "node", "replicas": 1}]},
    }


def _cache(informer: Informer[Any], body: dict[str, Any]) -> Any:
    decoded = informer._decode(msgspec.json.encode(body))
    assert decoded is not None
    informer.cache[decoded[0]] = decoded[1]
    return decoded


async def _filled_watcher(trainjobs: int, runtimes: int) -> tuple[Watcher, _Bus]:
    bus = _Bus()
    watcher = Watcher(
        WatcherSettings(nats_url="nats://unused", namespaces=(NAMESPACE,)),
        cast(KubeClient, None),
        cast(Any, bus),
        signer=Signer(generate_private_key()),
    )
    (trainjob_informer,) = watcher.trainjobs
    (jobset_informer,) = watcher.jobsets
    for i in range(trainjobs):
        name, uid = f"job-{i}", f"00000000-0000-4000-8000-{i:012d}"
        runtime = f"rt-{i % runtimes}"
        body = workload.trainjob_body(NAMESPACE, name, "torch", workload.num_nodes_for(i), runtime_name=runtime)
        body["metadata"].update(uid=uid, resourceVersion=str(10 + i))
        _cache(jobset_informer, _jobset(name, uid))
        key, cached = _cache(trainjob_informer, body)
        await watcher._on_trainjob("ADDED", key, cached)
    trainjob_informer.synced.set()
    return watcher, bus


async def _scan_every_trainjob(watcher: Watcher, runtime_kind: str, key: tuple[str, str], kind: str) -> None:
    """The watcher's runtime fan-out before the index: decode every cached TrainJob to find the few."""
    wanted = (runtime_kind, key[0], key[1])
    for inf in watcher.trainjobs:
        for job_key, cached in list(inf.cache.items()):
            job = cached.obj
            if core.runtime_key_of(job) != wanted:
                continue
            if core.is_suspended(job) or watcher._jobset(job_key) is None:
                await watcher.publish_observation(job, cause=f"{runtime_kind} {kind}")


def _found(watcher: Watcher, runtime: tuple[str, str]) -> int:
    """How many cached TrainJobs refer to the runtime, by the index (checked against the scan's rule)."""
    wanted = (RUNTIME_KIND, *runtime)
    indexed = watcher._by_runtime.trainjobs(wanted)
    scanned = [k for inf in watcher.trainjobs for k, c in inf.cache.items() if core.runtime_key_of(c.obj) == wanted]
    assert sorted(indexed) == sorted(scanned), "the index and the scan disagree"
    return len(indexed)


async def _median_seconds(fan_out: Callable[[], Awaitable[None]], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.process_time()
        await fan_out()
        times.append(time.process_time() - started)
    return statistics.median(times)


async def measure(trainjobs: int, runtimes: int, *, repeats: int) -> dict[str, float]:
    watcher, bus = await _filled_watcher(trainjobs, runtimes)
    runtime = ("", "rt-0")
    published = bus.published
    scan = await _median_seconds(lambda: _scan_every_trainjob(watcher, RUNTIME_KIND, runtime, "MODIFIED"), repeats)
    index = await _median_seconds(lambda: watcher._runtime_changed(RUNTIME_KIND, runtime, "MODIFIED"), repeats)
    assert bus.published == published, "running TrainJobs were published"
    found = _found(watcher, runtime)
    return {"trainjobs": trainjobs, "runtimes": runtimes, "found": found, "scan": scan, "index": index}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.watcher_fanout", description=__doc__.splitlines()[0])
    parser.add_argument("--trainjobs", type=int, default=10_000)
    parser.add_argument("--runtimes", type=int, default=100, help="runtimes the TrainJobs are spread over")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    header = (
        ("cached TrainJobs", 16),
        ("runtimes", 8),
        ("touched", 7),
        ("scan ms", 9),
        ("index ms", 9),
        ("scan / index", 12),
    )
    print(" ".join(f"{title:>{width}}" for title, width in header))
    for runtimes in (args.runtimes, 1):
        row = asyncio.run(measure(args.trainjobs, runtimes, repeats=args.repeats))
        ratio = row["scan"] / row["index"] if row["index"] > 0 else float("inf")
        print(
            f"{row['trainjobs']:>16,} {row['runtimes']:>8} {row['found']:>7,} "
            f"{row['scan'] * 1e3:>9.2f} {row['index'] * 1e3:>9.2f} {ratio:>11.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
