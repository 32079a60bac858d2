"""Messages between the services: what was observed, what to apply, and what happened.

Each message kind is a member of a tagged union, so a consumer decodes any payload on its subject into
exactly one typed value or rejects it as undecodable; there is no "maybe this dict has a kind field".

Events are *level* snapshots, not deltas: a ``TrainJobObserved`` carries the TrainJob, the runtime it
resolved to and the JobSet it owns, all as the watcher saw them at one moment. That is what lets the
planner stay a pure function of one event and what makes replaying a single event meaningful on its own.

Apply messages carry a complete apply configuration for one component. Fields the planner does not mean
to own stay ``msgspec.UNSET`` and are never encoded, so Server-Side Apply attributes to our field manager
exactly the fields we set. The target (GVK, namespace, name) and the status-subresource flag are spelled
out next to the object so the applier can route and fence a message without interpreting its body.

The wire-compatibility rule (how one version of the services reads another's messages, in a rolling
upgrade or a rollback, and in the history streams for as long as they keep them):

* A field may be **added** to a message or to anything it carries, always with a default (``msgspec.UNSET``
  for a Kubernetes field), so a message written before the field existed still decodes. Readers ignore
  fields they do not know (no struct here forbids unknown fields), so a message written after a field was
  added decodes in an older reader too, which simply does not see it.
* A field is never **renamed**, **removed** or given another **type**, and a default never changes meaning;
  a union's **tags** (``type`` of events, ``component`` of applies) and the Literal values stay as they are.
  What replaces a field is a new field beside it, read with a fallback to the old one.
* Events and apply messages carry ``wire_version``, the major version of this format (``WIRE_VERSION``).
  Additions do not bump it. Only a change an older reader would misread (a field whose absence it would
  take for "nothing", a meaning that changes) bumps it, and a reader refuses a message whose
  ``wire_version`` is above its own: ``decode_event``/``decode_apply`` raise ``UnsupportedVersion``, and the
  consumer dead-letters the message with reason ``unsupported-version`` instead of misapplying it.
  A message written before the field existed (up to 1ccf0d4) decodes with ``wire_version`` 0,
  ``UNVERSIONED``; a consumer that must know more about such a message than its fields say treats it on
  its own terms (``planner.core``: an unversioned event whose JobSet carries none of the spec fields
  JobSet keeps as created came from a watcher that did not keep them, and the JobSet is not re-applied).

``tests/unit/test_contracts_wire_compat.py`` decodes what older commits' own encoders wrote with today's types.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal, get_args

import msgspec

from contracts.jobset import JobSet
from contracts.kube import ConfigMap, Secret
from contracts.scheduling import PodGroup, VolcanoPodGroup
from contracts.trainer import TrainingRuntime, TrainJob

FIELD_MANAGER = "trainer"

WIRE_VERSION = 1
"""The major version of the events' and apply messages' format that this code writes and reads (see above)."""
UNVERSIONED = 0
"""``wire_version`` of a message written before messages carried one."""


class UnsupportedVersion(msgspec.ValidationError):
    """A message of a newer major wire version than this reader's: kept as a dead letter, never guessed at.

    A ``msgspec.ValidationError``, so a consumer that only knows "undecodable" still dead-letters it."""

    reason = "unsupported-version"


class ObjectKey(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, text: str) -> ObjectKey:
        namespace, sep, name = text.partition("/")
        if not sep or not namespace or not name or "/" in name:
            raise ValueError(f"expected NAMESPACE/NAME, got {text!r}")
        return cls(namespace=namespace, name=name)


# --------------------------------------------------------------------------------------------- events


RuntimeSource = Literal["snapshot", "live", "none"]


class TrainJobObserved(msgspec.Struct, frozen=True, kw_only=True, tag="trainjob.observed"):
    """The state of one TrainJob and everything its plan depends on, at one moment."""

    wire_version: int = WIRE_VERSION
    """The format's major version when written; ``UNVERSIONED`` after decoding one written without it."""
    trainjob: TrainJob
    runtime: TrainingRuntime | None = None
    """The runtime ``spec.runtimeRef`` resolved to; ``None`` when it does not exist (yet)."""
    runtime_source: RuntimeSource = "live"
    """Where ``runtime`` came from: the TrainJob's runtime snapshot ConfigMap, or the live runtime object."""
    runtime_error: str = ""
    """Why the runtime could not be used, e.g. a snapshot owned by another object; empty when it could."""
    priority_classes: tuple[str, ...] | None = None
    """Names of the cluster's PriorityClasses, for the Volcano check; ``None`` when the watcher does not know."""
    jobset: JobSet | None = None
    """The JobSet this TrainJob controls, if any; only its status and suspend flag matter to plans."""
    observed_at: float
    """Unix seconds when the watcher took the snapshot; the planner's only notion of "now"."""
    cause: str = ""
    """What made the watcher publish, e.g. ``TrainJob MODIFIED`` or ``JobSet MODIFIED`` or ``resync``."""
    trace_id: str = ""
    echo: bool = False
    """All that changed is the pipeline's own status write, and nothing the planner decides from can have
    changed since the plan that made it (``watcher.core.EchoGuard``): only the status is planned again, from
    the JobSet the observation carries. An older planner, which does not know the field, plans it whole."""


