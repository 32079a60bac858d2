"""``applier.results.result_of``: the result each way a message's work can end is recorded with, and its dead letter."""

from __future__ import annotations

import pytest

from applier import errors, outcomes
from applier.results import Applied, Result, result_of
from applier.trainjob_watch import TrainJobFacts

DONE = outcomes.Done(action="configured", resource_version="42")


@pytest.mark.parametrize(
    ("outcome", "result"),
    [
        (Applied(DONE, TrainJobFacts(uid="u")), Result("configured", resource_version="42")),
        (
            outcomes.Done(action="skipped", reason=outcomes.STALE_PLAN),
            Result("skipped", reason=outcomes.STALE_PLAN),
        ),
        (
            errors.TrainJobGone("TrainJob ns/tj does not exist"),
            Result("skipped", reason="TrainJob ns/tj does not exist: nothing to do"),
        ),
        (
            errors.Unauthorized("not ours"),
            Result("failed", reason="unauthorized: not ours", dead_letter="unauthorized", error="not ours"),
        ),
        (
            errors.PermanentError("422 Invalid: no", api_reason="Invalid"),
            Result("failed", reason="422 Invalid: no", dead_letter="permanent", error="422 Invalid: no"),
        ),
        (
            LookupError("no resource for example.com/v1 Widget"),
            Result(
                "failed",
                reason="no resource for example.com/v1 Widget",
                dead_letter="permanent",
                error="no resource for example.com/v1 Widget",
            ),
        ),
    ],
)
def test_each_end_has_its_result_and_only_a_failure_its_dead_letter(
    outcome: Applied | outcomes.Done | Exception, result: Result
) -> None:
    assert result_of(outcome) == result
