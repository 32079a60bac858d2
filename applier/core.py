"""The applier's decisions, separate from its I/O: how an attempt ends when it does not finish, what one
claim round does with a plan (``decide``), and what to call the outcome.

Read top to bottom, this is the order a message meets them. First the error types, which every module
above raises and ``applier.service`` finishes each its own way. Then one claim round, as ``applier.fence``
walks it: whether the plan is stale (``is_stale``), whether the live target is read (``reads_live``), and
``decide``, which answers with one ``Step`` out of a closed set that the fence performs; the small
functions ``decide`` is made of follow it in the order it calls them (``authorize_live``,
``still_applied``, ``policy_allows``, ``held_state``, ``status_outdated``), each with the reason it exists.
After the round: what the fence makes of the API server's answer (``outcome``, ``refused_write``,
``existing``), the applier's own condition on the TrainJob, and the judgement of a ledger claim newer than
the cluster (``applier.claims``). What the message itself may ask for is ``applier.authorize``'s, and the
check of the TrainJob it names is ``applier.trainjobs``', where the TrainJob is read.

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

from applier import objects
from contracts import conditions, labels
from contracts import trainer as t
from contracts.messages import (
    AppliedRecord,
    ApplyAction,
    ApplyMessage,
    ApplySecret,
    ApplyTrainJobStatus,
    ObjectApply,
)

# -------------------------------------------------------------------- how an attempt ends without a Done


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


class Held(Exception):
    """The message waits (nak with a delay) for something that resolves itself, e.g. a claim's grace."""

    def __init__(self, delay: float) -> None:
        super().__init__(f"held for {delay:.1f}s")
        self.delay = delay


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


SETTLING_DELIVERIES = 8
"""With the applier's growing nak delay (2 s doubling, at most 60 s) about three minutes."""
SETTLING_REFUSALS = ("retentionPolicy must be retain when PVC exists",)
"""Refusals that name a state the garbage collector is removing: JobSet v0.12.0's webhook answers this when
a claim of the JobSet's name still exists (whenDeleted: Delete claims go with the JobSet that owned them)."""


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
class Verdict:
    """A check's answer: allowed, or refused and why. A refusal is raised as ``Unauthorized`` (or, when the
    TrainJob is gone, ``TrainJobGone``) by whoever made the check."""

    allowed: bool
    why: str = ""
    gone: bool = False
    """Refused because the TrainJob the message names no longer exists: noise, not a forgery."""


ALLOWED = Verdict(True)


# ---------------------------------------------------------------------------------- what one attempt did


class Done(msgspec.Struct, frozen=True, kw_only=True):
    """What one apply or delete attempt did: the action reported, the resourceVersion it left, and why."""

    action: ApplyAction
    resource_version: str = ""
    reason: str = ""


STALE_PLAN = "stale plan: a newer plan for this target was claimed or applied"
ALREADY_APPLIED = "already applied; the live object still holds it"
ALREADY_HELD = "the live object already holds the plan; applying it would change nothing"
STALE_STATUS = "stale status: the TrainJob changed since this status was planned"
CREATED_CONCURRENTLY = "created concurrently"


# --------------------------------------------------------------------------------------- one claim round


def is_stale(record: AppliedRecord | None, message: ApplyMessage) -> bool:
    """A plan made from an older observation than one already claimed or applied for the same target."""
    if record is None or message.source_version == 0:
        return False
    return record.source_version > message.source_version


CREATE_ONLY: frozenset[type] = frozenset({ApplySecret})
"""Kinds the applier writes by create alone and never reads: it has no get, list, watch or patch on Secrets.

Kubernetes RBAC has no metadata-only read, and an apply or patch answers with the whole object, so any of
these verbs would let a stolen applier token read other Secrets' data. Every Secret a plan holds is
``if-absent`` (made once, with fresh key material), so a create, answered 409 when the name is taken, is all
the write needs; the ledger's ``created_for`` says whether the existing one is this pipeline's
(``existing``)."""


