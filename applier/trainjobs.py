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
from collections.abc import Sequence

from applier import core, objects
from contracts import conditions, resources
from contracts import trainer as t
from contracts.lifecycle import NO_RUNTIME
from contracts.messages import ApplyMessage, DeleteComponent
from plumbing import retrying
from plumbing.informer import Cached, Informer, Key
from plumbing.kube import KubeApiError, KubeClient
from plumbing.observability import TRAINJOB_CHECKS

log = logging.getLogger("applier")

EVENT_REASON = "ComponentApplyFailed"
_CACHE_LIMIT = 8192


@dataclasses.dataclass(frozen=True)
class TrainJobFacts:
    """The TrainJob as the live cluster has it: who may ask for writes, and our own condition on it."""

    uid: str
    managed_by: str = ""
    resource_version: str = ""
    applier_condition: str = ""
    """The message of the applier-owned condition, empty when the TrainJob does not have it."""
    runtime: str = NO_RUNTIME
    """The runtime's name (``spec.runtimeRef.name``, immutable): the lifecycle metrics' label."""


def authorize_trainjob(message: ApplyMessage, facts: TrainJobFacts | None) -> core.Verdict:
    """The TrainJob the message names exists, is the same object (uid), and is ours to manage."""
    if facts is None:
        return core.Verdict(False, f"TrainJob {message.trainjob} does not exist", gone=True)
    if facts.uid != message.trainjob_uid:
        return core.Verdict(
            False,
            f"TrainJob {message.trainjob} has uid {facts.uid}, the message names {message.trainjob_uid}",
            gone=True,
        )
    if facts.managed_by not in ("", t.MANAGED_BY_TRAINJOB_CONTROLLER):
        return core.Verdict(False, f"TrainJob {message.trainjob} is managed by {facts.managed_by}")
    return core.ALLOWED


def trainjob_facts(raw: bytes | None) -> TrainJobFacts | None:
    return None if raw is None else facts_of(objects.read(raw))


def facts_of(job: objects.KubeObject) -> TrainJobFacts:
    ours = next((c.message for c in job.status.conditions if c.type == conditions.CONDITION_COMPONENTS_APPLIED), "")
    return TrainJobFacts(
        uid=job.metadata.uid,
        managed_by=job.spec.managedBy,
        resource_version=job.metadata.resourceVersion,
        applier_condition=ours,
        runtime=job.spec.runtimeRef.name or NO_RUNTIME,
    )


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
            raise core.TrainJobGone(verdict.why)
        if not verdict.allowed or facts is None:
            raise core.Unauthorized(verdict.why)
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
        known = self._known(key, message.trainjob_uid)
        if known is not None and known.applier_condition == wanted:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = core.applier_condition(message, reason=reason, text=text, now=now)
        if await self._apply_condition(message, body):
            self._remember_condition(key, wanted)

    async def clear_condition(self, message: ApplyMessage) -> None:
        key = (message.trainjob.namespace, message.trainjob.name)
        if await self._apply_condition(message, core.applier_condition_cleared(message)):
            self._remember_condition(key, "")

    async def tell(self, message: ApplyMessage, change: core.ConditionChange) -> None:
        """Write a condition change a decision returned (``applier.claims``)."""
        if isinstance(change, core.SetCondition):
            await self.set_condition(message, reason=change.reason, text=change.text)
        else:
            await self.clear_condition(message)

    def _known(self, key: Key, uid: str) -> TrainJobFacts | None:
        """What is remembered of the TrainJob: the watch's facts, else the last verification by a read."""
        if self.watched is not None and (watched := self.watched.known(key, uid)) is not None:
            return watched
        cached = self._verified.get(key)
        return cached[0] if cached is not None else None

    def _remember_condition(self, key: Key, message: str) -> None:
        if self.watched is not None:
            self.watched.remember_condition(key, message)
        cached = self._verified.get(key)
        if cached is not None:
            self._verified[key] = (dataclasses.replace(cached[0], applier_condition=message), cached[1])

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


