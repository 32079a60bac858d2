"""``tjpipe history``'s table folds runs of training progress updates (``tjpipe.history_tools.fold_progress``)."""

from __future__ import annotations

from tjpipe.history_tools import TimelineEntry, fold_progress


def entry(seq: int, kind: str, summary: str = "") -> TimelineEntry:
    return TimelineEntry(time=float(seq), stream=f"TJ_{kind.upper()}", seq=seq, kind=kind, summary=summary or kind)


def test_a_run_of_progress_updates_becomes_one_row_with_the_first_and_the_last() -> None:
    timeline = [
        entry(1, "event"),
        *(entry(10 + i, "progress", f"{12 * (i + 1)}%") for i in range(8)),
        entry(30, "result"),
    ]
    folded = fold_progress(timeline)
    assert [e.kind for e in folded] == ["event", "progress", "result"]
    run = folded[1]
    assert run.summary == "8 progress updates: 12% … 96%"
    assert (run.time, run.seq, run.detail) == (10.0, 10, {"updates": 8, "last_seq": 17})
    assert timeline[1].summary == "12%"  # the entries themselves are left as they were


def test_short_runs_and_other_entries_stay_as_they_are() -> None:
    timeline = [entry(1, "progress", "5%"), entry(2, "progress", "9%"), entry(3, "plan"), entry(4, "progress", "12%")]
    assert fold_progress(timeline) == timeline
    assert fold_progress([]) == []
