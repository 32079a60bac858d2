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
import time

import nats.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from contracts import streams, subjects
from contracts.messages import (
    ApplyMessage,
    Event,
    TrainJobObserved,
    component_of,
    decode_event,
    encode,
)
from planner.core import FRAMEWORK, plan, plan_too_large
from planner.framework import Framework
from planner.plugins import registry
from planner.plugins.trainjobstatus import StatusServer
from planner.settings import PlannerSettings
from plumbing import bus, intake, publishing, retrying, signing
from plumbing.delivery import Delivery
from plumbing.observability import CONSUMER_LAG, PLANNED_MESSAGES, PLANS, STAGE_SECONDS
from plumbing.partitions import consume_partitioned, default_replica_id
from plumbing.runner import started

log = logging.getLogger("planner")

PUBACK_TIMEOUT_SECONDS = 10.0
HEADER_ALLOWANCE = 1024
"""Room kept for an apply message's headers (message id, trace id, signature) under the max payload."""
DEFAULT_MAX_PAYLOAD = 1024 * 1024
SYNCHRONOUS_AFTER_REFUSAL_SECONDS = 60.0


def framework_of(settings: PlannerSettings) -> Framework:
    """The plugins this planner runs: Trainer's default set, plus TrainJobStatus when its gate is on."""
    if not settings.trainjob_status:
        return FRAMEWORK
    return framework_with(StatusServer(url=settings.status_server_url, ca_cert=settings.status_server_ca))


def framework_with(status_server: StatusServer | None) -> Framework:
    """The planner's plugins with TrainJobStatus given this server, or without it (``None``): also what
    ``tjpipe replay`` and ``tjpipe plan`` plan with, so they plan as the planner does."""
    return FRAMEWORK if status_server is None else Framework(registry(status_server))


def apply_message_id(message: ApplyMessage, payload: bytes) -> str:
    digest = hashlib.sha256(payload).hexdigest()[:16]
    return f"{message.trainjob_uid}:{component_of(message)}:{message.source_seq}:{digest}"


