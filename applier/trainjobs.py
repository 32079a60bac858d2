"""The TrainJob a message names, as the applier reads it and as it tells it what went wrong.

Every apply is justified by a live TrainJob (``authorize_trainjob``, the second of the applier's checks, after
``applier.authorize``'s of the message alone). The applier watches TrainJobs, as Trainer's controller does,
and answers from what the watch last said whenever that names the same TrainJob (by uid) the message does, so
a TrainJob's applies over its whole life cost no read of it: the watch is the cluster's own account, delivered
moments after each change, never the message's word. Without a current watch (before its first list, while it
is broken, or where a deployment's role still lacks ``watch``) each message reads the TrainJob instead: a
positive answer is kept for a few seconds, and the components of one TrainJob, which arrive together and are
applied in parallel, share one GET in flight. A refusal is never taken from memory: a TrainJob the watch does
not know, or knows by another uid, is read, since it may have been created or replaced a moment ago. The watch
is of the namespaces the pipeline is confined to, one per namespace, because the role a platform team grants a
confined pipeline is a Role in each of them, under which a watch of the whole cluster is refused.

What goes wrong with a component is told on the TrainJob, where ``kubectl describe`` shows it: the applier's
own condition (``ComponentsApplied=False``, under a field manager of its own) and a Warning Event. The
condition is written only when the TrainJob does not already say exactly that: writing the same condition
again would change the TrainJob, which makes a new event and a new plan that fails the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time

from applier import errors, trainjob_condition
from applier.trainjob_watch import TrainJobFacts, WatchedTrainJobs, trainjob_facts
from contracts import conditions, resources
from contracts import trainer as t
from contracts.messages import ApplyMessage, DeleteComponent
from plumbing.kube import KubeApiError, KubeClient
from plumbing.observability import TRAINJOB_CHECKS

log = logging.getLogger("applier")

EVENT_REASON = "ComponentApplyFailed"
_CACHE_LIMIT = 8192


def authorize_trainjob(message: ApplyMessage, facts: TrainJobFacts | None) -> errors.Verdict:
    """The TrainJob the message names exists, is the same object (uid), and is ours to manage."""
    if facts is None:
        return errors.Verdict(False, f"TrainJob {message.trainjob} does not exist", gone=True)
    if facts.uid != message.trainjob_uid:
        return errors.Verdict(
            False,
            f"TrainJob {message.trainjob} has uid {facts.uid}, the message names {message.trainjob_uid}",
            gone=True,
        )
    if facts.managed_by not in ("", t.MANAGED_BY_TRAINJOB_CONTROLLER):
        return errors.Verdict(False, f"TrainJob {message.trainjob} is managed by {facts.managed_by}")
    return errors.ALLOWED


class TrainJobs:
    def __init__(self, kube: KubeClient, *, cache_seconds: float, watched: WatchedTrainJobs | None = None) -> None:
        self.kube = kube
        self.cache_seconds = cache_seconds
        self.watched = watched
        self._verified: dict[tuple[str, str], tuple[TrainJobFacts, float]] = {}
        """Positive TrainJob verifications (namespace, name) -> (facts, trusted until, monotonic)."""
        self._reading: dict[tuple[str, str], asyncio.Future[bytes | None]] = {}
        """TrainJobs (namespace, name) with a GET in flight, which other messages of them share."""

    # ----------------------------------------------------------------------------------------- reading

    async def verify(self, message: ApplyMessage) -> TrainJobFacts:
        """The TrainJob the message names, verified against the cluster; raises ``Unauthorized``, or
        ``TrainJobGone`` when it no longer exists. A delete always asks the cluster."""
        fresh = isinstance(message, DeleteComponent)
        facts = await self._facts(message, fresh=fresh)
        verdict = authorize_trainjob(message, facts)
        if not verdict.allowed and not fresh:
            facts = await self._facts(message, fresh=True)
            verdict = authorize_trainjob(message, facts)
        if verdict.gone:
            raise errors.TrainJobGone(verdict.why)
        if not verdict.allowed or facts is None:
            raise errors.Unauthorized(verdict.why)
        return facts

    async def _facts(self, message: ApplyMessage, *, fresh: bool) -> TrainJobFacts | None:
        key = (message.trainjob.namespace, message.trainjob.name)
        now = time.monotonic()
        if not fresh and self.watched is not None:
            watched = self.watched.known(key, message.trainjob_uid)
            if watched is not None:
                TRAINJOB_CHECKS.labels("watch").inc()
                return watched
        if not fresh:
            cached = self._verified.get(key)
            if cached is not None and cached[1] > now:
                TRAINJOB_CHECKS.labels("memory").inc()
                return cached[0]
        TRAINJOB_CHECKS.labels("read").inc()
        try:
            raw = await self._read(key, share=not fresh)
        except KubeApiError as exc:
            raise errors.from_api(exc) from exc
        facts = trainjob_facts(raw)
        if facts is not None and authorize_trainjob(message, facts).allowed:
            if len(self._verified) > _CACHE_LIMIT:
                self._verified = {k: v for k, v in self._verified.items() if v[1] > now}
            self._verified[key] = (facts, now + self.cache_seconds)
        else:
            self._verified.pop(key, None)
        return facts

    async def _read(self, key: tuple[str, str], *, share: bool) -> bytes | None:
        """One GET of the TrainJob; with ``share``, the GET another message of it has in flight, if any."""
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

    # ------------------------------------------------------------------------------------------ telling

    async def tell(self, message: ApplyMessage, change: trainjob_condition.ConditionChange) -> None:
        """Set the applier's condition on the TrainJob, or take it off, as a decision or a failure asks
        (``trainjob_condition``). It is set only when the TrainJob, as the watch or the last read has it, does
        not already say exactly this. What was written is remembered until the watch brings it; a write that
        fails is logged, and nothing is remembered."""
        key = (message.trainjob.namespace, message.trainjob.name)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        saying, body = trainjob_condition.written(message, change, now=now)
        if isinstance(change, trainjob_condition.SetCondition):
            known = self.watched.known(key, message.trainjob_uid) if self.watched is not None else None
            cached = self._verified.get(key)
            if known is None and cached is not None:
                known = cached[0]
            if known is not None and known.applier_condition == saying:
                return
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
            return
        if self.watched is not None:
            self.watched.remember_condition(key, saying)
        cached = self._verified.get(key)
        if cached is not None:
            self._verified[key] = (dataclasses.replace(cached[0], applier_condition=saying), cached[1])

    async def explain(self, message: ApplyMessage, error: str) -> None:
        """A Warning Event on the TrainJob, so ``kubectl describe`` shows why a component is missing."""
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
