"""Who may report a TrainJob's progress: a pod of that TrainJob, proven by a token the API server reviews.

Four layers, each stopping what the one before lets through (``docs/training-progress.md``):

0. The token's shape, read locally without verifying it (``core.screen_token``): a signed JWT whose audience is
   exactly this TrainJob's, not expired, bound to a pod of this namespace. What fails here costs nothing: an
   unauthenticated caller cannot make the server call the API server at will. What passes is not trusted yet
   (anyone can write such a payload); the API server's review below decides. At most ``max_reviews``
   TokenReviews are in flight at once; a request that waits longer than ``REVIEW_WAIT`` for one is answered
   :class:`Busy` (429), so a flood of forged-but-well-shaped tokens costs the API server a bounded load.
1. TokenReview, with exactly the TrainJob's audience, by the API server: the token is genuine, unexpired,
   minted for this TrainJob's status endpoint, and bound to a pod that still exists with that uid (the API
   server checks a bound token's object). Trainer's server stops here, plus a namespace check.
2. The token's own claims: a ServiceAccount of the TrainJob's namespace, bound to a pod (a token minted by
   TokenRequest for the ServiceAccount alone, with the right audience, by anyone who may
   ``create serviceaccounts/token``, carries no pod and is refused), and that audience only.
3. The live cluster: the pod's controller chain leads, uid by uid, to this TrainJob (pod → Job → JobSet →
   TrainJob). A pod of another TrainJob in the same namespace, made by that TrainJob's controllers, with a
   token it obtained for this audience, is refused.

The trust boundary this does not move: a pod's ``ownerReferences`` are written by whoever creates the pod. The
Job controller writes the true ones, but anyone allowed to create pods in the namespace can create a pod that
names this TrainJob's Job (its uid is readable to whoever may get Jobs there), and that pod's projected token
passes all three layers. So the caller is proven to be a pod of the namespace whose creator claims it for this
TrainJob; whoever may create pods in a TrainJob's namespace may report its progress (``docs/security.md``).
Nothing in the pod's object tells its creator (managed fields name a field manager the client chooses), so the
check cannot be made stronger here without the API server's audit record.

The chain of a pod never changes once its controllers made it, so it is read once per pod uid and kept (a
bounded table); the TokenReview and the TrainJob are read at every request, so a deleted pod's token or a
deleted TrainJob is refused at once. A token is never logged or recorded.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from contracts.resources import JOBSET, TRAINJOB, Resource
from plumbing.kube import KubeApiError, KubeClient
from status_server import core

log = logging.getLogger(__name__)

POD = Resource(api_version="v1", kind="Pod", plural="pods")
JOB = Resource(api_version="batch/v1", kind="Job", plural="jobs")
TOKEN_REVIEW = Resource(
    api_version="authentication.k8s.io/v1", kind="TokenReview", plural="tokenreviews", namespaced=False
)
CHAIN_CACHE = 10_000
REVIEW_WAIT = 2.0
"""Seconds a request waits for a free TokenReview slot before it is answered 429."""


class Refused(Exception):
    """403: the caller may not report for this TrainJob. The reason goes to the log, never to the caller."""


class Busy(Exception):
    """429: too many TokenReviews in flight; the caller tries again after ``Retry-After``."""


class Gone(Exception):
    """404: the TrainJob does not exist (any more)."""


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent an accepted update."""

    pod: str
    pod_uid: str
    service_account: str
    trainjob_uid: str
    trainjob: core.LiveTrainJob


class _User(msgspec.Struct, frozen=True, kw_only=True):
    username: str = ""
    extra: dict[str, list[str]] = {}


class _ReviewStatus(msgspec.Struct, frozen=True, kw_only=True):
    authenticated: bool = False
    user: _User = msgspec.field(default_factory=_User)
    audiences: list[str] = []
    error: str = ""


class _Review(msgspec.Struct, frozen=True, kw_only=True):
    status: _ReviewStatus = msgspec.field(default_factory=_ReviewStatus)


_review_decoder = msgspec.json.Decoder(_Review)


def token_audiences(token: str) -> list[str]:
    """The ``aud`` claim of a JWT, read without verifying (the API server verified it already)."""
    claims = core.token_claims(token)
    return core.token_audiences(claims) if claims is not None else []


