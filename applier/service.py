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
import dataclasses
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

from tjpipe.applier import core, secrets
from tjpipe.applier.cluster import ClusterEpoch, standing
from tjpipe.applier.ledger import Ledger, ledger_key, seen_key
from tjpipe.contracts import conditions, resources, streams, subjects
from tjpipe.contracts.messages import (
    AppliedRecord,
    ApplyAction,
    ApplyMessage,
    ApplyResult,
    ApplySecret,
    ApplyTrainJobStatus,
    DeleteComponent,
    ObjectApply,
    Target,
    UnsupportedVersion,
    component_of,
    decode_apply,
    encode,
)
from tjpipe.contracts.values import or_default
from tjpipe.plumbing import bus, publishing, signing
from tjpipe.plumbing.kube import MERGE_PATCH, KubeApiError, KubeClient, KubeConfig
from tjpipe.plumbing.observability import (
    APPLIES,
    DEAD_LETTERS,
    END_TO_END,
    FOREIGN_CLAIMS,
    RETRIES,
    STAGE_SECONDS,
    STALE_CLAIMS,
    TRAINJOBS_CREATED,
    UNAUTHORIZED,
    count_transitions,
)
from tjpipe.plumbing.partitions import consume_partitioned, default_replica_id
from tjpipe.plumbing.runner import ServiceSettings, started
from tjpipe.plumbing.stream_usage import StreamUsage

log = logging.getLogger("applier")

_CLAIM_ROUNDS = 5
EVENT_REASON = "ComponentApplyFailed"
LABEL_FIELD_MANAGER = "trainjob-pipeline-label"
"""The field manager that adds this pipeline's label to objects made before it (``_add_owned_label``)."""


