"""The applier process: one durable pull consumer, each message turned into one Server-Side Apply.

A message is acknowledged only after its apply succeeded (or was decided to be unnecessary) and its result
was recorded, so a crash anywhere before that point means redelivery, never loss. The ack itself is not
awaited: an ack lost on the way only means one redelivery, which the ledger answers as ``unchanged``,
while waiting for it cost a round trip per message and stalled for a whole ack wait whenever the
consumer's leader moved. Retrying happens in two tiers: a few quick attempts in process, with JetStream
kept informed by in-progress heartbeats, and then a delayed nak that frees this replica for other work.

Messages for the same target are handled one at a time, in arrival order; different targets run in
parallel up to a bound, sharing one connection pool to the API server.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from applier import core, secrets
from applier.ledger import Ledger, ledger_key
from contracts import resources, streams, subjects
from contracts.messages import (
    AppliedRecord,
    ApplyAction,
    ApplyMessage,
    ApplyResult,
    ApplySecret,
    DeleteComponent,
    ObjectApply,
    Target,
    component_of,
    decode_apply,
    encode,
)
from contracts.values import or_default
from plumbing import bus
from plumbing.kube import MERGE_PATCH, KubeApiError, KubeClient, KubeConfig
from plumbing.observability import APPLIES, DEAD_LETTERS, END_TO_END, RETRIES, HealthServer
from plumbing.partitions import consume_partitioned, default_replica_id

log = logging.getLogger("applier")

_CLAIM_ROUNDS = 5
EVENT_REASON = "ComponentApplyFailed"
LABEL_FIELD_MANAGER = "trainjob-pipeline-label"
"""The field manager that adds this pipeline's label to objects made before it (``_add_owned_label``)."""


@dataclass
class ApplierSettings:
    nats_url: str
    kubeconfig: str | None = None
    batch: int = 32
    concurrency: int = 16
    attempts: int = 5
    """In-process attempts for transient errors before the message goes back to JetStream."""
    max_backoff_seconds: float = 8.0
    replica: str = field(default_factory=default_replica_id)
    lease_ttl: float = 6.0
    metrics_port: int = 0


@dataclass
class ApplierStats:
    actions: dict[str, int] = field(default_factory=dict)
    retries: int = 0
    dead_letters: int = 0
    naks: int = 0

    def count(self, action: str) -> None:
        self.actions[action] = self.actions.get(action, 0) + 1


def _wait(settings: ApplierSettings) -> Any:
    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        backoff: float = min(settings.max_backoff_seconds, 0.1 * 2.0 ** (state.attempt_number - 1))
        backoff *= 0.5 + random.random()
        retry_after = exc.retry_after if isinstance(exc, core.TransientError) else None
        return max(backoff, retry_after or 0.0)

    return wait


