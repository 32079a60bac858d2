"""Streams and durable consumers, as data every service agrees on.

The definitions are plain msgspec Structs rather than nats-py config objects so that this package stays
free of any client library. The admin set-up (``plumbing.bus_setup.setup_bus``: ``tjpipe bus-setup``, ``tjpipe
up``, the deployment's set-up Job) translates them and creates or updates them idempotently; the services'
own NATS identities may only bind to what it made.

Work and its record are kept apart, so that a full record costs only record, never progress. The work
streams (``TJ_EVENTS``, ``TJ_APPLY``) use interest retention: a message stays until every consumer that has
interest in it has acknowledged it, and then goes, so what fills a work stream is only unfinished work,
and room comes back the moment the consumers catch up. A limits-retention work stream kept every
acknowledged message for its whole age window, so once it was full it stayed full, and its publishers
waited for room no consumer could make. Work queue retention would drop acknowledged messages too, but the
server cannot switch an existing stream to or from it, so an existing bus could not be upgraded in place;
interest can, and the per-partition durables (disjoint filters, one consumer per subject) make it behave
as a work queue.

The record is a set of history streams sourced from the work streams (JetStream stream sources):
``TJ_EVENTS_HISTORY`` and ``TJ_APPLY_HISTORY`` copy every message, with its subject, and keep it by their own
age and byte limits, dropping the oldest at the limit (discard old). The source is a consumer of the work
stream too, so under interest retention a message leaves the work stream only once it is both done and
recorded: the history misses nothing, and a full history drops its own oldest records instead of holding
anything up. ``TJ_RESULTS`` and ``TJ_DLQ`` are records from the start (nothing consumes them to make
progress), so they also discard old. ``tjpipe history``, ``replay`` and ``dlq`` read only the records.

Each work stream's duplicate window is what turns publisher-side message ids into effectively-once
delivery; a message removed after its ack keeps its id in the window.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

import msgspec

from contracts import subjects

DAY = 24 * 3600.0


class StreamSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    subjects: tuple[str, ...]
    description: str
    max_age_seconds: float
    max_bytes: int = -1
    max_msgs_per_subject: int = -1
    """Messages kept per subject (``-1``: no limit). On a record stream of one subject per TrainJob, the most one
    TrainJob can hold: past it, that TrainJob's own oldest go, never another's."""
    duplicate_window_seconds: float = 600.0
    replicas: int = 1
    retention: Literal["limits", "interest"] = "limits"
    """``interest`` for work streams (acknowledged and recorded messages go), ``limits`` for records."""
    sources: tuple[str, ...] = ()
    """Streams this one copies every message from (a history stream); such a stream has no subjects of its own."""
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


GIB = 1024**3

EVENTS = StreamSpec(
    name="TJ_EVENTS",
    subjects=(f"{subjects.EVENTS_PREFIX}.>",),
    description="TrainJob change events as observed by the watcher, until the planner has planned them",
    max_age_seconds=7 * DAY,
    retention="interest",
)
APPLY = StreamSpec(
    name="TJ_APPLY",
    subjects=(f"{subjects.APPLY_PREFIX}.>",),
    description="Per-component apply configurations planned for each TrainJob, until the applier has applied them",
    max_age_seconds=3 * DAY,
    retention="interest",
)
# Records: nothing consumes them to make progress, so at their byte limit they drop their oldest messages
# rather than make anyone wait for room. Their byte limits are finite by default, so that together they
# stay below the server's file store and a growing record can never take the room work needs.
EVENTS_HISTORY = StreamSpec(
    name="TJ_EVENTS_HISTORY",
    subjects=(),
    sources=(EVENTS.name,),
    description="Every event the watcher published, kept as history",
    max_age_seconds=7 * DAY,
    max_bytes=2 * GIB,
    discard="old",
)
APPLY_HISTORY = StreamSpec(
    name="TJ_APPLY_HISTORY",
    subjects=(),
    sources=(APPLY.name,),
    description="Every apply message the planner published, kept as history",
    max_age_seconds=3 * DAY,
    max_bytes=2 * GIB,
    discard="old",
)
RESULTS = StreamSpec(
    name="TJ_RESULTS",
    subjects=(f"{subjects.RESULTS_PREFIX}.>",),
    description="The outcome of every apply: created, configured, unchanged, skipped or failed",
    max_age_seconds=3 * DAY,
    max_bytes=GIB,
    discard="old",
)
DLQ = StreamSpec(
    name="TJ_DLQ",
    subjects=(f"{subjects.DLQ_PREFIX}.>",),
    description="Messages that can never succeed as sent, with the reason and the original payload",
    max_age_seconds=30 * DAY,
    max_bytes=GIB,
    discard="old",
)

PROGRESS = StreamSpec(
    name="TJ_PROGRESS",
    subjects=(f"{subjects.PROGRESS_PREFIX}.>",),
    description="Every training progress update the status server accepted (contracts.progress), kept as history",
    max_age_seconds=7 * DAY,
    max_bytes=GIB // 2,
    max_msgs_per_subject=5_000,
    discard="old",
)
"""A record from the start, like the results: the status server publishes here, nothing consumes it to make
progress, and at its limit it drops its oldest records. Half a GiB holds about a million updates of a few
metrics each (a record is some 400 bytes), which keeps every record stream together below the server's file
store. One subject per TrainJob, and at most 5,000 records per subject (about 7 hours of one pod at the SDK's
rate): a TrainJob that reports more loses its own oldest records, so no TrainJob's flood pushes out another's
series by count (``TJPIPE_PROGRESS_MAX_MSGS_PER_SUBJECT``)."""

WORK_STREAMS: tuple[StreamSpec, ...] = (EVENTS, APPLY)
RECORD_STREAMS: tuple[StreamSpec, ...] = (EVENTS_HISTORY, APPLY_HISTORY, RESULTS, DLQ, PROGRESS)
"""What ``tjpipe history``, ``replay`` and ``dlq`` read, and the ``reader`` identity may read."""
ALL_STREAMS: tuple[StreamSpec, ...] = WORK_STREAMS + RECORD_STREAMS

HISTORY_OF = {EVENTS.name: EVENTS_HISTORY.name, APPLY.name: APPLY_HISTORY.name}
"""Work stream → the history stream that records it."""


class BucketSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A JetStream object store bucket: a stream (``OBJ_<name>``) whose subjects hold each object's chunks
    (``$O.<name>.C.<nuid>``) and its description (``$O.<name>.M.<base64 of the object's name>``).

    Its limits are set like a record stream's: an age, a byte limit, and at the limit the oldest go (discard
    old), so a full bucket drops its own oldest objects instead of refusing the newest."""

    name: str
    description: str
    max_age_seconds: float
    max_bytes: int = -1
    replicas: int = 1
    discard: Literal["new", "old"] = "old"

    @property
    def stream(self) -> str:
        return f"OBJ_{self.name}"

    @property
    def chunks(self) -> str:
        """The prefix of every chunk subject."""
        return f"$O.{self.name}.C"

    @property
    def meta(self) -> str:
        """The prefix of every object's description subject."""
        return f"$O.{self.name}.M"


