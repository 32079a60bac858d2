"""One claim round, as ``applier.fence`` walks it once the plan is known not to be stale
(``applier.claims.is_stale``): whether the live target is read (``reads_live``), and ``decide``, which
answers with one ``Step`` (``applier.steps``) that the fence performs. The small functions ``decide`` is
made of follow it in the order it calls them (``authorize_live``, ``still_applied``, ``policy_allows``,
``status_outdated``; whether the live object already holds the plan is ``applier.live_holds``'), each with
the reason it exists, so that one round reads down one file. What the API server's answer makes of the
round is ``applier.api_answers``'. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgspec

from applier import objects
from applier.errors import ALLOWED, Verdict
from applier.live_holds import held_state
from applier.objects import resource_version_number
from applier.outcomes import ALREADY_CREATED
from applier.steps import Adopt, Advance, Create, Leave, Refuse, SkipStatus, Step, Write
from contracts import labels
from contracts.messages import AppliedRecord, ApplyMessage, ApplySecret, ApplyTrainJobStatus, ObjectApply

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


def decide(
    message: ObjectApply,
    record: AppliedRecord | None,
    live: bytes | None,
    *,
    planned: bytes,
    stamp: str,
    known_version: str = "",
) -> Step:
    """What a claim round does with a plan that is not stale (``applier.claims.is_stale``).

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
    if planned_from and resource_version_number(known_version) > resource_version_number(planned_from):
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


# ------------------------------------------------------------------ what decide asks of the live target


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
