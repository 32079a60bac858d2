"""Streams and durable consumers, as data every service agrees on.

The definitions are plain msgspec Structs rather than nats-py config objects so that this package stays
free of any client library. The admin set-up (``plumbing.bus.setup_bus``: ``tjpipe bus-setup``, ``tjpipe
up``, the deployment's set-up Job) translates them and creates or updates them idempotently; the services'
own NATS identities may only bind to what it made.

All streams use limits retention. It is the only retention that keeps what was consumed, and the event
history is a product feature here (``tjpipe history`` and ``tjpipe replay`` read it), not just a queue.
Each stream's duplicate window is what turns publisher-side message ids into effectively-once delivery.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

import msgspec

from tjpipe.contracts import subjects

DAY = 24 * 3600.0


class StreamSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    subjects: tuple[str, ...]
    description: str
    max_age_seconds: float
    max_bytes: int = -1
    duplicate_window_seconds: float = 600.0
    replicas: int = 1
    discard: Literal["new", "old"] = "new"
    """What the stream does at its byte or message limit.

    ``new`` (work streams): refuse the publish, so no unread message is ever deleted to make room; the
    publisher keeps the message and retries with backoff (``plumbing.publishing``). ``old`` would delete
    the oldest message instead, which on a work stream may be one nobody has consumed yet, and whose
    message id then stays in the duplicate window, so a resync of the same observation would be dropped
    as a repeat as well.
    """


class ConsumerSpec(msgspec.Struct, frozen=True, kw_only=True):
    stream: str
    durable: str
    filter_subject: str
    ack_wait_seconds: float = 60.0
    max_deliver: int = 10
    max_ack_pending: int = 1000


EVENTS = StreamSpec(
    name="TJ_EVENTS",
    subjects=(f"{subjects.EVENTS_PREFIX}.>",),
    description="TrainJob change events as observed by the watcher",
    max_age_seconds=7 * DAY,
)
APPLY = StreamSpec(
    name="TJ_APPLY",
    subjects=(f"{subjects.APPLY_PREFIX}.>",),
    description="Per-component apply configurations planned for each TrainJob",
    max_age_seconds=3 * DAY,
)
RESULTS = StreamSpec(
    name="TJ_RESULTS",
    subjects=(f"{subjects.RESULTS_PREFIX}.>",),
    description="The outcome of every apply: created, configured, unchanged, skipped or failed",
    max_age_seconds=3 * DAY,
    # History, not work: nothing consumes results to make progress, so at its limit the stream drops the
    # oldest results rather than making the applier wait for room.
    discard="old",
)
DLQ = StreamSpec(
    name="TJ_DLQ",
    subjects=(f"{subjects.DLQ_PREFIX}.>",),
    description="Messages that can never succeed as sent, with the reason and the original payload",
    max_age_seconds=30 * DAY,
)

ALL_STREAMS: tuple[StreamSpec, ...] = (EVENTS, APPLY, RESULTS, DLQ)

APPLIED_BUCKET = "tj_applied"
"""Key-value bucket of AppliedRecord, one key per target: ``<namespace>.<kind>.<name>[.status]``."""

# One durable per partition is derived from these (``plumbing.partitions.partition_consumer``).
# Redelivery is unlimited: a message is only ever finished by an ack or by being dead-lettered, so a long
# outage of the API server delays work but loses none. The two specs are alike in shape (duplicate finders pair
# them): two consumers' values, nothing to share.
PLANNER = ConsumerSpec(
    stream=EVENTS.name,
    durable="planner",
    filter_subject=subjects.events_filter(),
    ack_wait_seconds=15.0,
    max_deliver=-1,
)
APPLIER = ConsumerSpec(
    stream=APPLY.name,
    durable="applier",
    filter_subject=subjects.apply_filter(),
    ack_wait_seconds=20.0,
    max_deliver=-1,
)


def with_retention(spec: StreamSpec, *, max_age_seconds: float | None, max_bytes: int | None) -> StreamSpec:
    """The same stream with operator-chosen retention; ``None`` keeps the default."""
    changes: dict[str, float | int] = {}
    if max_age_seconds is not None:
        changes["max_age_seconds"] = max_age_seconds
        changes["duplicate_window_seconds"] = min(spec.duplicate_window_seconds, max_age_seconds)
    if max_bytes is not None:
        changes["max_bytes"] = max_bytes
    return msgspec.structs.replace(spec, **changes)


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY}
_SIZES = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "ki": 1024, "mi": 1024**2, "gi": 1024**3}


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``72h``, ``7d`` or plain seconds."""
    text = text.strip().lower()
    if text and text[-1] in _UNITS:
        return float(text[:-1]) * _UNITS[text[-1]]
    return float(text)


def parse_size(text: str) -> int:
    """``500mi``, ``2gi``, ``10g`` or plain bytes; ``-1`` means unlimited."""
    text = text.strip().lower().removesuffix("b")
    for suffix in sorted(_SIZES, key=len, reverse=True):
        if suffix and text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * _SIZES[suffix])
    return int(text)


_NO_SETTINGS: Mapping[str, str] = MappingProxyType({})


def configured_streams(environ: Mapping[str, str] = _NO_SETTINGS) -> tuple[StreamSpec, ...]:
    """The streams with retention from ``TJPIPE_<STREAM>_MAX_AGE`` / ``TJPIPE_<STREAM>_MAX_BYTES``.

    ``<STREAM>`` is EVENTS, APPLY, RESULTS or DLQ, e.g. ``TJPIPE_EVENTS_MAX_AGE=30d``. The bus set-up
    (``tjpipe bus-setup``, admin identity) passes the process environment in and configures the streams;
    contracts read no environment themselves. Without ``environ``: the defaults.
    """
    env = environ
    out = []
    for spec in ALL_STREAMS:
        prefix = f"TJPIPE_{spec.name.removeprefix('TJ_')}_"
        age = env.get(prefix + "MAX_AGE")
        size = env.get(prefix + "MAX_BYTES")
        configured = with_retention(
            spec,
            max_age_seconds=parse_duration(age) if age else None,
            max_bytes=parse_size(size) if size else None,
        )
        out.append(msgspec.structs.replace(configured, replicas=stream_replicas(env)))
    return tuple(out)


def stream_replicas(environ: Mapping[str, str] = _NO_SETTINGS) -> int:
    """``TJPIPE_STREAM_REPLICAS`` in ``environ``: 1 for one server, 3 for a JetStream cluster of three."""
    return int(environ.get("TJPIPE_STREAM_REPLICAS", "1"))
