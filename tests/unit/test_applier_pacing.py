"""``applier.pacing``: a running TrainJob's Jobs' counts written at most once per interval, conditions at once."""

from __future__ import annotations

import msgspec

from applier.pacing import StatusPacing
from contracts import messages as m

from .test_applier_decide import jobset, status


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def paced(message: m.ApplyTrainJobStatus, *, on: str = "tj", version: int = 40) -> m.ApplyTrainJobStatus:
    return msgspec.structs.replace(
        message, paced=True, trainjob=m.ObjectKey(namespace="ns", name=on), source_version=version
    )


def test_the_first_status_of_a_trainjob_is_written_at_once() -> None:
    pacing = StatusPacing(5.0, clock=Clock())
    assert pacing.wait_for(paced(status())) == 0.0


def test_counts_alone_wait_for_the_rest_of_the_interval_after_a_write() -> None:
    clock = Clock()
    pacing = StatusPacing(5.0, clock=clock)
    pacing.wrote(status())
    clock.now += 2.0
    assert pacing.wait_for(paced(status())) == 3.0
    clock.now += 3.0
    assert pacing.wait_for(paced(status())) == 0.0


def test_a_status_older_than_the_one_written_is_superseded() -> None:
    clock = Clock()
    pacing = StatusPacing(5.0, clock=clock)
    pacing.wrote(paced(status(), version=50))
    assert pacing.superseded(paced(status(), version=45))
    assert pacing.superseded(msgspec.structs.replace(paced(status(), version=45), paced=False))
    assert not pacing.superseded(paced(status(), version=55))
    assert not pacing.superseded(paced(status(), on="other", version=45))
    assert not pacing.superseded(paced(status(), version=0))  # an older planner's message: the fence judges it


def test_a_condition_is_never_held() -> None:
    clock = Clock()
    pacing = StatusPacing(5.0, clock=clock)
    pacing.wrote(status())
    assert pacing.wait_for(status()) == 0.0  # not paced: the planner saw a condition change
    assert pacing.wait_for(jobset()) == 0.0  # and only statuses are paced at all


def test_each_trainjob_has_its_own_turn() -> None:
    clock = Clock()
    pacing = StatusPacing(5.0, clock=clock)
    pacing.wrote(paced(status(), on="a"))
    assert pacing.wait_for(paced(status(), on="a")) == 5.0
    assert pacing.wait_for(paced(status(), on="b")) == 0.0


def test_an_interval_of_zero_holds_nothing() -> None:
    pacing = StatusPacing(0.0, clock=Clock())
    pacing.wrote(status())
    assert pacing.wait_for(paced(status())) == 0.0


def test_what_it_remembers_stays_bounded() -> None:
    clock = Clock()
    pacing = StatusPacing(5.0, clock=clock)
    for i in range(10_000):
        pacing.wrote(paced(status(), on=f"tj-{i}"))
        clock.now += 0.01
    assert len(pacing._written) <= 4096 + 500  # only the last interval's writers are kept past the bound
    assert pacing.wait_for(paced(status(), on="tj-9999")) > 0


def test_of_statuses_held_together_only_the_newest_is_written_when_they_come_back() -> None:
    clock = Clock()
    pacing = StatusPacing(5.0, clock=clock)
    pacing.wrote(paced(status(), version=10))
    clock.now += 0.5
    pods_running, pods_ready = paced(status(), version=11), paced(status(), version=12)
    assert pacing.wait_for(pods_running) == 4.5
    clock.now += 1.0
    assert pacing.wait_for(pods_ready) == 3.5
    clock.now += 3.5  # both come back at their turn, the older first
    assert pacing.superseded(pods_running)
    assert not pacing.superseded(pods_ready) and pacing.wait_for(pods_ready) == 0.0
    pacing.wrote(pods_ready)
    assert not pacing.superseded(paced(status(), version=13))


def test_replay_finds_no_change_in_a_status_recorded_before_statuses_were_paced() -> None:
    """``tjpipe replay`` compares what a plan decided: how soon the applier may write it is not part of it."""
    from tjpipe.history_tools import compare_plans

    recorded = msgspec.structs.replace(status(), paced=False)
    assert compare_plans([recorded], [paced(status(), on="tj")]) == {}