@dataclass
class ApplierSettings(ServiceSettings):
    kubeconfig: str | None = None
    kube_context: str | None = None
    batch: int = 32
    concurrency: int = 16
    attempts: int = 5
    """In-process attempts for transient errors before the message goes back to JetStream."""
    max_backoff_seconds: float = 8.0
    replica: str = field(default_factory=default_replica_id)
    lease_ttl: float = 6.0
    trainjob_cache_seconds: float = 5.0
    """How long a TrainJob verified against the cluster is trusted without reading it again."""
    cluster_id: str = ""
    """What tells this cluster's ledger claims from another's; empty: the kube-system namespace's uid."""
    stale_claim_grace_seconds: float = 330.0
    """How long a ledger claim newer than the cluster may hold a target before it is deemed corrupt and
    overwritten: a bit over the watcher's resync (5 min), since every resync brings a plan at least as new
    as any genuine claim."""
    trusted_plan_keys: str | None = None
    """The planner public keys an apply message must be signed with: a file, or a directory of ``*.pub``."""


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
        # Plain attribute assignments, alike in shape to other constructors' (duplicate finders pair them).
        self.settings = settings
        self.trusted_plans = trusted_plans
        self.kube = kube
        self.js = js
        self.ledger = ledger
        self.epoch = epoch
        self.stats = ApplierStats()
        self._locks: dict[tuple[str, str, str, str], asyncio.Lock] = {}
        self._slots = asyncio.Semaphore(settings.concurrency)
        self._trainjobs: dict[tuple[str, str], tuple[core.TrainJobFacts, float]] = {}
        """Positive TrainJob verifications (namespace, name) -> (facts, trusted until, monotonic)."""
        self._stale_claims: dict[str, tuple[int, float]] = {}
        self._reading: dict[tuple[str, str], asyncio.Future[bytes | None]] = {}
        """Ledger keys holding a claim beyond the cluster -> (its source_version, first seen, monotonic)."""

    @staticmethod
    def _key(target: Target) -> tuple[str, str, str, str]:
        return (target.api_version + "/" + target.kind, target.namespace, target.name, target.subresource or "")

    # ------------------------------------------------------------------------------------------ the work

    async def handle(self, msg: Msg) -> None:
        try:  # first of all: only a plan the planner signed is read, let alone applied
            self.trusted_plans.verify(msg.subject, msg.data, msg.headers)
        except signing.SignatureError as exc:
            await self._dead_letter(msg, reason=exc.reason, error=str(exc), key=None)
            await msg.term()
            return
        try:
            message = decode_apply(msg.data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            reason = exc.reason if isinstance(exc, UnsupportedVersion) else "undecodable"
            await self._dead_letter(msg, reason=reason, error=str(exc), key=None)
            await msg.term()
            return
        key = self._key(message.target)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with self._slots, lock, self._heartbeat(msg):
            await self._handle_decoded(msg, message, key)

    async def _handle_decoded(self, msg: Msg, message: ApplyMessage, key: tuple[str, str, str, str]) -> None:
        started = time.perf_counter()
        attempts = 0
        body = b"{}" if isinstance(message, DeleteComponent) else msgspec.json.encode(message.object)
        verdict = core.authorize_message(message, body)
        if not verdict.allowed:
            await self._refuse(msg, message, verdict.why, attempts, started)
            return
        try:
            resource = resources.resource_for(message.target.api_version, message.target.kind)
        except LookupError as exc:
            await self._dead_letter(msg, reason="permanent", error=str(exc), key=message)
            await self._finish(msg, message, "failed", attempts, started, reason=str(exc), ack=False)
            await msg.term()
            return
        done = core.Done(action="configured")
        facts: core.TrainJobFacts | None = None
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
                        RETRIES.labels(tjpipe_service="applier").inc()
                    facts = await self._authorize(message)
                    if isinstance(message, DeleteComponent):
                        done = await self._delete_once(message, resource)
                    else:
                        done = await self._apply_once(message, resource, key, body)
        except core.TrainJobGone as exc:
            await self._finish(msg, message, "skipped", attempts, started, reason=f"{exc.why}: nothing to do")
            return
        except core.Unauthorized as exc:
            await self._refuse(msg, message, exc.why, attempts, started)
            return
        except _Held as exc:
            self.stats.naks += 1
            await msg.nak(delay=exc.delay)
            return
        except core.SettlingRefusal as exc:
            if (msg.metadata.num_delivered or 1) >= core.SETTLING_DELIVERIES:
                await self._fail_permanently(msg, message, exc.permanent, attempts, started)
                return
            await self._hand_back(msg, message, exc)
            return
        except core.TransientError as exc:
            await self._hand_back(msg, message, exc)
            return
        except core.PermanentError as exc:
            await self._fail_permanently(msg, message, exc, attempts, started)
            return
        if (
            facts is not None
            and done.action in ("created", "configured", "unchanged")
            and core.condition_names(message, facts.applier_condition)
        ):
            await self._clear_condition(message)
        if facts is not None:
            await self._count_lifecycle(message, facts, done)
        await self._finish(
            msg, message, done.action, attempts, started, resource_version=done.resource_version, reason=done.reason
        )

    async def _count_lifecycle(self, message: ApplyMessage, facts: core.TrainJobFacts, done: core.Done) -> None:
        """The ``kubeflow_trainer_*`` counts this message accounts for, each made by exactly one applier.

        Created: the first applier to record the TrainJob's uid in the ledger (compare-and-set) counts it.
        A status change: the applier whose write made it; the write was conditional on the TrainJob version
        the planner saw without the condition, so no other write can make the same change.
        """
        namespace = message.trainjob.namespace
        try:
            if await self.ledger.first_sight(seen_key(namespace, message.trainjob.name), facts.uid):
                TRAINJOBS_CREATED.labels(namespace, facts.runtime).inc()
        except Exception as exc:  # the bus failed just now: a metric is not worth a redelivery
            log.warning("%s: could not record the TrainJob in the ledger: %s", message.trainjob, exc)
        if isinstance(message, ApplyTrainJobStatus) and done.action in ("created", "configured"):
            count_transitions(message.transitions, namespace=namespace, runtime=facts.runtime)

    async def _hand_back(self, msg: Msg, message: ApplyMessage, exc: core.TransientError) -> None:
        """Give a message that failed for now back to JetStream, with a delay that grows per delivery."""
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

    async def _fail_permanently(
        self, msg: Msg, message: ApplyMessage, exc: core.PermanentError, attempts: int, started: float
    ) -> None:
        """A dead letter, the reason on the TrainJob, a ``failed`` result, and the message terminated."""
        await self._dead_letter(msg, reason="permanent", error=exc.reason, key=message)
        await self._explain_on_trainjob(message, exc.reason)
        if exc.api_reason and not isinstance(message, ApplyTrainJobStatus | DeleteComponent):
            # The API server refused the component (e.g. a webhook's 422): say so on the TrainJob.
            await self._set_condition(message, reason=exc.api_reason, text=exc.api_message or exc.reason)
        await self._finish(msg, message, "failed", attempts, started, reason=exc.reason, ack=False)
        await msg.term()

    # --------------------------------------------------------------------------------- authorization

    async def _authorize(self, message: ApplyMessage) -> core.TrainJobFacts:
        """The TrainJob the message names, verified against the cluster; raises Unauthorized otherwise.

        A positive answer is trusted for a few seconds, so a TrainJob's components cost one read between
        them. A refusal is never taken from memory (the TrainJob may have been created or replaced since),
        and a delete always asks the cluster.
        """
        fresh = isinstance(message, DeleteComponent)
        facts = await self._trainjob(message, fresh=fresh)
        verdict = core.authorize_trainjob(message, facts)
        if not verdict.allowed and not fresh:
            facts = await self._trainjob(message, fresh=True)
            verdict = core.authorize_trainjob(message, facts)
        if verdict.gone:
            raise core.TrainJobGone(verdict.why)
        if not verdict.allowed or facts is None:
            raise core.Unauthorized(verdict.why)
        return facts

    async def _trainjob(self, message: ApplyMessage, *, fresh: bool) -> core.TrainJobFacts | None:
        key = (message.trainjob.namespace, message.trainjob.name)
        now = time.monotonic()
        if not fresh:
            cached = self._trainjobs.get(key)
            if cached is not None and cached[1] > now:
                return cached[0]
        try:
            raw = await self._read_trainjob(key, share=not fresh)
        except KubeApiError as exc:
            raise core.classify(exc.status, exc.reason, exc.message, retry_after=exc.retry_after) from exc
        facts = core.trainjob_facts(raw)
        if facts is not None and core.authorize_trainjob(message, facts).allowed:
            if len(self._trainjobs) > 8192:
                self._trainjobs = {k: v for k, v in self._trainjobs.items() if v[1] > now}
            self._trainjobs[key] = (facts, now + self.settings.trainjob_cache_seconds)
        else:
            self._trainjobs.pop(key, None)
        return facts

    async def _add_owned_label(self, message: ApplyMessage, resource: resources.Resource, patch: bytes) -> str:
        """Label an existing ``if-absent`` object (see ``core.owned_label_patch``), or one Trainer made that
        otherwise holds the plan (``core.held_state``); its new resourceVersion.

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

    async def _read_trainjob(self, key: tuple[str, str], *, share: bool) -> bytes | None:
        """One GET of the TrainJob; with ``share``, the GET another message of it has in flight, if any.

        A TrainJob's components arrive together and are applied in parallel: without sharing, each would
        miss the cache and read the same TrainJob at the same moment.
        """
        task = self._reading.get(key) if share else None
        if task is None:
            task = asyncio.ensure_future(self.kube.get(resources.TRAINJOB, namespace=key[0], name=key[1]))
            self._reading[key] = task

            def done(finished: asyncio.Future[bytes | None], key: tuple[str, str] = key) -> None:
                if self._reading.get(key) is finished:
                    del self._reading[key]
                if not finished.cancelled():
                    finished.exception()  # retrieved here too, so no waiter left is not an error

            task.add_done_callback(done)
        return await asyncio.shield(task)

    def _require_controlled(self, message: ApplyMessage, live: bytes | None) -> None:
        verdict = core.authorize_live(message, live)
        if not verdict.allowed:
            raise core.Unauthorized(verdict.why)

    async def _refuse(self, msg: Msg, message: ApplyMessage, why: str, attempts: int, started: float) -> None:
        """Nothing is written for a message no TrainJob justifies, not even an Event on the TrainJob."""
        UNAUTHORIZED.labels(kind=message.target.kind).inc()
        await self._dead_letter(msg, reason="unauthorized", error=why, key=message)
        await self._finish(msg, message, "failed", attempts, started, reason=f"unauthorized: {why}", ack=False)
        await msg.term()

    # ------------------------------------------------------------------------ the applier's condition

    async def _set_condition(self, message: ApplyMessage, *, reason: str, text: str) -> None:
        """``ComponentsApplied=False`` on the TrainJob, unless it already says exactly this.

        Writing the same condition again would change the TrainJob, which makes a new event and a new plan
        that fails the same way: the check against what the TrainJob already shows is what ends that loop.
        """
        key = (message.trainjob.namespace, message.trainjob.name)
        wanted = core.condition_message(message, text)
        cached = self._trainjobs.get(key)
        if cached is not None and cached[0].applier_condition == wanted:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = core.applier_condition(message, reason=reason, text=text, now=now)
        if await self._apply_condition(message, body) and cached is not None:
            self._trainjobs[key] = (dataclasses.replace(cached[0], applier_condition=wanted), cached[1])

    async def _clear_condition(self, message: ApplyMessage) -> None:
        key = (message.trainjob.namespace, message.trainjob.name)
        if await self._apply_condition(message, core.applier_condition_cleared(message)):
            cached = self._trainjobs.get(key)
            if cached is not None:
                self._trainjobs[key] = (dataclasses.replace(cached[0], applier_condition=""), cached[1])

    async def _apply_condition(self, message: ApplyMessage, body: bytes) -> bool:
        try:
            await self.kube.apply(
                resources.TRAINJOB,
                namespace=message.trainjob.namespace,
                name=message.trainjob.name,
                body=body,
                field_manager=conditions.APPLIER_FIELD_MANAGER,
                force=True,
                subresource="status",
            )
        except KubeApiError as exc:
            log.warning(
                "could not update the %s condition on %s: %s",
                conditions.CONDITION_COMPONENTS_APPLIED,
                message.trainjob,
                exc,
                extra={"trainjob": str(message.trainjob)},
            )
            return False
        return True

    async def _delete_once(self, message: DeleteComponent, resource: resources.Resource) -> core.Done:
        target = message.target
        lkey = ledger_key(target)
        record, revision = await self.ledger.read_fresh(lkey)
        if record is not None and core.is_stale(record, message):
            elsewhere = await self._made_elsewhere(message, record)
            if elsewhere:
                if not await self._set_aside(message, lkey, record, revision, elsewhere):
                    raise core.TransientError("the ledger record changed while it was being set aside")
            elif not await self._claim_is_corrupt(message, resource, lkey, record):
                return core.Done(action="skipped", reason=core.STALE_PLAN)
            elif not await self._replace_claim(message, lkey, record, revision):
                raise core.TransientError("the ledger record changed while it was being replaced")
        try:
            raw = await self.kube.get(resource, namespace=target.namespace, name=target.name)
            if raw is None:
                return core.Done(action="skipped", reason="already gone")
            self._require_controlled(message, raw)
            await self.kube.delete(resource, namespace=target.namespace, name=target.name)
        except KubeApiError as exc:
            raise core.classify(exc.status, exc.reason, exc.message, retry_after=exc.retry_after) from exc
        return core.Done(action="deleted", reason=message.reason)

    async def _apply_once(
        self, message: ObjectApply, resource: resources.Resource, key: tuple[str, str, str, str], planned: bytes
    ) -> core.Done:
        """One fenced apply: claim the target in the ledger, then write conditionally, then record it.

        Raises TransientError or PermanentError for the retry tiers around it. Every decision is
        ``applier.core``'s; this performs them.
        """
        if type(message) in core.CREATE_ONLY:
            return await self._create_once(message, resource, planned)
        target = message.target
        lkey = ledger_key(target)
        # ``planned`` is the encoded object, without generated key material, which is never part of the digest
        digest = core.content_digest(planned)
        for round_ in range(_CLAIM_ROUNDS):
            read = await self._round_record(message, resource, lkey, round_)
            if read is None:
                continue  # look again, with the claim replaced (or someone else's newer one)
            if isinstance(read, core.Done):
                return read
            record, revision = read
            live_raw: bytes | None = None
            read_live = False
            if record is not None:
                live_raw = await self._get(resource, target)
                read_live = True
                self._require_controlled(message, live_raw)
                if live_raw is not None and core.still_applied(record, live_raw, message, digest=digest):
                    advanced = await self.ledger.write(
                        lkey,
                        msgspec.structs.replace(
                            record,
                            source_version=message.source_version,
                            source_seq=message.source_seq,
                            cluster=self._stamp(),
                        ),
                        revision=revision,
                    )
                    if advanced is None:
                        continue  # another applier wrote the record meanwhile: look again
                    live_rv = core.live_state(live_raw).resource_version
                    return core.Done(action="unchanged", resource_version=live_rv, reason=core.ALREADY_APPLIED)
            if not read_live and not target.subresource:
                # Whether it exists, and whose it is: an object this TrainJob does not control is not taken
                # over. Not even a plan that saw the target absent moments ago is taken at its word here: the
                # API server has no create-only apply, so only a read tells an object of that name apart.
                live_raw = await self._get(resource, target)
                read_live = True
                self._require_controlled(message, live_raw)
            if message.policy != "always":
                live = core.live_state(live_raw)
                allowed, why = core.policy_allows(message, live)
                if not allowed:
                    label = core.owned_label_patch(message, live_raw)
                    if label is not None:
                        labelled = await self._add_owned_label(message, resource, label)
                        return core.Done(action="skipped", resource_version=labelled, reason=why + "; labelled")
                    return core.Done(action="skipped", resource_version=live.resource_version, reason=why)
            held = (
                core.held_state(planned, live_raw, manager=message.field_manager)
                if live_raw is not None and not target.subresource
                else "differs"
            )
            if live_raw is not None and held != "differs":
                # The live object already is the plan: one Trainer made, one whose ledger record was lost, or a
                # re-plan of an existing JobSet that only repeats what the live object holds. Record it, write
                # nothing but the label a Trainer-made object lacks.
                live_rv = core.live_state(live_raw).resource_version
                if held == "held-unlabelled":
                    live_rv = await self._add_owned_label(message, resource, core.OWNED_LABEL_PATCH)
                record_held = AppliedRecord(
                    source_version=message.source_version,
                    source_seq=message.source_seq,
                    digest=digest,
                    state="applied",
                    resource_version=live_rv,
                    managed=core.managed_digest(live_raw, manager=message.field_manager, subresource=None),
                    cluster=self._stamp(),
                )
                if await self.ledger.write(lkey, record_held, revision=revision) is None:
                    continue  # someone else wrote the record meanwhile: look again
                return core.Done(action="unchanged", resource_version=live_rv, reason=core.ALREADY_HELD)
            claim = AppliedRecord(
                source_version=message.source_version,
                source_seq=message.source_seq,
                digest=digest,
                state="claimed",
                cluster=self._stamp(),
            )
            claimed = await self.ledger.write(lkey, claim, revision=revision)
            if claimed is None:
                continue  # someone else claimed first: look again
            before = core.live_state(live_raw).resource_version if live_raw is not None else ""
            # A status carries its own precondition: the TrainJob version it was planned from.
            precondition = "" if target.subresource else before
            if core.status_outdated(message, live_version=before if live_raw is not None else None):
                return core.Done(action="skipped", resource_version=before, reason=core.STALE_STATUS)
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
                refused = await self._after_refusal(exc, message, resource, precondition=precondition, before=before)
                if refused is None:
                    continue  # the object changed between the read and the conditional write: look again
                return refused
            after = _resource_version(resp.body)
            done = msgspec.structs.replace(
                claim,
                state="applied",
                resource_version=after,
                managed=core.managed_digest(resp.body, manager=message.field_manager, subresource=target.subresource),
            )
            await self.ledger.write(lkey, done, revision=claimed)
            return core.Done(action=core.outcome(resp.status, before=before, after=after), resource_version=after)
        raise core.TransientError("the target kept changing under concurrent writers")

    async def _round_record(
        self, message: ObjectApply, resource: resources.Resource, lkey: str, round_: int
    ) -> tuple[AppliedRecord | None, int] | core.Done | None:
        """The target's ledger record and revision for one claim round, unless the plan is stale (``Done``) or a
        corrupt newer claim was just replaced (``None``: look again)."""
        # After a lost compare-and-set, remembering is what went wrong: ask the server.
        if round_ == 0:
            record, revision = await self.ledger.read(lkey, assume_absent=True)
        else:
            record, revision = await self.ledger.read_fresh(lkey)
        if record is not None and core.is_stale(record, message):
            elsewhere = await self._made_elsewhere(message, record)
            if elsewhere:
                await self._set_aside(message, lkey, record, revision, elsewhere)
                return None  # look again, with the claim set aside (or someone else's newer one)
            if not await self._claim_is_corrupt(message, resource, lkey, record):
                return core.Done(action="skipped", reason=core.STALE_PLAN)
            await self._replace_claim(message, lkey, record, revision)
            return None
        return record, revision

    async def _create_once(self, message: ObjectApply, resource: resources.Resource, planned: bytes) -> core.Done:
        """One fenced create of a create-only target (``core.CREATE_ONLY``): it is never read and never patched.

        The claim keeps whom the record says the object was created for, and only a 201 makes that this
        TrainJob: a create answered 409 is judged by the record as it was before the claim (``core.existing``).
        """
        target = message.target
        lkey = ledger_key(target)
        digest = core.content_digest(planned)
        for round_ in range(_CLAIM_ROUNDS):
            read = await self._round_record(message, resource, lkey, round_)
            if read is None:
                continue  # look again, with the claim replaced (or someone else's newer one)
            if isinstance(read, core.Done):
                return read
            record, revision = read
            # Whom another cluster's (or an earlier epoch's) record names says nothing of this cluster's object.
            known = record if record is not None and record.cluster == self._stamp() else None
            claim = AppliedRecord(
                source_version=message.source_version,
                source_seq=message.source_seq,
                digest=digest,
                state="claimed",
                created_for=known.created_for if known is not None else "",
                cluster=self._stamp(),
            )
            claimed = await self.ledger.write(lkey, claim, revision=revision)
            if claimed is None:
                continue  # someone else claimed first: look again
            try:
                resp = await self.kube.create(
                    resource, namespace=target.namespace, body=_body(message), field_manager=message.field_manager
                )
            except KubeApiError as exc:
                if exc.status != 409 or exc.reason != "AlreadyExists":
                    raise core.classify(exc.status, exc.reason, exc.message, retry_after=exc.retry_after) from exc
                whose = core.existing(message, known)
                if whose == "another-trainjob":
                    raise core.Unauthorized(
                        f"existing {target} was created for another TrainJob (uid {claim.created_for}),"
                        f" not for {message.trainjob}"
                    ) from exc
                await self.ledger.write(lkey, msgspec.structs.replace(claim, state="applied"), revision=claimed)
                return core.Done(action="skipped", reason=core.ALREADY_CREATED if whose == "ours" else core.UNRECORDED)
            after = _resource_version(resp.body)
            done = msgspec.structs.replace(
                claim, state="applied", resource_version=after, created_for=message.trainjob_uid
            )
            await self.ledger.write(lkey, done, revision=claimed)
            return core.Done(action="created", resource_version=after)
        raise core.TransientError("the ledger record kept changing under concurrent writers")

    async def _after_refusal(
        self, exc: KubeApiError, message: ObjectApply, resource: resources.Resource, *, precondition: str, before: str
    ) -> core.Done | None:
        """Perform ``core.refused_write``'s decision for a refused apply; ``None``: start the next claim round."""
        refusal = core.refused_write(exc.status, message, precondition=precondition)
        if refusal == "stale-status":
            return core.Done(action="skipped", resource_version=before, reason=core.STALE_STATUS)
        if refusal == "look-again":
            return None
        if refusal == "skip-if-created-concurrently":
            raw = await self._get(resource, message.target)
            if raw is not None:
                rv = core.live_state(raw).resource_version
                return core.Done(action="skipped", resource_version=rv, reason=core.CREATED_CONCURRENTLY)
        raise core.classify(exc.status, exc.reason, exc.message, retry_after=exc.retry_after) from exc

    def _stamp(self) -> str:
        return self.epoch.stamp if self.epoch is not None else ""

    def _fresh_claim(self, message: ApplyMessage) -> AppliedRecord:
        """This message's claim, to put in place of one that cannot stand (corrupt, or of another history)."""
        return AppliedRecord(
            source_version=message.source_version,
            source_seq=message.source_seq,
            digest="",
            state="claimed",
            cluster=self._stamp(),
        )

    async def _made_elsewhere(self, message: ApplyMessage, record: AppliedRecord) -> str:
        """Why a claim newer than this plan belongs to another history (``applier.cluster``); ``""`` if not.

        A claim of another cluster or an earlier epoch says so by its stamp. One of this cluster and epoch
        that is newer than the cluster's current revision proves that etcd went back since it was made,
        which begins a new epoch.
        """
        if self.epoch is None:
            return ""
        where = standing(record.cluster, self.epoch.stamp)
        if where in ("other-cluster", "rewound"):
            return where
        if where != "current":
            return ""
        current = await self._cluster_revision(message.trainjob.namespace)
        if not core.claim_beyond_cluster(record, cluster_revision=current):
            return ""
        revision = int(current) if current.isdigit() else 0
        try:
            await self.epoch.observe(revision=revision, seen=record.source_version)
        except KubeApiError as exc:
            raise core.classify(exc.status, exc.reason, exc.message, retry_after=exc.retry_after) from exc
        return "rewound" if standing(record.cluster, self.epoch.stamp) == "rewound" else ""

    async def _set_aside(
        self, message: ApplyMessage, lkey: str, record: AppliedRecord, revision: int, why: str
    ) -> bool:
        """Replace a claim of another history with this plan's (compare-and-set); ``False`` if the key changed."""
        reset = self._fresh_claim(message)
        if await self.ledger.write(lkey, reset, revision=revision) is None:
            return False
        FOREIGN_CLAIMS.labels(why=why).inc()
        held = self._stale_claims.pop(lkey, None)
        log.warning(
            "%s: set aside a ledger claim for source version %d made %s (%s; now %s)",
            message.target,
            record.source_version,
            "by another cluster" if why == "other-cluster" else "before the cluster's revisions went back",
            record.cluster,
            self._stamp(),
            extra={"trainjob": str(message.trainjob), "trace_id": message.trace_id},
        )
        if held is not None:  # it had been held as corrupt before the rewind was known: the condition goes
            await self._clear_condition(message)
        return True

    async def _replace_claim(self, message: ApplyMessage, lkey: str, record: AppliedRecord, revision: int) -> bool:
        """Overwrite a corrupt claim with this message's (compare-and-set); ``False`` if the key changed first."""
        reset = self._fresh_claim(message)
        if await self.ledger.write(lkey, reset, revision=revision) is None:
            return False
        STALE_CLAIMS.labels(action="overwritten").inc()
        log.warning(
            "%s: overwrote a ledger claim for source version %d that nothing in the cluster accounts for",
            message.target,
            record.source_version,
            extra={"trainjob": str(message.trainjob), "trace_id": message.trace_id},
        )
        await self._clear_condition(message)
        return True

    async def _claim_is_corrupt(
        self, message: ApplyMessage, resource: resources.Resource, lkey: str, record: AppliedRecord
    ) -> bool:
        """Whether a claim newer than this plan is corrupt: newer than the cluster, for longer than a resync.

        A plan older than the claim is normally just stale. But a claim newer than both the live target
        and the TrainJob that lasts longer than the grace is not explained by anything the cluster holds
        (a ledger written by something other than an applier): it would stall the target for good, so it
        is overwritten. While it lasts the message is held (nak'd) and the TrainJob carries a condition.
        """
        cluster_revision = await self._cluster_revision(message.trainjob.namespace)
        if not core.claim_beyond_cluster(record, cluster_revision=cluster_revision):
            self._stale_claims.pop(lkey, None)
            return False
        now = time.monotonic()
        seen = self._stale_claims.get(lkey)
        if seen is None or seen[0] != record.source_version:
            seen = (record.source_version, now)
            self._stale_claims[lkey] = seen
            log.warning(
                "%s: the ledger claims source version %d, newer than the cluster's current revision %s",
                message.target,
                record.source_version,
                cluster_revision,
                extra={"trainjob": str(message.trainjob), "trace_id": message.trace_id},
            )
            await self._set_condition(
                message,
                reason=conditions.REASON_STALE_LEDGER_CLAIM,
                text=(
                    f"a ledger claim for source version {record.source_version} is newer than anything the cluster"
                    f" holds; it is re-checked and overwritten after {self.settings.stale_claim_grace_seconds:.0f}s"
                ),
            )
        grace = self.settings.stale_claim_grace_seconds
        if core.stale_claim_action(seen[1], now, grace_seconds=grace) == "hold":
            STALE_CLAIMS.labels(action="held").inc()
            raise _Held(min(30.0, max(0.5, seen[1] + grace - now + 0.1)))
        self._stale_claims.pop(lkey, None)
        return True

    async def _cluster_revision(self, namespace: str) -> str:
        """The cluster's current etcd revision: the resourceVersion of a one-item list of TrainJobs.

        Only read on the rare path of a plan older than its target's claim (reordering, replays, a poisoned
        ledger); the applier's role may list TrainJobs for this and nothing else.
        """
        try:
            resp = await self.kube.request(
                "GET", resources.TRAINJOB.path(namespace=namespace), params={"limit": "1"}, timeout=30
            )
        except KubeApiError as exc:
            raise core.classify(exc.status, exc.reason, exc.message, retry_after=exc.retry_after) from exc
        return _resource_version(resp.body)  # a list's metadata carries it in the same place

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
        STAGE_SECONDS.labels(stage="applier").observe(duration_ms / 1000)
        if action in ("created", "configured", "unchanged", "deleted") and message.observed_at:
            END_TO_END.labels(kind=message.target.kind).observe(max(0.0, time.time() - message.observed_at))
        subject = subjects.result_subject(message.trainjob.namespace, message.trainjob.name, component)
        await publishing.publish_stored(
            self.js, subject, encode(result), stream=streams.RESULTS.name, headers={bus.TRACE_ID: message.trace_id}
        )
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


class _Held(Exception):
    """The message waits (nak with a delay) for something that resolves itself, e.g. a claim's grace."""

    def __init__(self, delay: float) -> None:
        super().__init__(f"held for {delay:.1f}s")
        self.delay = delay


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
        try:
            # The same keyword call as run_planner's (a pair to duplicate finders): one call, each stage's own values.
            await consume_partitioned(
                service.nc,
                service.js,
                streams.APPLIER,
                applier.handle_batch,
                role="applier",
                replica=settings.replica,
                batch=settings.batch,
                lease_ttl=settings.lease_ttl,
                stop=stop,
            )
        finally:
            for task in (watching, stamping):
                task.cancel()
            await asyncio.gather(watching, stamping, return_exceptions=True)
