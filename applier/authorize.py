"""What a message may write: the target checks, against the message itself, the TrainJob it names, and the
live object, before anything is written.

The bus is not trusted to say what may be written: an apply message only names a TrainJob, and the applier
checks that a real TrainJob managed by this controller justifies the write. The checks are pure; each
returns a ``Verdict``, and the service turns a refusal into a dead letter with reason ``unauthorized`` and
writes nothing at all (not even an Event on the TrainJob). They come in the order the applier can make
them: the message alone (``authorize_message``, before any request), the TrainJob as the cluster has it
(``authorize_trainjob``), and the live target once it was read (``authorize_live``); a create-only target,
which is never read, is judged from the ledger (``existing``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

from applier import objects
from contracts import conditions, resources
from contracts import trainer as t
from contracts.components import COMPONENT_KINDS
from contracts.lifecycle import NO_RUNTIME
from contracts.messages import (
    FIELD_MANAGER,
    AppliedRecord,
    ApplyMessage,
    ApplySecret,
    ApplyTrainJobStatus,
    DeleteComponent,
)


class Unauthorized(Exception):
    """The message asks for a write no real TrainJob justifies: dead-lettered, and nothing is written."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class TrainJobGone(Exception):
    """The TrainJob a plan is for no longer exists (deleted, or replaced by one of the same name).

    Its plans in flight are finished, not failed: nothing is written, the result says ``skipped`` and why,
    and no dead letter is kept, since there is nothing for an operator to do.
    """

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    why: str = ""
    gone: bool = False
    """Refused because the TrainJob the message names no longer exists: noise, not a forgery."""


ALLOWED = Verdict(True)

COMPONENT_RESOURCES: dict[type, resources.Resource] = {kind.message: kind.resource for kind in COMPONENT_KINDS}
"""The only kinds a component message may write, each bound to its own message type."""
CREATE_ONLY: frozenset[type] = frozenset({ApplySecret})
"""Kinds the applier writes by create alone and never reads: it has no get, list, watch or patch on Secrets.

Kubernetes RBAC has no metadata-only read, and an apply or patch answers with the whole object, so any of
these verbs would let a stolen applier token read other Secrets' data. Every Secret a plan holds is
``if-absent`` (made once, with fresh key material), so a create, answered 409 when the name is taken, is all
the write needs; the ledger's ``created_for`` says whether the existing one is this pipeline's
(``existing``)."""
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


@dataclass(frozen=True)
class TrainJobFacts:
    """The TrainJob as the live cluster has it: who may ask for writes, and our own condition on it."""

    uid: str
    managed_by: str = ""
    resource_version: str = ""
    applier_condition: str = ""
    """The message of the applier-owned condition, empty when the TrainJob does not have it."""
    runtime: str = NO_RUNTIME
    """The runtime's name (``spec.runtimeRef.name``, immutable): the lifecycle metrics' label."""


def trainjob_facts(raw: bytes | None) -> TrainJobFacts | None:
    return None if raw is None else facts_of(objects.read(raw))


def facts_of(job: objects.KubeObject) -> TrainJobFacts:
    ours = next((c.message for c in job.status.conditions if c.type == conditions.CONDITION_COMPONENTS_APPLIED), "")
    return TrainJobFacts(
        uid=job.metadata.uid,
        managed_by=job.spec.managedBy,
        resource_version=job.metadata.resourceVersion,
        applier_condition=ours,
        runtime=job.spec.runtimeRef.name or NO_RUNTIME,
    )


def authorize_trainjob(message: ApplyMessage, facts: TrainJobFacts | None) -> Verdict:
    """The TrainJob the message names exists, is the same object (uid), and is ours to manage."""
    if facts is None:
        return Verdict(False, f"TrainJob {message.trainjob} does not exist", gone=True)
    if facts.uid != message.trainjob_uid:
        return Verdict(
            False,
            f"TrainJob {message.trainjob} has uid {facts.uid}, the message names {message.trainjob_uid}",
            gone=True,
        )
    if facts.managed_by not in ("", t.MANAGED_BY_TRAINJOB_CONTROLLER):
        return Verdict(False, f"TrainJob {message.trainjob} is managed by {facts.managed_by}")
    return ALLOWED


def authorize_live(message: ApplyMessage, live: bytes | None) -> Verdict:
    """An existing target is written (or deleted) only when this TrainJob controls it: nothing is taken over."""
    if live is None or isinstance(message, ApplyTrainJobStatus):
        return ALLOWED
    refs = [r for r in objects.read(live).metadata.ownerReferences if r.controller is True]
    if any(r.uid == message.trainjob_uid for r in refs):
        return ALLOWED
    owner = f"{refs[0].kind} {refs[0].name}" if refs else "nobody"
    return Verdict(False, f"existing {message.target} is controlled by {owner}, not by TrainJob {message.trainjob}")


ExistingCreateOnly = Literal["ours", "another-trainjob", "unrecorded"]

ALREADY_CREATED = "exists already; created once and never changed"
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
