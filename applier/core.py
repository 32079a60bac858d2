"""The applier's decisions, separate from its I/O: which errors are worth retrying, whether a policy lets
a message touch the live object, and what to call the outcome.

Errors are types, as in kopf (TemporaryError / PermanentError) and controller-runtime (TerminalError):
a transient failure is retried in process and then handed back to JetStream with a delay; a permanent one
is dead-lettered at once, because sending the same bytes again cannot change the answer.
Outcomes use fluxcd ssa's words: created, configured, unchanged, plus skipped and failed.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal

import msgspec

from tjpipe.contracts import conditions, labels, resources
from tjpipe.contracts import trainer as t
from tjpipe.contracts.lifecycle import NO_RUNTIME
from tjpipe.contracts.messages import (
    FIELD_MANAGER,
    AppliedRecord,
    ApplyAction,
    ApplyConfigMap,
    ApplyJobSet,
    ApplyMessage,
    ApplyPodGroup,
    ApplySecret,
    ApplyTrainJobStatus,
    ApplyVolcanoPodGroup,
    DeleteComponent,
    ObjectApply,
)


class TransientError(Exception):
    def __init__(self, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class PermanentError(Exception):
    def __init__(self, reason: str, *, api_reason: str = "", api_message: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.api_reason = api_reason
        """The API server's own status reason (``Invalid``, ``Forbidden``, ...) when it refused the write."""
        self.api_message = api_message


class SettlingRefusal(TransientError):
    """A refusal that the cluster clears by itself within moments, e.g. JobSet's webhook refusing a JobSet
    made again while the claim of the one deleted before it is still being collected. It is retried as a
    transient error for ``SETTLING_DELIVERIES`` deliveries (a few minutes), then it is ``permanent``: a
    refusal that does not clear ends as a condition and a dead letter, never as an endless retry."""

    def __init__(self, reason: str, *, permanent: PermanentError) -> None:
        super().__init__(reason)
        self.permanent = permanent


SETTLING_DELIVERIES = 8
"""With the applier's growing nak delay (2 s doubling, at most 60 s) about three minutes."""
SETTLING_REFUSALS = ("retentionPolicy must be retain when PVC exists",)
"""Refusals that name a state the garbage collector is removing: JobSet v0.12.0's webhook answers this when
a claim of the JobSet's name still exists (whenDeleted: Delete claims go with the JobSet that owned them)."""


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


TRANSIENT_STATUSES = frozenset({0, 408, 409, 425, 429, 500, 502, 503, 504})
PERMANENT_STATUSES = frozenset({400, 401, 403, 404, 405, 406, 410, 413, 415, 422})
"""A 401 gets here only after the API client loaded its credentials again and the retry was refused too
(``plumbing.kube.KubeClient``): an expired exec or service-account token never reaches the dead letters."""


def classify(status: int, reason: str, message: str, *, retry_after: float | None = None) -> Exception:
    """Map an API answer to TransientError or PermanentError. Status 0 means no answer (connection)."""
    text = f"{status} {reason}: {message}" if status else message
    if status in TRANSIENT_STATUSES or status >= 500:
        return TransientError(text, retry_after=retry_after)
    if status == 404 and ("the server could not find the requested resource" in message or "page not found" in message):
        return PermanentError(f"{text} (is the CRD installed?)", api_reason=reason or "NotFound", api_message=message)
    permanent = PermanentError(text, api_reason=reason or str(status), api_message=message)
    if status == 422 and any(settling in message for settling in SETTLING_REFUSALS):
        return SettlingRefusal(f"{text} (waiting for the cluster to settle)", permanent=permanent)
    return permanent


@dataclass(frozen=True)
class LiveState:
    """What the applier needs to know about the live target to honour a policy."""

    exists: bool
    suspended: bool = False
    resource_version: str = ""


class _Owner(msgspec.Struct, kw_only=True):
    uid: str = ""
    controller: bool = False


class _OwnedMeta(msgspec.Struct, kw_only=True):
    ownerReferences: list[_Owner] = []


class _Owned(msgspec.Struct, kw_only=True):
    metadata: _OwnedMeta = msgspec.field(default_factory=_OwnedMeta)


_owned_decoder = msgspec.json.Decoder(_Owned)


def controlled_by(raw: bytes, uid: str) -> bool:
    """Whether the object's controller owner reference names this UID."""
    return any(o.controller and o.uid == uid for o in _owned_decoder.decode(raw).metadata.ownerReferences)


# Partial decoders read only the fields a decision needs; alike in shape to other partial decoders (duplicate
# finders pair them), each names its own fields.
class _LiveSpec(msgspec.Struct, kw_only=True):
    suspend: bool | None = None


