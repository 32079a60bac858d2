"""The demo's training stand-in and progress line: the pure parts."""

from __future__ import annotations

from tjpipe.demo import progress_line
from tjpipe.standin import go_duration_seconds


def test_go_durations_as_the_simulated_nodes_read_the_run_time_annotation() -> None:
    assert go_duration_seconds("90s") == 90
    assert go_duration_seconds("1m30s") == 90
    assert go_duration_seconds("1h") == 3600
    assert go_duration_seconds("") is None and go_duration_seconds("soon") is None


def test_the_progress_line_says_what_the_training_code_reported() -> None:
    line = progress_line(
        {
            "progressPercentage": 40,
            "estimatedRemainingSeconds": 12,
            "metrics": [{"name": "loss", "value": "0.52"}, {"name": "epoch", "value": "2"}],
            "lastUpdatedTime": "2026-12-03T22:40:01Z",
        }
    )
    assert line == "40% · ETA 12s · loss=0.52 epoch=2 · reported 22:40:01Z"
    assert progress_line({"lastUpdatedTime": "2026-12-03T22:40:01Z"}) == "reported 22:40:01Z"