def reads_live(message: ObjectApply, record: AppliedRecord | None, *, known_version: str = "") -> bool:
    """Whether a claim round reads the live target before ``decide``.

    A component is always read: whether it exists, and whose it is, decides everything, and not even a
    plan that saw the target absent moments ago is taken at its word (the API server has no create-only
    apply, so only a read tells an object of that name apart). A status is read only when the ledger has a
    record it might still hold and the TrainJob's version is not known otherwise (``known_version``, what
    the applier's watch of TrainJobs last said: ``status_by_version``); a create-only target never is.
    """
    if type(message) in CREATE_ONLY:
        return False
    if message.target.subresource:
        return record is not None and not known_version
    return True


class Refuse(msgspec.Struct, frozen=True, kw_only=True):
    """The live target is controlled by something other than this TrainJob: nothing is written or taken over."""

    why: str


class Advance(msgspec.Struct, frozen=True, kw_only=True):
    """The record is this very plan and the live object still holds it (``still_applied``): only the record
    moves on to this message (compare-and-set); the outcome is ``unchanged``."""

    record: AppliedRecord
    resource_version: str


class Leave(msgspec.Struct, frozen=True, kw_only=True):
    """The policy leaves the live object as it is (``policy_allows``); ``skipped``, and why. With ``label``,
    the merge patch that adds this pipeline's missing label first (``owned_label_patch``)."""

    resource_version: str
    reason: str
    label: bytes | None = None


class Adopt(msgspec.Struct, frozen=True, kw_only=True):
    """The live object already holds the plan (``held_state``): ``record`` is written as applied
    (compare-and-set) and nothing else, but for this pipeline's label when ``label`` says it lacks it."""

    record: AppliedRecord
    label: bool = False


class Create(msgspec.Struct, frozen=True, kw_only=True):
    """A create-only target (``CREATE_ONLY``): ``claim`` it, then create it; it is never read or patched.

    ``known`` is the record as this cluster made it (``None`` if none, or another history's): whom it says
    the object was created for judges a create answered 409 (``existing``).
    """

    claim: AppliedRecord
    known: AppliedRecord | None = None


class SkipStatus(msgspec.Struct, frozen=True, kw_only=True):
    """A status planned from another TrainJob version than the live one (``status_outdated``): ``claim`` the
    target, then skip it; a newer plan carries the newer status."""

    claim: AppliedRecord
    resource_version: str


class Write(msgspec.Struct, frozen=True, kw_only=True):
    """``claim`` the target, then apply the plan, on condition of ``precondition`` (the live resourceVersion
    read, ``""`` for none); ``before`` is the resourceVersion the outcome is told from (``outcome``)."""

    claim: AppliedRecord
    precondition: str
    before: str


Step = Refuse | Advance | Leave | Adopt | Create | SkipStatus | Write
"""What one claim round does; ``applier.fence`` performs each, and any compare-and-set it loses starts the
next round."""


def decide(
    message: ObjectApply,
    record: AppliedRecord | None,
    live: bytes | None,
    *,
    planned: bytes,
    stamp: str,
    known_version: str = "",
) -> Step:
    """What a claim round does with a plan that is not stale (``is_stale``).

    ``record`` is the target's ledger record, ``live`` the live target as read (``None``: absent, or not read,
    see ``reads_live``), ``planned`` the encoded object without generated key material (what the digest is
    of), ``stamp`` the cluster epoch the claims are made in (``applier.epoch``), and ``known_version`` the
    TrainJob's resourceVersion as the applier's watch last saw it (``""``: not known), which a status not
    read is judged by (``status_by_version``).
    """
    if type(message) in CREATE_ONLY:
        digest = create_only_digest(message, planned)
        # Whom another cluster's (or an earlier epoch's) record names says nothing of this cluster's object.
        known = record if record is not None and record.cluster == stamp else None
        if known is not None and already_created(message, known, digest=digest):
            return Leave(resource_version=known.resource_version, reason=ALREADY_CREATED)
        created_for = known.created_for if known is not None else ""
        return Create(claim=_claim(message, digest, stamp, created_for=created_for), known=known)
    digest = content_digest(planned)
    if message.target.subresource and live is None and record is not None and known_version:
        return status_by_version(message, record, digest=digest, stamp=stamp, known_version=known_version)
    verdict = authorize_live(message, live)
    if not verdict.allowed:
        return Refuse(why=verdict.why)
    state = live_state(live)
    if record is not None and still_applied(record, live, message, digest=digest):
        advanced = msgspec.structs.replace(
            record, source_version=message.source_version, source_seq=message.source_seq, cluster=stamp
        )
        return Advance(record=advanced, resource_version=state.resource_version)
    if message.policy != "always":
        allowed, why = policy_allows(message, state)
        if not allowed:
            label = owned_label_patch(message, live)
            if label is not None:
                return Leave(resource_version=state.resource_version, reason=why + "; labelled", label=label)
            return Leave(resource_version=state.resource_version, reason=why)
    subresource = message.target.subresource
    held = "differs" if live is None or subresource else held_state(planned, live, manager=message.field_manager)
    if live is not None and held != "differs":
        # One Trainer made, one whose ledger record was lost, or a re-plan of an existing JobSet that only
        # repeats what the live object holds.
        adopted = msgspec.structs.replace(
            _claim(message, digest, stamp),
            state="applied",
            resource_version=state.resource_version,
            managed=managed_digest(live, manager=message.field_manager, subresource=None),
        )
        return Adopt(record=adopted, label=held == "held-unlabelled")
    claim = _claim(message, digest, stamp)
    if status_outdated(message, live_version=state.resource_version if live is not None else None):
        return SkipStatus(claim=claim, resource_version=state.resource_version)
    # A status carries its own precondition: the TrainJob version it was planned from.
    precondition = "" if subresource else state.resource_version
    return Write(claim=claim, precondition=precondition, before=state.resource_version)


