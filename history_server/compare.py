"""Comparing runs: 2 to 10 TrainJobs side by side, their progress and each metric they all report on one time
axis, aligned by the moment each started running, with a table of what differs (runtime, nodes, duration,
final state, final metrics).

Why aligned by start: the runs of a sweep are launched minutes or days apart, and what their owner compares is
how each run went from its own start (MLflow's "relative time"), not the wall clock. A run's start is when its
events first showed it Running; one that never ran starts at its first record. Why only the metrics they all
report: a line that exists for one run only compares nothing, and its values are on that run's own page.

A pure function of each run's timeline entries and progress points, read by the handler under the same
authorization as one TrainJob's page (``get`` on every TrainJob compared), so the page, the CSV and the tests
see the same comparison.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from history_server import story

if TYPE_CHECKING:
    from tjpipe.history_tools import ProgressPoint, TimelineEntry

MOST = 10
LEAST = 2


@dataclass(frozen=True)
class Run:
    namespace: str
    name: str
    runtime: str
    nodes: int | None
    labels: dict[str, str]
    entries: Sequence[TimelineEntry]
    points: Sequence[ProgressPoint]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else math.nan
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _start(run: Run, phases: Sequence[story.Phase]) -> float:
    running = next((p.start for p in phases if p.state == "Running"), None)
    if running is not None:
        return running
    times = [e.time for e in run.entries if e.kind == "event"] + [p.time for p in run.points]
    return min(times) if times else 0.0


def shared_metrics(runs: Sequence[Run]) -> list[str]:
    """The metrics every run reported at least one number of, in name order."""
    each = [{m for p in run.points for m, v in p.metrics.items() if _number(v) is not None} for run in runs]
    return sorted(set.intersection(*each)) if each else []


def comparison(runs: Sequence[Run], now: float) -> dict[str, Any]:
    """The comparison as the page draws it: per run its facts and its series (seconds since its start)."""
    metrics = shared_metrics(runs)
    out = []
    for run in runs:
        phases = story.phases(run.entries)
        start = _start(run, phases)
        last = phases[-1] if phases else None
        ended = last is not None and last.state in ("Complete", "Failed")
        end = last.start if ended and last is not None else None
        newest = run.points[-1] if run.points else None
        out.append(
            {
                "namespace": run.namespace,
                "name": run.name,
                "runtime": run.runtime,
                "nodes": run.nodes,
                "labels": run.labels,
                "state": last.state if last is not None else "",
                "reason": last.reason if last is not None else "",
                "start": start,
                "seconds": round((end if end is not None else now) - start, 3) if start else None,
                "finished": ended,
                "finalMetrics": dict(newest.metrics) if newest is not None else {},
                "finalProgress": newest.percentage if newest is not None else None,
                "series": [
                    {
                        "t": round(p.time - start, 3),
                        "progress": p.percentage,
                        "metrics": {m: _number(p.metrics.get(m)) for m in metrics},
                    }
                    for p in run.points
                ],
            }
        )
    return {"metrics": metrics, "trainjobs": out}


def comparison_csv(compared: dict[str, Any]) -> str:
    """One row per progress update of each run: the run, seconds since its start, progress and each shared
    metric; a cell a spreadsheet would read as a formula is prefixed with a quote."""
    metrics: list[str] = compared["metrics"]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["trainjob", "seconds_since_start", "progress_percentage", *metrics])
    for run in compared["trainjobs"]:
        key = f"{run['namespace']}/{run['name']}"
        for point in run["series"]:
            values = [point["metrics"].get(m) for m in metrics]
            writer.writerow(
                [
                    _safe(key),
                    point["t"],
                    point["progress"] if point["progress"] is not None else "",
                    *("" if v is None else v for v in values),
                ]
            )
    return buffer.getvalue()


def _safe(text: str) -> str:
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
