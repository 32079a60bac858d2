"""The applier's condition on a TrainJob: what a refused component is told as (``applier_condition``),
the apply that takes it off again, what either change writes (``written``), and whether a condition is about
a message's component. Pure: no I/O; ``applier.trainjobs`` writes them (``TrainJobs.tell``).
"""

from __future__ import annotations

import re

import msgspec

from contracts import conditions
from contracts import trainer as t
from contracts.messages import ApplyMessage


class SetCondition(msgspec.Struct, frozen=True, kw_only=True):
    """Set the applier's condition on the message's TrainJob: ``reason``, and ``text`` about its component."""

    reason: str
    text: str


class ClearCondition(msgspec.Struct, frozen=True, kw_only=True):
    """Take the applier's condition off the message's TrainJob."""


ConditionChange = SetCondition | ClearCondition
"""What a decision asks to be told on the TrainJob; ``applier.trainjobs`` writes it (``TrainJobs.tell``)."""


def component_label(message: ApplyMessage) -> str:
    """How the applier's condition names a component: ``<Kind> <name>``."""
    return f"{message.target.kind} {message.target.name}"


def condition_message(message: ApplyMessage, text: str) -> str:
    full = f"{component_label(message)}: {text}"
    limit = conditions.CONDITION_MESSAGE_LIMIT
    return full if len(full) <= limit else full[: limit - 3] + "..."


_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")

FALLBACK_REASON = "ApplyRejected"


def condition_reason(api_reason: str) -> str:
    """The API server's status reason when it is a valid condition reason (``Invalid``), else a fixed one."""
    return api_reason if len(api_reason) <= 1024 and _REASON.match(api_reason) else FALLBACK_REASON


def applier_condition(message: ApplyMessage, *, reason: str, text: str, now: str) -> bytes:
    """The status apply that sets the applier's condition, under the applier's own field manager.

    ``metadata.uid`` makes it a precondition: a TrainJob of the same name but another uid refuses it.
    """
    condition = {
        "type": conditions.CONDITION_COMPONENTS_APPLIED,
        "status": "False",
        "reason": condition_reason(reason),
        "message": condition_message(message, text),
        "lastTransitionTime": now,
    }
    return _trainjob_status(message, {"conditions": [condition]})


def written(message: ApplyMessage, change: ConditionChange, *, now: str) -> tuple[str, bytes]:
    """What a condition change writes: the condition's message the TrainJob then says (``""``: none), and
    the status apply that says it."""
    if isinstance(change, SetCondition):
        body = applier_condition(message, reason=change.reason, text=change.text, now=now)
        return condition_message(message, change.text), body
    return "", applier_condition_cleared(message)


def applier_condition_cleared(message: ApplyMessage) -> bytes:
    """The status apply that lists nothing: SSA then removes the condition only this manager owned."""
    return _trainjob_status(message, None)


def _trainjob_status(message: ApplyMessage, status: dict[str, object] | None) -> bytes:
    job = message.trainjob
    body: dict[str, object] = {
        "apiVersion": t.API_VERSION,
        "kind": t.TRAINJOB_KIND,
        "metadata": {"name": job.name, "namespace": job.namespace, "uid": message.trainjob_uid},
    }
    if status is not None:
        body["status"] = status
    return msgspec.json.encode(body)


def condition_names(message: ApplyMessage, condition: str) -> bool:
    """Whether the applier's condition on the TrainJob is about this message's component."""
    return bool(condition) and condition.startswith(component_label(message) + ": ")
