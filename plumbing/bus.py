"""JetStream plumbing shared by the services: connecting, and bringing streams and consumers into shape.

Streams and consumers are created or updated by whichever service starts first, from the definitions in
``contracts.streams``; there is no separate provisioning step to forget. ``add_consumer`` is already
create-or-update on the server; streams need an explicit update when their settings changed.
"""

from __future__ import annotations

import logging
import time

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js import api as js_api
from nats.js.errors import BadRequestError

from contracts import subjects
from contracts.messages import DeadLetter, encode
from contracts.streams import ConsumerSpec, StreamSpec

log = logging.getLogger(__name__)

MSG_ID = "Nats-Msg-Id"
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
    letter = DeadLetter(
        stage=stage,
        reason=reason,
        error=error,
        subject=msg.subject,
        payload=msg.data,
        headers=dict(msg.headers or {}),
        stream_seq=msg.metadata.sequence.stream,
        deliveries=msg.metadata.num_delivered or 1,
        dead_at=time.time(),
    )
    log.error("dead-lettered %s (%s): %s", msg.subject, reason, error)
    await js.publish(subjects.dlq_subject(stage, namespace, name), encode(letter))
