"""The history server's pure parts: the TrainJob index's fold and prune, and the decision cache."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from contracts import subjects
from contracts.messages import ObjectKey, TrainJobDeleted, TrainJobObserved, encode
from contracts.trainer import TrainJob
from history_server.access import Decisions
from history_server.index import HistoryIndex
from plumbing.bus_history import StoredMessage


def _job(namespace: str, name: str, *, uid: str = "u1", status: dict[str, Any] | None = None) -> TrainJob:
    body: dict[str, Any] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    }
    if status is not None:
        body["status"] = status
    return msgspec.convert(body, TrainJob)


def _stored(seq: int, subject: str, data: bytes, time: float) -> StoredMessage:
    return StoredMessage(stream="TJ_EVENTS", seq=seq, subject=subject, data=data, headers={}, time=time)


def _observed(namespace: str, name: str, seq: int, **kwargs: Any) -> StoredMessage:
    event = TrainJobObserved(trainjob=_job(namespace, name, **kwargs), observed_at=float(seq))
    return _stored(seq, subjects.event_subject(namespace, name), encode(event), 100.0 + seq)


def test_the_index_keeps_the_newest_state_of_each_trainjob_by_namespace() -> None:
    index = HistoryIndex()
    index.add_event(_observed("a", "one", 1))
    index.add_event(_observed("a", "one", 2, status={"jobsStatus": [{"name": "node", "active": 2}]}))
    index.add_event(_observed("a", "two", 3, status={"conditions": [{"type": "Complete", "status": "True"}]}))
    index.add_event(_observed("b", "one", 4, status={"conditions": [{"type": "Failed", "status": "True"}]}))
    deleted = TrainJobDeleted(key=ObjectKey(namespace="b", name="gone"), uid="u9", observed_at=5.0)
    index.add_event(_observed("b", "gone", 5))
    index.add_event(_stored(6, subjects.event_subject("b", "gone"), encode(deleted), 106.0))
    index.add_event(_stored(7, subjects.event_subject("b", "junk"), b"{not json", 107.0))

    assert index.namespaces() == ["a", "b"]
    a = {s.name: s for s in index.in_namespace("a")}
    assert (a["one"].state, a["one"].events, a["one"].runtime, a["one"].first_seen) == (
        "Running",
        2,
        "torch-distributed",
        101.0,
    )
    assert a["two"].state == "Complete"
    assert [s.name for s in index.in_namespace("a")] == ["two", "one"]  # the most recently active first
    b = {s.name: s for s in index.in_namespace("b")}
    assert (b["one"].state, b["gone"].state) == ("Failed", "Deleted")
    assert "junk" not in b and index.undecodable == 1
    assert index.counts()["Deleted"] == 1


def test_dead_letters_count_against_their_trainjob_and_prune_forgets_what_the_streams_dropped() -> None:
    index = HistoryIndex()
    index.add_event(_observed("a", "old", 1))
    index.add_event(_observed("a", "kept", 2))
    letter = _stored(1, subjects.dlq_subject("applier", "a", "old"), b"{}", 150.0)
    index.add_dead_letter(letter)
    assert index.get("a", "old") is not None and index.get("a", "old").dead_letters == 1  # type: ignore[union-attr]
    assert index.prune(first_event_seq=2, first_dead_letter_seq=1) == 0  # its dead letter is still there
    assert index.prune(first_event_seq=2, first_dead_letter_seq=2) == 1
    assert [s.name for s in index.everywhere()] == ["kept"]
    assert index.prune(first_event_seq=3, first_dead_letter_seq=2) == 1
    assert index.namespaces() == [] and len(index) == 0


def test_decisions_expire_after_their_ttl_and_the_oldest_go_first() -> None:
    now = [0.0]
    made: list[str] = []
    cache = Decisions(ttl=10.0, size=2, clock=lambda: now[0])

    async def decide(key: str) -> str:
        async def make() -> str:
            made.append(key)
            return key.upper()

        return await cache.get(key, make)

    async def scenario() -> None:
        assert await decide("a") == "A"
        assert await decide("a") == "A"
        now[0] = 11.0
        assert await decide("a") == "A"
        await decide("b")
        await decide("c")
        assert len(cache) == 2
        await decide("a")  # pushed out by c

    asyncio.run(scenario())
    assert made == ["a", "a", "b", "c", "a"]
