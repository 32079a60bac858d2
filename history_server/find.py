"""Finding TrainJobs in the history: the query the list and the JSON API take, parsed once, applied as a pure
function of the index's summaries.

Why here and not in the streams: every field a query names (labels, runtime, state, creation time, the newest
metrics) is already in the index's summary of each TrainJob, so a query is a scan of memory, never a read of
the bus, and answers in the same time whatever the streams hold. Why parsed into a frozen ``Query`` first: the
request's words are checked once (a clear 400 for a selector or a condition that does not parse), and the scan
then runs a few comparisons per TrainJob; the benchmark ``python -m bench.history_find`` measures it over
100,000 TrainJobs.

The words are those the people who use it know: a label selector as ``kubectl get -l`` takes it (``team=nlp``,
``env!=dev``, ``tier in (a,b)``, ``release``, ``!canary``), a metric condition as one writes it (``loss < 0.3``),
a time as a date, an RFC 3339 time, or an age (``24h``: the last day). Authorization is not this module's:
the handlers hand it only summaries of namespaces the caller may list.
"""

from __future__ import annotations

import datetime as dt
import heapq
import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from history_server.index import STATES

if TYPE_CHECKING:
    from history_server.index import Summary

SORTS = ("lastSeen", "created", "name", "namespace", "state", "runtime", "cluster", "nodes", "progress")
"""What a list can be sorted by, besides ``metric:NAME`` (the newest value of a metric)."""
PAGE = 50
"""TrainJobs on one page of the UI's list."""

_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_AGE = re.compile(r"^(\d+(?:\.\d+)?)\s*(s|m|h|d|w)$")
_AGE_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_METRIC = re.compile(r"^\s*([A-Za-z_][-A-Za-z0-9_./:]*)\s*(<=|>=|==|!=|<|>|=)\s*(\S+)\s*$")
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "=": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


class BadQuery(ValueError):
    """A query that does not parse: said back to the caller as it is (a 400), never guessed at."""


@dataclass(frozen=True)
class Requirement:
    """One clause of a label selector."""

    key: str
    op: str
    """``=``, ``!=``, ``in``, ``notin``, ``exists``, ``!exists``."""
    values: frozenset[str] = frozenset()

    def test(self) -> Callable[[Summary], bool]:
        """``matches`` of a summary's labels, as one small function (what a scan of 100,000 runs)."""
        key, values = self.key, self.values
        if self.op == "exists":
            return lambda s: key in s.labels
        if self.op == "!exists":
            return lambda s: key not in s.labels
        if self.op in ("=", "in"):
            if len(values) == 1:
                (only,) = values
                return lambda s: s.labels.get(key) == only
            return lambda s: s.labels.get(key) in values
        return lambda s: s.labels.get(key) not in values

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op == "exists":
            return value is not None
        if self.op == "!exists":
            return value is None
        if self.op in ("=", "in"):
            return value is not None and value in self.values
        return value is None or value not in self.values  # "!=" and "notin", as Kubernetes reads them


@dataclass(frozen=True)
class MetricCondition:
    """A condition on the newest value a TrainJob reported of one metric; a job without it does not match."""

    name: str
    op: str
    value: float

    def matches(self, metrics: Mapping[str, str]) -> bool:
        text = metrics.get(self.name)
        if text is None:
            return False
        try:
            number = float(text)
        except ValueError:
            return False
        return not math.isnan(number) and _OPS[self.op](number, self.value)

    def __str__(self) -> str:
        return f"{self.name} {self.op} {self.value:g}"


