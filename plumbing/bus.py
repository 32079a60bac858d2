"""JetStream plumbing shared by the services: connecting, and bringing streams and consumers into shape.

Streams and consumers are created or updated by whichever service starts first, from the definitions in
``contracts.streams``; there is no separate provisioning step to forget. ``add_consumer`` is already
create-or-update on the server; streams need an explicit update when their settings changed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import BadRequestError

from contracts import subjects
from contracts.messages import DeadLetter, encode
from contracts.streams import ConsumerSpec, StreamSpec

log = logging.getLogger(__name__)

T = TypeVar("T")

MSG_ID = "Nats-Msg-Id"
MAX_DEAD_LETTER_PAYLOAD = 640 * 1024
"""Kept whole up to this size; base64 in the letter then still fits the default 1 MB max payload."""
TRACE_ID = "Tj-Trace-Id"


async def connect(url: str, *, name: str) -> NATS:
    async def on_error(exc: Exception) -> None:
        log.warning("nats: %s", exc)

    async def on_disconnect() -> None:
        log.warning("nats: disconnected")

    async def on_reconnect() -> None:
        log.info("nats: reconnected")

    return await nats.connect(
        servers=[u.strip() for u in url.split(",")],
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        error_cb=on_error,
        disconnected_cb=on_disconnect,
        reconnected_cb=on_reconnect,
    )


def _stream_config(spec: StreamSpec) -> js_api.StreamConfig:
    return js_api.StreamConfig(
        name=spec.name,
        description=spec.description,
        subjects=list(spec.subjects),
        retention=js_api.RetentionPolicy.LIMITS,
        storage=js_api.StorageType.FILE,
        max_age=spec.max_age_seconds,
        max_bytes=spec.max_bytes,
        duplicate_window=spec.duplicate_window_seconds,
        num_replicas=spec.replicas,
        discard=js_api.DiscardPolicy.OLD,
        allow_direct=True,
    )


async def ensure_streams(js: JetStreamContext, specs: tuple[StreamSpec, ...]) -> None:
    """Create or update every stream; retried while a JetStream cluster is still electing leaders."""
    await until_done(lambda: _ensure_streams(js, specs), what="setting up the streams")


_SETUP_RETRYABLE = (
    TimeoutError,
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.ServiceUnavailableError,
)


async def until_done(step: Callable[[], Awaitable[T]], *, what: str, attempts: int = 30) -> T:
    """Run a bus set-up step again after a timeout or a transient refusal, with backoff, a bounded number
    of times: a cluster that is busy creating replicated streams must not make a service exit."""
    delay = 0.5
    for attempt in range(1, attempts + 1):
        try:
            return await step()
        except (
            TimeoutError,
            nats.errors.TimeoutError,
            nats.js.errors.ServiceUnavailableError,
            nats.errors.NoRespondersError,
        ) as exc:
            if attempt == attempts:
                raise
            log.warning("%s failed (%s); trying again in %.1fs", what, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")


async def _ensure_streams(js: JetStreamContext, specs: tuple[StreamSpec, ...]) -> None:
    for spec in specs:
        config = _stream_config(spec)
        try:
            await js.add_stream(config)
        except BadRequestError:
            await js.update_stream(config)


async def ensure_consumer(js: JetStreamContext, spec: ConsumerSpec) -> None:
    await js.add_consumer(
        spec.stream,
        js_api.ConsumerConfig(
            durable_name=spec.durable,
            filter_subject=spec.filter_subject,
            ack_policy=js_api.AckPolicy.EXPLICIT,
            deliver_policy=js_api.DeliverPolicy.ALL,
            ack_wait=spec.ack_wait_seconds,
            max_deliver=spec.max_deliver,
            max_ack_pending=spec.max_ack_pending,
        ),
    )


async def dead_letter(
    js: JetStreamContext, msg: Msg, *, stage: str, reason: str, error: str, namespace: str, name: str
) -> None:
    """Keep a message that can never succeed, with why and its original bytes, on the DLQ stream."""
    payload = msg.data
    if len(payload) > MAX_DEAD_LETTER_PAYLOAD:
        # The letter must fit the server's max payload even base64-encoded; the original stays in its
        # stream at stream_seq, and the digest identifies it.
        digest = hashlib.sha256(payload).hexdigest()
        error = f"{error} (payload of {len(payload)} bytes cut to {MAX_DEAD_LETTER_PAYLOAD}; sha256 {digest})"
        payload = payload[:MAX_DEAD_LETTER_PAYLOAD]
    letter = DeadLetter(
        stage=stage,
        reason=reason,
        error=error,
        subject=msg.subject,
        payload=payload,
        headers=dict(msg.headers or {}),
        stream_seq=msg.metadata.sequence.stream,
        deliveries=msg.metadata.num_delivered or 1,
        dead_at=time.time(),
    )
    log.error("dead-lettered %s (%s): %s", msg.subject, reason, error)
    await js.publish(subjects.dlq_subject(stage, namespace, name), encode(letter))


class StoredMessage:
    """One message as the stream keeps it: where it sits, when it arrived, and its bytes."""

    __slots__ = ("data", "headers", "seq", "stream", "subject", "time")

    def __init__(
        self, *, stream: str, seq: int, subject: str, data: bytes, headers: dict[str, str], time: float
    ) -> None:
        self.stream = stream
        self.seq = seq
        self.subject = subject
        self.data = data
        self.headers = headers
        self.time = time


async def read_stream(
    js: JetStreamContext,
    stream: str,
    subject: str,
    *,
    start_seq: int | None = None,
    start_time: float | None = None,
    last_per_subject: bool = False,
    batch: int = 256,
) -> list[StoredMessage]:
    """Every stored message on ``subject`` (wildcards allowed), oldest first, without touching any durable.

    An ephemeral, unacknowledged, in-memory consumer reads the history; the production consumers and the
    stream are left exactly as they were, which is what makes history and replay safe on a live system.
    ``last_per_subject`` has the server pick only the newest message of each subject instead.
    """
    import datetime as dt

    policy = js_api.DeliverPolicy.ALL
    options: dict[str, object] = {}
    if last_per_subject:
        policy = js_api.DeliverPolicy.LAST_PER_SUBJECT
    elif start_seq is not None:
        policy = js_api.DeliverPolicy.BY_START_SEQUENCE
        options["opt_start_seq"] = start_seq
    elif start_time is not None:
        policy = js_api.DeliverPolicy.BY_START_TIME
        options["opt_start_time"] = dt.datetime.fromtimestamp(start_time, tz=dt.UTC).isoformat()
    config = js_api.ConsumerConfig(
        ack_policy=js_api.AckPolicy.NONE,
        deliver_policy=policy,
        inactive_threshold=30,
        mem_storage=True,
        num_replicas=1,
        **options,  # type: ignore[arg-type]
    )
    sub = await js.pull_subscribe(subject, stream=stream, config=config)
    out: list[StoredMessage] = []
    try:
        while True:
            try:
                msgs = await sub.fetch(batch, timeout=1.0)
            except (nats.errors.TimeoutError, TimeoutError):
                break
            for msg in msgs:
                meta = msg.metadata
                out.append(
                    StoredMessage(
                        stream=stream,
                        seq=meta.sequence.stream,
                        subject=msg.subject,
                        data=msg.data,
                        headers=dict(msg.headers or {}),
                        time=meta.timestamp.timestamp(),
                    )
                )
            if msgs and msgs[-1].metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return out
