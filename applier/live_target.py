"""What the live target holds, as ``decide`` (``applier.claim_round``) asks it, in the order it asks:
whether this TrainJob controls it (``authorize_live``), whether the ledger's record still holds
(``still_applied``), whether the policy lets it be written (``policy_allows``), whether a write would change
anything (``held_state``), and whether a status was planned from the live TrainJob (``status_outdated``).
Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

import msgspec

from applier import objects
from applier.errors import ALLOWED, Verdict
from contracts import labels
from contracts.messages import AppliedRecord, ApplyMessage, ApplyTrainJobStatus, ObjectApply


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


def resource_version_number(text: str) -> int:
    """A resourceVersion as the number etcd gives it; 0 for one that is not a number (never newer)."""
    try:
        return int(text)
    except ValueError:
        return 0
