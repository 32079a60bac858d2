"""The cluster mark and claim stamps of ``applier.epoch``: pure functions, no servers."""

from __future__ import annotations

from applier.epoch import ClusterMark, mark_key, next_mark, stamp_of, standing
from plumbing.stream_usage import is_full


def test_a_first_mark_starts_epoch_one_at_the_current_revision() -> None:
    mark, rewound = next_mark(None, cluster="c1", revision=500)
    assert (mark, rewound) == (ClusterMark(cluster="c1", epoch=1, high_water=500), False)


def test_the_high_water_follows_the_revision_and_a_lower_one_starts_an_epoch() -> None:
    mark = ClusterMark(cluster="c1", epoch=1, high_water=500)
    assert next_mark(mark, cluster="c1", revision=900) == (ClusterMark(cluster="c1", epoch=1, high_water=900), False)
    assert next_mark(mark, cluster="c1", revision=120) == (ClusterMark(cluster="c1", epoch=2, high_water=120), True)
    # A claim of this epoch beyond the current revision is evidence the revisions went back.
    assert next_mark(mark, cluster="c1", revision=600, seen=15151)[1] is True
    assert next_mark(mark, cluster="c1", revision=600, seen=550)[1] is False
    # An unknown revision proves nothing.
    assert next_mark(mark, cluster="c1", revision=0)[1] is False


def test_a_claim_stands_by_its_stamp() -> None:
    now = stamp_of(ClusterMark(cluster="c1", epoch=2, high_water=1))
    assert standing("c1/2", now) == "current"
    assert standing("c1/1", now) == "rewound"
    assert standing("c0/7", now) == "other-cluster"
    assert standing("", now) == "unstamped"


def test_marks_cannot_collide_with_ledger_keys() -> None:
    key = mark_key("9f0c-uid/with spaces")
    assert key.startswith("_cluster.") and " " not in key and "/" not in key.split(".", 1)[1]


def test_a_stream_is_full_near_its_limit_and_never_without_one() -> None:
    assert is_full(990, 1000) and is_full(800, 1000) and not is_full(500, 1000) and not is_full(10**12, -1)
    gib = 1024**3
    assert is_full(gib - 10 * 1024**2, gib) and not is_full(gib - 100 * 1024**2, gib)
