"""The planner microbenchmark: what the planner service does per event, minus I/O, on one core.

Per event, as ``planner.service.Planner.handle`` does it: verify the watcher's signature, decode the event
bytes, ``plan()``, and for every apply message encode it, compute its ``Nats-Msg-Id`` (a SHA-256 of the
payload) and its subject, and sign it. What is left out is the I/O around it: fetching, publishing, acking,
the log line and the metric increments.

The signing microbenchmark times one ed25519 signature and one verification on the very bytes a TrainJob
produces (its event and its apply messages), so the cost of signatures per TrainJob can be stated.

Rates are per CPU-second of this process (``time.process_time``), which is what "per core" means on a
shared machine: time the scheduler gave to other processes does not count against the planner. The wall
rate is reported next to it.
"""

from __future__ import annotations

import functools
import gc
import time
from collections.abc import Callable, Mapping
from typing import Any

from bench import workload
from contracts import subjects
from contracts.messages import component_of, decode_event, encode
from planner.core import plan
from planner.service import apply_message_id
from plumbing.signing import Keyring, Signer, generate_private_key

_WATCHER = Signer(generate_private_key())
_PLANNER = Signer(generate_private_key())
_TRUSTED_EVENTS = Keyring.of(_WATCHER.public_key)

EVENTS_PER_RUNTIME = 32
"""Distinct events cycled through, so nothing can be served from a cache keyed by the last input."""
EVENT_SHAPE = "numNodes 2-4, resourcesPerNode cpu+memory, runtime_source=live, no JobSet yet"


def encoded_events(runtime_name: str, runtime: Mapping[str, Any], count: int = EVENTS_PER_RUNTIME) -> list[bytes]:
    events = []
    for i in range(count):
        event = workload.observed_event(
            namespace="bench-micro",
            name=f"job-{i}",
            uid=f"00000000-0000-4000-8000-{i:012d}",
            kind="torch",
            runtime={**runtime, "metadata": {**runtime.get("metadata", {}), "name": runtime_name}},
            num_nodes=workload.num_nodes_for(i),
            observed_at=1_700_000_000.0 + i,
            resource_version=str(100 + i),
        )
        events.append(encode(event))
    return events


def handle_once(data: bytes, seq: int, headers: dict[str, str]) -> tuple[int, int]:
    """One event through the planner's CPU path; returns (messages, warnings)."""
    _TRUSTED_EVENTS.verify(EVENT_SUBJECT, data, headers)
    event = decode_event(data)
    result = plan(event, source_seq=seq)
    for message in result.applies:
        payload = encode(message)
        apply_message_id(message, payload)
        subject = subjects.apply_subject(message.trainjob.namespace, message.trainjob.name, component_of(message))
        _PLANNER.sign(subject, payload)
    return len(result.applies), len(result.warnings)


EVENT_SUBJECT = subjects.event_subject("bench-micro", "job")
"""One subject for every event: the subject's length, not its text, is what costs."""


def signed(events: list[bytes]) -> list[tuple[bytes, dict[str, str]]]:
    return [(data, _WATCHER.headers(EVENT_SUBJECT, data)) for data in events]


def bench_runtime(
    runtime_name: str,
    runtime: Mapping[str, Any],
    *,
    seconds: float,
    max_plans: int = 2_000_000,
    clock: Callable[[], float] = time.process_time,
) -> dict[str, Any]:
    """Plans per CPU-second for one runtime, run for ``seconds`` of CPU or ``max_plans``, whichever first."""
    events = signed(encoded_events(runtime_name, runtime))
    messages, warnings = handle_once(events[0][0], 1, events[0][1])
    for i in range(min(200, max_plans)):  # warm-up: imports, caches, first-call costs
        data, headers = events[i % len(events)]
        handle_once(data, i + 1, headers)
    gc.collect()
    plans = 0
    cpu_start = clock()
    wall_start = time.perf_counter()
    cpu_elapsed = 0.0
    while plans < max_plans:
        for _ in range(16):
            data, headers = events[plans % len(events)]
            handle_once(data, plans + 1, headers)
            plans += 1
        cpu_elapsed = clock() - cpu_start
        if cpu_elapsed >= seconds:
            break
    wall_elapsed = time.perf_counter() - wall_start
    return {
        "runtime": runtime_name,
        "plans": plans,
        "cpu_seconds": cpu_elapsed,
        "wall_seconds": wall_elapsed,
        "plans_per_cpu_s": plans / cpu_elapsed if cpu_elapsed > 0 else None,
        "wall_plans_per_s": plans / wall_elapsed if wall_elapsed > 0 else None,
        "us_per_plan": cpu_elapsed / plans * 1e6 if plans else None,
        "messages_per_plan": messages,
        "warnings": warnings,
        "event_bytes": len(events[0][0]),
    }


