"""Finding TrainJobs, as a pure function of the index's summaries: label selectors as kubectl reads them, a
newest-metric condition, a time range, sorting by any column with those that lack it last, pages that are the
same on every ask, and a clear refusal of words that do not parse."""

from __future__ import annotations

import pytest

from history_server.find import BadQuery, find, parse_metric, parse_selector, parse_time, query_of
from history_server.index import Progress, Summary

NOW = 1_800_000_000.0


def _job(name: str, *, labels: dict[str, str] | None = None, loss: str | None = None, **more: object) -> Summary:
    summary = Summary(namespace="ns", name=name, labels=labels or {}, **more)  # type: ignore[arg-type]
    if loss is not None:
        summary.progress = Progress(received_at=NOW, metrics={"loss": loss})
    return summary


JOBS = [
    _job(
        "lr-1",
        labels={"team": "nlp", "sweep": "lr"},
        loss="0.25",
        runtime="torch",
        state="Complete",
        created_at=NOW - 3600,
        last_seen=NOW - 10,
        nodes=2,
    ),
    _job(
        "lr-2",
        labels={"team": "nlp", "sweep": "lr"},
        loss="0.41",
        runtime="torch",
        state="Complete",
        created_at=NOW - 7200,
        last_seen=NOW - 20,
        nodes=4,
    ),
    _job(
        "lr-3",
        labels={"team": "nlp", "sweep": "lr", "canary": ""},
        loss="nan",
        runtime="torch",
        state="Failed",
        created_at=NOW - 86400 * 3,
        last_seen=NOW - 30,
    ),
    _job("vision", labels={"team": "cv"}, runtime="deepspeed", state="Running", created_at=NOW - 60, last_seen=NOW),
]


def _names(params: dict[str, str]) -> list[str]:
    query = query_of(params, now=NOW, most=1000, default_limit=1000)
    page, _ = find(query, JOBS)
    return [s.name for s in page]


def test_a_label_selector_reads_as_kubectl_reads_it() -> None:
    assert _names({"labelSelector": "team=nlp"}) == ["lr-1", "lr-2", "lr-3"]
    assert _names({"labelSelector": "team!=nlp"}) == ["vision"]
    assert _names({"labelSelector": "team in (cv, other),!sweep"}) == ["vision"]
    assert _names({"labelSelector": "team notin (cv)"}) == ["lr-1", "lr-2", "lr-3"]
    assert _names({"labelSelector": "canary"}) == ["lr-3"]
    assert _names({"labelSelector": "team==nlp, sweep=lr, !canary"}) == ["lr-1", "lr-2"]
    for bad in ("team=(", "=x", "team in cv", "a b"):
        with pytest.raises(BadQuery):
            parse_selector(bad)


def test_the_newest_metric_a_runtime_a_state_and_a_time_range_narrow_the_list() -> None:
    assert _names({"metric": "loss < 0.3"}) == ["lr-1"]
    assert _names({"metric": "loss>=0.25"}) == ["lr-1", "lr-2"]  # NaN matches nothing, no metric matches nothing
    assert _names({"runtime": "deepspeed"}) == ["vision"]
    assert _names({"state": "Complete", "labelSelector": "sweep=lr"}) == ["lr-1", "lr-2"]
    assert _names({"from": "24h"}) == ["vision", "lr-1", "lr-2"]
    assert _names({"from": "3h", "to": "30m"}) == ["lr-1", "lr-2"]
    assert parse_time("2027-01-15", NOW) == parse_time("2027-01-15T00:00:00Z", NOW)
    assert str(parse_metric("loss<0.3")) == "loss < 0.3"
    for bad in ("loss", "loss < x", "< 3", "loss < inf"):
        with pytest.raises(BadQuery):
            parse_metric(bad)
    with pytest.raises(BadQuery, match="ends before it starts"):
        query_of({"from": "1h", "to": "2h"}, now=NOW, most=10, default_limit=10)
    with pytest.raises(BadQuery, match="unknown state"):
        query_of({"state": "Done"}, now=NOW, most=10, default_limit=10)


def test_any_column_sorts_with_those_lacking_it_last_and_pages_are_stable() -> None:
    assert _names({}) == ["vision", "lr-1", "lr-2", "lr-3"]
    assert _names({"sort": "lastSeen"}) == ["lr-3", "lr-2", "lr-1", "vision"]
    assert _names({"sort": "metric:loss"}) == ["lr-1", "lr-2", "lr-3", "vision"]  # "nan" is no number: last
    assert _names({"sort": "-metric:loss"}) == ["lr-2", "lr-1", "lr-3", "vision"]
    assert _names({"sort": "-nodes"}) == ["lr-2", "lr-1", "lr-3", "vision"]
    assert _names({"sort": "created"}) == ["lr-3", "lr-2", "lr-1", "vision"]
    assert _names({"sort": "state"}) == ["vision", "lr-1", "lr-2", "lr-3"]
    assert _names({"sort": "name", "offset": "1", "limit": "2"}) == ["lr-2", "lr-3"]
    query = query_of({"limit": "2", "offset": "2"}, now=NOW, most=1000, default_limit=50)
    page, total = find(query, JOBS)
    assert total == 4 and [s.name for s in page] == ["lr-2", "lr-3"]
    assert query_of({"limit": "5000"}, now=NOW, most=1000, default_limit=50).limit == 1000
    for bad in ({"sort": "colour"}, {"limit": "0"}, {"offset": "-1"}, {"limit": "ten"}):
        with pytest.raises(BadQuery):
            query_of(bad, now=NOW, most=1000, default_limit=50)
