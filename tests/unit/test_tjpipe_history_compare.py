"""Comparing runs as a pure function: aligned by the moment each started running, only the metrics every run
reported as numbers, durations to the end or so far, and a CSV a spreadsheet opens safely."""

from __future__ import annotations

import csv
import io

from history_server.compare import Run, comparison, comparison_csv, shared_metrics
from tjpipe.history_tools import ProgressPoint, TimelineEntry


def _event(time: float, state: str, reason: str = "") -> TimelineEntry:
    return TimelineEntry(time, "TJ_EVENTS", int(time), "event", "", {"state": state, "reason": reason})


def _point(time: float, percent: int | None, **metrics: str) -> ProgressPoint:
    return ProgressPoint(time, int(time), "pod-0", "", percent, None, dict(metrics))


def _run(name: str, entries: list[TimelineEntry], points: list[ProgressPoint]) -> Run:
    return Run("ns", name, "torch-distributed", 2, {"sweep": "lr"}, entries, points)


def test_runs_are_aligned_by_their_start_and_only_shared_numeric_metrics_are_charted() -> None:
    a = _run(
        "a",
        [_event(100, "Created"), _event(110, "Running"), _event(170, "Complete", "AllJobsCompleted")],
        [_point(120, 10, loss="2.0", acc="0.1"), _point(160, 100, loss="0.5", acc="0.9")],
    )
    b = _run("b", [_event(5000, "Created"), _event(5002, "Running")], [_point(5012, 50, loss="1.5", note="=x")])
    assert shared_metrics([a, b]) == ["loss"]
    out = comparison([a, b], now=5100)
    first, second = out["trainjobs"]
    assert out["metrics"] == ["loss"]
    assert [p["t"] for p in first["series"]] == [10, 50] and [p["t"] for p in second["series"]] == [10]
    assert first["seconds"] == 60 and first["finished"] and first["state"] == "Complete"
    assert second["seconds"] == 98 and not second["finished"] and second["state"] == "Running"
    assert first["finalMetrics"] == {"loss": "0.5", "acc": "0.9"} and first["finalProgress"] == 100
    assert first["series"][1]["metrics"] == {"loss": 0.5}


def test_the_csv_has_one_row_per_update_and_no_formula() -> None:
    a = _run("=cmd", [_event(0, "Running")], [_point(1, 5, loss="1"), _point(2, None, loss="nan")])
    b = _run("b", [_event(0, "Running")], [_point(3, 7, loss="0.5")])
    rows = list(csv.reader(io.StringIO(comparison_csv(comparison([a, b], now=10)))))
    assert rows[0] == ["trainjob", "seconds_since_start", "progress_percentage", "loss"]
    assert rows[1:] == [["ns/=cmd", "1", "5", "1.0"], ["ns/=cmd", "2", "", ""], ["ns/b", "3", "7", "0.5"]]