class Applier:
    def __init__(self, settings: ApplierSettings, kube: KubeClient, js: JetStreamContext, ledger: Ledger) -> None:
        self.settings = settings
        self.kube = kube
        self.js = js
        self.ledger = ledger
        self.stats = ApplierStats()
        self._locks: dict[tuple[str, str, str, str], asyncio.Lock] = {}
        self._slots = asyncio.Semaphore(settings.concurrency)

    @staticmethod
    def _key(target: Target) -> tuple[str, str, str, str]:
        return (target.api_version + "/" + target.kind, target.namespace, target.name, target.subresource or "")

    # ------------------------------------------------------------------------------------------ the work

    async def handle(self, msg: Msg) -> None:
        try:
            message = decode_apply(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            await self._dead_letter(msg, reason="undecodable", error=str(exc), key=None)
            await msg.term()
            return
        key = self._key(message.target)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with self._slots, lock, self._heartbeat(msg):
            await self._handle_decoded(msg, message, key)

    async def _handle_decoded(self, msg: Msg, message: ApplyMessage, key: tuple[str, str, str, str]) -> None:
        started = time.perf_counter()
        attempts = 0
        try:
            resource = resources.resource_for(message.target.api_version, message.target.kind)
        except LookupError as exc:
            await self._dead_letter(msg, reason="permanent", error=str(exc), key=message)
            await self._finish(msg, message, "failed", attempts, started, reason=str(exc), ack=False)
            await msg.term()
            return
        action: ApplyAction = "configured"
        resource_version = ""
        reason = ""
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(core.TransientError),
                stop=stop_after_attempt(self.settings.attempts),
                wait=_wait(self.settings),
                reraise=True,
            ):
                with attempt:
                    attempts += 1
                    if attempts > 1:
                        self.stats.retries += 1
                        RETRIES.labels(service="applier").inc()
                    if isinstance(message, DeleteComponent):
                        action, resource_version, reason = await self._delete_once(message, resource)
                    else:
                        action, resource_version, reason = await self._apply_once(message, resource, key)
        except core.TransientError as exc:
            delay = min(60.0, 2.0 ** min(msg.metadata.num_delivered or 1, 6))
            self.stats.naks += 1
            log.warning(
                "%s: %s; handing back to JetStream for %.0fs",
                message.target,
                exc.reason,
                delay,
                extra={"trainjob": str(message.trainjob), "trace_id": message.trace_id},
            )
            await msg.nak(delay=delay)
            return
        except core.PermanentError as exc:
            await self._dead_letter(msg, reason="permanent", error=exc.reason, key=message)
            await self._explain_on_trainjob(message, exc.reason)
            await self._finish(msg, message, "failed", attempts, started, reason=exc.reason, ack=False)
            await msg.term()
            return
        await self._finish(msg, message, action, attempts, started, resource_version=resource_version, reason=reason)

    async def _delete_once(
        self, message: DeleteComponent, resource: resources.Resource
    ) -> tuple[ApplyAction, str, str]:
        target = message.target
        record, _ = await self.ledger.read_fresh(ledger_key(target))
        if core.is_stale(record, message):
            return "skipped", "", "stale plan: a newer plan for this target was claimed or applied"
        try:
            raw = await self.kube.get(resource, namespace=target.namespace, name=target.name)
            if raw is None:
                return "skipped", "", "already gone"
            if not core.controlled_by(raw, message.trainjob_uid):
                return "skipped", "", "not controlled by this TrainJob; left alone"
            await self.kube.delete(resource, namespace=target.namespace, name=target.name)
        except KubeApiError as exc:
            raise core.classify(exc.status, exc.reason, exc.message, retry_after=exc.retry_after) from exc
        return "deleted", "", message.reason

    async def _apply_once(
        self, message: ObjectApply, resource: resources.Resource, key: tuple[str, str, str, str]
    ) -> tuple[ApplyAction, str, str]:
        """One fenced apply: claim the target in the ledger, then write conditionally, then record it.

        Returns the action, the resulting resourceVersion and a reason. Raises TransientError or
        PermanentError for the retry tiers around it.
        """
        target = message.target
        lkey = ledger_key(target)
        planned = msgspec.json.encode(message.object)  # generated key material is never part of the digest
        digest = core.content_digest(planned)
        for round_ in range(_CLAIM_ROUNDS):
            # After a lost compare-and-set, remembering is what went wrong: ask the server.
            if round_ == 0:
                record, revision = await self.ledger.read(lkey, assume_absent=True)
            else:
                record, revision = await self.ledger.read_fresh(lkey)
            if core.is_stale(record, message):
                return "skipped", "", "stale plan: a newer plan for this target was claimed or applied"
            live_raw: bytes | None = None
            if record is not None:
                live_raw = await self._get(resource, target)
                if (
                    live_raw is not None
                    and record.state == "applied"
                    and record.digest == digest
                    and core.managed_digest(live_raw, manager=message.field_manager, subresource=target.subresource)
                    == record.managed
                ):
                    live_rv = core.live_state(live_raw).resource_version
                    advanced = await self.ledger.write(
                        lkey,
                        msgspec.structs.replace(
                            record, source_version=message.source_version, source_seq=message.source_seq
                        ),
                        revision=revision,
                    )
                    if advanced is None:
                        continue  # another applier wrote the record meanwhile: look again
                    return "unchanged", live_rv, "already applied; the live object still holds it"
            if message.policy != "always":
                if live_raw is None and not (record is None and _freshly_seen_absent(message)):
                    live_raw = await self._get(resource, target)
                live = core.live_state(live_raw)
                allowed, why = core.policy_allows(message, live)
                if not allowed:
                    label = core.owned_label_patch(message, live_raw)
                    if label is not None:
                        return "skipped", await self._add_owned_label(message, resource, label), why + "; labelled"
                    return "skipped", live.resource_version, why
            claim = AppliedRecord(
                source_version=message.source_version, source_seq=message.source_seq, digest=digest, state="claimed"
            )
            claimed = await self.ledger.write(lkey, claim, revision=revision)
            if claimed is None:
                continue  # someone else claimed first: look again
            before = core.live_state(live_raw).resource_version if live_raw is not None else ""
            # A status carries its own precondition: the TrainJob version it was planned from.
            precondition = "" if target.subresource else before
            planned_from = core.planned_resource_version(message)
            if target.subresource and live_raw is not None and planned_from and planned_from != before:
                return "skipped", before, "stale status: the TrainJob changed since this status was planned"
            try:
                resp = await self.kube.apply(
                    resource,
                    namespace=target.namespace,
                    name=target.name,
                    body=_body(message, resource_version=precondition),
                    field_manager=message.field_manager,
                    force=message.force,
                    subresource=target.subresource,
                )
            except KubeApiError as exc:
                if exc.status == 409 and target.subresource:
                    return "skipped", before, "stale status: the TrainJob changed since this status was planned"
                if exc.status == 409 and before:
                    continue  # the object changed since we read it: look at the ledger again
                if message.policy == "if-absent" and exc.status in (409, 422):
                    # Another writer created it between our read and our write (an immutable Secret then
                    # refuses the second key): it exists, which is all "if-absent" asks for.
                    raw = await self._get(resource, target)
                    if raw is not None:
                        return "skipped", core.live_state(raw).resource_version, "created concurrently"
                raise core.classify(exc.status, exc.reason, exc.message, retry_after=exc.retry_after) from exc
            after = _resource_version(resp.body)
            done = msgspec.structs.replace(
                claim,
                state="applied",
                resource_version=after,
                managed=core.managed_digest(resp.body, manager=message.field_manager, subresource=target.subresource),
            )
            await self.ledger.write(lkey, done, revision=claimed)
            return core.outcome(resp.status, before=before, after=after), after, ""
        raise core.TransientError("the target kept changing under concurrent writers")

    async def _add_owned_label(self, message: ApplyMessage, resource: resources.Resource, patch: bytes) -> str:
        """Label an existing ``if-absent`` object (see ``core.owned_label_patch``); its new resourceVersion.

        A JSON merge patch under a field manager of its own, so the label is all it claims: an apply as
        ``trainer`` with nothing but the label would drop every other field ``trainer`` owns.
        """
        target = message.target
        try:
            resp = await self.kube.request(
                "PATCH",
                resource.path(namespace=target.namespace, name=target.name),
                params={"fieldManager": LABEL_FIELD_MANAGER},
                body=patch,
                content_type=MERGE_PATCH,
            )
        except KubeApiError as exc:
            raise core.classify(exc.status, exc.reason, exc.message, retry_after=exc.retry_after) from exc
        log.info("%s: labelled an existing object, which is kept as it is otherwise", target)
        return _resource_version(resp.body)

    async def _explain_on_trainjob(self, message: ApplyMessage, error: str) -> None:
        """A Warning Event on the TrainJob, so `kubectl describe` shows why a component is missing."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{message.trainjob.name}.", "namespace": message.trainjob.namespace},
            "involvedObject": {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJob",
                "name": message.trainjob.name,
                "namespace": message.trainjob.namespace,
                "uid": message.trainjob_uid,
            },
            "reason": EVENT_REASON,
            "message": f"{message.target}: {error}"[:1000],
            "type": "Warning",
            "source": {"component": "tjpipe-applier"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.kube.create(
                resources.EVENT, namespace=message.trainjob.namespace, body=json.dumps(event).encode()
            )
        except KubeApiError as exc:
            log.warning("could not record an Event on %s: %s", message.trainjob, exc)

    async def _get(self, resource: resources.Resource, target: Target) -> bytes | None:
        try:
            return await self.kube.get(resource, namespace=target.namespace, name=target.name)
        except KubeApiError as exc:
            raise core.classify(exc.status, exc.reason, exc.message, retry_after=exc.retry_after) from exc

    # ------------------------------------------------------------------------------------- bookkeeping

    @contextlib.asynccontextmanager
    async def _heartbeat(self, msg: Msg) -> AsyncIterator[None]:
        async def beat() -> None:
            while True:
                await asyncio.sleep(streams.APPLIER.ack_wait_seconds / 3)
                with contextlib.suppress(Exception):
                    await msg.in_progress()

        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            task.cancel()

    async def _finish(
        self,
        msg: Msg,
        message: ApplyMessage,
        action: ApplyAction,
        attempts: int,
        started: float,
        *,
        resource_version: str = "",
        reason: str = "",
        ack: bool = True,
    ) -> None:
        component = component_of(message)
        duration_ms = (time.perf_counter() - started) * 1000
        result = ApplyResult(
            trainjob=message.trainjob,
            target=message.target,
            component=component,
            source_seq=message.source_seq,
            action=action,
            attempts=attempts,
            duration_ms=round(duration_ms, 3),
            resource_version=resource_version,
            reason=reason,
            finished_at=time.time(),
            trace_id=message.trace_id,
        )
        self.stats.count(action)
        APPLIES.labels(kind=message.target.kind, action=action).inc()
        if action in ("created", "configured", "unchanged", "deleted") and message.observed_at:
            END_TO_END.labels(kind=message.target.kind).observe(max(0.0, time.time() - message.observed_at))
        subject = subjects.result_subject(message.trainjob.namespace, message.trainjob.name, component)
        await self.js.publish(subject, encode(result), headers={bus.TRACE_ID: message.trace_id})
        log.info(
            "%s %s (%d attempt%s, %.1f ms)%s",
            action,
            message.target,
            attempts,
            "" if attempts == 1 else "s",
            duration_ms,
            f": {reason}" if reason else "",
            extra={"trainjob": str(message.trainjob), "trace_id": message.trace_id, "action": action},
        )
        if ack:
            await msg.ack()

    async def _dead_letter(self, msg: Msg, *, reason: str, error: str, key: ApplyMessage | None) -> None:
        if key is not None:
            namespace, name = key.trainjob.namespace, key.trainjob.name
        else:
            namespace, name = subjects.trainjob_of_subject(msg.subject)
        self.stats.dead_letters += 1
        DEAD_LETTERS.labels(stage="applier", reason=reason).inc()
        where = f"{key.target}: " if key is not None else ""
        await bus.dead_letter(
            self.js, msg, stage="applier", reason=reason, error=where + error, namespace=namespace, name=name
        )

    # ----------------------------------------------------------------------------------------------- run

    async def handle_batch(self, msgs: list[Msg]) -> None:
        """A partition's batch: different targets in parallel, the same target in arrival order."""
        await asyncio.gather(*(self._guarded(msg) for msg in msgs))

    async def _guarded(self, msg: Msg) -> None:
        try:
            await self.handle(msg)
        except Exception:
            # Not acked: JetStream redelivers after ack_wait. Nothing is lost.
            log.exception("unexpected failure handling %s", msg.subject)