def _what_facts_need(job: objects.KubeObject) -> objects.KubeObject:
    """A TrainJob cut down to what ``facts_of`` reads, so the watch holds about a kilobyte per TrainJob."""
    meta = job.metadata
    return objects.KubeObject(
        metadata=objects.Meta(
            name=meta.name, namespace=meta.namespace, uid=meta.uid, resourceVersion=meta.resourceVersion
        ),
        spec=objects.Spec(managedBy=job.spec.managedBy, runtimeRef=job.spec.runtimeRef),
        status=objects.Status(
            conditions=[c for c in job.status.conditions if c.type == conditions.CONDITION_COMPONENTS_APPLIED]
        ),
    )


def _may_watch_review(namespace: str | None) -> bytes:
    """A SelfSubjectAccessReview asking whether this identity may watch TrainJobs (in ``namespace``)."""
    attributes = {
        "group": resources.TRAINJOB.api_version.rpartition("/")[0],
        "resource": resources.TRAINJOB.plural,
        "verb": "watch",
    }
    if namespace is not None:
        attributes["namespace"] = namespace
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    return json.dumps(review).encode()


class WatchedTrainJobs:
    """What the checks need of every TrainJob in ``namespaces`` (default: the whole cluster), kept by a list
    and watch of TrainJobs: one per namespace, so that a role granted in those namespaces alone suffices."""

    def __init__(self, kube: KubeClient, *, namespaces: Sequence[str] = ()) -> None:
        self.kube = kube
        self.facts: dict[Key, TrainJobFacts] = {}
        self.informers: dict[str | None, Informer[objects.KubeObject]] = {
            namespace: Informer(
                kube,
                resources.TRAINJOB,
                objects.KubeObject,
                self._on_change,
                namespace=namespace,
                trim=_what_facts_need,
            )
            for namespace in (tuple(dict.fromkeys(namespaces)) or (None,))
        }

    async def run(self) -> None:
        """Follow TrainJobs wherever the API server says this identity may watch them (a role written by an
        earlier version may not: there every check reads, and nothing lists TrainJobs over and over)."""
        followed = [informer for namespace, informer in self.informers.items() if await self._may_watch(namespace)]
        if len(followed) < len(self.informers):
            refused = [namespace or "(all namespaces)" for namespace, i in self.informers.items() if i not in followed]
            log.warning(
                "this identity may not watch TrainJobs in %s: checks there read their TrainJob instead (the"
                " applier's role in deploy/base/rbac.yaml grants list and watch on trainjobs; re-apply it to use"
                " the watch)",
                ", ".join(refused),
            )
        if followed:
            await asyncio.gather(*(informer.run() for informer in followed))

    async def synced(self) -> None:
        """Until every namespace's watch has listed once."""
        await asyncio.gather(*(informer.synced.wait() for informer in self.informers.values()))

    async def _may_watch(self, namespace: str | None) -> bool:
        policy = dataclasses.replace(retrying.API_UNAVAILABLE, retry_on=(KubeApiError, OSError, TimeoutError))
        async for attempt in policy.retrying(
            on_retry=lambda exc, wait: log.warning(
                "could not ask whether TrainJobs may be watched (%s); asking again in %.0fs", exc, wait
            )
        ):
            with attempt:
                try:
                    response = await self.kube.request(
                        "POST",
                        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                        body=_may_watch_review(namespace),
                        content_type="application/json",
                    )
                except KubeApiError as exc:
                    if exc.status in (401, 403):
                        return False
                    raise
                allowed: bool = json.loads(response.body).get("status", {}).get("allowed", False)
                return allowed
        raise AssertionError("unreachable: the policy retries until it is answered")

    async def _on_change(self, kind: str, key: Key, cached: Cached[objects.KubeObject] | None) -> None:
        if kind == "DELETED" or cached is None:
            self.facts.pop(key, None)
        else:
            self.facts[key] = facts_of(cached.obj)

    def known(self, key: Key, uid: str) -> TrainJobFacts | None:
        """The TrainJob as the watch has it, when the watch of its namespace is current and has it by this
        uid; None for a namespace nothing here watches."""
        informer = self.informers.get(key[0]) or self.informers.get(None)
        if informer is None or not informer.current:
            return None
        facts = self.facts.get(key)
        return facts if facts is not None and facts.uid == uid else None

    def remember_condition(self, key: Key, message: str) -> None:
        """Our own condition as just written, until the watch brings the TrainJob that carries it."""
        facts = self.facts.get(key)
        if facts is not None:
            self.facts[key] = dataclasses.replace(facts, applier_condition=message)
