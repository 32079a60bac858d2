"""Pure helpers for the benchmark: percentiles, targets, Prometheus text, request accounting, Markdown.

Nothing here does I/O or reads a clock, so all of it is unit-tested with plain values
(``tests/unit/test_bench_stats.py``). The scenarios measure; this module only counts and describes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

# ------------------------------------------------------------------------------------------ percentiles


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) by linear interpolation between closest ranks; ``None`` if empty.

    The same definition as numpy's default (``method="linear"``), so p50 of an even count is the mean of
    the middle two and p100 is the maximum.
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return float(ordered[low])
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    """Count, min, mean, p50, p95, p99 and max of ``values`` (``None`` for each statistic when empty)."""
    if not values:
        return {"count": 0, "min": None, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}
    return {
        "count": len(values),
        "min": float(min(values)),
        "mean": sum(values) / len(values),
        "p50": percentile(values, 50),
        "p95": percentile(values, 95),
        "p99": percentile(values, 99),
        "max": float(max(values)),
    }


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, or ``None`` when either is missing or the denominator is zero."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def rate(count: float, seconds: float | None) -> float | None:
    """Events per second, or ``None`` for a zero or missing duration."""
    if seconds is None or seconds <= 0:
        return None
    return count / seconds


def build_outcome(n: int, built: int, good: int, problems: Mapping[str, str], span: float | None) -> dict[str, Any]:
    """What a run of ``n`` TrainJobs got built, the same figures for every side measured: how many were built and
    how many with the right spec, the first three problems (or how many were built, if short), and throughput
    over ``span`` only when every one was built."""
    complete = built == n
    return {
        "built": built,
        "complete": complete,
        "good": good,
        "good_percent": 100.0 * good / n if n else 0.0,
        "problem": "; ".join(list(problems.values())[:3]) if problems else ("" if complete else f"{built}/{n} built"),
        "seconds": span,
        "trainjobs_per_s": rate(built, span) if complete else None,
    }


# ---------------------------------------------------------------------------------------------- targets

Op = Literal["<=", ">=", "=="]


@dataclass(frozen=True)
class Target:
    """A bound a figure must respect, e.g. ``Target("<=", 0.050, "s")``."""

    op: Op
    value: float
    unit: str = ""

    def met(self, figure: float | None) -> bool | None:
        """Whether ``figure`` is within the bound; ``None`` when there is no figure to judge."""
        if figure is None or (isinstance(figure, float) and math.isnan(figure)):
            return None
        if self.op == "<=":
            return figure <= self.value
        if self.op == ">=":
            return figure >= self.value
        return figure == self.value

    def met_bounded(self, figure: float | None, bound: Bound) -> bool | None:
        """Like ``met``, for a figure that may be only a bound of the true value (``"at most"``, ``"at least"``).

        A bound decides one way only: an upper bound within ``<=`` is met, a lower bound outside it is not;
        anything else about a bound is ``None`` (undecided).
        """
        met = self.met(figure)
        if bound is None or met is None or self.op == "==":
            return met
        decides = "at most" if self.op == "<=" else "at least"
        if bound == decides:
            return True if met else None
        return False if not met else None

    def describe(self) -> str:
        symbol = {"<=": "≤", ">=": "≥", "==": "="}[self.op]
        return f"{symbol} {format_value(self.value, self.unit)}"


Bound = Literal["at most", "at least"] | None
"""Whether a figure is the true value (``None``) or only a bound of it, e.g. a wait that ended first."""
BOUND_SIGN = {"at most": "< ", "at least": "> "}


def verdict(met: bool | None) -> str:
    if met is None:
        return "no figure"
    return "met" if met else "not met"


def check(
    section: str, figure: str, value: float | None, unit: str, target: Target | None, *, bound: Bound = None
) -> dict[str, Any]:
    """One row of the report's list of figures: the value (or a ``bound`` of it), its target and the verdict."""
    met = target.met_bounded(value, bound) if target is not None else None
    return {
        "section": section,
        "figure": figure,
        "value": value,
        "bound": bound,
        "unit": unit,
        "display": (BOUND_SIGN[bound] if bound and value is not None else "") + format_value(value, unit),
        "target": target.describe() if target is not None else None,
        "target_op": target.op if target is not None else None,
        "target_value": target.value if target is not None else None,
        "met": met,
        "verdict": verdict(met) if target is not None else "reference",
    }


# --------------------------------------------------------------------------------------------- formatting


def format_value(value: float | None, unit: str = "") -> str:
    """A figure for people: seconds under one as milliseconds, large counts with thousands separators."""
    if value is None:
        return "n/a"
    if unit == "s":
        if abs(value) < 1.0:
            return f"{value * 1000:.1f} ms"
        return f"{value:.2f} s"
    if unit == "%":
        return f"{value:.1f}%"
    if unit == "MB":
        return f"{value:.1f} MB"
    if unit == "x":
        return f"{value:.3f}x"
    if float(value).is_integer() and abs(value) >= 1:
        text = f"{int(value):,}"
    elif abs(value) >= 100:
        text = f"{value:,.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".rstrip() if unit else text


# --------------------------------------------------------------------------------------- Prometheus text

_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of metric ``name`` in Prometheus text format, as (labels, value).

    Only exact-name lines are read (``name{...} v`` or ``name v``), so a histogram's ``_bucket`` lines
    never match its base name. Lines are filtered by prefix before any regex runs: the API server's
    ``/metrics`` holds many thousands of lines and only a few hundred matter here.
    """
    out: list[tuple[dict[str, str], float]] = []
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name) :]
        if rest.startswith("{"):
            end = rest.rfind("}")
            if end < 0:
                continue
            labels = {k: _unescape(v) for k, v in _LABEL.findall(rest[1:end])}
            value_text = rest[end + 1 :].split()
        elif rest.startswith(" "):
            labels = {}
            value_text = rest.split()
        else:
            continue
        if not value_text:
            continue
        try:
            out.append((labels, float(value_text[0])))
        except ValueError:
            continue
    return out


def _unescape(value: str) -> str:
    return value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


def sum_by(rows: Iterable[tuple[dict[str, str], float]], *keys: str) -> dict[tuple[str, ...], float]:
    """Sum sample values grouped by the given label names (a missing label counts as empty)."""
    out: dict[tuple[str, ...], float] = {}
    for labels, value in rows:
        group = tuple(labels.get(k, "") for k in keys)
        out[group] = out.get(group, 0.0) + value
    return out


def delta(after: Mapping[Any, float], before: Mapping[Any, float]) -> dict[Any, float]:
    """Per-key difference of two counter snapshots; keys that did not move are left out."""
    out: dict[Any, float] = {}
    for key in set(after) | set(before):
        moved = after.get(key, 0.0) - before.get(key, 0.0)
        if moved:
            out[key] = moved
    return out


# ------------------------------------------------------------------------------------ request accounting

RequestKey = tuple[str, str, str]
"""(resource, subresource, verb) as ``apiserver_request_total`` labels them."""

TRACKED_RESOURCES = ("jobsets", "configmaps", "secrets", "podgroups", "trainjobs")
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
VERB_ORDER = ("APPLY", "PATCH", "POST", "PUT", "DELETE", "DELETECOLLECTION", "GET", "LIST", "WATCH")
APPLY_PATCH = "application/apply-patch+yaml"
APISERVER_HOUSEKEEPING = frozenset(
    {
        "leases",
        "endpoints",
        "endpointslices",
        "services",
        "servicecidrs",
        "ipaddresses",
        "flowschemas",
        "prioritylevelconfigurations",
    }
)
"""Resources the kube-apiserver itself reads and writes on a timer (its identity lease, the ``kubernetes``
Service and its endpoints, flow control): no controller measured here touches them (Trainer's leader
election is off), so they are left out of a controller's requests."""