def status_by_version(
    message: ObjectApply, record: AppliedRecord, *, digest: str, stamp: str, known_version: str
) -> Step:
    """A status with a ledger record, judged by the TrainJob version the watch last saw instead of a read.

    The status apply is conditional on the version it was planned from, so the API server refuses one
    planned from an older TrainJob (409) whatever is decided here; the read only saved that write. The
    watch may lag behind the cluster but never runs ahead of it, so only a known version *newer* than the
    planned one proves the plan outdated: the last write of this very plan moved the TrainJob on (a
    repeat: the record advances, ``unchanged``, as ``still_applied`` would say), or another change did
    (``SkipStatus``). Otherwise the status is written, and the server's precondition decides.
    """
    planned_from = planned_resource_version(message)
    if planned_from and _version(known_version) > _version(planned_from):
        if record.state == "applied" and record.digest == digest:
            advanced = msgspec.structs.replace(
                record, source_version=message.source_version, source_seq=message.source_seq, cluster=stamp
            )
            return Advance(record=advanced, resource_version=known_version)
        return SkipStatus(claim=_claim(message, digest, stamp), resource_version=known_version)
    return Write(claim=_claim(message, digest, stamp), precondition="", before=known_version)


def content_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()[:32]


def create_only_digest(message: ObjectApply, planned: bytes) -> str:
    """A create-only target's digest: its planned object, the TrainJob it is for and what sends its create
    again (``recheck``), so that no plan for another TrainJob of the same name ever repeats it."""
    recheck = message.recheck if isinstance(message, ApplySecret) else ""
    if not recheck:
        return content_digest(planned)
    return content_digest(b"\0".join((planned, message.trainjob_uid.encode(), recheck.encode())))


def already_created(message: ObjectApply, record: AppliedRecord, *, digest: str) -> bool:
    """A create-only plan that repeats the one the ledger records as done: nothing is sent, not even the create.

    The applier may not read a Secret, so a create answered 409 was the only way to learn it exists; it
    was sent for every plan, and after a restart or a resync for every Secret there is. The plan's
    ``recheck`` says when to send it again anyway (the TrainJob was changed by someone, so a Secret
    deleted by hand is made again); a plan without one (an older planner's) is always created.
    """
    recheck = message.recheck if isinstance(message, ApplySecret) else ""
    return bool(recheck) and record.state == "applied" and record.digest == digest


def _claim(message: ApplyMessage, digest: str, stamp: str, *, created_for: str = "") -> AppliedRecord:
    return AppliedRecord(
        source_version=message.source_version,
        source_seq=message.source_seq,
        digest=digest,
        state="claimed",
        created_for=created_for,
        cluster=stamp,
    )


