"""What one TrainJob may cost the pipeline: every budget row, declared once, and the verdict on a measurement.

The tests in this folder measure (``costs``); the rows below say what each figure may be; ``tools/gen_budgets.py``
writes ``docs/cost-budgets.md``'s tables from them, and ``tests/unit/test_budget_page.py`` fails when the page and
the rows disagree, so raising a row shows in the same diff as the page, with its reason.

A row is stated per behaviour, not per count one machine's timing happened to give. How many observations the
watcher makes of a new TrainJob depends on how the changes to its components fall into the watcher's gathering
windows, and how many times JobSet's manager writes the JobSet's status depends on how the pods' transitions fall
together; neither is the pipeline's choice, and a slower machine splits them further. So the rows are counted
per **unit**, each a thing the servers' own records show (``UNITS``): an apply message per observation, an
acknowledgement per delivery, a pull per second of the window. What the pipeline does for each unit is exact, and
an exact row fails on one round trip more or one less; the units themselves have rows that bound them by their
worst case (every component change in a window of its own), with the reason. Every kind of API request and
JetStream request and every stream must have a row: a figure no row names fails, so a new kind of round trip
cannot pass unseen.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from contracts import streams
from contracts.subjects import PARTITIONS
from plumbing import pull, stream_usage, work_trim
from plumbing.bus_setup import LEASE_BUCKET, LEASE_TTL_SECONDS

UNITS: Mapping[str, str] = {
    "observation": "an event of the TrainJob that is not an echo (read back from the event history)",
    "echo": "an event caused only by the pipeline's own status write (marked so by the watcher)",
    "observation without the snapshot": "an observation whose runtime came from the live runtime, not from the "
    "TrainJob's snapshot ConfigMap: the watcher had not seen the snapshot yet (the first observation, or one "
    "made before the snapshot's own addition reached it)",
    "component write": "a write by anyone to a ConfigMap, JobSet, JobSet status, PodGroup or Secret of the "
    "TrainJob's namespace (the audit log): what the watcher can observe",
    "second": "a second of the measured window, for what the services do on a clock",
}
"""What rows are counted per, besides the other rows' own figures; each measured from the servers' records."""


@dataclass(frozen=True)
class Per:
    """``count`` for every ``every`` of ``unit`` (a unit of ``UNITS`` or another row's figure)."""

    count: float
    unit: str
    every: float = 1

    def __str__(self) -> str:
        if self.every == 1:
            return f"{self.count:g} per {self.unit}"
        return f"{self.count:g} per {self.every:g} {self.unit}s"


@dataclass(frozen=True)
class Row:
    """``figure`` is at most (or, ``exact``, exactly) ``base`` plus each ``per`` term."""

    figure: str
    base: int
    reason: str
    per: tuple[Per, ...] = ()
    exact: bool = False

    def limit(self, measured: Mapping[str, int]) -> int:
        return math.floor(self.base + sum(p.count * measured.get(p.unit, 0) / p.every for p in self.per) + 1e-9)

    def formula(self) -> str:
        terms = [str(self.base)] if self.base or not self.per else []
        terms += [str(p) for p in self.per]
        return ("= " if self.exact else "≤ ") + " + ".join(terms)


def once_each(*units: str) -> tuple[Per, ...]:
    return tuple(Per(1, unit) for unit in units)


def verdict(costs: Mapping[str, int], rows: Iterable[Row]) -> list[str]:
    """Every row its figure breaks, and every figure no row names. ``costs`` holds the units too: a row is
    counted per a unit or per another row's figure, all measured in the same run."""
    table = {row.figure: row for row in rows}
    problems = []
    for row in table.values():
        value, limit = costs.get(row.figure, 0), row.limit(costs)
        if value > limit or (row.exact and value != limit):
            problems.append(f"{row.figure}: {value}, budget {row.formula()} = {limit} ({row.reason})")
    problems += [
        f"{figure}: {value}, and no budget row names it"
        for figure, value in sorted(costs.items())
        if value and figure not in table and figure not in UNITS
    ]
    return problems


def table(costs: Mapping[str, int], rows: Iterable[Row]) -> str:
    declared = {row.figure: row for row in rows}
    names = sorted(set(costs) | set(declared))
    width = max(len(name) for name in names)
    lines = []
    for name in names:
        row = declared.get(name)
        budget = f"{row.formula()} = {row.limit(costs)}" if row else "-"
        lines.append(f"  {name:<{width}}  {costs.get(name, 0):>5}  {budget}")
    return "\n".join(lines)


# The services' clocks, from the constants the services run with, so a changed interval changes its row.
STAGES = 2
"""The planner and the applier: each holds partition leases, pulls its partitions and sweeps its work stream."""
LEASE_ROUND_SECONDS = LEASE_TTL_SECONDS / 3
LEASE_KEYS = 1 + PARTITIONS
"""Per round, a replica renews its membership and each partition it holds (one replica holds all 16)."""
PULLS = STAGES * PARTITIONS
STREAMS_REPORTED = len(streams.ALL_STREAMS)
"""The applier's stream usage report reads every stream's info."""

CLOCK: tuple[Row, ...] = (
    Row(
        f"stored in KV_{LEASE_BUCKET}",
        STAGES * LEASE_KEYS,
        "the partition leases: every lease round each stage renews its membership and its partitions' leases",
        (Per(STAGES * LEASE_KEYS, "second", LEASE_ROUND_SECONDS),),
    ),
    Row(
        f"JetStream API DIRECT.GET.KV_{LEASE_BUCKET}",
        STAGES,
        "each lease round reads the members' keys once, to rebalance",
        (Per(STAGES, "second", LEASE_ROUND_SECONDS),),
    ),
    Row(
        "JetStream API CONSUMER.MSG.NEXT",
        PULLS,
        "a pull per partition waits for work until it expires, and is sent again; deliveries ride on the open one",
        (Per(PULLS, "second", pull.EXPIRES_SECONDS),),
    ),
    Row(
        "JetStream API STREAM.INFO",
        STAGES + STREAMS_REPORTED,
        "each stage looks at its work stream's first message (the sweep), and the applier reports every stream's "
        "usage, each on its interval",
        (Per(STAGES + STREAMS_REPORTED, "second", stream_usage.INTERVAL_SECONDS),),
    ),
    Row(
        "JetStream API CONSUMER.INFO",
        PULLS,
        "the sweep reads its partitions' ack floors, only when the same message stayed first a whole interval",
        (Per(PULLS, "second", work_trim.SWEEP_SECONDS),),
    ),
)
"""What the services do on a clock whatever the TrainJobs do: the same in every scenario."""

EVENTS = once_each("observation", "echo")
APPLIED = ("stored in TJ_APPLY",)

BUS: tuple[Row, ...] = (
    Row("echo", 0, "each of the pipeline's own status writes is seen once more", once_each("status writes"), True),
    Row("stored in TJ_EVENTS", 0, "one event per observation and per echo", EVENTS, True),
    Row("stored in TJ_EVENTS_HISTORY", 0, "the history keeps every event", EVENTS, True),
    Row("planner deliveries", 0, "each event delivered once; more would be a redelivery", EVENTS, True),
    Row(
        "planner acks (ack floor)",
        0,
        "each event acknowledged once planned",
        EVENTS,
        True,
    ),
    Row(
        "stored in TJ_APPLY_HISTORY",
        0,
        "the history keeps every apply message",
        once_each(*APPLIED),
        True,
    ),
    Row(
        "stored in TJ_RESULTS",
        0,
        "one outcome per apply message: created, configured, unchanged or skipped",
        once_each(*APPLIED),
        True,
    ),
    Row(
        "other ack replies (nak, in progress, term)",
        0,
        "a status whose only change is the Jobs' counts waits for its turn (a nak with the rest of the 5 s "
        "interval), at most once each",
        once_each("apply messages for trainjob-status"),
    ),
    Row(
        "applier deliveries",
        0,
        "each apply message once, and each held one once more after its wait",
        once_each(*APPLIED, "other ack replies (nak, in progress, term)"),
        True,
    ),
    Row(
        "applier acks (ack floor)",
        0,
        "each delivery acknowledged or handed back",
        once_each(*APPLIED, "other ack replies (nak, in progress, term)"),
        True,
    ),
    Row(
        "acks sent",
        0,
        "one acknowledgement per event planned and per apply message done, as the server routed them",
        once_each("stored in TJ_EVENTS", *APPLIED),
        True,
    ),
    Row(
        "stored in KV_tj_applied",
        1,
        "the fence: a claim and a record per component write, a record per apply message (a status is recorded "
        "once written, with no claim before: its write is conditional on the TrainJob's resourceVersion), and the "
        "TrainJob's seen key; a held status overtaken by a newer write records nothing",
        once_each("api configmaps APPLY", "api jobsets APPLY", *APPLIED),
    ),
    Row(
        "JetStream API DIRECT.GET.KV_tj_applied",
        0,
        "a fresh read of a record after a compare-and-set lost to a concurrent claim on the same target",
        once_each(*APPLIED),
    ),
)
"""How the bus carries whatever the TrainJob's observations ask for: the same rules in every scenario."""

COMPONENTS: tuple[Row, ...] = (
    Row(
        "apply messages for configmap",
        0,
        "the runtime snapshot, planned from every observation that does not carry it: the first, and any the "
        "watcher made before the snapshot's addition reached it (it holds such an observation back up to 2 s)",
        once_each("observation without the snapshot"),
        True,
    ),
    Row(
        "api configmaps GET",
        0,
        "read before its apply: a foreign ConfigMap is never taken over",
        once_each("apply messages for configmap"),
    ),
    Row(
        "api configmaps APPLY",
        1,
        "the runtime snapshot written once (field manager trainer)",
        (),
        True,
    ),
    Row("api jobsets APPLY", 1, "the JobSet written once", (), True),
    Row(
        "api jobsets GET",
        0,
        "the live JobSet read before each of its apply messages: a foreign one is never taken over and an unchanged "
        "one is not written",
        once_each("apply messages for jobset"),
        True,
    ),
    Row(
        "apply messages for trainjob-status",
        0,
        "the status planned from each observation, at most once each (none where an echo finds it standing)",
        once_each("observation"),
    ),
)
"""What every torch TrainJob's components cost, suspended or run."""

OBSERVATIONS = Row(
    "observation",
    1,
    "worst case: the TrainJob's addition, and each change to its components in a gathering window of its own",
    once_each("component write"),
)
"""How many times the watcher can observe a TrainJob: its gathering is held exactly by its unit tests."""

SUM_OF_COMPONENTS = once_each(
    "apply messages for configmap", "apply messages for jobset", "apply messages for trainjob-status"
)

# fmt: off
CREATION: tuple[Row, ...] = (
    OBSERVATIONS,
    Row("stored in TJ_APPLY", 0, "the apply messages of each component, and no other", SUM_OF_COMPONENTS, True),
    Row("apply messages for jobset", 0, "a suspended TrainJob's JobSet is planned again from the live one at each "
        "observation, to hold it to the plan", once_each("observation"), True),
    Row("api trainjobs/status APPLY", 2, "Suspended=True, then jobsStatus once JobSet reports its Job", (), True),
    Row("status writes", 2, "the same two (APPLY, PATCH or UPDATE on trainjobs/status)", (), True),
    *COMPONENTS, *BUS, *CLOCK,
)
"""A suspended torch TrainJob (2 nodes): created, its runtime snapshot and suspended JobSet applied, its
Suspended condition written; no pod runs."""

LIFECYCLE: tuple[Row, ...] = (
    OBSERVATIONS,
    Row("stored in TJ_APPLY", 0, "the apply messages of each component, and no other", SUM_OF_COMPONENTS, True),
    Row("apply messages for jobset", 1, "planned once: a running JobSet's status changes re-plan nothing of it", (),
        True),
    Row("status writes", 2, "jobsStatus as the Jobs appear and Complete with the final counts, at once; the counts "
        "between at most once per 5 s (--status-interval), so a slow run writes one more per interval",
        (Per(1, "second", 5),)),
    Row("api trainjobs/status APPLY", 0, "every status write is an apply", once_each("status writes"), True),
    *COMPONENTS, *BUS, *CLOCK,
)
"""A torch TrainJob (2 nodes) created and run to Complete."""
# fmt: on

SCENARIOS: tuple[tuple[str, tuple[Row, ...]], ...] = (
    ("Creation: a suspended torch TrainJob (2 nodes)", CREATION),
    ("A torch TrainJob (2 nodes) run to Complete", LIFECYCLE),
)