class _LiveMeta(msgspec.Struct, kw_only=True):
    resourceVersion: str = ""


class _Live(msgspec.Struct, kw_only=True):
    metadata: _LiveMeta = msgspec.field(default_factory=_LiveMeta)
    spec: _LiveSpec = msgspec.field(default_factory=_LiveSpec)


_live_decoder = msgspec.json.Decoder(_Live)


def live_state(raw: bytes | None) -> LiveState:
    if raw is None:
        return LiveState(exists=False)
    live = _live_decoder.decode(raw)
    suspended = live.spec.suspend is True
    return LiveState(exists=True, suspended=suspended, resource_version=live.metadata.resourceVersion)


def policy_allows(message: ApplyMessage, live: LiveState) -> tuple[bool, str]:
    """Whether the message may be applied to this live state, and why not when it may not."""
    if message.policy == "always" or not live.exists:
        return True, ""
    if message.policy == "if-absent":
        return False, "exists already; created once and never changed"
    if live.suspended or message.trainjob_suspended:
        return True, ""
    return False, "running and not suspended; left as it is"


class _LabelsMeta(msgspec.Struct, kw_only=True):
    labels: dict[str, str] = {}


class _Labelled(msgspec.Struct, kw_only=True):
    metadata: _LabelsMeta = msgspec.field(default_factory=_LabelsMeta)


_labelled_decoder = msgspec.json.Decoder(_Labelled)


def owned_label_patch(message: ApplyMessage, live_raw: bytes | None) -> bytes | None:
    """A merge patch adding this pipeline's label to an existing, unlabelled object, or None.

    An ``if-absent`` object is never changed once it exists, but one made before the label existed (by
    Trainer, or an older version of this pipeline) would stay invisible to the watcher, which selects
    ConfigMaps by that label. So the label alone is added, once; nothing the object holds is touched.
    Secrets never get here: they are create-only (``CREATE_ONLY``), never read or patched.
    """
    kind = message.target.kind
    if live_raw is None or message.policy != "if-absent" or kind not in labels.LABELLED_KINDS:
        return None
    if _labelled_decoder.decode(live_raw).metadata.labels.get(labels.MANAGED_BY_LABEL) == labels.MANAGED_BY:
        return None
    return OWNED_LABEL_PATCH


OWNED_LABEL_PATCH = msgspec.json.encode({"metadata": {"labels": {labels.MANAGED_BY_LABEL: labels.MANAGED_BY}}})
"""The JSON merge patch that adds this pipeline's label and nothing else."""


class Done(msgspec.Struct, frozen=True, kw_only=True):
    """What one apply or delete attempt did: the action reported, the resourceVersion it left, and why."""

    action: ApplyAction
    resource_version: str = ""
    reason: str = ""


STALE_PLAN = "stale plan: a newer plan for this target was claimed or applied"
ALREADY_APPLIED = "already applied; the live object still holds it"


def still_applied(record: AppliedRecord, live_raw: bytes | None, message: ObjectApply, *, digest: str) -> bool:
    """The ledger's applied record is this very plan, and the live object still holds what it applied.

    Then nothing needs writing: the record only advances to this message's source version.
    """
    return (
        live_raw is not None
        and record.state == "applied"
        and record.digest == digest
        and managed_digest(live_raw, manager=message.field_manager, subresource=message.target.subresource)
        == record.managed
    )


ALREADY_HELD = "the live object already holds the plan; applying it would change nothing"
HeldState = Literal["held", "held-unlabelled", "differs"]


