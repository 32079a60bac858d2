"""The history server's retention decision and Run again's new TrainJob: pure parts, no bus, no cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts import subjects
from contracts.messages import ObjectKey, TrainJobDeleted, encode
from history_server.index import HistoryIndex, Summary
from history_server.rerun import RUN_AGAIN_OF, again, recorded_trainjob
from history_server.retention import BadPolicy, Keep, Policy, Retention, expired, kept_until, parse_policy

from .test_tjpipe_history_index import _observed, _stored

DONE = {"conditions": [{"type": "Complete", "status": "True"}]}
RUNNING = {"jobsStatus": [{"name": "node", "active": 2}]}


def _ended(namespace: str, name: str, at: float) -> Summary:
    return Summary(namespace=namespace, name=name, state="Complete", ended_at=at)


def test_the_policy_file_takes_a_default_and_namespaces_of_their_own() -> None:
    policy = parse_policy("default: {keepFor: 30d, maxTrainJobs: 1000}\nnamespaces:\n  scratch: {keepFor: 90m}\n")
    assert policy.of("team-a") == Keep(keep_for=30 * 86400.0, max_trainjobs=1000)
    assert policy.of("scratch") == Keep(keep_for=5400.0, max_trainjobs=None)
    assert parse_policy("") == Policy()


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("default: {keepFor: soon}", "keepFor 'soon'"),
        ("default: {keepFor: 0}", "more than 0"),
        ("default: {maxTrainJobs: 0}", "at least 1"),
        ("namespaces: {Not_A_Namespace: {keepFor: 1d}}", "not a namespace"),
        ("default: {keepfor: 1d}", "keepfor"),
        ("default: [", "policy.yaml"),
    ],
)
def test_a_bad_policy_says_what_is_wrong(text: str, said: str) -> None:
    with pytest.raises(BadPolicy, match=said):
        parse_policy(text, "policy.yaml")


def test_the_index_knows_when_a_trainjob_ended_and_a_new_one_of_its_name_lives_again() -> None:
    index = HistoryIndex()
    index.add_event(_observed("a", "one", 1, status=RUNNING))
    assert index.get("a", "one").ended_at == 0.0  # type: ignore[union-attr]
    index.add_event(_observed("a", "one", 2, status=DONE))
    index.add_event(_observed("a", "one", 3, status=DONE))  # a resync: still ended when it first did
    assert index.get("a", "one").ended_at == 102.0  # type: ignore[union-attr]
    deleted = TrainJobDeleted(key=ObjectKey(namespace="a", name="one"), uid="u1", observed_at=4.0)
    index.add_event(_stored(4, subjects.event_subject("a", "one"), encode(deleted), 104.0))
    assert index.get("a", "one").ended_at == 102.0  # type: ignore[union-attr]
    index.add_event(_observed("a", "one", 5, uid="u2"))  # made again: lives
    assert index.get("a", "one").ended_at == 0.0  # type: ignore[union-attr]
    index.add_event(_observed("a", "gone", 6))
    index.add_event(_stored(7, subjects.event_subject("a", "gone"), encode(deleted), 107.0))
    assert index.get("a", "gone").ended_at == 107.0  # type: ignore[union-attr]
    index.forget("a", "gone")
    index.forget("a", "one")
    assert index.namespaces() == []


def test_what_expired_is_what_ended_longer_ago_than_its_namespace_keeps_or_beyond_its_count() -> None:
    policy = Policy(
        default=Keep(keep_for=100.0),
        namespaces={"few": Keep(keep_for=1000.0, max_trainjobs=2), "forever": Keep()},
    )
    live = Summary(namespace="a", name="live", state="Running", first_seen=1.0)
    jobs = [
        live,
        _ended("a", "old", 800.0),
        _ended("a", "new", 950.0),
        _ended("few", "first", 500.0),
        _ended("few", "second", 600.0),
        _ended("few", "third", 700.0),
        _ended("forever", "ancient", 1.0),
    ]
    assert [(s.namespace, s.name) for s in expired(jobs, policy, now=1000.0)] == [("few", "first"), ("a", "old")]
    assert kept_until(jobs[2], policy.of("a")) == 1050.0
    assert kept_until(live, policy.of("a")) is None
    assert kept_until(jobs[-1], policy.of("forever")) is None
    assert expired(jobs, Policy(), now=1e12) == []


def test_run_again_takes_the_newest_recorded_spec_under_a_new_name() -> None:
    job = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "mnist",
            "namespace": "team",
            "uid": "u1",
            "resourceVersion": "9",
            "labels": {"sweep": "lr"},
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}", "note": "kept"},
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 2, "futureField": 1}},
        "status": DONE,
    }
    older = {**job, "spec": {"runtimeRef": {"name": "older"}}}
    events = [
        json.dumps({"type": "trainjob.observed", "trainjob": older}).encode(),
        json.dumps({"type": "trainjob.observed", "trainjob": job}).encode(),
        json.dumps({"type": "trainjob.deleted", "uid": "u1"}).encode(),
        b"{not json",
    ]
    recorded = recorded_trainjob(events)
    assert recorded is not None
    made = again(recorded, "team", "mnist-2")
    assert made == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "mnist-2",
            "namespace": "team",
            "labels": {"sweep": "lr"},
            "annotations": {"note": "kept", RUN_AGAIN_OF: "team/mnist (uid u1)"},
        },
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 2, "futureField": 1}},
    }
    assert recorded_trainjob([events[2]]) is None


def test_the_policy_file_is_read_again_when_it_changes_and_a_bad_one_leaves_the_last_in_force(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "retention.yaml"
    path.write_text("default: {keepFor: 1h}\n")
    retention = Retention(path=path, stores=[])
    assert retention.load().default.keep_for == 3600.0
    path.write_text("default: {keepFor: 90m, maxTrainJobs: 5}\n")
    assert retention.load().default == Keep(keep_for=5400.0, max_trainjobs=5)
    path.write_text("default: {keepFor: for ever}\n")
    assert retention.load().default == Keep(keep_for=5400.0, max_trainjobs=5)
    assert "the previous retention policy stays in force" in caplog.text
    with pytest.raises(BadPolicy):  # at start there is no previous one: the server does not start
        Retention(path=path, stores=[]).load()