class Authorizer:
    def __init__(
        self, kube: KubeClient, *, max_reviews: int = core.MAX_REVIEWS, clock: Callable[[], float] = time.time
    ) -> None:
        self.kube = kube
        self.clock = clock
        self._reviews = asyncio.Semaphore(max_reviews)
        self._chains: OrderedDict[str, str] = OrderedDict()
        """Pod uid → the uid of the TrainJob its controller chain leads to."""

    async def authorize(self, token: str, namespace: str, name: str) -> Caller:
        """The caller, or :class:`Refused` / :class:`Gone`; ``KubeApiError`` when the API server cannot answer."""
        if not token:
            raise Refused("no bearer token")
        wanted = core.audience(namespace, name)
        problem = core.screen_token(token, audience=wanted, namespace=namespace, now=self.clock())
        if problem:
            raise Refused(f"refused before review: {problem}")
        try:
            await asyncio.wait_for(self._reviews.acquire(), timeout=REVIEW_WAIT)
        except TimeoutError:
            raise Busy("too many token reviews in flight") from None
        try:
            review = await self._review(token, wanted)
        finally:
            self._reviews.release()
        status = review.status
        if not status.authenticated:
            raise Refused(f"the token is not valid for {wanted}: {status.error or 'not authenticated'}")
        if wanted not in status.audiences or token_audiences(token) != [wanted]:
            raise Refused("the token is not minted for this TrainJob's status endpoint alone")
        user = status.user.username
        if not user.startswith(f"{core.SERVICE_ACCOUNT_PREFIX}{namespace}:"):
            raise Refused(f"{user} is not a ServiceAccount of namespace {namespace}")
        pods = status.user.extra.get(core.POD_NAME_EXTRA, [])
        pod_uids = status.user.extra.get(core.POD_UID_EXTRA, [])
        if len(pods) != 1 or len(pod_uids) != 1:
            raise Refused(f"the token of {user} is bound to no pod")
        pod, pod_uid = pods[0], pod_uids[0]
        raw = await self.kube.get(TRAINJOB, namespace=namespace, name=name)
        if raw is None:
            raise Gone(f"TrainJob {namespace}/{name} not found")
        trainjob = core.decode_trainjob(raw)
        owner = await self._trainjob_of(namespace, pod, pod_uid)
        if owner != trainjob.metadata.uid:
            raise Refused(f"pod {namespace}/{pod} does not belong to TrainJob {namespace}/{name}")
        return Caller(
            pod=pod,
            pod_uid=pod_uid,
            service_account=user.rsplit(":", 1)[-1],
            trainjob_uid=trainjob.metadata.uid,
            trainjob=trainjob,
        )

    async def _review(self, token: str, wanted: str) -> _Review:
        body = json.dumps(
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token, "audiences": [wanted]},
            }
        ).encode()
        response = await self.kube.create(TOKEN_REVIEW, namespace=None, body=body)
        return _review_decoder.decode(response.body)

    async def _trainjob_of(self, namespace: str, pod: str, pod_uid: str) -> str:
        """The uid of the TrainJob whose JobSet's Job controls the pod; empty when the chain breaks anywhere."""
        known = self._chains.get(pod_uid)
        if known is not None:
            self._chains.move_to_end(pod_uid)
            return known
        found = await self._walk(namespace, pod, pod_uid)
        if found:
            self._chains[pod_uid] = found
            while len(self._chains) > CHAIN_CACHE:
                self._chains.popitem(last=False)
        return found

    async def _walk(self, namespace: str, pod: str, pod_uid: str) -> str:
        steps = ((POD, pod, pod_uid, JOB), (JOB, None, None, JOBSET), (JOBSET, None, None, TRAINJOB))
        name, uid = pod, pod_uid
        for resource, _, _, parent in steps:
            raw = await self.kube.get(resource, namespace=namespace, name=name)
            if raw is None:
                return ""
            meta = core.decode_owned(raw).metadata
            if meta.uid != uid:
                return ""
            ref = core.controller_of(meta, api_version=parent.api_version, kind=parent.kind)
            if ref is None:
                return ""
            name, uid = ref.name, ref.uid
        return uid


__all__ = ["Authorizer", "Busy", "Caller", "Gone", "KubeApiError", "Refused"]