LOGS = BucketSpec(
    name="tj_logs",
    description="The logs of TrainJobs' pods, kept when a TrainJob finishes or when its page asks for them",
    max_age_seconds=7 * DAY,
    max_bytes=GIB // 2,
)
"""One bucket per cluster (each cluster's own bus). Half a GiB for a week sits next to the record streams below
the server's file store; at the limit the oldest logs go first, and a page then says which part is gone.
``TJPIPE_LOGS_MAX_AGE`` / ``TJPIPE_LOGS_MAX_BYTES`` change it."""

BUCKETS: tuple[BucketSpec, ...] = (LOGS,)
"""The object store buckets the bus set-up makes."""


APPLIED_BUCKET = "tj_applied"
"""Key-value bucket of AppliedRecord, one key per target: ``<namespace>.<kind>.<name>[.status]``."""

# One durable per partition is derived from these (``plumbing.partitions.partition_consumer``).
# Redelivery is unlimited: a message is only ever finished by an ack or by being dead-lettered, so a long
# outage of the API server delays work but loses none.
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


def with_retention(
    spec: StreamSpec, *, max_age_seconds: float | None, max_bytes: int | None, max_msgs_per_subject: int | None = None
) -> StreamSpec:
    """The same stream with operator-chosen retention; ``None`` keeps the default."""
    changes: dict[str, float | int] = {}
    if max_msgs_per_subject is not None:
        changes["max_msgs_per_subject"] = max_msgs_per_subject
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
    """The streams with retention from ``TJPIPE_<STREAM>_MAX_AGE`` / ``TJPIPE_<STREAM>_MAX_BYTES`` (and
    ``TJPIPE_PROGRESS_MAX_MSGS_PER_SUBJECT`` for the progress records).

    ``<STREAM>`` is EVENTS, APPLY, EVENTS_HISTORY, APPLY_HISTORY, RESULTS, DLQ or PROGRESS, e.g.
    ``TJPIPE_EVENTS_HISTORY_MAX_AGE=30d``. The bus set-up
    (``tjpipe bus-setup``, admin identity) passes the process environment in and configures the streams;
    contracts read no environment themselves. Without ``environ``: the defaults.
    """
    env = environ
    out = []
    for spec in ALL_STREAMS:
        prefix = f"TJPIPE_{spec.name.removeprefix('TJ_')}_"
        age = env.get(prefix + "MAX_AGE")
        size = env.get(prefix + "MAX_BYTES")
        per_subject = env.get(prefix + "MAX_MSGS_PER_SUBJECT") if spec.name == PROGRESS.name else None
        configured = with_retention(
            spec,
            max_age_seconds=parse_duration(age) if age else None,
            max_bytes=parse_size(size) if size else None,
            max_msgs_per_subject=int(per_subject) if per_subject else None,
        )
        out.append(msgspec.structs.replace(configured, replicas=stream_replicas(env)))
    return tuple(out)


def stream_replicas(environ: Mapping[str, str] = _NO_SETTINGS) -> int:
    """``TJPIPE_STREAM_REPLICAS`` in ``environ``: 1 for one server, 3 for a JetStream cluster of three."""
    return int(environ.get("TJPIPE_STREAM_REPLICAS", "1"))


def configured_buckets(environ: Mapping[str, str] = _NO_SETTINGS) -> tuple[BucketSpec, ...]:
    """The buckets with limits from ``TJPIPE_<BUCKET>_MAX_AGE`` / ``TJPIPE_<BUCKET>_MAX_BYTES`` (``<BUCKET>``:
    LOGS), read from ``environ`` as ``configured_streams`` reads the streams'; without it, the defaults."""
    out = []
    for spec in BUCKETS:
        prefix = f"TJPIPE_{spec.name.removeprefix('tj_').upper()}_"
        age, size = environ.get(prefix + "MAX_AGE"), environ.get(prefix + "MAX_BYTES")
        changes: dict[str, float | int] = {"replicas": stream_replicas(environ)}
        if age:
            changes["max_age_seconds"] = parse_duration(age)
        if size:
            changes["max_bytes"] = parse_size(size)
        out.append(msgspec.structs.replace(spec, **changes))
    return tuple(out)
