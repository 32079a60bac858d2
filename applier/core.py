"""The applier's decisions, separate from its I/O: which errors are worth retrying, whether a policy lets
a message touch the live object, and what to call the outcome.

Errors are types, as in kopf (TemporaryError / PermanentError) and controller-runtime (TerminalError):
a transient failure is retried in process and then handed back to JetStream with a delay; a permanent one
is dead-lettered at once, because sending the same bytes again cannot change the answer.
Outcomes use fluxcd ssa's words: created, configured, unchanged, plus skipped and failed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgspec

from contracts import labels
from contracts.messages import AppliedRecord, ApplyAction, ApplyMessage


class TransientError(Exception):
    def __init__(self, reason: str, *, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


class PermanentError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


TRANSIENT_STATUSES = frozenset({0, 408, 409, 425, 429, 500, 502, 503, 504})
PERMANENT_STATUSES = frozenset({400, 401, 403, 404, 405, 406, 410, 413, 415, 422})


def classify(status: int, reason: str, message: str, *, retry_after: float | None = None) -> Exception:
    """Map an API answer to TransientError or PermanentError. Status 0 means no answer (connection)."""
    text = f"{status} {reason}: {message}" if status else message
    if status in TRANSIENT_STATUSES or status >= 500:
        return TransientError(text, retry_after=retry_after)
    if status == 404 and ("the server could not find the requested resource" in message or "page not found" in message):
        return PermanentError(f"{text} (is the CRD installed?)")
    return PermanentError(text)


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
    ConfigMaps and Secrets by that label. Metadata is the one thing even an immutable Secret lets change,
    so the label alone is added, once; nothing the object holds is touched.
    """
    kind = message.target.kind
    if live_raw is None or message.policy != "if-absent" or kind not in labels.LABELLED_KINDS:
        return None
    if _labelled_decoder.decode(live_raw).metadata.labels.get(labels.MANAGED_BY_LABEL) == labels.MANAGED_BY:
        return None
    return msgspec.json.encode({"metadata": {"labels": {labels.MANAGED_BY_LABEL: labels.MANAGED_BY}}})


def outcome(http_status: int, *, before: str, after: str) -> ApplyAction:
    if http_status == 201:
        return "created"
    if before and before == after:
        return "unchanged"
    return "configured"


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
