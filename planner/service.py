"""The planner process: the pure ``plan()`` between two JetStream streams.

An event is acknowledged only after every apply message of its plan has a PubAck, so a crash between the
two leaves the event to be redelivered and planned again. The republished messages then carry the same
``Nats-Msg-Id`` (derived from the event's stream sequence and the message content) and the stream drops
them as duplicates: a redelivery costs the applier nothing. That is also why the ack is sent without
waiting for the server's confirmation: losing it costs one repeated plan, not a lost one.
"""

from __future__ import annotations

import asyncio
import contextlib
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
from plumbing.observability import CONSUMER_LAG, DEAD_LETTERS, PLANNED_MESSAGES, PLANS, HealthServer
from plumbing.partitions import consume_partitioned, default_replica_id

log = logging.getLogger("planner")

PUBACK_TIMEOUT_SECONDS = 10.0


@dataclass
class PlannerSettings:
    nats_url: str
    batch: int = 64
    replica: str = field(default_factory=default_replica_id)
    lease_ttl: float = 6.0
    metrics_port: int = 0


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
        PLANS.labels(outcome="planned").inc()
        CONSUMER_LAG.labels(consumer=msg.metadata.consumer or "planner").set(msg.metadata.num_pending or 0)
        futures = []
        for message in result.applies:
            payload = encode(message)
            subject = subjects.apply_subject(message.trainjob.namespace, message.trainjob.name, component_of(message))
            headers = {bus.MSG_ID: apply_message_id(message, payload), bus.TRACE_ID: message.trace_id}
            PLANNED_MESSAGES.labels(component=str(type(message).__struct_config__.tag)).inc()
            futures.append(await self.js.publish_async(subject, payload, headers=headers))
        if futures:
            # Bounded: a PubAck lost with a stream leader never completes its future, and an unbounded wait
            # would stall this partition for good while its lease is still renewed. On timeout the event is
            # handed back (handle_batch naks it) and planned again; the message ids make repeats free.
            await asyncio.wait_for(asyncio.gather(*futures), timeout=PUBACK_TIMEOUT_SECONDS)
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
        await msg.ack()

    async def _dead_letter(self, msg: Msg, error: str) -> None:
        self.stats.dead_letters += 1
        PLANS.labels(outcome="dead-letter").inc()
        DEAD_LETTERS.labels(stage="planner", reason="undecodable").inc()
        namespace, name = subjects.trainjob_of_subject(msg.subject)
        await bus.dead_letter(
            self.js, msg, stage="planner", reason="undecodable", error=error, namespace=namespace, name=name
        )

    async def handle_batch(self, msgs: list[Msg]) -> None:
        for msg in msgs:  # in order: one partition's events, one TrainJob after another
            try:
                await self.handle(msg)
            except (TimeoutError, nats.errors.Error, ConnectionError) as exc:
                # The bus failed us, not the plan: hand the event back to be planned again.
                log.warning("publishing the plan for %s failed (%s); it will be redelivered", msg.subject, exc)
                with contextlib.suppress(Exception):
                    await msg.nak(delay=1.0)
            except Exception as exc:
                # A plan that raises would raise again on every redelivery: keep it aside instead.
                log.exception("failed to plan %s", msg.subject)
                with contextlib.suppress(Exception):
                    await bus.dead_letter(
                        self.js,
                        msg,
                        stage="planner",
                        reason="planner-error",
                        error=repr(exc),
                        namespace=subjects.trainjob_of_subject(msg.subject)[0],
                        name=subjects.trainjob_of_subject(msg.subject)[1],
                    )
                    await msg.term()


async def run_planner(settings: PlannerSettings, stop: asyncio.Event) -> None:
    nc = await bus.connect(settings.nats_url, name="tjpipe-planner")
    js = nc.jetstream()
    await bus.ensure_streams(js, streams.configured_streams())
    health = HealthServer(port=settings.metrics_port)
    health.add_check("nats", lambda: nc.is_connected)
    await health.start()
    planner = Planner(settings, js)
    try:
        await consume_partitioned(
            nc,
            js,
            streams.PLANNER,
            planner.handle_batch,
            role="planner",
            replica=settings.replica,
            batch=settings.batch,
            lease_ttl=settings.lease_ttl,
            stop=stop,
        )
    finally:
        await health.stop()
        await nc.drain()