@dataclass(frozen=True)
class Query:
    selector: tuple[Requirement, ...] = ()
    runtime: str = ""
    state: str = ""
    created_from: float | None = None
    created_to: float | None = None
    metric: MetricCondition | None = None
    name: str = ""
    """A part of the TrainJob's name."""
    sort: str = "lastSeen"
    descending: bool = True
    offset: int = 0
    limit: int = PAGE

    def matches(self, summary: Summary) -> bool:
        return all(test(summary) for test in self.tests())

    def tests(self) -> list[Callable[[Summary], bool]]:
        """One small test per part the query sets, the cheapest first: what a scan of every TrainJob runs."""
        tests: list[Callable[[Summary], bool]] = []
        if state := self.state:
            tests.append(lambda s: s.state == state)
        if runtime := self.runtime:
            tests.append(lambda s: s.runtime == runtime)
        if name := self.name:
            tests.append(lambda s: name in s.name)
        if self.created_from is not None or self.created_to is not None:
            lo = self.created_from if self.created_from is not None else -math.inf
            hi = self.created_to if self.created_to is not None else math.inf
            tests.append(lambda s: lo <= (s.created_at or s.first_seen) <= hi)
        tests += [r.test() for r in self.selector]
        if (metric := self.metric) is not None:
            tests.append(lambda s: s.progress is not None and metric.matches(s.progress.metrics))
        return tests


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """A label selector as ``kubectl get -l`` takes it; a clause that does not parse is a ``BadQuery``."""
    out: list[Requirement] = []
    for clause in _clauses(text):
        clause = clause.strip()
        if not clause:
            continue
        if m := re.fullmatch(rf"({_KEY})\s+(in|notin)\s+\(([^)]*)\)", clause):
            values = frozenset(v.strip() for v in m.group(4).split(","))
            if not all(re.fullmatch(_VALUE, v) for v in values):
                raise BadQuery(f"a value in {clause!r} is not a label value")
            out.append(Requirement(m.group(1), m.group(3), values))
        elif m := re.fullmatch(rf"({_KEY})\s*(==|=|!=)\s*({_VALUE})", clause):
            out.append(Requirement(m.group(1), "!=" if m.group(3) == "!=" else "=", frozenset({m.group(4)})))
        elif m := re.fullmatch(rf"!\s*({_KEY})", clause):
            out.append(Requirement(m.group(1), "!exists"))
        elif re.fullmatch(_KEY, clause):
            out.append(Requirement(clause, "exists"))
        else:
            raise BadQuery(f"{clause!r} is not a selector clause (key=value, key!=value, key in (a,b), key, !key)")
    return tuple(out)


def _clauses(text: str) -> list[str]:
    """The selector split at the commas outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def parse_metric(text: str) -> MetricCondition:
    m = _METRIC.match(text)
    if m is None:
        raise BadQuery(f"{text!r} is not a metric condition (for example: loss < 0.3)")
    try:
        value = float(m.group(3))
    except ValueError:
        raise BadQuery(f"{m.group(3)!r} in {text!r} is not a number") from None
    if not math.isfinite(value):
        raise BadQuery(f"{text!r} compares with {m.group(3)!r}: a finite number is needed")
    return MetricCondition(m.group(1), m.group(2), value)


def parse_time(text: str, now: float) -> float:
    """``2026-12-01``, ``2026-12-01T10:00:00Z`` (no zone: UTC), or an age before ``now`` (``30m``, ``24h``, ``7d``)."""
    text = text.strip()
    if m := _AGE.match(text):
        return now - float(m.group(1)) * _AGE_SECONDS[m.group(2)]
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadQuery(f"{text!r} is not a time (a date, an RFC 3339 time, or an age such as 24h or 7d)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _whole(params: Mapping[str, str], key: str, default: int, least: int) -> int:
    text = params.get(key)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise BadQuery(f"{key} must be a whole number") from None
    if value < least:
        raise BadQuery(f"{key} must be at least {least}")
    return value


def query_of(params: Mapping[str, str], *, now: float, most: int, default_limit: int) -> Query:
    """The query a request's parameters ask for; ``most`` caps the page size."""
    state = params.get("state") or ""
    if state and state not in STATES:
        raise BadQuery(f"unknown state {state!r}; one of {', '.join(STATES)}")
    sort = params.get("sort") or "-lastSeen"
    descending = sort.startswith("-")
    key = sort.removeprefix("-")
    if key not in SORTS and not (key.startswith("metric:") and len(key) > len("metric:")):
        raise BadQuery(f"unknown sort {key!r}; one of {', '.join(SORTS)} or metric:NAME, '-' first for descending")
    created_from = parse_time(params["from"], now) if params.get("from") else None
    created_to = parse_time(params["to"], now) if params.get("to") else None
    if created_from is not None and created_to is not None and created_to < created_from:
        raise BadQuery("the time range ends before it starts")
    return Query(
        selector=parse_selector(params.get("labelSelector") or ""),
        runtime=(params.get("runtime") or "").strip(),
        state=state,
        created_from=created_from,
        created_to=created_to,
        metric=parse_metric(params["metric"]) if (params.get("metric") or "").strip() else None,
        name=(params.get("name") or "").strip(),
        sort=key,
        descending=descending,
        offset=_whole(params, "offset", 0, 0),
        limit=min(_whole(params, "limit", default_limit, 1), most),
    )


