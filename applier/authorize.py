"""What a message may ask for at all, checked before any request: the first of the applier's checks of a
write, made in the order the applier can make them.

The bus is not trusted to say what may be written: an apply message only names a TrainJob, and the applier
checks that a real TrainJob managed by this controller justifies the write. Each check returns a
``errors.Verdict``; a refusal becomes a dead letter with reason ``unauthorized``, and nothing at all is
written (not even an Event on the TrainJob). This module holds the check of the message alone
(``authorize_message``), made before anything is read. The later checks sit where their facts are read:
the TrainJob the message names in ``applier.trainjobs`` (``authorize_trainjob``), and the live target in
the claim round (``claim_round.authorize_live``; a create-only target, which is never read, is judged from the
ledger by ``api_answers.existing``).
"""

from __future__ import annotations

import msgspec

from applier import objects
from applier.claim_round import CREATE_ONLY
from applier.errors import ALLOWED, Verdict
from contracts import resources
from contracts import trainer as t
from contracts.components import COMPONENT_KINDS
from contracts.messages import FIELD_MANAGER, ApplyMessage, ApplyTrainJobStatus, DeleteComponent

COMPONENT_RESOURCES: dict[type, resources.Resource] = {kind.message: kind.resource for kind in COMPONENT_KINDS}
"""The only kinds a component message may write, each bound to its own message type."""
DELETABLE = frozenset(
    (r.api_version, r.kind) for message_type, r in COMPONENT_RESOURCES.items() if message_type not in CREATE_ONLY
)
"""Deleting needs a read first (is the target controlled by the TrainJob?), which a create-only kind does not get."""


def authorize_message(message: ApplyMessage, body: bytes) -> Verdict:
    """What the message itself must say before any request is made; ``body`` is its encoded object.

    The target lives in the TrainJob's namespace and is of a component kind bound to the message's type;
    the object names the target and carries exactly one owner reference, the controller reference to the
    TrainJob; a status is for that TrainJob itself; the field manager is Trainer's.
    """
    target, job = message.target, message.trainjob
    if target.namespace != job.namespace:
        return Verdict(False, f"target namespace {target.namespace!r} is not the TrainJob's ({job.namespace!r})")
    if message.field_manager != FIELD_MANAGER:
        return Verdict(False, f"field manager {message.field_manager!r} is not {FIELD_MANAGER!r}")
    gvk = (target.api_version, target.kind)
    if isinstance(message, DeleteComponent):
        if gvk not in DELETABLE or target.subresource is not None:
            return Verdict(False, f"{target.kind} in {target.api_version} is not a component kind")
        return ALLOWED
    try:
        claimed = objects.read(body)
    except msgspec.DecodeError as exc:  # pragma: no cover - the body was encoded from a decoded struct
        return Verdict(False, f"unreadable object: {exc}")
    if (claimed.apiVersion, claimed.kind) != gvk:
        return Verdict(False, f"object is {claimed.kind} in {claimed.apiVersion}, target is {target.kind}")
    if claimed.metadata.name != target.name or claimed.metadata.namespace not in ("", target.namespace):
        return Verdict(False, "object metadata does not name the target")
    if isinstance(message, ApplyTrainJobStatus):
        if gvk != (resources.TRAINJOB.api_version, resources.TRAINJOB.kind) or target.subresource != "status":
            return Verdict(False, "a status apply must target a TrainJob's status subresource")
        if target.name != job.name:
            return Verdict(False, f"status for TrainJob {target.name!r}, but the message is for {job.name!r}")
        if claimed.metadata.ownerReferences:
            return Verdict(False, "a status apply carries no owner references")
        return ALLOWED
    expected = COMPONENT_RESOURCES.get(type(message))
    if expected is None or gvk != (expected.api_version, expected.kind) or target.subresource is not None:
        return Verdict(False, f"{target.kind} in {target.api_version} is not a component kind for this message")
    refs = claimed.metadata.ownerReferences
    if len(refs) != 1 or refs[0].controller is not True:
        return Verdict(False, "the object must carry exactly one owner reference, the controller reference")
    ref = refs[0]
    if (ref.apiVersion, ref.kind, ref.name, ref.uid) != (
        t.API_VERSION,
        t.TRAINJOB_KIND,
        job.name,
        message.trainjob_uid,
    ):
        return Verdict(False, f"the controller reference points to {ref.kind} {ref.name} ({ref.uid}), not the TrainJob")
    return ALLOWED