ABSENCE_TRUSTED_SECONDS = 30.0
"""How long an observation that a component was absent is taken as true (see ``_freshly_seen_absent``)."""


def _freshly_seen_absent(message: ObjectApply) -> bool:
    """The plan saw no such object moments ago, so the read before a conditional create can be left out.

    Only together with no ledger record: every applier claims a record before it writes, so an object that
    exists without one was made by someone else, or the ledger was lost. For an old message (a replay, a
    dead letter retried) after a ledger loss that could be wrong, hence the age limit. Were the record only
    assumed absent and exist after all, the claim fails and the next round reads the object.
    """
    return message.observed_absent and 0.0 <= time.time() - message.observed_at <= ABSENCE_TRUSTED_SECONDS


def _body(message: ObjectApply, *, resource_version: str = "") -> bytes:
    """The apply body: generated key material is made here, now; never stored, published or logged.

    With ``resource_version`` the apply is conditional: the API server refuses it (409) if the object
    changed since that version was read.
    """
    obj: Any = message.object
    if isinstance(message, ApplySecret) and message.generate is not None:
        data = dict(or_default(message.object.data, {}))
        data.update(secrets.generated_data(message.generate, trainjob_name=message.trainjob.name))
        obj = msgspec.structs.replace(message.object, data=data)
    if resource_version:
        meta = msgspec.structs.replace(obj.metadata, resource_version=resource_version)
        obj = msgspec.structs.replace(obj, metadata=meta)
    return msgspec.json.encode(obj)