def authorize_live(message: ApplyMessage, live: bytes | None) -> Verdict:
    """An existing target is written (or deleted) only when this TrainJob controls it: nothing is taken over."""
    if live is None or isinstance(message, ApplyTrainJobStatus):
        return ALLOWED
    refs = [r for r in objects.read(live).metadata.ownerReferences if r.controller is True]
    if any(r.uid == message.trainjob_uid for r in refs):
        return ALLOWED
    owner = f"{refs[0].kind} {refs[0].name}" if refs else "nobody"
    return Verdict(False, f"existing {message.target} is controlled by {owner}, not by TrainJob {message.trainjob}")


@dataclass(frozen=True)
class LiveState:
    """What the applier needs to know about the live target to honour a policy."""

    exists: bool
    suspended: bool = False
    resource_version: str = ""


def live_state(raw: bytes | None) -> LiveState:
    if raw is None:
        return LiveState(exists=False)
    live = objects.read(raw)
    suspended = live.spec.suspend is True
    return LiveState(exists=True, suspended=suspended, resource_version=live.metadata.resourceVersion)


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


def managed_digest(raw: bytes, *, manager: str, subresource: str | None) -> str:
    """Digest of the fields ``manager`` owns by Apply on this object (or its subresource).

    It changes when anyone else takes over or removes a field we set, and not when others touch only
    their own fields (a controller writing status, say); it is empty when we own nothing there.
    """
    for entry in objects.read(raw).metadata.managedFields:
        if entry.manager == manager and entry.operation == "Apply" and entry.subresource == (subresource or ""):
            return hashlib.sha256(bytes(entry.fieldsV1)).hexdigest()[:32]
    return ""


def policy_allows(message: ApplyMessage, live: LiveState) -> tuple[bool, str]:
    """Whether the message may be applied to this live state, and why not when it may not."""
    if message.policy == "always" or not live.exists:
        return True, ""
    if message.policy == "if-absent":
        return False, "exists already; created once and never changed"
    if live.suspended or message.trainjob_suspended:
        return True, ""
    return False, "running and not suspended; left as it is"


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
    if objects.read(live_raw).metadata.labels.get(labels.MANAGED_BY_LABEL) == labels.MANAGED_BY:
        return None
    return OWNED_LABEL_PATCH


OWNED_LABEL_PATCH = msgspec.json.encode({"metadata": {"labels": {labels.MANAGED_BY_LABEL: labels.MANAGED_BY}}})
"""The JSON merge patch that adds this pipeline's label and nothing else."""


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


def _keyed_by(item: dict[str, object], key: dict[str, object]) -> bool:
    return all(item.get(field, LIST_KEY_DEFAULTS.get(field)) == value for field, value in key.items())


LIST_KEY_DEFAULTS: dict[str, object] = {"protocol": "TCP"}
"""List-map key fields the API server fills in when an apply leaves them out.

A port list is keyed by containerPort and protocol, and protocol defaults to TCP (for built-in types and
in the pod templates of the CRDs this pipeline writes alike), so a manager that applied a port without a
protocol owns the item keyed ``{"containerPort": N, "protocol": "TCP"}``. A plan that leaves protocol out
names that same item again; one that owned a UDP port and now sends none does not.
"""


def _holds(want: object, have: object) -> bool:
    if isinstance(want, dict):
        return isinstance(have, dict) and all(v is None or (k in have and _holds(v, have[k])) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(_holds, want, have))
    return want == have


def status_outdated(message: ObjectApply, *, live_version: str | None) -> bool:
    """A status planned from another TrainJob version than the live one: a newer plan carries the newer status.

    ``live_version`` is the live TrainJob's resourceVersion, ``None`` if it was not read.
    """
    planned_from = planned_resource_version(message)
    return bool(
        message.target.subresource and live_version is not None and planned_from and planned_from != live_version
    )


def planned_resource_version(message: ApplyMessage) -> str:
    """The resourceVersion a message's object carries as its precondition, if any."""
    meta = getattr(getattr(message, "object", None), "metadata", msgspec.UNSET)
    value = getattr(meta, "resource_version", msgspec.UNSET) if meta is not msgspec.UNSET else msgspec.UNSET
    return value if isinstance(value, str) else ""


# ------------------------------------------------------- what the API server's answer makes of the round


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


# -------------------------------------------------------------------------------- poisoned ledger claims


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
