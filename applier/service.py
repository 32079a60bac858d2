"""The applier process: one durable pull consumer, each message turned into one Server-Side Apply.

A message is acknowledged only after its apply succeeded (or was decided to be unnecessary) and its result
was recorded, so a crash anywhere before that point means redelivery, never loss. The ack itself is not
awaited: an ack lost on the way only means one redelivery, which the ledger answers as ``unchanged``,
while waiting for it cost a round trip per message and stalled for a whole ack wait whenever the
consumer's leader moved. Retrying happens in two tiers: a few quick attempts in process, with JetStream
kept informed by in-progress heartbeats, and then a delayed nak that frees this replica for other work.

Messages for the same target are handled one at a time, in arrival order; different targets run in
parallel up to a bound, sharing one connection pool to the API server.

This module is the shell around three parts, each in a file of its own and read in this order: intake
(``plumbing.intake``: the planner's signature verified, the message decoded, or a dead letter), then
authorization (``applier.authorize``'s check of the message, then ``applier.trainjobs``' of the TrainJob
it names, as it reads it), then the fenced write (``applier.fence``, doing what ``claim_round.decide``
answers; claims newer than the plan in ``applier.claims``). What stays here is what every message needs
whatever its outcome: its turn (``applier.pacing``) and the in-process retry tier. A message travels as one
``plumbing.delivery.Delivery`` (the message, its decoded form, its attempts, when its work started); its
work answers what became of it (``results.Outcome``), and ``applier.results.Endings`` ends it, written once:
finished (result, ack), failed (dead letter, ``failed`` result, terminate) or handed back (``Delivery.retry``).
Read in the order one message meets them: this file, then the checks and the fence, then its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator

import msgspec
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from applier import authorize, errors, outcomes, results
from applier.claims import NewerClaims
from applier.epoch import ClusterEpoch
from applier.fence import Fence
from applier.ledger import Ledger
from applier.pacing import StatusPacing
from applier.settings import ApplierSettings
from applier.trainjob_watch import WatchedTrainJobs
from applier.trainjobs import TrainJobs
from contracts import resources, streams
from contracts.messages import ApplyMessage, DeleteComponent, Target, decode_apply
from plumbing import intake, retrying, signing
from plumbing.delivery import Delivery
from plumbing.kube import KubeClient, KubeConfig
from plumbing.observability import RETRIES
from plumbing.partitions import consume_partitioned, default_replica_id
from plumbing.runner import started
from plumbing.stream_usage import StreamUsage
from plumbing.tasks import cancel_and_wait

log = logging.getLogger("applier")


def _retry_policy(settings: ApplierSettings) -> retrying.Policy:
    """The transient-error policy with this applier's attempts and cap, honouring the server's Retry-After."""
    return dataclasses.replace(
        retrying.TRANSIENT_API_ERROR.with_limits(attempts=settings.attempts, maximum=settings.max_backoff_seconds),
        retry_on=(errors.TransientError,),
        wait_at_least=lambda exc: exc.retry_after if isinstance(exc, errors.TransientError) else None,
    )


class Applier:
    def __init__(
        self,
        settings: ApplierSettings,
        kube: KubeClient,
        js: JetStreamContext,
        ledger: Ledger,
        *,
        trusted_plans: signing.Keyring,
        epoch: ClusterEpoch | None = None,
    ) -> None:
        self.settings = settings
        self.retry_policy = _retry_policy(settings)
        self.trusted_plans = trusted_plans
        self.js = js
        self.ledger = ledger
        watched = (
            WatchedTrainJobs(kube, namespaces=settings.namespaces) if settings.trainjob_source == "watch" else None
        )
        self.trainjobs = TrainJobs(kube, cache_seconds=settings.trainjob_cache_seconds, watched=watched)
        claims = NewerClaims(
            kube, ledger, self.trainjobs, epoch=epoch, grace_seconds=settings.stale_claim_grace_seconds
        )
        self.fence = Fence(kube, ledger, claims)
        self.pacing = StatusPacing(settings.status_interval_seconds)
        self.endings = results.Endings(ledger, self.trainjobs, self.pacing)
        self._locks: dict[tuple[str, str, str, str], asyncio.Lock] = {}
        self._slots = asyncio.Semaphore(settings.concurrency)

    @staticmethod
    def _key(target: Target) -> tuple[str, str, str, str]:
        return (target.api_version + "/" + target.kind, target.namespace, target.name, target.subresource or "")

    # ------------------------------------------------------------------------------------------ intake

    async def handle(self, msg: Msg) -> None:
        delivery: Delivery[ApplyMessage] = Delivery(msg, stage="applier", js=self.js)
        # First of all: only a plan the planner signed is read, let alone applied.
        message = await intake.admit(delivery, keyring=self.trusted_plans, decode=decode_apply)
        if message is None:
            return
        lock = self._locks.setdefault(self._key(message.target), asyncio.Lock())
        async with self._slots, lock, self._heartbeat(msg):
            delivery.started = time.perf_counter()  # its work starts with its turn, not with the wait for it
            await self._handle_decoded(delivery)

    async def _handle_decoded(self, delivery: Delivery[ApplyMessage]) -> None:
        """What became of the message's work, then its end, written once (``applier.results.Endings``)."""
        outcome = await self._work(delivery)
        await self.endings.end(delivery, outcome)

    # ------------------------------------------------------------------------------------------ the work

    async def _work(self, delivery: Delivery[ApplyMessage]) -> results.Outcome:
        """The message's checks and its turn, then the in-process retry tier: authorize, then one fenced write,
        again while it fails for now. What became of it, for ``Endings.end``."""
        message = delivery.message
        body = b"{}" if isinstance(message, DeleteComponent) else msgspec.json.encode(message.object)
        verdict = authorize.authorize_message(message, body)
        if not verdict.allowed:
            return errors.Unauthorized(verdict.why)
        if self.pacing.superseded(message):
            return outcomes.Done(action="skipped", reason=outcomes.STALE_PLAN)
        if (wait := self.pacing.wait_for(message)) > 0:
            return errors.Held(wait)  # its turn comes with the interval (applier.pacing)
        try:
            resource = resources.resource_for(message.target.api_version, message.target.kind)
        except LookupError as exc:
            return exc

        async def once() -> results.Applied:
            delivery.attempts += 1
            if delivery.attempts > 1:
                RETRIES.labels(tjpipe_service="applier").inc()
            facts = await self.trainjobs.verify(message)
            if isinstance(message, DeleteComponent):
                return results.Applied(await self.fence.delete(message, resource), facts)
            done = await self.fence.apply_plan(message, resource, body, known_version=facts.resource_version)
            return results.Applied(done, facts)

        try:
            return await self.retry_policy.call(once)
        except _NOT_DONE as exc:
            return exc

    @contextlib.asynccontextmanager
    async def _heartbeat(self, msg: Msg) -> AsyncIterator[None]:
        """While a message is worked on, JetStream is told so, so that it is not delivered again meanwhile."""

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