class TrainJobDeleted(msgspec.Struct, frozen=True, kw_only=True, tag="trainjob.deleted"):
    wire_version: int = WIRE_VERSION
    key: ObjectKey
    uid: str
    observed_at: float
    trace_id: str = ""


Event = TrainJobObserved | TrainJobDeleted


# ---------------------------------------------------------------------------------------------- applies

ApplyPolicy = Literal["always", "if-absent", "while-suspended"]
"""How the applier treats a live object that already exists.

``always``: apply. ``if-absent``: create only, never change what an existing object holds (e.g. immutable
Secrets, generated keys); the applier only adds this pipeline's label to one made without it.
``while-suspended``: create if absent; otherwise apply only while the TrainJob or the live object is
suspended, which is Trainer's rule for JobSets and PodGroups of running jobs.
"""


class Target(msgspec.Struct, frozen=True, kw_only=True):
    api_version: str
    kind: str
    namespace: str
    name: str
    subresource: Literal["status"] | None = None

    @property
    def group(self) -> str:
        return self.api_version.rpartition("/")[0]

    @property
    def version(self) -> str:
        return self.api_version.rpartition("/")[2]

    def __str__(self) -> str:
        sub = f"/{self.subresource}" if self.subresource else ""
        return f"{self.kind}{sub} {self.namespace}/{self.name}"


class _Apply(msgspec.Struct, frozen=True, kw_only=True, tag_field="component"):
    wire_version: int = WIRE_VERSION
    """As on events: the format's major version when written, ``UNVERSIONED`` for a message without it."""
    trainjob: ObjectKey
    trainjob_uid: str
    target: Target
    source_seq: int
    """Sequence of the event this plan came from, in the events stream (for history and replay)."""
    source_version: int = 0
    """The newest resourceVersion among the objects the plan was made from: the ordering fence.

    One etcd revision counter numbers every object, so a later observation of any input has a version at
    least as high, whichever watcher replica made it and in whatever order the bus delivers it."""
    field_manager: str = FIELD_MANAGER
    force: bool = True
    policy: ApplyPolicy = "always"
    trainjob_suspended: bool = False
    """``spec.suspend`` of the TrainJob when planned; a ``while-suspended`` component may then be updated."""
    trace_id: str = ""
    observed_at: float = 0.0
    """When the watcher saw the change this plan answers; the start of the end-to-end latency."""
    observed_absent: bool = False
    """The observation this plan came from showed no such object (a hint, kept for history and replay).

    The applier no longer acts on it: an observation only covers objects the TrainJob controls, so an object
    of the same name owned by someone else, or by nobody, would look absent. Before a first write the
    applier reads the target itself, and refuses to take over what the TrainJob does not control."""


class ApplyJobSet(_Apply, frozen=True, kw_only=True, tag="jobset"):
    object: JobSet


LifecycleChange = Literal["completed", "failed", "suspended"]


