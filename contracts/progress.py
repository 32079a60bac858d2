"""Training progress as the status server records it: one record per accepted update, on ``TJ_PROGRESS``.

Why a record per update and not the latest value only: Trainer keeps only ``status.trainerStatus``, the
newest value, so how the loss and the progress moved is lost with every write and with the TrainJob itself.
The status server (``tjpipe status-server``) records every update it accepts here first, and only then
applies the newest one to the TrainJob (coalesced, see ``docs/training-progress.md``): the history is the
source, the TrainJob's status a view of its latest entry.

Why its own stream and not the events stream: ``TJ_EVENTS`` is the planner's work, and a progress update is
not a reason to plan anything; a record stream of its own is kept by its own age and byte limits and is
read by the same read-only identity as the rest of the history.

What a record holds: the TrainJob (key and uid), the pod whose token sent it, the update as Trainer's API
types spell it (``TrainerStatus``: ``progressPercentage``, ``estimatedRemainingSeconds``, ``metrics``,
``lastUpdatedTime``), and when the server accepted it. Never the token, nor anything else of the request.

Reading the series of one TrainJob: ``plumbing.bus_history.read_stream(js, streams.PROGRESS.name,
subjects.trainjob_progress_filter(ns, name))``, then :func:`decode_progress` on each message's data; order
by ``trainer_status.lastUpdatedTime`` (the training code's clock, what the status is fenced by) or by
``received_at`` (the server's). Several pods of one TrainJob may report, each its own series (``pod``).

The wire-compatibility rule of ``contracts.messages`` holds here too: fields are only added, with
defaults; ``wire_version`` says the major version, and a reader refuses a newer one.
"""

from __future__ import annotations

import msgspec

from contracts.messages import WIRE_VERSION, ObjectKey, UnsupportedVersion
from contracts.trainer import TrainerStatus

STATUS_FIELD_MANAGER = "trainer-status"
"""The field manager of ``status.trainerStatus``, as Trainer's status server."""


class ProgressReported(msgspec.Struct, frozen=True, kw_only=True, tag="progress.reported"):
    """One update the status server accepted from a pod of the TrainJob."""

    wire_version: int = WIRE_VERSION
    trainjob: ObjectKey
    trainjob_uid: str
    pod: str
    """The pod the caller's token is bound to (its name; a TrainJob's pods report each their own series)."""
    pod_uid: str = ""
    service_account: str = ""
    """The ServiceAccount the token belongs to, ``<name>`` in the TrainJob's namespace."""
    trainer_status: TrainerStatus
    """The update as sent, in Trainer's API types; ``lastUpdatedTime`` is always set (the server requires it)."""
    received_at: float
    """Unix seconds when the server accepted it."""
    updated_at: float = 0.0
    """``trainer_status.lastUpdatedTime`` as Unix seconds, for a reader that sorts or charts by it."""


Progress = ProgressReported
"""The union of progress record kinds (one member today; a new kind is a new tagged member)."""

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(ProgressReported)


class _Versioned(msgspec.Struct):
    wire_version: int = 0


_version = msgspec.json.Decoder(_Versioned)


def encode_progress(record: Progress) -> bytes:
    return _encoder.encode(record)


def decode_progress(data: bytes) -> Progress:
    """A record of any wire version up to ``WIRE_VERSION``; ``UnsupportedVersion`` for a newer one."""
    version = _version.decode(data).wire_version
    if version > WIRE_VERSION:
        raise UnsupportedVersion(
            f"unsupported-version: a progress record of wire version {version}; this reader reads up to {WIRE_VERSION}"
        )
    return _decoder.decode(data)