class Planner:
    def __init__(
        self,
        settings: PlannerSettings,
        js: JetStreamContext,
        *,
        signer: signing.Signer,
        trusted_events: signing.Keyring,
    ) -> None:
        self.settings = settings
        self.js = js
        self.signer = signer
        self.trusted_events = trusted_events
        self.framework = framework_of(settings)
        self.max_payload = DEFAULT_MAX_PAYLOAD
        """The server's max payload (headers and body); ``run_planner`` sets it from the connection."""
        self._synchronous_until = 0.0
        """Until when (``time.monotonic()``) apply messages go one at a time, after a full stream refused one."""

    async def handle(self, delivery: Delivery[Event]) -> None:
        """One event, from its signature to its plan's apply messages on the bus; ``handle_batch`` ends it when
        this raises."""
        msg = delivery.msg
        seq = msg.metadata.sequence.stream
        # Before anything reads the bytes: an event the watcher did not sign is not planned at all.
        event = await intake.admit(delivery, keyring=self.trusted_events, decode=decode_event)
        if event is None:
            PLANS.labels(outcome="dead-letter").inc()
            return
        result = plan(event, source_seq=seq, framework=self.framework)
        PLANS.labels(outcome="planned").inc()
        CONSUMER_LAG.labels(consumer=msg.metadata.consumer or "planner").set(msg.metadata.num_pending or 0)
        encoded = [(message, encode(message)) for message in result.applies]
        # Sized by the component's object, not the whole message: the message also carries the event's
        # sequence and time, and a condition naming a size that changes with every plan would make every
        # status change a new event, planned again to another size, for ever.
        oversized = {
            component_of(message): len(encode(getattr(message, "object", message)))
            for message, payload in encoded
            if len(payload) + HEADER_ALLOWANCE > self.max_payload
        }
        if oversized and isinstance(event, TrainJobObserved):
            await self._plan_too_large(delivery, event, oversized)
            return
        await self._publish(encoded)
        for warning in result.warnings:
            log.warning("%s: %s", result.trainjob, warning, extra={"trainjob": str(result.trainjob)})
        log.info(
            "planned %s from event %d: %s",
            result.trainjob,
            seq,
            ", ".join(component_of(m) for m in result.applies) or "nothing to apply",
            extra={"trainjob": str(result.trainjob), "seq": seq},
        )
        await delivery.ack()
        STAGE_SECONDS.labels(stage="planner").observe(delivery.seconds)

    async def _plan_too_large(self, delivery: Delivery[Event], event: TrainJobObserved, sizes: dict[str, int]) -> None:
        """A plan that cannot fit the bus never will: its event is dead-lettered, not retried for ever.

        Only the TrainJob's status is published instead, with ``ResourcesCreated=False`` reason
        ``PlanTooLarge``; it is small, and published only when the TrainJob does not already say so, so the
        status change's own event plans to the same answer and publishes nothing: no loop.
        """
        seq = delivery.msg.metadata.sequence.stream
        replacement = plan_too_large(event, source_seq=seq, sizes=sizes, max_payload=self.max_payload)
        await self._publish([(message, encode(message)) for message in replacement.applies])
        PLANS.labels(outcome="too-large").inc()
        trainjob = (replacement.trainjob.namespace, replacement.trainjob.name)
        await delivery.dead_letter(reason="plan-too-large", error=replacement.warnings[0], trainjob=trainjob)

    async def _publish(self, encoded: list[tuple[ApplyMessage, bytes]]) -> None:
        outgoing = []
        for message, payload in encoded:
            subject = subjects.apply_subject(message.trainjob.namespace, message.trainjob.name, component_of(message))
            headers = {bus.MSG_ID: apply_message_id(message, payload), bus.TRACE_ID: message.trace_id}
            PLANNED_MESSAGES.labels(component=str(type(message).__struct_config__.tag)).inc()
            outgoing.append(publishing.Outgoing(subject, payload, headers))
        if outgoing:
            # Tried once: a failure hands the event back (handle_batch naks it) to be planned again, and the
            # message ids make the repeats free. Pipelined, each PubAck bounded: a PubAck lost with a stream
            # leader never comes, and an unbounded wait would stall this partition for good while its lease
            # is still renewed. After a refusal, one at a time for a while, so a refusal shows at once.
            await publishing.publish(
                self.js,
                outgoing,
                stream=streams.APPLY.name,
                signer=self.signer,
                timeout=PUBACK_TIMEOUT_SECONDS,
                pipelined=time.monotonic() >= self._synchronous_until,
                retry=None,
            )

    async def handle_batch(self, msgs: list[Msg]) -> None:
        for msg in msgs:  # in order: one partition's events, one TrainJob after another
            delivery: Delivery[Event] = Delivery(msg, stage="planner", js=self.js)
            try:
                await self.handle(delivery)
            except (TimeoutError, nats.errors.Error, ConnectionError) as exc:
                # The bus failed us, not the plan: hand the event back to be planned again. A full apply
                # stream refused it (and stored nothing): back off further each time until there is room.
                delay = 1.0
                if publishing.is_refused(exc):
                    self._synchronous_until = time.monotonic() + SYNCHRONOUS_AFTER_REFUSAL_SECONDS
                    delay = retrying.FULL_STREAM_REDELIVERY.delay(delivery.deliveries)
                    publishing.note_refused(exc, stream=streams.APPLY.name, subject=msg.subject, delay=delay)
                else:
                    log.warning("publishing the plan for %s failed (%s); it will be redelivered", msg.subject, exc)
                with contextlib.suppress(Exception):
                    await delivery.retry(delay)
            except Exception as exc:
                # A plan that raises would raise again on every redelivery: keep it aside instead.
                log.exception("failed to plan %s", msg.subject)
                with contextlib.suppress(Exception):
                    await delivery.dead_letter(reason="planner-error", error=repr(exc))


async def run_planner(settings: PlannerSettings, stop: asyncio.Event) -> None:
    signer = signing.Signer.from_file(settings.signing_key, setting=settings.signing_key_setting)
    trusted_events = signing.Keyring.from_path(
        settings.trusted_event_keys, setting="--trusted-event-keys / TJPIPE_TRUSTED_EVENT_KEYS", name="event"
    )
    log.info(
        "signing apply messages with key %s; trusting events signed by %s",
        signer.key_id,
        ", ".join(trusted_events.key_ids),
    )
    async with started("tjpipe-planner", settings) as service:
        await service.health.start()
        planner = Planner(settings, service.js, signer=signer, trusted_events=trusted_events)
        planner.max_payload = service.nc.max_payload or DEFAULT_MAX_PAYLOAD
        await consume_partitioned(
            service.nc,
            service.js,
            streams.PLANNER,
            planner.handle_batch,
            role="planner",
            replica=settings.replica or default_replica_id(),
            batch=settings.batch,
            lease_ttl=settings.lease_ttl,
            work_sweep_seconds=settings.work_sweep_seconds,
            stop=stop,
        )