def held_state(planned: bytes, live_raw: bytes, *, manager: str) -> HeldState:
    """Whether applying ``planned`` as ``manager`` would leave the live object as it is.

    Asked before any write the ledger does not already rule out: a controller this pipeline takes over
    from (Trainer, which applies with the same field manager) built the target, the ledger lost its
    record, or a new plan of an existing JobSet repeats what the live object holds (a suspended JobSet
    is re-planned from the live one, server defaults included). ``held`` needs two
    things: every value the plan sets is the live value (lists item by item, in order), and every field
    ``manager`` already owns by Apply is still in the plan, since an apply would remove a field its
    manager stops sending. The only thing skipping the write leaves undone is co-owning fields that
    already hold the planned values. Anything this cannot tell (a list of another length, a list key
    it cannot find) is ``differs``: the write is then made, as it would have been without the check.

    ``held-unlabelled``: all that differs is this pipeline's label (an object Trainer made), which the
    label merge patch adds under a field manager of its own, so Trainer's next apply of the object as
    ``trainer`` after a rollback does not take it off again.
    """
    want = msgspec.json.decode(planned)
    have = msgspec.json.decode(live_raw)
    for entry in (have.get("metadata") or {}).get("managedFields") or []:
        if entry.get("manager") == manager and entry.get("operation") == "Apply" and not entry.get("subresource"):
            if not _owned_fields_in(entry.get("fieldsV1") or {}, want):
                return "differs"
            break
    want_meta = want.get("metadata") or {}
    ours = (want_meta.get("labels") or {}).pop(labels.MANAGED_BY_LABEL, None)
    if ours is not None and not want_meta["labels"]:
        del want_meta["labels"]
    if not _holds(want, have):
        return "differs"
    have_labels = (have.get("metadata") or {}).get("labels") or {}
    if ours is not None and have_labels.get(labels.MANAGED_BY_LABEL) != ours:
        return "held-unlabelled"
    return "held"


def _holds(want: object, have: object) -> bool:
    if isinstance(want, dict):
        return isinstance(have, dict) and all(v is None or (k in have and _holds(v, have[k])) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(_holds, want, have))
    return want == have


LIST_KEY_DEFAULTS: dict[str, object] = {"protocol": "TCP"}
"""List-map key fields the API server fills in when an apply leaves them out.

A port list is keyed by containerPort and protocol, and protocol defaults to TCP (for built-in types and
in the pod templates of the CRDs this pipeline writes alike), so a manager that applied a port without a
protocol owns the item keyed ``{"containerPort": N, "protocol": "TCP"}``. A plan that leaves protocol out
names that same item again; one that owned a UDP port and now sends none does not.
"""


def _keyed_by(item: dict[str, object], key: dict[str, object]) -> bool:
    return all(item.get(field, LIST_KEY_DEFAULTS.get(field)) == value for field, value in key.items())


def _owned_fields_in(fields: dict[str, object], obj: object) -> bool:
    """Every field of a managedFields ``fieldsV1`` set is present in ``obj``."""
    for key, sub in fields.items():
        if key == ".":
            continue
        kind, _, rest = key.partition(":")
        child: object
        if kind == "f" and isinstance(obj, dict) and rest in obj:
            child = obj[rest]
        elif kind == "k" and isinstance(obj, list):
            item_key = msgspec.json.decode(rest)
            match = [i for i in obj if isinstance(i, dict) and _keyed_by(i, item_key)]
            if not match:
                return False
            child = match[0]
        elif kind == "v" and isinstance(obj, list):
            if msgspec.json.decode(rest) not in obj:
                return False
            continue
        else:
            return False
        if isinstance(sub, dict) and sub and not _owned_fields_in(sub, child):
            return False
    return True


def status_outdated(message: ObjectApply, *, live_version: str | None) -> bool:
    """A status planned from another TrainJob version than the live one: a newer plan carries the newer status.

    ``live_version`` is the live TrainJob's resourceVersion, ``None`` if it was not read.
    """
    planned_from = planned_resource_version(message)
    return bool(
        message.target.subresource and live_version is not None and planned_from and planned_from != live_version
    )


def outcome(http_status: int, *, before: str, after: str) -> ApplyAction:
    if http_status == 201:
        return "created"
    if before and before == after:
        return "unchanged"
    return "configured"


STALE_STATUS = "stale status: the TrainJob changed since this status was planned"
CREATED_CONCURRENTLY = "created concurrently"

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


def planned_resource_version(message: ApplyMessage) -> str:
    """The resourceVersion a message's object carries as its precondition, if any."""
    meta = getattr(getattr(message, "object", None), "metadata", msgspec.UNSET)
    value = getattr(meta, "resource_version", msgspec.UNSET) if meta is not msgspec.UNSET else msgspec.UNSET
    return value if isinstance(value, str) else ""


def is_stale(record: AppliedRecord | None, message: ApplyMessage) -> bool:
    """A plan made from an older observation than one already claimed or applied for the same target."""
    if record is None or message.source_version == 0:
        return False
    return record.source_version > message.source_version


def content_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[:32]


class _ManagedEntry(msgspec.Struct, kw_only=True):
    manager: str = ""
    operation: str = ""
    subresource: str = ""
    fieldsV1: msgspec.Raw = msgspec.Raw()


class _ManagedMeta(msgspec.Struct, kw_only=True):
    managedFields: list[_ManagedEntry] = []
    resourceVersion: str = ""


class _Managed(msgspec.Struct, kw_only=True):
    metadata: _ManagedMeta = msgspec.field(default_factory=_ManagedMeta)


