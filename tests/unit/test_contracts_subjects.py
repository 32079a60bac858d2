"""``contracts.subjects``: FNV-1a partitions (NATS' ``partition()`` hash) and subject shapes."""

from __future__ import annotations

import pytest

from contracts import subjects as s


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", 0x811C9DC5),
        (b"a", 0xE40C292C),
        (b"b", 0xE70C2DE5),
        (b"foobar", 0xBF9CF968),
    ],
)
def test_fnv1a32_known_vectors(data: bytes, expected: int) -> None:
    assert s.fnv1a32(data) == expected


def test_partition_of_known_values() -> None:
    # namespace and name are hashed joined without a separator: FNV-1a("foobar") % 16 == 8.
    assert s.partition_of("foo", "bar") == 0xBF9CF968 % 16 == 8
    assert s.partition_of("", "a") == 12
    assert s.partition_of("team-a", "mnist") == 11
    assert s.partition_of("foo", "bar", partitions=7) == 0xBF9CF968 % 7


def test_partition_of_is_stable_and_in_range() -> None:
    keys = [(f"ns-{i % 7}", f"job-{i}") for i in range(500)]
    first = [s.partition_of(ns, name) for ns, name in keys]
    assert first == [s.partition_of(ns, name) for ns, name in keys]
    assert all(0 <= p < s.PARTITIONS for p in first)
    assert len(set(first)) == s.PARTITIONS  # 500 keys reach every partition


def test_escape_token() -> None:
    assert s.escape_token("tj-mpi-hostfile") == "tj-mpi-hostfile"
    assert s.escape_token("configmap.tj-mpi-hostfile") == "configmap_tj-mpi-hostfile"
    assert s.escape_token("a.b.c") == "a_b_c"
    assert s.escape_token("") == "_"


def test_subject_shapes() -> None:
    p = s.partition_of("team-a", "mnist")
    assert s.event_subject("team-a", "mnist") == f"tj.ev.{p}.team-a.mnist"
    assert s.apply_subject("team-a", "mnist", "jobset") == f"tj.apply.{p}.team-a.mnist.jobset"
    assert s.apply_subject("team-a", "mnist", "configmap.mnist.x") == f"tj.apply.{p}.team-a.mnist.configmap_mnist_x"
    assert s.result_subject("team-a", "mnist", "trainjob-status") == f"tj.result.{p}.team-a.mnist.trainjob-status"
    assert s.dlq_subject("applier", "team-a", "mnist") == "tj.dlq.applier.team-a.mnist"
    for subject in (s.event_subject("team-a", "mnist"), s.apply_subject("team-a", "mnist", "a.b")):
        assert all(token for token in subject.split("."))


def test_filters() -> None:
    assert s.events_filter() == "tj.ev.*.>"
    assert s.events_filter(3) == "tj.ev.3.>"
    assert s.events_filter(0) == "tj.ev.0.>"
    assert s.apply_filter() == "tj.apply.*.>"
    assert s.apply_filter(15) == "tj.apply.15.>"
    p = s.partition_of("ns", "tj")
    assert s.trainjob_events_filter("ns", "tj") == f"tj.ev.{p}.ns.tj"
    assert s.trainjob_apply_filter("ns", "tj") == f"tj.apply.{p}.ns.tj.>"
    assert s.trainjob_results_filter("ns", "tj") == f"tj.result.{p}.ns.tj.>"


def _matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` one or more trailing tokens."""
    pt, st = pattern.split("."), subject.split(".")
    for i, token in enumerate(pt):
        if token == ">":
            return len(st) > i
        if i >= len(st) or (token != "*" and token != st[i]):
            return False
    return len(pt) == len(st)


def test_filters_match_their_subjects() -> None:
    p = s.partition_of("ns", "tj")
    assert _matches(s.events_filter(), s.event_subject("ns", "tj"))
    assert _matches(s.events_filter(p), s.event_subject("ns", "tj"))
    assert not _matches(s.events_filter((p + 1) % s.PARTITIONS), s.event_subject("ns", "tj"))
    assert _matches(s.trainjob_events_filter("ns", "tj"), s.event_subject("ns", "tj"))
    assert _matches(s.apply_filter(p), s.apply_subject("ns", "tj", "jobset"))
    assert _matches(s.trainjob_apply_filter("ns", "tj"), s.apply_subject("ns", "tj", "jobset"))
    assert _matches(s.trainjob_results_filter("ns", "tj"), s.result_subject("ns", "tj", "jobset"))
    assert not _matches(s.trainjob_apply_filter("ns", "tj2"), s.apply_subject("ns", "tj", "jobset"))
