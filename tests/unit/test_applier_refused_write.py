"""What the applier does when the API server refuses its apply: a pure decision, one row per case."""

from __future__ import annotations

import msgspec
import pytest

from applier import api_answers, claim_round
from contracts import messages as m
from contracts.kube import Secret
from contracts.trainer import TrainJob

KEY = m.ObjectKey(namespace="ns", name="tj")


def _status() -> m.ApplyTrainJobStatus:
    return m.ApplyTrainJobStatus(
        trainjob=KEY,
        trainjob_uid="u",
        source_seq=1,
        target=m.Target(
            api_version="trainer.kubeflow.org/v1alpha1",
            kind="TrainJob",
            namespace="ns",
            name="tj",
            subresource="status",
        ),
        object=msgspec.convert({"metadata": {"name": "tj", "namespace": "ns"}}, TrainJob),
    )


def _secret(policy: m.ApplyPolicy) -> m.ApplySecret:
    return m.ApplySecret(
        trainjob=KEY,
        trainjob_uid="u",
        source_seq=1,
        target=m.Target(api_version="v1", kind="Secret", namespace="ns", name="tj-ssh"),
        policy=policy,
        object=msgspec.convert({"metadata": {"name": "tj-ssh", "namespace": "ns"}}, Secret),
    )


@pytest.mark.parametrize(
    ("status", "message", "precondition", "expected"),
    [
        # A status carries the TrainJob version it was planned from: any conflict means a newer TrainJob.
        (409, _status(), "", "stale-status"),
        (409, _status(), "7", "stale-status"),
        (422, _status(), "", "fail"),
        # The object changed between the read and the conditional write.
        (409, _secret("always"), "7", "look-again"),
        (409, _secret("if-absent"), "7", "look-again"),
        # Created by another writer between read and write: an if-absent target may just exist now.
        (409, _secret("if-absent"), "", "skip-if-created-concurrently"),
        (422, _secret("if-absent"), "", "skip-if-created-concurrently"),
        (422, _secret("if-absent"), "7", "skip-if-created-concurrently"),
        # Anything else goes to the retry tiers.
        (409, _secret("always"), "", "fail"),
        (422, _secret("always"), "7", "fail"),
        (422, _secret("while-suspended"), "", "fail"),
        (500, _secret("if-absent"), "", "fail"),
        (403, _status(), "", "fail"),
    ],
)
def test_refused_write(
    status: int, message: m.ObjectApply, precondition: str, expected: api_answers.RefusedWrite
) -> None:
    assert api_answers.refused_write(status, message, precondition=precondition) == expected


def _status_planned_from(version: str) -> m.ApplyTrainJobStatus:
    message = _status()
    meta = msgspec.structs.replace(message.object.metadata, resource_version=version)
    return msgspec.structs.replace(message, object=msgspec.structs.replace(message.object, metadata=meta))


@pytest.mark.parametrize(
    ("message", "live_version", "expected"),
    [
        # Planned from another TrainJob version than the live one: a newer plan carries the newer status.
        (_status_planned_from("7"), "8", True),
        (_status_planned_from("7"), "7", False),
        # Not read, or planned without a version: nothing to compare; the API server's 409 decides.
        (_status_planned_from("7"), None, False),
        (_status(), "8", False),
        # Only a status is written on the version it was planned from.
        (_secret("always"), "8", False),
    ],
)
def test_status_outdated(message: m.ObjectApply, live_version: str | None, expected: bool) -> None:
    assert claim_round.status_outdated(message, live_version=live_version) is expected


def test_still_applied_only_when_the_record_is_this_plan_and_the_live_object_holds_it() -> None:
    message = _secret("always")
    live = msgspec.json.encode(
        {
            "metadata": {
                "name": "tj-ssh",
                "managedFields": [{"manager": message.field_manager, "operation": "Apply", "fieldsV1": {"f:data": {}}}],
            }
        }
    )
    managed = claim_round.managed_digest(live, manager=message.field_manager, subresource=None)
    record = m.AppliedRecord(source_version=1, source_seq=1, digest="d1", state="applied", managed=managed)
    assert claim_round.still_applied(record, live, message, digest="d1")
    assert not claim_round.still_applied(record, live, message, digest="d2")  # another plan's content
    assert not claim_round.still_applied(msgspec.structs.replace(record, state="claimed"), live, message, digest="d1")
    assert not claim_round.still_applied(record, None, message, digest="d1")  # the object is gone
    changed = live.replace(b'"f:data":{}', b'"f:data":{"f:x":{}}')
    assert not claim_round.still_applied(record, changed, message, digest="d1")  # someone changed our fields
