"""``planner.status.only_counts_changed``: which planned statuses the applier may hold (``applier.pacing``)."""

from __future__ import annotations

import msgspec

from contracts.trainer import TrainJob
from planner import status as rules

RUNNING = {"name": "node", "active": 2, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0}
READY = {**RUNNING, "ready": 2}
COMPLETE = {"type": "Complete", "status": "True", "reason": "JobsCompleted", "message": "done"}


def job(status: dict[str, object]) -> TrainJob:
    return msgspec.convert({"metadata": {"name": "tj", "namespace": "ns"}, "status": status}, TrainJob)


def test_counts_alone_may_be_held() -> None:
    assert rules.only_counts_changed(job({"jobsStatus": [RUNNING]}), {"jobsStatus": [READY]})


def test_the_first_counts_may_be_held_too() -> None:
    """The applier writes a TrainJob's first status at once anyway: it has no earlier write to wait after."""
    assert rules.only_counts_changed(job({}), {"jobsStatus": [RUNNING]})


def test_a_condition_with_the_counts_is_written_at_once() -> None:
    assert not rules.only_counts_changed(
        job({"jobsStatus": [READY]}), {"conditions": [COMPLETE], "jobsStatus": [{**READY, "succeeded": 2}]}
    )


def test_a_condition_alone_is_written_at_once() -> None:
    assert not rules.only_counts_changed(
        job({"jobsStatus": [READY]}), {"conditions": [COMPLETE], "jobsStatus": [READY]}
    )


def test_nothing_changed_is_not_paced() -> None:
    assert not rules.only_counts_changed(job({"jobsStatus": [READY]}), {"jobsStatus": [READY]})