_NOT_DONE = (errors.TrainJobGone, errors.Unauthorized, errors.Held, errors.TransientError, errors.PermanentError)
"""How an attempt ends without a ``Done``: each is ended its own way (``results.Endings.end``)."""


async def run_applier(settings: ApplierSettings, stop: asyncio.Event) -> None:
    trusted_plans = signing.Keyring.from_path(
        settings.trusted_plan_keys, setting="--trusted-plan-keys / TJPIPE_TRUSTED_PLAN_KEYS", name="plan"
    )
    log.info("trusting apply messages signed by %s", ", ".join(trusted_plans.key_ids))
    async with started(
        "tjpipe-applier",
        settings,
        kube=lambda: KubeClient(
            KubeConfig.load(settings.kubeconfig, context=settings.kube_context), max_connections=settings.concurrency
        ),
    ) as service:
        await service.health.start()
        ledger = await Ledger.open(service.js)
        epoch = ClusterEpoch(ledger.kv, service.kube_client(), configured=settings.cluster_id)
        # Not awaited: with the API server away the applier still takes its messages and hands them back.
        # A claim made before the first answer carries no stamp and is judged as older versions' are.
        stamping = asyncio.create_task(epoch.start())
        applier = Applier(settings, service.kube_client(), service.js, ledger, trusted_plans=trusted_plans, epoch=epoch)
        usage = StreamUsage(
            service.js,
            [spec.name for spec in streams.ALL_STREAMS],
            records=[spec.name for spec in streams.RECORD_STREAMS],
        )
        watching = asyncio.create_task(usage.run(stop))
        watched = applier.trainjobs.watched
        following = [asyncio.create_task(watched.run())] if watched is not None else []
        try:
            await consume_partitioned(
                service.nc,
                service.js,
                streams.APPLIER,
                applier.handle_batch,
                role="applier",
                replica=settings.replica or default_replica_id(),
                batch=settings.batch,
                lease_ttl=settings.lease_ttl,
                work_sweep_seconds=settings.work_sweep_seconds,
                stop=stop,
            )
        finally:
            await cancel_and_wait(watching, stamping, *following)
