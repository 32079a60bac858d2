"""The demo's training stand-in and progress line: the pure parts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tjpipe.demo import progress_line
from tjpipe.standin import _REPORTER, go_duration_seconds


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


def test_the_stand_in_sends_100_percent_before_the_pod_ends_and_stops(tmp_path: Path) -> None:
    """The SDK lets one report through every 5 s: the stand-in must reach 100 % a throttle window before the pod's
    run time is over, send it, and stop, or the demo's TrainJobs finish showing their last report short of it."""
    sdk = tmp_path / "kubeflow" / "trainer"
    sdk.mkdir(parents=True)
    (tmp_path / "kubeflow" / "__init__.py").write_text("")
    (sdk / "__init__.py").write_text(
        "import json, os\n"
        "calls = 0\n"
        "def update_trainjob_status(**report):\n"
        "    global calls\n"
        "    calls += 1\n"
        "    sent = calls % 3 == 0  # the throttle holds twice in three calls\n"
        "    with open(os.environ['REPORTS'], 'a') as out:\n"
        "        out.write(json.dumps({'sent': sent, **report}) + '\\n')\n"
        "    return sent\n"
    )
    reports = tmp_path / "reports.jsonl"
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "REPORTS": str(reports)}
    # A 20 s pod that has run for 13 s: 100 % is due now (20 s less the 5 s window and a second of slack).
    subprocess.run([sys.executable, "-c", _REPORTER, "20", "13"], env=env, check=True, timeout=30)
    sent = [json.loads(line) for line in reports.read_text().splitlines() if json.loads(line)["sent"]]
    assert [r["progress_percent"] for r in sent] == [100]
    assert sent[0]["estimated_remaining_seconds"] == 0