_managed_decoder = msgspec.json.Decoder(_Managed)


def managed_digest(raw: bytes, *, manager: str, subresource: str | None) -> str:
    """Digest of the fields ``manager`` owns by Apply on this object (or its subresource).

    It changes when anyone else takes over or removes a field we set, and not when others touch only
    their own fields (a controller writing status, say); it is empty when we own nothing there.
    """
    for entry in _managed_decoder.decode(raw).metadata.managedFields:
        if entry.manager == manager and entry.operation == "Apply" and entry.subresource == (subresource or ""):
            return hashlib.sha256(bytes(entry.fieldsV1)).hexdigest()[:32]
    return ""


# ------------------------------------------------------------------------------ what a message may touch
#
# The bus is not trusted to say what may be written: an apply message only names a TrainJob, and the
# applier checks, against the message and then against the live cluster, that a real TrainJob managed by
# this controller justifies the write. Each check returns a Verdict; the service turns a refusal into a
# dead letter with reason ``unauthorized`` and writes nothing at all.


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    why: str = ""
    gone: bool = False
    """Refused because the TrainJob the message names no longer exists: noise, not a forgery."""


ALLOWED = Verdict(True)

COMPONENT_RESOURCES: dict[type, resources.Resource] = {
    ApplyJobSet: resources.JOBSET,
    ApplyConfigMap: resources.CONFIG_MAP,
    ApplySecret: resources.SECRET,
    ApplyPodGroup: resources.POD_GROUP,
    ApplyVolcanoPodGroup: resources.VOLCANO_POD_GROUP,
}
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


class _Ref(msgspec.Struct, kw_only=True):
    apiVersion: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


class _ClaimMeta(msgspec.Struct, kw_only=True):
    name: str = ""
    namespace: str = ""
    ownerReferences: list[_Ref] = []


class _Claimed(msgspec.Struct, kw_only=True):
    apiVersion: str = ""
    kind: str = ""
    metadata: _ClaimMeta = msgspec.field(default_factory=_ClaimMeta)


_claimed_decoder = msgspec.json.Decoder(_Claimed)


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
        claimed = _claimed_decoder.decode(body)
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


class _Condition(msgspec.Struct, kw_only=True):
    type: str = ""
    message: str = ""


class _JobStatus(msgspec.Struct, kw_only=True):
    conditions: list[_Condition] = []


class _RuntimeRef(msgspec.Struct, kw_only=True):
    name: str = ""


class _JobSpec(msgspec.Struct, kw_only=True):
    managedBy: str = ""
    runtimeRef: _RuntimeRef = msgspec.field(default_factory=_RuntimeRef)


class _JobMeta(msgspec.Struct, kw_only=True):
    uid: str = ""
    resourceVersion: str = ""


class _Job(msgspec.Struct, kw_only=True):
    metadata: _JobMeta = msgspec.field(default_factory=_JobMeta)
    spec: _JobSpec = msgspec.field(default_factory=_JobSpec)
    status: _JobStatus = msgspec.field(default_factory=_JobStatus)


_job_decoder = msgspec.json.Decoder(_Job)


def trainjob_facts(raw: bytes | None) -> TrainJobFacts | None:
    if raw is None:
        return None
    job = _job_decoder.decode(raw)
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
    refs = [r for r in _claimed_decoder.decode(live).metadata.ownerReferences if r.controller is True]
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


# ------------------------------------------------------------------------------- the applier's condition


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


# ----------------------------------------------------------------------------------- poisoned ledger claims


def _version(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def claim_beyond_cluster(record: AppliedRecord, *, cluster_revision: str) -> bool:
    """A claim newer than the cluster itself: no observation could have produced it.

    A record's source_version is the newest resourceVersion among the objects a plan was made from, and one
    etcd revision counter numbers every object, so a genuine claim is never above the cluster's current
    revision (a list's resourceVersion). Comparing with the live target and the TrainJob alone is not
    enough: the snapshot ConfigMap, the runtime or a JobSet status change can make a genuine claim newer
    than both, and a replayed older plan then looked like poisoning. An unknown revision proves nothing.
    """
    revision = _version(cluster_revision)
    return revision > 0 and record.source_version > revision


StaleClaimAction = Literal["overwrite", "hold"]


def stale_claim_action(first_seen: float, now: float, *, grace_seconds: float) -> StaleClaimAction:
    """A claim beyond the cluster is held to be corrupt, and overwritten, once it outlasted the grace."""
    return "overwrite" if now - first_seen >= grace_seconds else "hold"
