"""The TrainJob a message names, as the applier reads it and as it tells it what went wrong.

Every apply is justified by a live TrainJob (``applier.authorize``), so each message costs a TrainJob read
unless one is shared: a positive answer is kept for a few seconds, and the components of one TrainJob,
which arrive together and are applied in parallel, share one GET in flight. A refusal is never taken from
memory, since the TrainJob may have been created or replaced since.

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

from tjpipe.applier import core
from tjpipe.applier.authorize import TrainJobFacts, TrainJobGone, Unauthorized, authorize_trainjob, trainjob_facts
from tjpipe.contracts import conditions, resources
from tjpipe.contracts.messages import ApplyMessage, DeleteComponent
from tjpipe.plumbing.kube import KubeApiError, KubeClient

log = logging.getLogger("applier")

EVENT_REASON = "ComponentApplyFailed"
_CACHE_LIMIT = 8192


class TrainJobs:
    def __init__(self, kube: KubeClient, *, cache_seconds: float) -> None:
        self.kube = kube
        self.cache_seconds = cache_seconds
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
            raise TrainJobGone(verdict.why)
        if not verdict.allowed or facts is None:
            raise Unauthorized(verdict.why)
        return facts

    async def _facts(self, message: ApplyMessage, *, fresh: bool) -> TrainJobFacts | None:
        key = (message.trainjob.namespace, message.trainjob.name)
        now = time.monotonic()
        if not fresh:
            cached = self._verified.get(key)
            if cached is not None and cached[1] > now:
                return cached[0]
        try:
            raw = await self._read(key, share=not fresh)
        except KubeApiError as exc:
            raise core.classify(exc.status, exc.reason, exc.message, retry_after=exc.retry_after) from exc
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

    async def set_condition(self, message: ApplyMessage, *, reason: str, text: str) -> None:
        """``ComponentsApplied=False`` on the TrainJob, unless it already says exactly this."""
        key = (message.trainjob.namespace, message.trainjob.name)
        wanted = core.condition_message(message, text)
        cached = self._verified.get(key)
        if cached is not None and cached[0].applier_condition == wanted:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = core.applier_condition(message, reason=reason, text=text, now=now)
        if await self._apply_condition(message, body) and cached is not None:
            self._verified[key] = (dataclasses.replace(cached[0], applier_condition=wanted), cached[1])

    async def clear_condition(self, message: ApplyMessage) -> None:
        key = (message.trainjob.namespace, message.trainjob.name)
        if await self._apply_condition(message, core.applier_condition_cleared(message)):
            cached = self._verified.get(key)
            if cached is not None:
                self._verified[key] = (dataclasses.replace(cached[0], applier_condition=""), cached[1])

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
