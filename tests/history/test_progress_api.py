"""Training progress and the owner's story over the JSON API, against the real nats-server and apiserver.

The series of a TrainJob comes back in the order the updates were accepted, with every metric, as JSON and
as a CSV a spreadsheet opens safely; the list carries the newest values and says which Running job went
quiet for longer than ``--stalled-after``; a ServiceAccount without rights in the namespace gets a refusal
and nothing else; the timeline names the job's states with Trainer's reasons and says each record in plain
words; and ``tjpipe history`` prints the updates too.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from .progress_support import ACCURACY, LOSS, STALLED_AFTER, Story, publish_progress
from .support import get, run_async

pytestmark = [pytest.mark.cluster, pytest.mark.nats]


def _api(story: Story, path: str, who: str | None) -> tuple[int, Any, dict[str, str]]:
    status, body, headers = get(f"{story.server.url}/api/v1{path}", story.tokens[who] if who else None)
    try:
        return status, json.loads(body), headers
    except ValueError:
        return status, body.decode(), headers


def _gamma(story: Story) -> str:
    return f"/namespaces/{story.namespace}/trainjobs/gamma"


def test_the_series_holds_every_update_in_order_with_each_metric(story: Story) -> None:
    status, body, _ = _api(story, _gamma(story) + "/progress", "viewer")
    assert status == 200
    points = body["points"]
    assert [p["progressPercentage"] for p in points] == [12 * (i + 1) for i in range(len(LOSS))]
    assert [float(p["metrics"]["loss"]) for p in points] == list(LOSS)
    assert [float(p["metrics"]["accuracy"]) for p in points] == list(ACCURACY)
    assert body["metrics"] == ["accuracy", "loss", "phase"] and body["pods"] == ["gamma-node-0-0"]
    assert (body["total"], body["truncated"]) == (len(LOSS), False)
    times = [p["time"] for p in points]
    assert times == sorted(times) and all(p["at"].endswith("Z") and p["lastUpdatedTime"] for p in points)
    assert points[-1]["estimatedRemainingSeconds"] == (100 - 96) * 3
    assert body["trainjob"]["state"] == "Complete" and body["trainjob"]["progress"]["percentage"] == 96

    status, newest, _ = _api(story, _gamma(story) + "/progress?limit=3", "viewer")
    assert [p["progressPercentage"] for p in newest["points"]] == [72, 84, 96] and newest["truncated"] is True
    assert _api(story, _gamma(story) + "/progress?output=xml", "viewer")[0] == 400
    assert _api(story, f"/namespaces/{story.namespace}/trainjobs/nobody/progress", "viewer")[0] == 404


def test_the_csv_has_a_row_per_update_a_column_per_metric_and_no_formula(story: Story) -> None:
    status, text, headers = _api(story, _gamma(story) + "/progress?output=csv", "viewer")
    assert status == 200
    assert headers["Content-Type"].startswith("text/csv")
    assert headers["Content-Disposition"] == f'attachment; filename="{story.namespace}_gamma_progress.csv"'
    assert headers["Cache-Control"] == "no-store"
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == [
        "time_utc",
        "last_updated_time",
        "pod",
        "progress_percentage",
        "estimated_remaining_seconds",
        "accuracy",
        "loss",
        "phase",
    ]
    assert len(rows) == len(LOSS)
    assert [float(r["loss"]) for r in rows] == list(LOSS)
    assert [int(r["progress_percentage"]) for r in rows] == [12 * (i + 1) for i in range(len(LOSS))]
    assert rows[0]["phase"] == "'=warmup" and all(r["phase"] == "" for r in rows[1:])
    assert all(r["pod"] == "gamma-node-0-0" and r["time_utc"].endswith("Z") for r in rows)
    assert text.count("\r\n") == len(LOSS) + 1


def test_a_serviceaccount_without_rights_in_the_namespace_gets_nothing(story: Story) -> None:
    paths = [
        _gamma(story) + "/progress",
        _gamma(story) + "/progress?output=csv",
        _gamma(story) + "/history",
        f"/namespaces/{story.namespace}/trainjobs",
    ]
    for path in paths:
        status, body, _ = _api(story, path, "outsider")
        assert status == 403, path
        assert set(body) == {"status", "error"}, path
        assert "gamma-node" not in json.dumps(body) and "loss" not in json.dumps(body)
        assert _api(story, path, None)[0] == 401, path
    # The viewer of one namespace reads nothing of another's progress, named or listed.
    for path in (f"/namespaces/{story.other}/trainjobs/hidden/progress", f"/namespaces/{story.other}/trainjobs"):
        status, body, _ = _api(story, path, "viewer")
        assert status == 403 and set(body) == {"status", "error"}, path
    assert _api(story, f"/namespaces/{story.namespace}/trainjobs/hidden/progress", "viewer")[0] == 404


def _listed(story: Story, name: str) -> dict[str, Any]:
    status, body, _ = _api(story, f"/namespaces/{story.namespace}/trainjobs", "viewer")
    assert status == 200
    return next(j for j in body["items"] if j["name"] == name)


def test_the_list_shows_the_newest_values_and_a_running_job_that_went_quiet_as_stalled(story: Story) -> None:
    gamma = _listed(story, "gamma")
    assert gamma["progress"]["percentage"] == 96 and gamma["progress"]["metrics"] == {
        "loss": "0.31",
        "accuracy": "0.84",
    }
    assert gamma["progress"]["updates"] == len(LOSS)
    assert gamma["stalled"] is False  # Complete: quiet because it is done

    delta = _listed(story, "delta")
    assert delta["state"] == "Running" and delta["progress"] is None
    assert delta["stalled"] is False  # never reported: nothing to stall

    run_async(
        lambda: publish_progress(
            story.nats_url, story.admin_creds, story.namespace, "delta", pod="delta-0", percent=5, metrics={"loss": "3"}
        )
    )
    reported = time.monotonic()
    deadline = reported + 10
    while (delta := _listed(story, "delta"))["progress"] is None:
        assert time.monotonic() < deadline, "the update never reached the list"
        time.sleep(0.2)
    if time.monotonic() - reported < STALLED_AFTER - 0.5:
        assert delta["stalled"] is False and delta["stalledSeconds"] is None
    deadline = time.monotonic() + STALLED_AFTER + 10
    while not (delta := _listed(story, "delta"))["stalled"]:
        assert time.monotonic() < deadline, "a Running job quiet for longer than --stalled-after is not stalled"
        time.sleep(0.3)
    assert delta["stalledSeconds"] >= STALLED_AFTER  # the API rounds to a tenth: 4.04 s quiet reads 4.0
    assert _api(story, f"/namespaces/{story.namespace}/trainjobs/delta/progress", "viewer")[1]["trainjob"]["stalled"]


def test_the_timeline_tells_the_states_with_reasons_and_each_record_in_plain_words(story: Story) -> None:
    status, body, _ = _api(story, _gamma(story) + "/history", "viewer")
    assert status == 200
    states = body["states"]
    assert [s["state"] for s in states] == ["Created", "Running", "Complete"]
    assert states[-1]["reason"] == "AllJobsCompleted" and states[-1]["to"] is None
    assert states[1]["seconds"] > 1.5  # it ran while it reported (8 updates, 0.25 s apart)
    texts = [e["text"] for e in body["entries"]]
    assert texts[0] == "Created"
    assert "Running" in texts
    assert "Complete — AllJobsCompleted: jobset completed successfully" in texts
    assert not [t for t in texts if "rv " in t or "policy" in t or "TJ_" in t or "observed_at" in t]
    skipped = [e for e in body["entries"] if e["kind"] == "result" and e["detail"]["action"] == "skipped"]
    assert len(skipped) == 1 and skipped[0]["tone"] == "skipped"
    assert skipped[0]["text"].startswith("Left the TrainJob's status as it was: stale status")
    assert {e["tone"] for e in body["entries"] if e["kind"] == "result"} == {"ok", "skipped"}
    assert not [e for e in body["entries"] if e["kind"] == "progress"]  # the chart draws those
    # The list's "Events" and the timeline's event count are one figure.
    assert body["counts"]["event"] == _listed(story, "gamma")["events"] == 3


def test_tjpipe_history_prints_the_progress_updates(story: Story) -> None:
    env = {**os.environ, "NATS_URL": story.nats_url, "NATS_CREDS": str(story.reader_creds)}
    run = [sys.executable, "-m", "tjpipe", "history", f"{story.namespace}/gamma"]
    done = subprocess.run([*run, "-o", "json"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    rows = [r for r in json.loads(done.stdout) if r["kind"] == "progress"]
    assert [r["detail"]["progressPercentage"] for r in rows] == [12 * (i + 1) for i in range(len(LOSS))]
    assert rows[-1]["summary"].startswith("96% · 12s left · accuracy 0.84 · loss 0.31")
    wide = env | {"COLUMNS": "250"}
    table = subprocess.run(run, env=wide, capture_output=True, text=True, timeout=60, check=False)
    assert table.returncode == 0, table.stderr
    assert "progress" in table.stdout and "loss 0.31" in table.stdout
    # One row for the run of updates, naming how many, the first and the last; each one with --every-progress.
    assert f"{len(LOSS)} progress updates: 12%" in table.stdout and "loss 2.31" in table.stdout
    assert table.stdout.count("loss ") == 2
    every = subprocess.run(
        [*run, "--every-progress"], env=wide, capture_output=True, text=True, timeout=60, check=False
    )
    assert every.returncode == 0, every.stderr
    assert every.stdout.count("loss ") == len(LOSS) and "progress updates:" not in every.stdout