class _Meta(msgspec.Struct):
    resourceVersion: str = ""


class _Head(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)


_head = msgspec.json.Decoder(_Head)


def _resource_version(body: bytes) -> str:
    try:
        return _head.decode(body).metadata.resourceVersion
    except msgspec.DecodeError:
        return ""


async def run_applier(settings: ApplierSettings, stop: asyncio.Event) -> None:
    nc = await bus.connect(settings.nats_url, name="tjpipe-applier")
    js = nc.jetstream()
    await bus.ensure_streams(js, streams.configured_streams())
    health = HealthServer(port=settings.metrics_port)
    health.add_check("nats", lambda: nc.is_connected)
    async with KubeClient(KubeConfig.load(settings.kubeconfig), max_connections=settings.concurrency) as kube:
        health.add_check("kubernetes", kube.reachable)
        await health.start()
        ledger = await bus.until_done(
            lambda: Ledger.open(js, replicas=streams.stream_replicas()), what="opening the ledger"
        )
        applier = Applier(settings, kube, js, ledger)
        try:
            await consume_partitioned(
                nc,
                js,
                streams.APPLIER,
                applier.handle_batch,
                role="applier",
                replica=settings.replica,
                batch=settings.batch,
                lease_ttl=settings.lease_ttl,
                stop=stop,
            )
        finally:
            await health.stop()
            await nc.drain()