class Transition(msgspec.Struct, frozen=True, kw_only=True):
    """A TrainJob lifecycle change a status apply makes: a condition that was not True at the planned version.

    The planner states it; the applier counts it only when its status apply, conditional on that very
    version, changed the TrainJob, which is what makes the count happen once (docs/operating.md, metrics).
    """

    change: LifecycleChange
    reason: str = ""
    """The condition's reason, e.g. ``DeadlineExceeded`` for ``failed``."""
    duration_seconds: float | msgspec.UnsetType = msgspec.UNSET
    """From the TrainJob's creation to the condition's transition, for ``completed`` and ``failed``."""


class ApplyTrainJobStatus(_Apply, frozen=True, kw_only=True, tag="trainjob-status"):
    object: TrainJob
    transitions: tuple[Transition, ...] = ()
    paced: bool = False
    """Only the Jobs' counts change, no condition: the applier may hold the write so that a running TrainJob's
    status is written at most once per interval (``applier.pacing``). An older applier writes it at once."""


class ApplyConfigMap(_Apply, frozen=True, kw_only=True, tag="configmap"):
    object: ConfigMap


SecretGenerator = Literal["mpi-ssh-auth", "flux-curve"]
"""Key material the applier makes itself when it writes the Secret, so no key is ever planned or published.

Both are random and made only when the Secret does not exist (policy ``if-absent``):
``mpi-ssh-auth``: a fresh ECDSA P-521 key pair (``ssh-privatekey`` PEM, ``ssh-publickey`` authorized_keys
line). ``flux-curve``: a ZeroMQ CURVE certificate in Trainer's format around a fresh X25519 key; Trainer
derives that key from the TrainJob's UID, which every event carries, so it is not derived here.
"""


class ApplySecret(_Apply, frozen=True, kw_only=True, tag="secret"):
    object: Secret
    generate: SecretGenerator | None = None
    recheck: str = ""
    """What, when it changes, sends the create again although the ledger says the Secret was made: the
    TrainJob's generation, labels and annotations (``planner.core.secret_recheck``). The applier may not read
    a Secret, so a plan that repeats the last one it created costs nothing (no create answered 409 after a
    restart or a resync), and a Secret deleted by hand is made again once someone changes its TrainJob.
    An older planner sends none: every plan of it is created again, as before."""


class ApplyPodGroup(_Apply, frozen=True, kw_only=True, tag="podgroup"):
    object: PodGroup


class ApplyVolcanoPodGroup(_Apply, frozen=True, kw_only=True, tag="volcano-podgroup"):
    object: VolcanoPodGroup


class DeleteComponent(_Apply, frozen=True, kw_only=True, tag="delete"):
    """Delete the target if it exists and is controlled by the TrainJob (e.g. a JobSet past its deadline)."""

    reason: str = ""


ObjectApply = ApplyJobSet | ApplyTrainJobStatus | ApplyConfigMap | ApplySecret | ApplyPodGroup | ApplyVolcanoPodGroup
"""The messages that carry an object to server-side apply."""

ApplyMessage = ObjectApply | DeleteComponent


def _message_for_object_type() -> Mapping[type, type[ObjectApply]]:
    table: dict[type, type[ObjectApply]] = {}
    for message_type in get_args(ObjectApply):
        (field,) = (f for f in msgspec.structs.fields(message_type) if f.name == "object")
        if not isinstance(field.type, type) or field.type in table:
            raise TypeError(f"{message_type.__name__}.object must be one struct type no other apply message carries")
        table[field.type] = message_type
    return MappingProxyType(table)


MESSAGE_FOR_OBJECT_TYPE = _message_for_object_type()
"""The apply message that carries each object type, read off ``ObjectApply`` when this module is imported.

A new member of the union is found here without a second table to keep in step; two members carrying
the same object type, or one carrying a union, stop the import.
"""


def component_of(message: ApplyMessage) -> str:
    """The stable component name of a message: its kind tag plus the target name where one kind repeats."""
    tag = type(message).__struct_config__.tag
    if isinstance(message, ApplyConfigMap | ApplySecret):
        return f"{tag}.{message.target.name}"
    if isinstance(message, DeleteComponent):
        return f"{tag}.{message.target.kind.lower()}"
    return str(tag)


