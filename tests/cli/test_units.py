"""The pure parts of the operator commands: names, times, and YAML that keeps user text as written."""

from __future__ import annotations

import datetime as dt

import pytest
import yaml

from tjpipe import opscli
from tjpipe.cli import main
from tjpipe.contracts.messages import ObjectKey
from tjpipe.exits import ExitCode, UsageError


def test_trainjob_names_as_kubectl_writes_them() -> None:
    assert opscli.trainjob_key("ns/job", None) == ObjectKey(namespace="ns", name="job")
    assert opscli.trainjob_key("job", "ns") == ObjectKey(namespace="ns", name="job")
    assert opscli.trainjob_key("job", None) == ObjectKey(namespace="default", name="job")
    assert opscli.trainjob_key("ns/job", "ns") == ObjectKey(namespace="ns", name="job")
    assert opscli.trainjob_key("a" * 63, "0-9") == ObjectKey(namespace="0-9", name="a" * 63)
    for bad in ("a" * 64, "9job", "job-", "j_b", "*", ">", "", "ns/", "/job", "ns/j.b"):
        with pytest.raises(UsageError):
            opscli.trainjob_key(bad, None)


def test_since_is_a_duration_ago_or_an_iso_time() -> None:
    now = 1_000_000.0
    assert opscli.parse_since("90s", now=now) == now - 90
    assert opscli.parse_since("30m", now=now) == now - 1800
    assert opscli.parse_since("2h", now=now) == now - 7200
    assert opscli.parse_since("1d", now=now) == now - 86400
    assert opscli.parse_since(None) is None
    utc = dt.datetime(2026, 1, 31, 12, tzinfo=dt.UTC).timestamp()
    assert opscli.parse_since("2026-01-31T12:00:00Z") == utc
    assert opscli.parse_since("2026-01-31T12:00:00") == utc  # no zone: UTC, as the tables print
    assert opscli.parse_since("2026-01-31T13:00:00+01:00") == utc
    for bad in ("2x", "-1h", "yesterday", "1.5h"):
        with pytest.raises(UsageError):
            opscli.parse_since(bad)


@pytest.mark.parametrize(
    "text",
    [
        "x = batch[i]\nopen('[/opt/x]')\n",
        "trailing spaces   \nkeep\n",
        "no final newline\nsecond",
        "  leading indent\n",
        "[bold]:smile:[/bold]",
        "tab\there\n",
        "ünïcode ✓\n",
    ],
)
def test_yaml_round_trips_user_text_exactly(text: str) -> None:
    assert yaml.safe_load(opscli.to_yaml({"command": [text]})) == {"command": [text]}


def test_multi_line_text_is_a_literal_block() -> None:
    assert opscli.to_yaml({"source": "x = batch[i]\ny = 1\n"}) == "source: |\n  x = batch[i]\n  y = 1\n"


def test_replay_all_with_a_namespace_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--all", "-n", "team"]) == ExitCode.USAGE
    assert capsys.readouterr().err == "error: --all replays every namespace; -n/--namespace goes with a NAME\n"
