"""What the API server's answer makes of a claim round: the action reported (``outcome``), what to do
when the write is refused (``refused_write``), and whose an existing create-only target is (``existing``).
Pure: no I/O.
"""

from __future__ import annotations

from typing import Literal

from contracts.messages import AppliedRecord, ApplyAction, ApplyMessage, ObjectApply


def outcome(http_status: int, *, before: str, after: str) -> ApplyAction:
    if http_status == 201:
        return "created"
    if before and before == after:
        return "unchanged"
    return "configured"


RefusedWrite = Literal["stale-status", "look-again", "skip-if-created-concurrently", "fail"]
"""What the applier does when the API server refuses its apply (``refused_write``):

* ``stale-status``: skip it. A status is written on the TrainJob version it was planned from; 409 says the
  TrainJob has changed since, and a newer plan carries the newer status.
* ``look-again``: start the next claim round. The object changed between the read and the conditional write.
* ``skip-if-created-concurrently``: read the target; skip if it now exists, otherwise ``fail``. Another
  writer created an ``if-absent`` target between the read and the write (an immutable Secret then
  refuses the second key with 422), and existing is all ``if-absent`` asks for.
* ``fail``: raise what ``classify`` makes of the error, for the retry tiers.
"""


def refused_write(http_status: int, message: ObjectApply, *, precondition: str) -> RefusedWrite:
    """The decision for an apply the API server refused; ``precondition`` is the resourceVersion the write sent."""
    if http_status == 409 and message.target.subresource:
        return "stale-status"
    if http_status == 409 and precondition:
        return "look-again"
    if message.policy == "if-absent" and http_status in (409, 422):
        return "skip-if-created-concurrently"
    return "fail"


ExistingCreateOnly = Literal["ours", "another-trainjob", "unrecorded"]

UNRECORDED = (
    "exists already, and this pipeline has no record of creating it (Trainer's, or made by someone in the"
    " namespace); left as it is, unread"
)


def existing(message: ApplyMessage, record: AppliedRecord | None) -> ExistingCreateOnly:
    """Whose a create-only target is, when its create is answered 409 AlreadyExists, from the ledger alone.

    ``record`` is the ledger record as it was before this attempt claimed the target. Created for this
    TrainJob: ``ours``, nothing more to do. Created for another TrainJob (an earlier one of the same name,
    whose Secret the garbage collector removes): ``another-trainjob``, refused as ``authorize_live`` refuses
    a live object another TrainJob controls. No record of a creation (Trainer made it before this pipeline
    took over, the ledger was lost, or someone in the namespace made it): ``unrecorded``, left as it is, as
    Trainer leaves a Secret that exists.
    """
    created_for = record.created_for if record is not None else ""
    if created_for == message.trainjob_uid:
        return "ours"
    return "another-trainjob" if created_for else "unrecorded"