class Plan(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the planner decided for one event."""

    trainjob: ObjectKey
    trainjob_uid: str
    source_seq: int
    applies: tuple[ApplyMessage, ...] = ()
    warnings: tuple[str, ...] = ()
    """Human-readable reasons the plan is smaller than usual (e.g. the runtime is missing)."""


# ---------------------------------------------------------------------------------------------- results

ApplyAction = Literal["created", "configured", "unchanged", "deleted", "skipped", "failed"]


class ApplyResult(msgspec.Struct, frozen=True, kw_only=True):
    trainjob: ObjectKey
    target: Target
    component: str
    source_seq: int
    action: ApplyAction
    attempts: int
    duration_ms: float
    resource_version: str = ""
    reason: str = ""
    finished_at: float = 0.0
    trace_id: str = ""


class AppliedRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What the appliers last did to one target; kept in the ``tj_applied`` key-value bucket.

    A claim is written (compare-and-set) before the API call and completed after it, so an applier holding
    an older plan sees the newer claim and stands down, and a repeat of the last apply is recognised by its
    digest without writing anything.
    """

    source_version: int
    source_seq: int
    digest: str
    state: Literal["claimed", "applied"]
    resource_version: str = ""
    managed: str = ""
    """Digest of our managedFields entry on the live object after the apply; unchanged means untouched."""
    created_for: str = ""
    """For a kind the applier only creates and never reads (Secrets): the uid of the TrainJob it created the
    object for. The record is then what tells an existing object of that name apart
    (``applier.api_answers.existing``)."""
    cluster: str = ""
    """Where the claim was made, ``<cluster>/<epoch>`` (``applier.epoch``); empty in claims of older versions."""


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True):
    stage: str
    """The service that gave up: ``planner`` or ``applier``."""
    reason: str
    error: str
    subject: str
    payload: bytes
    headers: dict[str, str] = {}
    stream_seq: int = 0
    deliveries: int = 0
    dead_at: float = 0.0


# ---------------------------------------------------------------------------------------------- codecs

_json_encoder = msgspec.json.Encoder()
_event_decoder = msgspec.json.Decoder(Event)
_apply_decoder = msgspec.json.Decoder(ApplyMessage)
_result_decoder = msgspec.json.Decoder(ApplyResult)
_dead_letter_decoder = msgspec.json.Decoder(DeadLetter)


def encode(message: msgspec.Struct) -> bytes:
    return _json_encoder.encode(message)


class _Versioned(msgspec.Struct):
    """Only the version of a message; it decodes as ``UNVERSIONED`` where the field is absent."""

    wire_version: int = UNVERSIONED


_version_decoder = msgspec.json.Decoder(_Versioned)


def _wire_version(data: bytes, what: str) -> int:
    """The version ``data`` carries, read apart from the message: the struct's default is the writer's
    version, which would hide an absent field, and a newer format may not decode as this one at all. The
    number alone decodes in a fraction of the message's time (the rest is skipped, not built)."""
    version = _version_decoder.decode(data).wire_version
    if version > WIRE_VERSION:
        raise UnsupportedVersion(
            f"unsupported-version: {what} of wire version {version}; this reader reads up to {WIRE_VERSION}"
        )
    return version


def decode_event(data: bytes) -> Event:
    """An event of any wire version up to ``WIRE_VERSION``; ``UnsupportedVersion`` for a newer one."""
    version = _wire_version(data, "an event")  # first: a newer format may not decode as this one at all
    event = _event_decoder.decode(data)
    return event if version == event.wire_version else msgspec.structs.replace(event, wire_version=version)


def decode_apply(data: bytes) -> ApplyMessage:
    """An apply message of any wire version up to ``WIRE_VERSION``; ``UnsupportedVersion`` for a newer one."""
    version = _wire_version(data, "an apply message")
    message = _apply_decoder.decode(data)
    return message if version == message.wire_version else msgspec.structs.replace(message, wire_version=version)


def decode_result(data: bytes) -> ApplyResult:
    return _result_decoder.decode(data)


def decode_dead_letter(data: bytes) -> DeadLetter:
    return _dead_letter_decoder.decode(data)
