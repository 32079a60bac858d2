"""The applier's watch of TrainJobs, and what a check needs to know of one (``TrainJobFacts``).

The applier watches TrainJobs, as Trainer's controller does, so that ``applier.trainjobs`` answers a check
from what the watch last said whenever that names the same TrainJob (by uid) the message does: a TrainJob's
applies over its whole life then cost no read of it. The watch is of the namespaces the pipeline is confined
to, one per namespace, because the role a platform team grants a confined pipeline is a Role in each of them,
under which a watch of the whole cluster is refused; it keeps about a kilobyte per TrainJob.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Sequence

from applier import objects
from contracts import conditions, resources
from contracts.lifecycle import NO_RUNTIME
from plumbing import retrying
from plumbing.informer import Cached, Informer, Key
from plumbing.kube import KubeApiError, KubeClient

log = logging.getLogger("applier")


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
