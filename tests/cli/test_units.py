"""The pure parts of the operator commands: names, times, and YAML that keeps user text as written."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml

from contracts.messages import ObjectKey
from tjpipe import operator_commands
from tjpipe.cli import main
from tjpipe.exits import ExitCode, UsageError


def test_trainjob_names_as_kubectl_writes_them() -> None:
    assert operator_commands.trainjob_key("ns/job", None) == ObjectKey(namespace="ns", name="job")
    assert operator_commands.trainjob_key("job", "ns") == ObjectKey(namespace="ns", name="job")
    assert operator_commands.trainjob_key("job", None) == ObjectKey(namespace="default", name="job")
    assert operator_commands.trainjob_key("ns/job", "ns") == ObjectKey(namespace="ns", name="job")
    assert operator_commands.trainjob_key("a" * 63, "0-9") == ObjectKey(namespace="0-9", name="a" * 63)
    for bad in ("a" * 64, "9job", "job-", "j_b", "*", ">", "", "ns/", "/job", "ns/j.b"):
        with pytest.raises(UsageError):
            operator_commands.trainjob_key(bad, None)


def test_since_is_a_duration_ago_or_an_iso_time() -> None:
    now = 1_000_000.0
    assert operator_commands.parse_since("90s", now=now) == now - 90
    assert operator_commands.parse_since("30m", now=now) == now - 1800
    assert operator_commands.parse_since("2h", now=now) == now - 7200
    assert operator_commands.parse_since("1d", now=now) == now - 86400
    assert operator_commands.parse_since(None) is None
    utc = dt.datetime(2026, 1, 31, 12, tzinfo=dt.UTC).timestamp()
    assert operator_commands.parse_since("2026-01-31T12:00:00Z") == utc
    assert operator_commands.parse_since("2026-01-31T12:00:00") == utc  # no zone: UTC, as the tables print
    assert operator_commands.parse_since("2026-01-31T13:00:00+01:00") == utc
    for bad in ("2x", "-1h", "yesterday", "1.5h"):
        with pytest.raises(UsageError):
            operator_commands.parse_since(bad)


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
    assert yaml.safe_load(operator_commands.to_yaml({"command": [text]})) == {"command": [text]}


def test_multi_line_text_is_a_literal_block() -> None:
    assert operator_commands.to_yaml({"source": "x = batch[i]\ny = 1\n"}) == "source: |\n  x = batch[i]\n  y = 1\n"


def test_replay_all_with_a_namespace_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--all", "-n", "team"]) == ExitCode.USAGE
    assert capsys.readouterr().err == "error: --all replays every namespace; -n/--namespace goes with a NAME\n"


async def test_history_shows_each_undecodable_record_as_its_own_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from contracts import streams
    from contracts.messages import DeadLetter, encode
    from plumbing.bus_history import StoredMessage
    from tjpipe import history_tools

    letter = DeadLetter(stage="applier", reason="permanent", error="422", subject="s", payload=b"{}")
    stored = {
        name: [StoredMessage(stream=name, seq=1, subject=f"{name}.x", data=b"{not json", headers={}, time=1.0)]
        for name in (streams.EVENTS_HISTORY.name, streams.APPLY_HISTORY.name, streams.RESULTS.name)
    }
    stored[streams.DLQ.name] = [
        StoredMessage(stream=streams.DLQ.name, seq=1, subject="dlq.x", data=b"[]", headers={}, time=2.0),
        StoredMessage(stream=streams.DLQ.name, seq=2, subject="dlq.y", data=encode(letter), headers={}, time=3.0),
    ]
    stored[streams.PROGRESS.name] = [
        StoredMessage(stream=streams.PROGRESS.name, seq=1, subject="p.x", data=b"{}", headers={}, time=4.0)
    ]

    async def read_stream(js: object, stream: str, subject: str, **options: object) -> list[StoredMessage]:
        return stored[stream]

    monkeypatch.setattr(history_tools, "read_stream", read_stream)
    entries = await history_tools.history(None, ObjectKey(namespace="default", name="a"))  # type: ignore[arg-type]
    assert [(e.kind, e.summary) for e in entries] == [
        ("plan", "undecodable apply message"),
        ("event", "undecodable event"),
        ("result", "undecodable apply result"),
        ("dead-letter", "undecodable dead letter"),
        ("dead-letter", "applier: permanent: 422"),
        ("progress", "undecodable progress update"),
    ]


def test_tjpipe_up_prints_paths_urls_and_cluster_text_without_markup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from types import SimpleNamespace

    from tjpipe import cli
    from tjpipe.demo import DemoWatch
    from tjpipe.local.stack import StatePaths

    root = tmp_path / "state [bold]x[/]"
    stack = SimpleNamespace(
        paths=StatePaths(root),
        local_kube=None,
        kubeconfig=Path("/home/u/[prod]/kubeconfig"),
        nats_url="nats://[::1]:4222",
        nats_adopted=True,
        credentials=None,
    )
    cli._where(stack)
    watch = DemoWatch.__new__(DemoWatch)
    watch.namespace, watch.name, watch._say = "tjpipe-demo", "mnist", cli._say
    watch._print_status(
        (("Failed", "True", "Err[i]", "python -c 'x = batch[i]' [/opt/x] :smile:"),), (("node", 0, 0, 0, 1, 0),)
    )
    err = capsys.readouterr().err
    assert f"state folder: {root}\n" in err
    assert "  kubeconfig: /home/u/[prod]/kubeconfig   (an EXISTING cluster)\n" in err
    assert "  NATS:       nats://[::1]:4222   (an EXISTING server)\n" in err
    assert "  condition Failed=True reason=Err[i]: python -c 'x = batch[i]' [/opt/x] :smile:\n" in err
    assert "  jobsStatus node: active=0 ready=0 succeeded=0 failed=1 suspended=0\n" in err