def apiserver_requests(text: str) -> dict[RequestKey, float]:
    """``apiserver_request_total`` summed by (resource, subresource, verb), over every code and scope."""
    rows = samples(text, "apiserver_request_total")
    return {(r, s, v): n for (r, s, v), n in sum_by(rows, "resource", "subresource", "verb").items()}


def classify_request(
    method: str, path: str, *, params: Mapping[str, str] | None = None, content_type: str | None = None
) -> RequestKey | None:
    """How the API server labels one request in ``apiserver_request_total``; ``None`` for non-resource paths.

    ``/api/v1/namespaces/ns/configmaps`` is a LIST (or a WATCH with ``watch=true``), a named path a GET;
    a PATCH with the apply content type is counted as APPLY; ``namespaces/<ns>`` alone is the namespace.
    """
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if not parts or parts[0] not in ("api", "apis"):
        return None
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    if not rest:
        return None  # discovery
    if rest[0] == "namespaces" and len(rest) >= 3:
        rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else None
    subresource = rest[2] if len(rest) > 2 else ""
    method = method.upper()
    watch = (params or {}).get("watch") in ("true", "1")
    if method == "GET" and name is not None:
        verb = "GET"
    elif method == "GET":
        verb = "WATCH" if watch else "LIST"
    elif method == "PATCH":
        verb = "APPLY" if (content_type or "").startswith(APPLY_PATCH) else "PATCH"
    elif method == "DELETE" and name is None:
        verb = "DELETECOLLECTION"
    else:
        verb = method
    return (resource, subresource, verb)


def pipeline_requests(
    server_delta: Mapping[RequestKey, float],
    own: Mapping[RequestKey, float],
    *,
    resources: Sequence[str] = TRACKED_RESOURCES,
) -> dict[RequestKey, float]:
    """The API server's request counts on ``resources`` less the benchmark's own requests (never below 0)."""
    out: dict[RequestKey, float] = {}
    for key, count in server_delta.items():
        if key[0] not in resources:
            continue
        remaining = count - own.get(key, 0.0)
        if remaining > 0:
            out[key] = remaining
    return out