_STATE_ORDER = {state: i for i, state in enumerate(STATES)}
_ATTRIBUTES = {"lastSeen": "last_seen", "name": "name", "namespace": "namespace", "nodes": "nodes"}


def _values(key: str, rows: Sequence[Summary], cluster_of: Callable[[Summary], str]) -> list[Any]:
    """The value each row sorts by; ``None`` for a row without it (those go last whichever the direction)."""
    if key in _ATTRIBUTES:
        return list(map(operator.attrgetter(_ATTRIBUTES[key]), rows))
    if key.startswith("metric:"):
        metric = key.removeprefix("metric:")

        def value(s: Summary) -> float | None:
            text = s.progress.metrics.get(metric) if s.progress is not None else None
            try:
                number = float(text) if text is not None else math.nan
            except ValueError:
                return None
            return None if math.isnan(number) else number

        return list(map(value, rows))
    getters: dict[str, Callable[[Summary], Any]] = {
        "created": lambda s: s.created_at or s.first_seen,
        "state": lambda s: _STATE_ORDER.get(s.state, len(STATES)),
        "runtime": lambda s: s.runtime or None,
        "cluster": cluster_of,
        "progress": lambda s: s.progress.percentage if s.progress is not None else None,
    }
    return list(map(getters[key], rows))


def find(
    query: Query, rows: Iterable[Summary], cluster_of: Callable[[Summary], str] = lambda _: ""
) -> tuple[list[Summary], int]:
    """The page of summaries the query asks for and how many match in all; ``cluster_of`` names a row's
    cluster (at a fleet's hub), for sorting by it.

    Among equal values rows keep the order they came in (the index's, which does not change between asks), so a
    page is the same on every ask; rows without the sorted value (no such metric) come last. Only the rows up to
    the page's end are ordered when that is a small part of them (a heap, not a sort of every match): a page of
    50 out of 100,000 matches costs a scan, not a sort."""
    chosen = rows if isinstance(rows, list) else list(rows)
    for test in query.tests():  # each test a pass over what the ones before it kept
        chosen = list(filter(test, chosen))
    values = _values(query.sort, chosen, cluster_of)
    known: Sequence[int] = range(len(chosen))
    if None in values:
        known = [i for i, v in enumerate(values) if v is not None]
    end = query.offset + query.limit
    if end * 8 < len(known):
        order = (heapq.nlargest if query.descending else heapq.nsmallest)(end, known, key=values.__getitem__)
    else:
        order = sorted(known, key=values.__getitem__, reverse=query.descending)
    if len(order) < end and len(known) < len(chosen):
        order += [i for i, v in enumerate(values) if v is None][: end - len(order)]
    return [chosen[i] for i in order[query.offset : end]], len(chosen)
