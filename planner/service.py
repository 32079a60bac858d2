"""The planner process: the pure ``plan()`` between two JetStream streams.

An event is acknowledged only after every apply message of its plan has a PubAck, so a crash between the
two leaves the event to be redelivered and planned again. The republished messages then carry the same
``Nats-Msg-Id`` (derived from the event's stream sequence and the message content) and the stream drops
them as duplicates: a redelivery costs the applier nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from dataclasses import dataclass, field

import msgspec
import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from contracts import streams, subjects
from contracts.messages import (
    ApplyMessage,
    component_of,
    decode_event,
    encode,
)
from planner.core import plan
from plumbing import bus

log = logging.getLogger("planner")


@dataclass
class PlannerSettings:
    nats_url: str
    batch: int = 64


@dataclass
class PlannerStats:
    events: int = 0
    messages: int = 0
    dead_letters: int = 0
    warnings: dict[str, int] = field(default_factory=dict)


def apply_message_id(message: ApplyMessage, payload: bytes) -> str:
    digest = hashlib.sha256(payload).hexdigest()[:16]
    return f"{message.trainjob_uid}:{component_of(message)}:{message.source_seq}:{digest}"


class Planner:
    def __init__(self, settings: PlannerSettings, js: JetStreamContext) -> None:
        self.settings = settings
        self.js = js
        self.stats = PlannerStats()

    async def handle(self, msg: Msg) -> None:
        seq = msg.metadata.sequence.stream
        try:
            event = decode_event(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await self._dead_letter(msg, str(exc))
            await msg.term()
            return
        result = plan(event, source_seq=seq)
        self.stats.events += 1
        futures = []
        for message in result.applies:
            payload = encode(message)
            subject = subjects.apply_subject(message.trainjob.namespace, message.trainjob.name, component_of(message))
            headers = {bus.MSG_ID: apply_message_id(message, payload), bus.TRACE_ID: message.trace_id}
            futures.append(await self.js.publish_async(subject, payload, headers=headers))
        if futures:
            await asyncio.gather(*futures)
        self.stats.messages += len(futures)
        for warning in result.warnings:
            log.warning("%s: %s", result.trainjob, warning, extra={"trainjob": str(result.trainjob)})
        log.info(
            "planned %s from event %d: %s",
            result.trainjob,
            seq,
            ", ".join(component_of(m) for m in result.applies) or "nothing to apply",
            extra={"trainjob": str(result.trainjob), "seq": seq},
        )
        await msg.ack_sync()

    async def _dead_letter(self, msg: Msg, error: str) -> None:
        self.stats.dead_letters += 1
        namespace, name = subjects.trainjob_of_subject(msg.subject)
        await bus.dead_letter(
            self.js, msg, stage="planner", reason="undecodable", error=error, namespace=namespace, name=name
        )

    async def run(self, stop: asyncio.Event) -> None:
        sub = await self.js.pull_subscribe_bind(durable=streams.PLANNER.durable, stream=streams.PLANNER.stream)
        log.info("planner running")
        while not stop.is_set():
            try:
                batch = await sub.fetch(self.settings.batch, timeout=1.0)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            except Exception as exc:
                log.warning("fetch failed: %s", exc)
                await asyncio.sleep(0.5)
                continue
            for msg in batch:
                try:
                    await self.handle(msg)
                except Exception:
                    # Not acked: redelivered after ack_wait, and planned again from scratch.
                    log.exception("failed to plan %s", msg.subject)


async def run_planner(settings: PlannerSettings, stop: asyncio.Event) -> None:
    nc = await bus.connect(settings.nats_url, name="tjpipe-planner")
    js = nc.jetstream()
    await bus.ensure_streams(js, streams.configured_streams())
    await bus.ensure_consumer(js, streams.PLANNER)
    try:
        await Planner(settings, js).run(stop)
    finally:
        await nc.drain()