def by_verb(counts: Mapping[RequestKey, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for (_, _, verb), count in counts.items():
        out[verb] = out.get(verb, 0.0) + count
    return out


def by_resource_verb(counts: Mapping[RequestKey, float]) -> dict[str, float]:
    """``"jobsets APPLY"``, ``"trainjobs/status APPLY"``: flat keys that read well in JSON."""
    out: dict[str, float] = {}
    for (resource, subresource, verb), count in sorted(counts.items()):
        label = f"{resource}/{subresource}" if subresource else resource
        out[f"{label} {verb}"] = out.get(f"{label} {verb}", 0.0) + count
    return out


def writes(counts: Mapping[RequestKey, float]) -> float:
    return sum(count for (_, _, verb), count in counts.items() if verb in WRITE_VERBS)


def per_each(counts: Mapping[str, float], n: int) -> dict[str, float]:
    return {key: value / n for key, value in counts.items()} if n > 0 else {}


def ordered_verbs(verbs: Iterable[str]) -> list[str]:
    known = [v for v in VERB_ORDER if v in verbs]
    return known + sorted(v for v in verbs if v not in VERB_ORDER)


# ------------------------------------------------------------------------------------------------ /proc


def parse_status_kib(status_text: str, field: str) -> int | None:
    """A ``kB`` field of ``/proc/<pid>/status`` (e.g. ``VmRSS``) in KiB; ``None`` when it is absent."""
    for line in status_text.splitlines():
        if line.startswith(field + ":"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return int(parts[1])
    return None


def cpu_model(cpuinfo_text: str) -> str:
    """The ``model name`` of the first processor in ``/proc/cpuinfo`` (other architectures name it else)."""
    for key in ("model name", "Model Name", "cpu model", "Processor", "model"):
        for line in cpuinfo_text.splitlines():
            name, sep, value = line.partition(":")
            if sep and name.strip() == key and value.strip():
                return value.strip()
    return "unknown"


def kib_to_mb(kib: int | None) -> float | None:
    """KiB (as /proc reports ``kB``) to MB of 10^6 bytes, the unit the memory target is stated in."""
    return None if kib is None else kib * 1024 / 1_000_000


# --------------------------------------------------------------------------------------------- Markdown


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table; ``|`` inside cells is escaped."""

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines.extend("| " + " | ".join(cell(v) for v in row) + " |" for row in rows)
    return "\n".join(lines)


def _figure(checks: Sequence[Mapping[str, Any]], section: str, figure: str) -> Mapping[str, Any] | None:
    for row in checks:
        if row["section"] == section and row["figure"] == figure:
            return row
    return None


def _with_verdict(row: Mapping[str, Any] | None) -> tuple[str, str, str]:
    if row is None:
        return ("n/a", "—", "—")
    return (str(row["display"]), row["target"] or "—", row["verdict"] if row["target"] else "—")


def _ms(value: float | None) -> str:
    return format_value(value, "s")


def _x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def render_markdown(report: Mapping[str, Any]) -> str:
    """The whole ``report.md`` from the ``report.json`` structure."""
    meta = report.get("meta", {})
    machine = report.get("machine", {})
    checks: list[Mapping[str, Any]] = list(report.get("checks", []))
    sc: Mapping[str, Any] = report.get("scenarios", {})
    out: list[str] = ["# trainjob-pipeline benchmark", ""]
    out.append(f"Command: `{meta.get('command', '')}`  ")
    out.append(f"Started: {meta.get('started', '')}; took {format_value(meta.get('duration_s'), 's')}.  ")
    out.append(f"Backends: {meta.get('backend', '')}.  ")
    if meta.get("skipped"):
        out.append(f"Skipped: {', '.join(meta['skipped'])}.  ")
    out.append("")
    out.append(
        "All figures were measured side by side in this one run, on this machine; ratios compare runs of the "
        "same report. Each figure stands next to its target where it has one."
    )
    out.append("")

    out.append("## Machine")
    out.append("")
    out.append(
        table(
            ["what", "value"],
            [
                ("CPU", machine.get("cpu_model", "")),
                ("cores", machine.get("cores", "")),
                ("memory", format_value(machine.get("memory_gib"), "GiB")),
                ("Python", machine.get("python", "")),
                ("platform", machine.get("platform", "")),
                (
                    "load average at start / end",
                    f"{machine.get('loadavg_start', '')} / {machine.get('loadavg_end', '')}",
                ),
            ],
        )
    )
    out.append("")

    targeted = [c for c in checks if c["target"]]
    out.append("## Targets")
    out.append("")
    if targeted:
        out.append(
            table(
                ["section", "figure", "value", "target", "verdict"],
                [(c["section"], c["figure"], c["display"], c["target"], c["verdict"]) for c in targeted],
            )
        )
        met = sum(1 for c in targeted if c["met"])
        out.append("")
        out.append(f"{met} of {len(targeted)} targets met.")
    else:
        out.append("No targeted figure was measured.")
    out.append("")

    if "reference" in sc:
        out.extend(_render_reference(sc, checks))
    if "floor" in sc:
        out.extend(_render_floor(sc["floor"]))
    if "e2e" in sc:
        out.extend(_render_e2e(sc["e2e"], checks, floor=sc.get("floor")))
    if "write_amplification" in sc:
        out.extend(_render_write_amp(sc["write_amplification"], checks))
    if "planner" in sc:
        out.extend(_render_planner(sc["planner"], checks))
    if "memory" in sc:
        out.extend(_render_memory(sc["memory"], checks))
    if "lifecycle" in sc:
        out.extend(_render_lifecycle(sc["lifecycle"]))
    if "history" in sc:
        out.extend(_render_history(sc["history"]))
    if "status_flood" in sc:
        out.extend(_render_status_flood(sc["status_flood"]))

    notes = report.get("notes") or []
    if notes:
        out.append("## Notes")
        out.append("")
        out.extend(f"- {note}" for note in notes)
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _render_floor(f: Mapping[str, Any]) -> list[str]:
    rows = []
    for run in f.get("runs", []):
        lat = run.get("latency", {})
        per = run.get("requests_per_trainjob_by_verb") or {}
        rows.append(
            (
                run.get("label", ""),
                format_value(run.get("trainjobs_per_s")),
                f"{_ms(lat.get('p50'))} / {_ms(lat.get('p99'))}",
                ", ".join(f"{v} {per[v]:.2f}" for v in ordered_verbs(per)) or "n/a",
                run.get("errors", 0),
            )
        )
    return [
        "## 1. Apiserver floor",
        "",
        "What the API server does per TrainJob whoever the controller is, with no controller running: each "
        "TrainJob is created, then the applies the planner makes for a new TrainJob (`planner.core.plan`, "
        "encoded beforehand as the applier encodes them, with the created TrainJob's uid) are sent in order, "
        f"{(f.get('runs') or [{}])[0].get('concurrency', '')} TrainJobs at a time. Nothing watches. Latency: "
        "create sent to last apply answered. End-to-end throughput is stated as a share of the floor of the "
        "same mix (section 2); the floor replaces the raw SSA ceiling, which left out the TrainJob's creation.",
        "",
        table(["floor", "TrainJobs/s", "latency p50 / p99", "requests per TrainJob", "errors"], rows),
        "",
    ]


def _render_e2e(
    e: Mapping[str, Any], checks: Sequence[Mapping[str, Any]], *, floor: Mapping[str, Any] | None = None
) -> list[str]:
    out = [
        "## 2. End to end",
        "",
        "TrainJobs created as fast as the client can (bounded concurrency), each creation time taken "
        "client-side when the API server answered the POST. Latency = the JobSet's `ApplyResult.finished_at` "
        "(TJ_RESULTS) minus that creation time. Throughput = N ÷ (last required component applied minus first "
        "create sent). Ratios are to the apiserver floor of the same mix (section 1; torch runs and the paced "
        "run to the torch floor, mix runs to the mix floor): throughput e2e ÷ floor, higher is better; latency "
        "e2e ÷ floor, lower is better.",
        "",
    ]
    rows = []
    for run in e.get("runs", []):
        lat = run.get("latency", {})
        rat = run.get("ratios", {})
        rows.append(
            (
                run["label"],
                run["n"],
                format_value(run.get("trainjobs_per_s")),
                _x(rat.get("throughput")),
                f"{_ms(lat.get('p50'))} / {_ms(lat.get('p95'))} / {_ms(lat.get('p99'))}",
                f"{_x(rat.get('p50'))} / {_x(rat.get('p95'))} / {_x(rat.get('p99'))}",
                format_value(run.get("create_per_s")),
                f"{run.get('good', 0)}/{run['n']}" + (f" ({run['problem']})" if run.get("problem") else ""),
            )
        )
    out.append(
        table(
            [
                "run",
                "N",
                "TJ/s",
                "TJ/s ÷ floor",
                "latency p50 / p95 / p99",
                "÷ floor p50 / p95 / p99",
                "client creates/s",
                "all components, correct spec",
            ],
            rows,
        )
    )
    out.append("")
    staged = [r for r in [*e.get("runs", []), *([e["paced"]] if e.get("paced") else [])] if r.get("stages")]
    if staged:
        names = list(staged[0]["stages"])
        out.append(
            "Where the latency goes, p50 / p99 per stage (stream timestamps): watcher = created to event stored; "
            "planner = event to JobSet apply message stored; applier wait = message stored to applier start; "
            "applier work = the applier's own duration for the JobSet."
        )
        out.append("")
        rows = []
        for run in staged:
            cells = []
            for stage in names:
                summary = run["stages"].get(stage) or {}
                cells.append(f"{_ms(summary.get('p50'))} / {_ms(summary.get('p99'))}")
            rows.append((run["label"], *cells))
        out.append(table(["run", *names], rows))
        out.append("")
    out.extend(_render_cpu(e, floor))
    paced = e.get("paced")
    if paced:
        lat = paced.get("latency", {})
        value, target, verdict_text = _with_verdict(_figure(checks, "end to end", "paced p99 latency"))
        achieved = format_value(paced.get("create_per_s"))
        over = format_value(paced.get("create_seconds"), "s")
        out.append(
            f"Paced run: {paced['n']} torch TrainJobs at {paced.get('rate', 0):g}/s "
            f"(achieved {achieved}/s over {over}). "
            f"Latency p50 {_ms(lat.get('p50'))}, p95 {_ms(lat.get('p95'))}, max {_ms(lat.get('max'))}."
        )
        out.append("")
        out.append(
            table(["figure", "value", "target", "verdict"], [("paced p99 latency", value, target, verdict_text)])
        )
        out.append("")
    return out


CPU_ORDER = ("kube-apiserver", "etcd", "nats", "watcher", "planner", "applier", "benchmark")


def _render_cpu(e: Mapping[str, Any], floor: Mapping[str, Any] | None) -> list[str]:
    """CPU milliseconds per TrainJob by process: on two shared cores, the budget every figure comes out of."""
    measured: list[tuple[str, int, Mapping[str, float]]] = []
    for run in (floor or {}).get("runs", []):
        if run.get("cpu_seconds"):
            measured.append((f"floor {run['label']}", int(run.get("trainjobs", 0)), run["cpu_seconds"]))
    for run in [*e.get("runs", []), *([e["paced"]] if e.get("paced") else [])]:
        if run.get("cpu_seconds"):
            measured.append((run["label"], int(run.get("created", 0)), run["cpu_seconds"]))
    if not measured:
        return []
    names = [n for n in CPU_ORDER if any(n in used for _, _, used in measured)]
    names += sorted({n for _, _, used in measured for n in used} - set(names))
    rows = []
    for label, count, used in measured:
        per = [1000 * used.get(n, 0.0) / count if count else None for n in names]
        total = sum(p for p in per if p is not None)
        rows.append((label, *(format_value(p) for p in per), format_value(total)))
    return [
        "Where the CPU goes: CPU milliseconds per TrainJob by process (user + system, from /proc), over the "
        "measured window (floor: its creates and applies; end to end: first create until every component was "
        "applied). On two cores every process shares one budget, so the end-to-end rate can approach the floor "
        "only as far as the work the floor leaves out (watches and the pipeline itself) is small.",
        "",
        table(["run", *names, "total"], rows),
        "",
    ]


def _render_write_amp(w: Mapping[str, Any], checks: Sequence[Mapping[str, Any]]) -> list[str]:
    situations = w.get("situations", [])
    verbs: set[str] = set()
    for s in situations:
        verbs.update(s.get("per_trainjob_by_verb", {}))
    columns = ordered_verbs(verbs)
    out = [
        "## 3. Write amplification",
        "",
        f"API requests per TrainJob by verb, from the API server's own `apiserver_request_total` for "
        f"{', '.join(w.get('resources', TRACKED_RESOURCES))} (status subresource included), less the benchmark's "
        "own requests (its TrainJob creates and verification reads), divided by the TrainJobs present. "
        "Writes are PATCH, APPLY, POST, PUT and DELETE. Messages stored per TrainJob are the NATS writes: "
        "each stream's sequence delta (events, apply messages, results, dead letters, and the apply ledger's "
        "KV bucket, which stores each claim and each record); acks are not stored and not counted.",
        "",
    ]
    rows = []
    for s in situations:
        per = s.get("per_trainjob_by_verb", {})
        row = _figure(checks, "write amplification", f"writes per TrainJob: {s['name']}")
        rows.append(
            (
                s["name"],
                s.get("trainjobs", 0),
                *(f"{per.get(v, 0.0):.2f}" for v in columns),
                f"{s.get('writes_per_trainjob', 0.0):.3f}",
                f"{int(s.get('writes', 0))}",
                row["target"] if row and row["target"] else "—",
                row["verdict"] if row and row["target"] else "—",
            )
        )
    out.append(table(["situation", "TrainJobs", *columns, "writes/TJ", "writes", "target", "verdict"], rows))
    out.append("")
    for s in situations:
        details = []
        if s.get("events"):
            details.append("watcher events " + ", ".join(f"{k}={int(v)}" for k, v in sorted(s["events"].items())))
        if s.get("applies"):
            details.append("apply outcomes " + ", ".join(f"{k}={int(v)}" for k, v in sorted(s["applies"].items())))
        if s.get("bus_messages_per_trainjob"):
            details.append(
                "messages stored per TrainJob "
                + ", ".join(f"{k} {v:.2f}" for k, v in s["bus_messages_per_trainjob"].items())
            )
        if s.get("by_resource"):
            details.append("requests " + ", ".join(f"{k}={int(v)}" for k, v in s["by_resource"].items()))
        if s.get("quiet_after_s") is not None and not s["name"].startswith("creation"):
            details.append(f"the bus settled {format_value(s['quiet_after_s'], 's')} after the action")
        if s.get("note"):
            details.append(s["note"])
        if details:
            out.append(f"- **{s['name']}**: " + "; ".join(details) + ".")
    out.append("")
    return out


def _render_planner(p: Mapping[str, Any], checks: Sequence[Mapping[str, Any]]) -> list[str]:
    out = [
        "## 4. Planner microbenchmark",
        "",
        "Per event, what the planner service does minus I/O: verify the event's signature, decode it, `plan()`, "
        "then for each apply message encode it, hash its message id, build its subject and sign it. One thread; "
        "plans per CPU-second "
        f"of this process (so other load on the machine does not count against it). Event: a new TrainJob "
        f"({p.get('event', '')}), {format_value(p.get('seconds_per_runtime'), 's')} per runtime.",
        "",
    ]
    rows = []
    for r in p.get("runtimes", []):
        row = _figure(checks, "planner", f"plans/s/core: {r['runtime']}")
        value, target, verdict_text = _with_verdict(row)
        rows.append(
            (
                r["runtime"],
                value,
                format_value(r.get("wall_plans_per_s")),
                f"{r.get('us_per_plan', 0):.1f}",
                r.get("messages_per_plan", ""),
                r.get("warnings") or "",
                target,
                verdict_text,
            )
        )
    out.append(
        table(
            ["runtime", "plans/s/core", "plans/s (wall)", "µs/plan", "messages/plan", "warnings", "target", "verdict"],
            rows,
        )
    )
    out.append("")
    sig = p.get("signatures")
    if sig:
        out += [
            f"Signatures (ed25519, CPU µs) on a new TrainJob's messages ({sig.get('runtime', '')}); the planner's "
            "figures above include verifying the event and signing its apply messages. Per TrainJob plan, "
            f"signing and verifying every message once costs {sig.get('us_per_trainjob_plan', 0):.0f} µs in all ("
            + ", ".join(f"{k} {v:.0f} µs" for k, v in (sig.get("us_by_service") or {}).items())
            + ").",
            "",
            table(
                ["message", "bytes", "µs sign", "µs verify"],
                [
                    (m["message"], m["bytes"], f"{m['us_sign']:.1f}", f"{m['us_verify']:.1f}")
                    for m in sig.get("messages", [])
                ],
            ),
            "",
        ]
    return out


def _render_memory(m: Mapping[str, Any], checks: Sequence[Mapping[str, Any]]) -> list[str]:
    out = [
        "## 5. Memory",
        "",
        f"RSS (VmRSS of /proc/<pid>/status; MB = 10^6 bytes) of each service with {m.get('present', 0):,} "
        f"TrainJobs present and planned ({m.get('created', 0):,} created for this section, the rest by earlier "
        "sections), after the pipeline went quiet. VmHWM is the peak since the process started.",
        "",
    ]
    rows = []
    for s in m.get("services", []):
        value, target, verdict_text = _with_verdict(_figure(checks, "memory", f"RSS: {s['service']}"))
        rows.append((s["service"], s.get("pid", ""), value, format_value(s.get("hwm_mb"), "MB"), target, verdict_text))
    out.append(table(["service", "pid", "RSS", "peak (VmHWM)", "target", "verdict"], rows))
    out.append("")
    if m.get("note"):
        out.append(m["note"])
        out.append("")
    return out


# ----------------------------------------------------------------------------------------------- checks

PACED_P99 = Target("<=", 0.050, "s")
E2E_THROUGHPUT = Target(">=", 0.8, "x")
"""End-to-end TrainJobs/s as a share of the apiserver floor's (same mix), for every end-to-end run."""
VS_THROUGHPUT = Target(">=", 2.0, "x")
"""The pipeline's TrainJobs/s over Trainer's (shipped settings), the same load measured the same way."""
VS_CPU = Target("<=", 1.0, "x")
"""Controller-side CPU per TrainJob (watcher + planner + applier + nats-server) over Trainer's controller's."""
VS_RSS = Target("<=", 2.0, "x")
"""Controller-side RSS (the same processes, summed) over Trainer's controller's, at the same TrainJob count."""
VS_RSS_FILLED = Target("<=", 1.0, "x")
"""The same at the memory fill (10,000 TrainJobs by default), where the interpreters' fixed cost no longer
dominates (it was 2x there at first)."""
PIPELINE_SERVICES = ("watcher", "planner", "applier")
NO_WRITES = Target("<=", 0.0, "writes/TJ")
PLANNER_TORCH = Target(">=", 20_000.0, "plans/s")
SERVICE_RSS = Target("<=", 150.0, "MB")
ALL_BUILT = Target(">=", 100.0, "%")
PLANNER_TARGET_RUNTIME = "torch-distributed"
QUIET_SITUATIONS = ("resync", "restart")
"""Situations (by name prefix) whose target is zero writes: nothing changed, so nothing may be written."""


def add_ratios(scenarios: dict[str, Any]) -> None:
    """Each end-to-end run's throughput and latency as ratios to the floor of its mix, in place."""
    floors = {run.get("mix"): run for run in (scenarios.get("floor") or {}).get("runs", [])}
    e2e = scenarios.get("e2e") or {}
    for run in [*e2e.get("runs", []), *([e2e["paced"]] if e2e.get("paced") else [])]:
        mix = "torch" if set(run.get("kinds") or {"torch": 1}) <= {"torch"} else "mix"
        base = floors.get(mix) or {}
        b_lat = base.get("latency") or {}
        lat = run.get("latency") or {}
        run["ratios"] = {
            "floor": base.get("label"),
            "throughput": ratio(run.get("trainjobs_per_s"), base.get("trainjobs_per_s")),
            "p50": ratio(lat.get("p50"), b_lat.get("p50")),
            "p95": ratio(lat.get("p95"), b_lat.get("p95")),
            "p99": ratio(lat.get("p99"), b_lat.get("p99")),
        }


HISTORY_P99 = Target("<=", 0.200, "s")


def _render_history(h: Mapping[str, Any]) -> list[str]:
    out = ["## History server", ""]
    out.append(
        f"{h['trainjobs']} TrainJobs in {h['namespaces']} namespaces, {h['messages']} messages in the streams; "
        f"the index read them in {format_value(h.get('index_ready_s'), 's')}, and the server then held "
        f"{format_value(h.get('server_rss_mb'), 'MB')} ({format_value(h.get('server_hwm_mb'), 'MB')} at its peak)."
    )
    out.append("")
    rows = []
    for label, key in (("a namespace's list", "list_latency_s"), ("one timeline", "timeline_latency_s")):
        lat = h.get(key) or {}
        rows.append((label, lat.get("count"), format_value(lat.get("p50"), "s"), format_value(lat.get("p99"), "s")))
    out.append(table(["request", "count", "p50", "p99"], rows))
    out.append("")
    return out


VS_STATUS_WRITES = Target("<=", 0.5, "x")
"""Writes per update against Trainer's one: coalescing is the point of this project's status server."""


def status_flood_rows(flood: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The status-server flood side by side (``side_row`` rows): Trainer's status server, then the pipeline's."""
    t = flood.get("trainer") or {}
    p = flood.get("pipeline") or {}
    if not t and not p:
        return []

    def lat(run: Mapping[str, Any], q: str) -> float | None:
        value: float | None = (run.get("latency_s") or {}).get(q)
        return value

    return [
        side_row("updates accepted", "", t.get("accepted"), p.get("accepted")),
        side_row("updates/s accepted", "", t.get("accepted_per_s"), p.get("accepted_per_s")),
        side_row("p50 latency", "s", lat(t, "p50"), lat(p, "p50")),
        side_row("p99 latency", "s", lat(t, "p99"), lat(p, "p99")),
        side_row("API server writes of trainjobs/status", "", t.get("status_writes"), p.get("status_writes")),
        side_row(
            "API server writes per update",
            "",
            t.get("writes_per_update"),
            p.get("writes_per_update"),
            VS_STATUS_WRITES,
            "ratio",
        ),
    ]


def _render_status_flood(flood: Mapping[str, Any]) -> list[str]:
    out = ["## Status-server flood, side by side with Trainer v2.3.0's status server", ""]
    if flood.get("skipped") or flood.get("error"):
        out.extend([f"Not measured: {flood.get('skipped') or flood.get('error')}.", ""])
        return out
    n = flood.get("trainjobs", 0) * flood.get("pods_per_trainjob", 0)
    out.append(
        f"{flood.get('trainjobs')} TrainJobs x {flood.get('pods_per_trainjob')} pods x "
        f"{flood.get('updates_per_pod')} updates per side ({n * flood.get('updates_per_pod', 0)} updates), every pod "
        "posting its updates one after the other with a real projected token bound to it, all pods at once, over "
        "HTTPS, on one kube-apiserver: first to Trainer's own status server (its controller manager built from its "
        "module, shipped configuration with `TrainJobStatus` on: client limit 5 requests/s, burst 10), then to "
        "`tjpipe status-server` (coalescing interval "
        f"{format_value(flood.get('coalesce_s'), 's')}), each on TrainJobs of its own. Writes: the API server's "
        "`apiserver_request_total` for `trainjobs/status` (APPLY, PATCH, UPDATE) from the flood's start until its "
        "writes are done (for this project, one interval after the last answer). Latency as the client sees it. "
        "A 200 from Trainer means the TrainJob was written; from this project, that the update is stored in the "
        "history (JetStream acknowledged it), the TrainJob being written from there, coalesced. "
        "Ratios are this project ÷ Trainer, from one run of each side, one after the other.",
    )
    out.append("")
    out.append(side_by_side_table(status_flood_rows(flood)))
    out.append("")
    for side in ("trainer", "pipeline"):
        run = flood.get(side) or {}
        if run:
            answers = ", ".join(f"{code}: {count}" for code, count in (run.get("answers") or {}).items())
            out.append(
                f"- {run.get('label', side)}: answers {answers} over {format_value(run.get('flood_s'), 's')}; "
                f"{run.get('newest_shown')} of {flood.get('trainjobs')} TrainJobs show the newest update after it."
            )
    out.append("")
    return out


def build_checks(scenarios: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every reported figure with its target (or as a reference), in report order."""
    out: list[dict[str, Any]] = []
    for row in reference_rows(scenarios):
        if row["judge"] == "ratio":
            out.append(check("versus Trainer", row["figure"], row["ratio"], "x", row["target"]))
    for run in (scenarios.get("floor") or {}).get("runs", []):
        out.append(check("floor", f"{run['label']}: TrainJobs/s", run.get("trainjobs_per_s"), "", None))
    e2e = scenarios.get("e2e") or {}
    for run in e2e.get("runs", []):
        label = run["label"]
        lat = run.get("latency") or {}
        rat = run.get("ratios") or {}
        out.append(check("end to end", f"{label}: built with the right spec", run.get("good_percent"), "%", ALL_BUILT))
        out.append(check("end to end", f"{label}: TrainJobs/s", run.get("trainjobs_per_s"), "", None))
        out.append(check("end to end", f"{label}: TJ/s ÷ floor", rat.get("throughput"), "x", E2E_THROUGHPUT))
        for q in ("p50", "p95", "p99"):
            out.append(check("end to end", f"{label}: {q} latency", lat.get(q), "s", None))
            out.append(check("end to end", f"{label}: {q} ÷ floor", rat.get(q), "x", None))
    paced = e2e.get("paced")
    if paced:
        out.append(check("end to end", "paced: built with the right spec", paced.get("good_percent"), "%", ALL_BUILT))
        out.append(check("end to end", "paced p99 latency", (paced.get("latency") or {}).get("p99"), "s", PACED_P99))
    wa = scenarios.get("write_amplification") or {}
    for s in wa.get("situations", []):
        target = NO_WRITES if s["name"].startswith(QUIET_SITUATIONS) else None
        value = s.get("writes_per_trainjob") if "unavailable" not in s else None
        out.append(check("write amplification", f"writes per TrainJob: {s['name']}", value, "writes/TJ", target))
    planner = scenarios.get("planner") or {}
    for r in planner.get("runtimes", []):
        target = PLANNER_TORCH if r["runtime"] == PLANNER_TARGET_RUNTIME else None
        out.append(check("planner", f"plans/s/core: {r['runtime']}", r.get("plans_per_cpu_s"), "plans/s", target))
    for row in lifecycle_rows(scenarios.get("lifecycle") or {}):
        if row["judge"] == "ratio":
            out.append(check("lifecycle", row["figure"], row["ratio"], "x", row["target"], bound=row["ratio_bound"]))
        elif row["judge"] == "pipeline":
            bound: Bound = "at least" if "pipeline" in row["at_least"] else None
            out.append(check("lifecycle", row["figure"], row["pipeline"], row["unit"], row["target"], bound=bound))
    mem = scenarios.get("memory") or {}
    for s in mem.get("services", []):
        target = SERVICE_RSS if s["service"] in PIPELINE_SERVICES else None
        out.append(check("memory", f"RSS: {s['service']}", s.get("rss_mb"), "MB", target))
    for row in status_flood_rows(scenarios.get("status_flood") or {}):
        if row["judge"] == "ratio":
            out.append(check("status-server flood", row["figure"], row["ratio"], "x", row["target"]))
    history = scenarios.get("history") or {}
    for label, key in (("namespace list", "list_latency_s"), ("timeline", "timeline_latency_s")):
        if history.get(key):
            out.append(check("history server", f"{label} p50", history[key].get("p50"), "s", None))
            out.append(check("history server", f"{label} p99", history[key].get("p99"), "s", HISTORY_P99))
    if history:
        out.append(check("history server", "RSS with the index", history.get("server_rss_mb"), "MB", None))
    out.extend(pass_checks(scenarios))
    return out


PASS_SECTION = "interim"
PASS_THROUGHPUT = Target(">=", 1.5, "x")
PASS_CPU = Target("<=", 2.0, "x")
PASS_LIFECYCLE_CPU = Target("<=", 2.5, "x")
PASS_REACTION = Target("<=", 1.0, "s")
"""Interim targets, judged beside the long-term ones above, which stay as they are: creation
throughput and controller CPU against Trainer's, the lifecycle's controller CPU, and the median time from a
JobSet's finish to its TrainJob's (the reaction the pipeline must keep under a second)."""


def pass_checks(scenarios: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The figures the interim targets bound more loosely than the long-term ones, each with its interim bound."""
    out: list[dict[str, Any]] = []
    for row in reference_rows(scenarios):
        if row["figure"].startswith("throughput, torch"):
            out.append(check(PASS_SECTION, row["figure"], row["ratio"], "x", PASS_THROUGHPUT))
        elif row["figure"] == "CPU per TrainJob, controller side":
            out.append(check(PASS_SECTION, row["figure"], row["ratio"], "x", PASS_CPU))
    for row in lifecycle_rows(scenarios.get("lifecycle") or {}):
        if row["figure"] == "CPU per TrainJob, controller side":
            out.append(check(PASS_SECTION, f"lifecycle: {row['figure']}", row["ratio"], "x", PASS_LIFECYCLE_CPU))
        elif row["figure"] == "JobSet finished to TrainJob finished p50":
            out.append(check(PASS_SECTION, f"lifecycle: {row['figure']}", row["pipeline"], "s", PASS_REACTION))
    return out


# -------------------------------------------------------------------------------------- versus Trainer

TRAINER_PROCESS = "trainer-controller"
CONTROLLER_SIDE = (*PIPELINE_SERVICES, "nats")
"""The pipeline's processes that do what Trainer's controller does (the NATS server carries their work)."""
REFERENCE_CPU_ORDER = (TRAINER_PROCESS, *CONTROLLER_SIDE, "kube-apiserver", "etcd", "benchmark")
ONE_PROCESS_SIDE = ("controller", "nats")
"""``tjpipe controller`` (the three stages in one process) and the NATS server."""


def _per_trainjob_ms(run: Mapping[str, Any], process: str) -> float | None:
    used = (run.get("cpu_seconds") or {}).get(process)
    created = run.get("created") or 0
    return None if used is None or not created else 1000.0 * used / created


def _situation(scenarios: Mapping[str, Any], prefix: str) -> Mapping[str, Any]:
    for s in (scenarios.get("write_amplification") or {}).get("situations", []):
        if s["name"].startswith(prefix):
            found: Mapping[str, Any] = s
            return found
    return {}


def _pipeline_rss_at_fill(memory: Mapping[str, Any]) -> float | None:
    by_name = {s["service"]: s.get("rss_mb") for s in memory.get("services", [])}
    values = [by_name.get(name) for name in CONTROLLER_SIDE]
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def side_row(
    figure: str,
    unit: str,
    trainer: float | None,
    pipeline: float | None,
    target: Target | None = None,
    judge: str | None = None,
    at_least: Iterable[str] = (),
) -> dict[str, Any]:
    """One row of a side-by-side table: both sides' values, this project ÷ Trainer, and what a target judges.

    ``judge`` says what the target bounds: ``"ratio"`` (this project ÷ Trainer), ``"pipeline"`` (this
    project's own figure) or ``None`` (reference only, also whenever there is no target). ``at_least``
    names the sides (``"trainer"``, ``"pipeline"``) whose value is only a lower bound, e.g. the wait for
    all Complete that ended first; the ratio is then a bound too, or none when both are.
    """
    bounded = frozenset(at_least)
    ratio_bound: Bound = None
    if bounded == {"trainer"}:
        ratio_bound = "at most"
    elif bounded == {"pipeline"}:
        ratio_bound = "at least"
    return {
        "figure": figure,
        "unit": unit,
        "trainer": trainer,
        "pipeline": pipeline,
        "ratio": None if len(bounded) > 1 else ratio(pipeline, trainer),
        "at_least": sorted(bounded),
        "ratio_bound": ratio_bound,
        "target": target,
        "judge": judge if target is not None else None,
    }


def _side_cell(row: Mapping[str, Any], side: str) -> str:
    """One side's value in a side-by-side row: a dash where the figure is not that side's, ``>`` for a lower bound.

    A per-process CPU row (``CPU per TrainJob: <process>``) that only one side has shows a dash on the other.
    """
    value = row[side]
    dash = row["figure"].startswith("CPU per TrainJob: ")
    if value is None and (dash or (side == "trainer" and row["judge"] == "pipeline")):
        return "—"
    sign = BOUND_SIGN["at least"] if side in (row.get("at_least") or ()) and value is not None else ""
    return sign + format_value(value, row["unit"])


def side_by_side_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The Markdown table of ``side_row`` rows, each with its target and verdict (a bound decides one way only)."""
    body = []
    for r in rows:
        target: Target | None = r["target"]
        at_least = r.get("at_least") or ()
        ratio_bound: Bound = r.get("ratio_bound")
        if r["judge"] == "ratio":
            judged, bound = r["ratio"], ratio_bound
        else:
            judged, bound = r["pipeline"], ("at least" if "pipeline" in at_least else None)
        body.append(
            (
                r["figure"],
                _side_cell(r, "trainer"),
                _side_cell(r, "pipeline"),
                (BOUND_SIGN[ratio_bound] if ratio_bound and r["ratio"] is not None else "") + _x(r["ratio"]),
                (("ratio " if r["judge"] == "ratio" else "") + target.describe()) if target else "—",
                verdict(target.met_bounded(judged, bound)) if target else "—",
            )
        )
    return table(["figure", "Trainer v2.3.0", "this project", "ratio", "target", "verdict"], body)


def reference_rows(scenarios: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The side-by-side table with Trainer's controller: one row per figure, both sides, their ratio.

    ``judge`` (``side_row``) says what a row's target bounds, e.g. ``"pipeline"`` for zero writes on restart.
    Ratios are this project over Trainer for every row, so above 1 means more of it here.
    """
    ref = scenarios.get("reference") or {}
    if not ref:
        return []
    t_side = ref.get("trainer") or {}
    t = t_side.get("run") or {}
    p = (ref.get("pipeline") or {}).get("run") or {}
    n = ref.get("n", 0)
    rows: list[dict[str, Any]] = []

    def row(*args: Any) -> None:  # side_row's arguments
        rows.append(side_row(*args))

    row(
        f"throughput, torch N={n:,}", "TJ/s", t.get("trainjobs_per_s"), p.get("trainjobs_per_s"), VS_THROUGHPUT, "ratio"
    )
    t_lat, p_lat = t.get("latency") or {}, p.get("latency") or {}
    row("latency p50", "s", t_lat.get("p50"), p_lat.get("p50"))
    row("latency p99", "s", t_lat.get("p99"), p_lat.get("p99"))
    t_req, p_req = t.get("requests_per_trainjob_by_verb") or {}, p.get("requests_per_trainjob_by_verb") or {}
    for verb in ordered_verbs(set(t_req) | set(p_req)):
        row(
            f"API requests per TrainJob: {verb}",
            "",
            t_req.get(verb, 0.0) if t else None,
            p_req.get(verb, 0.0) if p else None,
        )
    row("API writes per TrainJob", "", t.get("writes_per_trainjob"), p.get("writes_per_trainjob"))
    row(
        "CPU per TrainJob, controller side",
        "ms",
        t.get("controller_cpu_ms_per_trainjob"),
        p.get("controller_cpu_ms_per_trainjob"),
        VS_CPU,
        "ratio",
    )
    for process in REFERENCE_CPU_ORDER:
        if process in (t.get("cpu_seconds") or {}) or process in (p.get("cpu_seconds") or {}):
            row(f"CPU per TrainJob: {process}", "ms", _per_trainjob_ms(t, process), _per_trainjob_ms(p, process))
    t_rss, p_rss = t.get("controller_rss_mb") or {}, p.get("controller_rss_mb") or {}
    row(f"RSS, controller side, {n:,} TrainJobs", "MB", t_rss.get("rss_mb"), p_rss.get("rss_mb"), VS_RSS, "ratio")
    row(f"peak RSS (VmHWM), controller side, {n:,} TrainJobs", "MB", t_rss.get("hwm_mb"), p_rss.get("hwm_mb"))
    t_mem = t_side.get("memory") or {}
    p_mem = scenarios.get("memory") or {}
    if t_mem or p_mem:
        count = int(ref.get("memory_jobs") or t_mem.get("present") or p_mem.get("present") or 0)
        row(
            f"RSS, controller side, {count:,} TrainJobs",
            "MB",
            (t_mem.get("controller_rss_mb") or {}).get("rss_mb"),
            _pipeline_rss_at_fill(p_mem) if p_mem else None,
            VS_RSS_FILLED,
            "ratio",
        )
    one = (ref.get("one_process") or {}).get("run") or {}
    if one:
        # The same figures for ``tjpipe controller``, which ran alone as well; the pipeline column holds them.
        tag = "one process (tjpipe controller)"
        row(f"throughput, {tag}", "TJ/s", t.get("trainjobs_per_s"), one.get("trainjobs_per_s"), VS_THROUGHPUT, "ratio")
        one_lat = one.get("latency") or {}
        row(f"latency p50, {tag}", "s", t_lat.get("p50"), one_lat.get("p50"))
        row(f"latency p99, {tag}", "s", t_lat.get("p99"), one_lat.get("p99"))
        row(f"API writes per TrainJob, {tag}", "", t.get("writes_per_trainjob"), one.get("writes_per_trainjob"))
        row(
            f"CPU per TrainJob, controller side, {tag}",
            "ms",
            t.get("controller_cpu_ms_per_trainjob"),
            one.get("controller_cpu_ms_per_trainjob"),
            VS_CPU,
            "ratio",
        )
        for process in ONE_PROCESS_SIDE:
            row(f"CPU per TrainJob: {process}, {tag}", "ms", None, _per_trainjob_ms(one, process))
        one_rss = one.get("controller_rss_mb") or {}
        row(
            f"RSS, controller side, {n:,} TrainJobs, {tag}",
            "MB",
            t_rss.get("rss_mb"),
            one_rss.get("rss_mb"),
            VS_RSS,
            "ratio",
        )
        row(
            f"peak RSS (VmHWM), controller side, {n:,} TrainJobs, {tag}",
            "MB",
            t_rss.get("hwm_mb"),
            one_rss.get("hwm_mb"),
        )
    restart = _situation(scenarios, "restart")
    row(
        "writes per TrainJob on restart",
        "writes/TJ",
        (t_side.get("restart") or {}).get("writes_per_trainjob"),
        restart.get("writes_per_trainjob") if restart and "unavailable" not in restart else None,
        NO_WRITES,
        "pipeline",
    )
    resync = _situation(scenarios, "resync")
    row(
        "writes per TrainJob on resync",
        "writes/TJ",
        None,
        resync.get("writes_per_trainjob") if resync and "unavailable" not in resync else None,
        NO_WRITES,
        "pipeline",
    )
    return rows


def _render_reference(sc: Mapping[str, Any], checks: Sequence[Mapping[str, Any]]) -> list[str]:
    ref = sc.get("reference") or {}
    t_side = ref.get("trainer") or {}
    t = t_side.get("run") or {}
    p = (ref.get("pipeline") or {}).get("run") or {}
    out = [
        "## Versus Trainer v2.3.0's controller",
        "",
        f"The same load, {ref.get('n', 0):,} torch TrainJobs created by the same client, on the same API server, "
        "one controller at a time: Trainer's first and alone, then everything it built deleted, then the "
        "pipeline in one process (`tjpipe controller`, rows marked so) the same way, then the pipeline's three "
        "services. Trainer's controller runs with its shipped settings"
        + (f" ({t_side['settings']})" if t_side.get("settings") else "")
        + ", leader election off (one replica; no Lease renewals in the counts), its webhooks served but not "
        "registered (the pipeline's side runs without an admission webhook too). A TrainJob is built when "
        "the benchmark's own watch sees its JobSet and its runtime snapshot ConfigMap; latency is the JobSet's "
        "sighting minus the create's answer; throughput is N over first create sent to last TrainJob built. "
        "CPU (user + system from /proc) and API requests (`apiserver_request_total`, less the benchmark's own "
        "and the API server's housekeeping) run from the first create to the controller's last activity. "
        "Controller side: Trainer's controller process; here watcher + planner + applier + nats-server. RSS "
        "is VmRSS when the run settled. Writes on restart: Trainer's controller restarted with its TrainJobs "
        "settled; the pipeline's from section 3 (every service restarted). Ratios are this "
        "project ÷ Trainer.",
        "",
        side_by_side_table(reference_rows(sc)),
        "",
    ]
    for side, run in (("Trainer", t), ("this project", p)):
        if run and run.get("problem"):
            out.append(f"- {side}: {run.get('good', 0)}/{run.get('n', 0)} built: {run['problem']}.")
    if t_side.get("left_behind"):
        out.append(f"- Trainer's objects not deleted before the pipeline started: {t_side['left_behind']}.")
    if t_side.get("exited"):
        out.append(f"- Trainer's controller had exited; last log lines: {t_side['exited']}")
    if not t_side:
        out.append("- Trainer's controller was not measured in this run (skipped or failed; see Notes).")
    out.append("- Trainer's resync is not measured: controller-runtime's default resync period is 10 hours.")
    out.append("")
    return out


VS_LIFECYCLE = Target("<=", 1.0, "x")
"""The lifecycle's status writes per TrainJob and its time to all Complete over Trainer's."""
LIFECYCLE_CPU_ORDER = (
    TRAINER_PROCESS,
    *CONTROLLER_SIDE,
    "kube-apiserver",
    "etcd",
    "kube-controller-manager",
    "kube-scheduler",
    "jobset-manager",
    "kwok",
    "benchmark",
)


def lifecycle_rows(life: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The lifecycle side by side (``side_row`` rows): Trainer's run and the pipeline's on simulated clusters."""
    t = life.get("trainer") or {}
    p = life.get("pipeline") or {}
    if not t and not p:
        return []
    rows: list[dict[str, Any]] = []

    def row(
        figure: str,
        unit: str,
        key: str,
        target: Target | None = None,
        judge: str | None = None,
        pick: Any = None,
    ) -> None:
        def value(run: Mapping[str, Any]) -> float | None:
            found = run.get(key)
            got: float | None = pick(found or {}) if pick is not None else found
            return got

        rows.append(side_row(figure, unit, value(t) if t else None, value(p) if p else None, target, judge))

    row("ran to Complete", "%", "complete_percent", ALL_BUILT, "pipeline")
    waits = {side: _time_to_all_complete(run) for side, run in (("trainer", t), ("pipeline", p))}
    rows.append(
        side_row(
            "time to all Complete",
            "s",
            waits["trainer"][0],
            waits["pipeline"][0],
            VS_LIFECYCLE,
            "ratio",
            at_least=[side for side, (_, exact) in waits.items() if not exact],
        )
    )
    for q in ("p50", "p99"):
        row(f"create to Complete {q}", "s", "time_to_finish", pick=lambda summary, q=q: summary.get(q))
    for q in ("p50", "p99"):
        row(f"create to JobSet finished {q}", "s", "time_to_jobset_finish", pick=lambda summary, q=q: summary.get(q))
    for q in ("p50", "p99"):
        row(
            f"JobSet finished to TrainJob finished {q}",
            "s",
            "finish_reaction",
            pick=lambda summary, q=q: summary.get(q),
        )
    row("status writes per TrainJob", "writes/TJ", "status_writes_per_trainjob", VS_LIFECYCLE, "ratio")
    for key, scope in (
        ("tracked_requests_per_trainjob_by_verb", "TrainJobs and components"),
        ("requests_per_trainjob_by_verb", "every resource"),
    ):
        t_req, p_req = t.get(key) or {}, p.get(key) or {}
        for verb in ordered_verbs(set(t_req) | set(p_req)):
            rows.append(
                side_row(
                    f"API requests per TrainJob, {scope}: {verb}",
                    "",
                    t_req.get(verb, 0.0) if t_req else None,
                    p_req.get(verb, 0.0) if p_req else None,
                )
            )
        if key.startswith("tracked"):
            row("API writes per TrainJob, TrainJobs and components", "", "tracked_writes_per_trainjob")
    row("CPU per TrainJob, controller side", "ms", "controller_cpu_ms_per_trainjob")
    used = {name for run in (t, p) for name in (run.get("cpu_seconds") or {})}
    for process in [*(n for n in LIFECYCLE_CPU_ORDER if n in used), *sorted(used - set(LIFECYCLE_CPU_ORDER))]:
        rows.append(
            side_row(f"CPU per TrainJob: {process}", "ms", _per_trainjob_ms(t, process), _per_trainjob_ms(p, process))
        )
    row("RSS, controller side, all Complete", "MB", "controller_rss_mb", pick=lambda m: m.get("rss_mb"))
    row("peak RSS (VmHWM), controller side", "MB", "controller_rss_mb", pick=lambda m: m.get("hwm_mb"))
    row("cluster start", "s", "cluster_start_seconds")
    row("the side, cluster start to stop", "s", "total_seconds")
    return rows


def _time_to_all_complete(run: Mapping[str, Any]) -> tuple[float | None, bool]:
    """(seconds, exact): a side's time to all Complete, or, when its wait ended first, how long it waited (a
    lower bound: its TrainJobs were not all Complete by then)."""
    if not run or run.get("seconds_to_all_complete") is not None or not run.get("created"):
        return (run.get("seconds_to_all_complete") if run else None), True
    waited = run.get("seconds_waited") or run.get("seconds_to_last_finished")
    return waited, waited is None  # without a wait there is no figure, so nothing to mark as a bound


def _render_lifecycle(life: Mapping[str, Any]) -> list[str]:
    out = [
        "## 6. Lifecycle on a simulated cluster, side by side with Trainer v2.3.0",
        "",
        f"{life.get('n', 0):,} torch TrainJobs per side on {life.get('nodes', '')} simulated nodes (kwok; each pod "
        f"succeeds {format_value(life.get('pod_run_seconds'), 's')} after it starts), with kube-controller-manager, "
        "kube-scheduler and JobSet's manager with its webhooks. Each side runs on a fresh simulated cluster of its "
        "own, built the same way, Trainer's controller first (shipped settings, webhooks served but not "
        "registered), then the pipeline's three services; they never run at the same time. Done = the benchmark's "
        "watch sees the TrainJob's `Complete` (or `Failed`) condition True; times run from the first create sent. "
        "The wait splits at the JobSet: create to JobSet finished (its `Completed` or `Failed` condition, seen by "
        "a second watch) is the simulated cluster's pace, JobSet finished to TrainJob finished the controller's "
        "reaction. "
        "Status writes: writes to `trainjobs/status` (only the controller writes it). Requests: "
        "`apiserver_request_total` deltas less the benchmark's own and the API server's housekeeping, from the "
        'first create to the controller\'s last activity; "every resource" includes the simulated '
        'controllers\' Jobs, Pods and JobSet status, "TrainJobs and components" counts TrainJobs, JobSets, '
        "ConfigMaps, Secrets and PodGroups only (JobSet's manager writes `jobsets/status`). CPU over the same "
        "window; RSS once the side settled. Controller side: Trainer's controller process; here watcher + "
        "planner + applier + nats-server. Ratios are this project ÷ Trainer.",
        "",
        side_by_side_table(lifecycle_rows(life)),
        "",
    ]
    for side in life.get("sides", []):
        run = life.get(side) or {}
        label = run.get("label", side)
        if run.get("outcomes"):
            outcomes = ", ".join(f"{k} {v}" for k, v in sorted(run["outcomes"].items()))
            out.append(f"- {label}: outcomes {outcomes} of {run.get('created', 0):,} created.")
        if run.get("applies"):
            out.append(
                f"- {label}: apply outcomes "
                + ", ".join(f"{k}={int(v)}" for k, v in sorted(run["applies"].items()))
                + "."
            )
        if run.get("trainjob_checks"):
            out.append(
                f"- {label}: TrainJob checks answered by "
                + ", ".join(f"{k}={int(v)}" for k, v in sorted(run["trainjob_checks"].items()))
                + "."
            )
        if run.get("error"):
            out.append(f"- {label}: failed: {run['error']}.")
    out.append("")
    return out
