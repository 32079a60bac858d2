"""A plan too large for the bus: the pure replacement plan, and the planner's status leaving the applier's
own condition alone."""

from __future__ import annotations

from typing import Any

import msgspec

from contracts import conditions
from contracts import messages as m
from contracts.trainer import TrainJob
from planner import status as status_rules
from planner.core import plan_too_large

from .builders import trainjob_dict, trainjob_observed


def _status(p: m.Plan) -> dict[str, Any]:
    (message,) = p.applies
    assert isinstance(message, m.ApplyTrainJobStatus)
    out: dict[str, Any] = msgspec.to_builtins(message.object)["status"]
    return out


def test_only_the_status_with_plan_too_large() -> None:
    job = trainjob_dict(name="tj", namespace="ns", uid="u1", runtime="torch-distributed")
    job["metadata"]["resourceVersion"] = "7"
    event = trainjob_observed(job, None)
    p = plan_too_large(event, source_seq=3, sizes={"jobset": 2_000_000}, max_payload=1_048_576)
    (cond,) = _status(p)["conditions"]
    assert cond["type"] == conditions.CONDITION_RESOURCES_CREATED
    assert (cond["status"], cond["reason"]) == ("False", conditions.REASON_PLAN_TOO_LARGE)
    assert "jobset is 2000000 bytes" in cond["message"] and "1048576" in cond["message"]
    assert p.applies[0].target.subresource == "status" and p.trainjob_uid == "u1"


def test_nothing_is_published_once_the_trainjob_says_so() -> None:
    job = trainjob_dict(name="tj", namespace="ns", uid="u1", runtime="torch-distributed")
    first = plan_too_large(trainjob_observed(job, None), source_seq=3, sizes={"jobset": 9}, max_payload=8)
    job["status"] = _status(first)
    again = plan_too_large(trainjob_observed(job, None), source_seq=4, sizes={"jobset": 9}, max_payload=8)
    assert again.applies == ()  # the status change's own event plans to the same answer: no loop
    assert again.warnings


def test_the_planner_neither_sends_nor_counts_the_applier_condition() -> None:
    ours = {"type": conditions.CONDITION_COMPONENTS_APPLIED, "status": "False", "reason": "Invalid", "message": "x"}
    job = msgspec.convert(
        trainjob_dict(name="tj", namespace="ns", runtime="r", status={"conditions": [ours]}), TrainJob
    )
    desired = status_rules.desired_status(job, None, now=0.0)
    assert "conditions" not in desired
    assert not status_rules.status_changed(job, desired)