def run_planner_micro(
    runtimes: Mapping[str, Mapping[str, Any]],
    *,
    seconds: float,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Every shipped runtime in turn, torch-distributed first."""
    order = sorted(runtimes, key=lambda name: (name != workload.TORCH_RUNTIME, name))
    results = []
    for name in order:
        result = bench_runtime(name, runtimes[name], seconds=seconds)
        progress(f"planner: {name}: {result['plans_per_cpu_s']:,.0f} plans/s/core ({result['plans']:,} plans)")
        results.append(result)
    signatures = bench_signatures(workload.TORCH_RUNTIME, runtimes[workload.TORCH_RUNTIME], seconds=seconds)
    progress(f"signatures: {signatures['us_per_trainjob_plan']:.0f} µs of CPU per TrainJob plan (sign + verify)")
    return {"event": EVENT_SHAPE, "seconds_per_runtime": seconds, "runtimes": results, "signatures": signatures}


def bench_signatures(
    runtime_name: str, runtime: Mapping[str, Any], *, seconds: float, clock: Callable[[], float] = time.process_time
) -> dict[str, Any]:
    """µs of CPU per ed25519 signature and per verification, on a new TrainJob's event and apply messages.

    Per TrainJob change the watcher signs one event and the planner verifies it; the planner signs each
    apply message and the applier verifies it. The figure per TrainJob is that sum for the first plan.
    """
    data = encoded_events(runtime_name, runtime, count=1)[0]
    event = decode_event(data)
    applies = [
        (component_of(m), subjects.apply_subject(m.trainjob.namespace, m.trainjob.name, component_of(m)), encode(m))
        for m in plan(event, source_seq=1).applies
    ]
    trusted_plans = Keyring.of(_PLANNER.public_key)
    messages = [
        ("event", EVENT_SUBJECT, data, _WATCHER, _TRUSTED_EVENTS),
        *((f"apply {c}", s, p, _PLANNER, trusted_plans) for c, s, p in applies),
    ]

    def timed(step: Callable[[], object]) -> float:
        for _ in range(50):
            step()
        count = 0
        start = clock()
        while (elapsed := clock() - start) < seconds / (2 * len(messages)) or count < 200:
            for _ in range(50):
                step()
            count += 50
        return elapsed / count * 1e6

    rows: list[dict[str, Any]] = []
    for label, subject, payload, signer, ring in messages:
        header = signer.headers(subject, payload)
        rows.append(
            {
                "message": label,
                "bytes": len(payload),
                "us_sign": timed(functools.partial(signer.sign, subject, payload)),
                "us_verify": timed(functools.partial(ring.verify, subject, payload, header)),
            }
        )
    per_trainjob = sum(r["us_sign"] + r["us_verify"] for r in rows)
    event_row, plan_rows = rows[0], rows[1:]
    return {
        "runtime": runtime_name,
        "messages": rows,
        "us_per_trainjob_plan": per_trainjob,
        "us_by_service": {
            "watcher": event_row["us_sign"],
            "planner": event_row["us_verify"] + sum(r["us_sign"] for r in plan_rows),
            "applier": sum(r["us_verify"] for r in plan_rows),
        },
        "note": "one event and its apply messages, each signed once and verified once",
    }
