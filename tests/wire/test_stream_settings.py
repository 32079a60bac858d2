"""Stream retention and replicas come from the settings the edge passes in; contracts read no environment."""

from __future__ import annotations

import pytest

from tjpipe.contracts import streams


def test_retention_and_replicas_come_from_the_mapping_given() -> None:
    configured = {
        s.name: s for s in streams.configured_streams({"TJPIPE_EVENTS_MAX_AGE": "2h", "TJPIPE_STREAM_REPLICAS": "3"})
    }
    assert configured[streams.EVENTS.name].max_age_seconds == 7200
    assert {s.replicas for s in configured.values()} == {3}
    assert streams.stream_replicas({"TJPIPE_STREAM_REPLICAS": "3"}) == 3


def test_the_process_environment_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TJPIPE_EVENTS_MAX_AGE", "2h")
    monkeypatch.setenv("TJPIPE_STREAM_REPLICAS", "3")
    assert streams.configured_streams() == streams.configured_streams({})
    assert streams.stream_replicas() == 1
