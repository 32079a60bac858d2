"""Finding TrainJobs in the history server's list over 100,000 TrainJobs: each query's latency, side by side with
the plain list's.

The index is built the way the server builds it: every TrainJob's event and newest progress update folded in
by ``HistoryIndex.add_event``/``add_progress`` from the bytes the streams hold (an event carries only what the
index decodes, since the rest is skipped by its decoder either way). Then each query runs through
``history_server.app.list_answer``, the code the list's handlers run once the caller is authorized,
with the JSON text of the answer made as the handler makes it. Left out: HTTP and the authorization, which
are the same for every query (a cached SubjectAccessReview, the history benchmark's figures). Each request's
wall time is printed beside its CPU time (``time.process_time``): on a shared machine the wall time also
counts the time other processes had the CPU.

    python -m bench.history_find [--trainjobs 100000] [--requests 200]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

import msgspec

from bench import stats
from contracts import subjects
from contracts.messages import ObjectKey
from contracts.progress import ProgressReported, encode_progress
from contracts.trainer import Metric, TrainerStatus
from history_server.app import LIST_LIMIT, list_answer
from history_server.find import PAGE, query_of
from history_server.index import HistoryIndex
from plumbing.bus_history import StoredMessage

NAMESPACES = 20
TEAMS = ("nlp", "vision", "speech", "recsys", "rl")
RUNTIMES = ("torch-distributed", "deepspeed-distributed", "mlx-distributed", "torchtune-llama3.2-1b")
QUERIES = {
    "the list (newest first)": {},
    "a label selector": {"labelSelector": "team=nlp,sweep in (lr,batch)"},
    "state and runtime": {"state": "Complete", "runtime": "torch-distributed"},
    "loss < 0.3, by loss": {"metric": "loss < 0.3", "sort": "metric:loss"},
    "last 7 days, oldest first": {"from": "7d", "sort": "created"},
    "all of them, by name": {
        "labelSelector": "team=nlp",
        "state": "Complete",
        "runtime": "torch-distributed",
        "from": "30d",
        "metric": "loss < 0.5",
        "sort": "name",
    },
    "page 100 of the list": {"offset": str(99 * PAGE)},
}


def _stored(stream: str, seq: int, subject: str, data: bytes, at: float) -> StoredMessage:
    return StoredMessage(stream=stream, seq=seq, subject=subject, data=data, headers={}, time=at)


def build(trainjobs: int, now: float, seed: int = 7) -> HistoryIndex:
    rng = random.Random(seed)
    index = HistoryIndex()
    for i in range(trainjobs):
        namespace, name = f"team-{i % NAMESPACES}", f"job-{i:06d}"
        created = now - rng.uniform(0, 60 * 86400)
        state = rng.choice(("Complete", "Complete", "Running", "Failed", "Created"))
        status: dict[str, object] = {}
        if state == "Running":
            status = {"jobsStatus": [{"name": "node", "active": 2}]}
        elif state in ("Complete", "Failed"):
            status = {"conditions": [{"type": state, "status": "True"}]}
        event = {
            "type": "trainjob.observed",
            "trainjob": {
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": f"uid-{i}",
                    "creationTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
                    "labels": {"team": TEAMS[i % len(TEAMS)], "sweep": rng.choice(("lr", "batch", "seed"))},
                },
                "spec": {
                    "runtimeRef": {"name": RUNTIMES[i % len(RUNTIMES)]},
                    "trainer": {"numNodes": rng.choice((1, 2, 4, 8))},
                },
                "status": status,
            },
            "observed_at": created,
        }
        subject = subjects.event_subject(namespace, name)
        index.add_event(_stored("TJ_EVENTS_HISTORY", i + 1, subject, msgspec.json.encode(event), created))
        if state != "Created":
            report = ProgressReported(
                trainjob=ObjectKey(namespace=namespace, name=name),
                trainjob_uid=f"uid-{i}",
                pod=f"{name}-node-0-0",
                service_account="default",
                trainer_status=TrainerStatus(
                    progress_percentage=rng.randint(1, 100),
                    metrics=[
                        Metric(name="loss", value=f"{rng.uniform(0.05, 2.5):.3f}"),
                        Metric(name="accuracy", value=f"{rng.uniform(0.1, 0.95):.3f}"),
                    ],
                ),
                received_at=created + 60,
            )
            progress = subjects.progress_subject(namespace, name)
            index.add_progress(_stored("TJ_PROGRESS", i + 1, progress, encode_progress(report), created + 60))
    return index


def measure(index: HistoryIndex, requests: int, now: float) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for label, params in QUERIES.items():
        samples, cpu, total = [], [], 0
        for _ in range(requests):
            started, cpu_started = time.perf_counter(), time.process_time()
            query = query_of(params, now=now, most=LIST_LIMIT, default_limit=PAGE)
            answer = list_answer(index.summaries(), query, now=now, stalled_after=600.0)
            json.dumps(answer, ensure_ascii=False, default=str)
            samples.append((time.perf_counter() - started) * 1000)
            cpu.append((time.process_time() - cpu_started) * 1000)
            total = answer["total"]
        out[label] = {
            "p50": stats.percentile(samples, 50) or 0.0,
            "p99": stats.percentile(samples, 99) or 0.0,
            "max": max(samples),
            "cpu_p50": stats.percentile(cpu, 50) or 0.0,
            "cpu_p99": stats.percentile(cpu, 99) or 0.0,
            "matches": float(total),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainjobs", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    now = time.time()
    started = time.perf_counter()
    index = build(args.trainjobs, now)
    print(f"index of {len(index):,} TrainJobs built in {time.perf_counter() - started:.1f} s")
    figures = measure(index, args.requests, now)
    base = figures["the list (newest first)"]["p99"]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (wall time counts what others took)")
    head = f"{'query':<28} {'matches':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'CPU p50':>8} {'CPU p99':>8}"
    print(head + f" {'p99 / list':>10}")
    for label, f in figures.items():
        print(
            f"{label:<28} {int(f['matches']):>8,} {f['p50']:>8.1f} {f['p99']:>8.1f} {f['max']:>8.1f}"
            f" {f['cpu_p50']:>8.1f} {f['cpu_p99']:>8.1f} {f['p99'] / base:>9.2f}x"
        )


if __name__ == "__main__":
    main()
