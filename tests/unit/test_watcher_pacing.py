"""``watcher.pacing``: which JobSet changes wait for the status interval, and for how long."""

from __future__ import annotations

from typing import Any

import msgspec

from contracts.jobset import JobSet
from watcher.pacing import CountsPacing, counts_aside

KEY = ("team", "llm")


def jobset(
    rv: str, *, ready: int = 0, succeeded: int = 0, completed: bool = False, uid: str = "u1", parallelism: int = 2
) -> JobSet:
    status: dict[str, Any] = {
        "replicatedJobsStatus": [{"name": "node", "ready": ready, "succeeded": succeeded, "active": 2 - succeeded}]
    }
    if completed:
        status["conditions"] = [{"type": "Completed", "status": "True", "reason": "AllJobsCompleted"}]
    return msgspec.convert(
        {
            "metadata": {"name": "llm", "namespace": "team", "uid": uid, "resourceVersion": rv},
            "spec": {
                "replicatedJobs": [{"name": "node", "replicas": 1, "template": {"spec": {"parallelism": parallelism}}}]
            },
            "status": status,
        },
        JobSet,
    )


def test_counts_and_version_aside_the_number_follows_everything_else() -> None:
    base = counts_aside(jobset("1"))
    assert counts_aside(jobset("2", ready=2, succeeded=1)) == base
    assert counts_aside(jobset("3", completed=True)) != base
    assert counts_aside(jobset("4", uid="u2")) != base
    assert counts_aside(jobset("5", parallelism=3)) != base
    assert counts_aside(None) is None


def quiet(pacing: CountsPacing, at: float) -> None:
    """An observation, then the echo of the status written from it, carrying the same JobSet."""
    pacing.published(KEY, jobset("1"), echo=False, now=at - 0.5)
    pacing.published(KEY, jobset("1"), echo=True, now=at)


def test_after_a_quiet_echo_a_change_of_counts_alone_waits_for_the_interval() -> None:
    pacing = CountsPacing(5.0)
    quiet(pacing, 100.0)
    assert pacing.wait(KEY, jobset("2", ready=2), now=101.0) == 4.0
    assert pacing.wait(KEY, jobset("3", ready=2, succeeded=1), now=104.5) == 0.5
    assert pacing.wait(KEY, jobset("3", ready=2, succeeded=1), now=105.0) == 0


def test_after_anything_but_a_quiet_echo_nothing_waits() -> None:
    pacing = CountsPacing(5.0)
    assert pacing.wait(KEY, jobset("2", ready=2), now=100.0) == 0  # nothing seen yet
    pacing.published(KEY, jobset("1"), echo=False, now=100.0)
    assert pacing.wait(KEY, jobset("2", ready=2), now=100.5) == 0  # a status from it may wait in the applier
    pacing.published(KEY, jobset("2", ready=2), echo=True, now=101.0)  # the echo brought newer counts
    assert pacing.wait(KEY, jobset("3", ready=2, succeeded=1), now=101.5) == 0


def test_a_condition_a_new_jobset_or_a_spec_change_never_waits() -> None:
    pacing = CountsPacing(5.0)
    quiet(pacing, 100.0)
    assert pacing.wait(KEY, jobset("2", succeeded=2, completed=True), now=101.0) == 0
    assert pacing.wait(KEY, jobset("3", uid="u2"), now=101.0) == 0
    assert pacing.wait(KEY, jobset("4", parallelism=3), now=101.0) == 0
    assert pacing.wait(KEY, None, now=101.0) == 0


def test_a_change_the_last_observation_carried_is_known() -> None:
    pacing = CountsPacing(5.0)
    quiet(pacing, 100.0)
    assert pacing.carried(KEY, jobset("1"))
    assert not pacing.carried(KEY, jobset("2", ready=2))
    assert not pacing.carried(("team", "other"), jobset("1"))


def test_no_interval_or_a_forgotten_trainjob_holds_nothing() -> None:
    pacing = CountsPacing(0.0)
    quiet(pacing, 100.0)
    assert pacing.wait(KEY, jobset("2", ready=2), now=100.0) == 0
    paced = CountsPacing(5.0)
    quiet(paced, 100.0)
    paced.forget(KEY)
    assert paced.wait(KEY, jobset("2", ready=2), now=100.0) == 0
    assert not paced.carried(KEY, jobset("1"))
