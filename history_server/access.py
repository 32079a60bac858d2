"""Who is asking, and may they read this namespace: the API server decides, this module only asks and
remembers the answer for a few seconds.

The rule is the one Argo Workflows applies to its archive and Tekton Results to its records: the history of
a TrainJob is readable by whoever may read the live TrainJob. A bearer token is resolved to a user with a
TokenReview, then a SubjectAccessReview asks whether that user (with its groups, uid and extra fields, so
group bindings and impersonation rules apply exactly) may ``list`` (a namespace's list) or ``get`` (one
TrainJob's timeline, plans and diffs) ``trainjobs.trainer.kubeflow.org`` there. Listing every namespace
needs the cluster-wide ``list``. So RBAC, an authorization webhook or anything else the cluster uses decides,
and the server keeps no rules of its own that could drift from the cluster's.

Why a cache, and a short one: a page of the UI makes a handful of requests, and asking the API server twice
per request would make it the bottleneck; a decision is kept ``ttl`` seconds (10 by default), so a revoked
RoleBinding or token stops working within that time. A token is never a key as it is: entries are keyed by
its SHA-256, and no token ever reaches a log line or an error message. When the API server cannot be asked,
the answer is "unavailable" (503) and nothing is cached, so an outage never turns into a remembered "no".
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import msgspec

GROUP = "trainer.kubeflow.org"
RESOURCE = "trainjobs"
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class Unauthenticated(Exception):
    """No token, or one the API server does not accept: 401."""


class Unavailable(Exception):
    """The API server could not be asked: 503, and nothing remembered."""


@dataclass(frozen=True)
class Caller:
    """The user a token belongs to, as the TokenReview said."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def as_subject(self) -> dict[str, object]:
        subject: dict[str, object] = {"user": self.username, "groups": list(self.groups)}
        if self.uid:
            subject["uid"] = self.uid
        if self.extra:
            subject["extra"] = {k: list(v) for k, v in self.extra}
        return subject


class Authorizer(Protocol):
    async def authenticate(self, token: str) -> Caller:
        """The caller, or ``Unauthenticated``/``Unavailable``."""
        ...

    async def allowed(self, caller: Caller, verb: str, namespace: str, name: str = "") -> bool:
        """Whether ``caller`` may ``verb`` TrainJobs in ``namespace`` (``""``: cluster-wide)."""
        ...


# ----------------------------------------------------------------------------------------------- cache

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass
class Decisions:
    """A bounded map whose entries expire ``ttl`` seconds after they were made; the oldest go first."""

    ttl: float
    size: int = 4096
    clock: Callable[[], float] = time.monotonic
    _entries: OrderedDict[Hashable, tuple[float, object]] = field(default_factory=OrderedDict)

    async def get(self, key: Hashable, make: Callable[[], Awaitable[V]]) -> V:
        now = self.clock()
        found = self._entries.get(key)
        if found is not None and found[0] > now:
            return found[1]  # type: ignore[return-value]
        value = await make()
        self._entries[key] = (now + self.ttl, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._entries)


# ------------------------------------------------------------------------------------ the API server's


class _UserInfo(msgspec.Struct, kw_only=True):
    username: str = ""
    uid: str = ""
    groups: list[str] = []
    extra: dict[str, list[str]] = {}


class _TokenReviewStatus(msgspec.Struct, kw_only=True):
    authenticated: bool = False
    user: _UserInfo = msgspec.field(default_factory=_UserInfo)


class _TokenReview(msgspec.Struct, kw_only=True):
    status: _TokenReviewStatus = msgspec.field(default_factory=_TokenReviewStatus)


class _AccessReviewStatus(msgspec.Struct, kw_only=True):
    allowed: bool = False


class _AccessReview(msgspec.Struct, kw_only=True):
    status: _AccessReviewStatus = msgspec.field(default_factory=_AccessReviewStatus)


class _Poster(Protocol):
    async def post(self, path: str, body: bytes) -> bytes: ...


def token_key(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class ClusterAuthorizer:
    """TokenReview and SubjectAccessReview through ``poster`` (the server's own Kubernetes client)."""

    def __init__(self, poster: _Poster, *, ttl: float = 10.0, size: int = 4096) -> None:
        self._poster = poster
        self.tokens = Decisions(ttl=ttl, size=size)
        self.reviews = Decisions(ttl=ttl, size=size)
        self.asked = 0
        """How many reviews went to the API server (the rest came from the cache)."""

    async def authenticate(self, token: str) -> Caller:
        if not token:
            raise Unauthenticated("no bearer token")
        caller = await self.tokens.get(token_key(token), lambda: self._review_token(token))
        if caller is None:
            raise Unauthenticated("the API server does not accept this token")
        return caller

    async def _review_token(self, token: str) -> Caller | None:
        body = msgspec.json.encode(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}
        )
        review = msgspec.json.decode(await self._post(TOKEN_REVIEWS, body), type=_TokenReview)
        if not review.status.authenticated or not review.status.user.username:
            return None
        user = review.status.user
        return Caller(
            username=user.username,
            uid=user.uid,
            groups=tuple(user.groups),
            extra=tuple(sorted((k, tuple(v)) for k, v in user.extra.items())),
        )

    async def allowed(self, caller: Caller, verb: str, namespace: str, name: str = "") -> bool:
        return await self.reviews.get(
            (caller, verb, namespace, name), lambda: self._review(caller, verb, namespace, name)
        )

    async def _review(self, caller: Caller, verb: str, namespace: str, name: str) -> bool:
        attributes: dict[str, str] = {"verb": verb, "group": GROUP, "resource": RESOURCE}
        if namespace:
            attributes["namespace"] = namespace
        if name:
            attributes["name"] = name
        body = msgspec.json.encode(
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {**caller.as_subject(), "resourceAttributes": attributes},
            }
        )
        return msgspec.json.decode(await self._post(ACCESS_REVIEWS, body), type=_AccessReview).status.allowed

    async def _post(self, path: str, body: bytes) -> bytes:
        self.asked += 1
        return await self._poster.post(path, body)


class KubePoster:
    """``plumbing.kube.KubeClient`` as the authorizer's transport: its errors become ``Unavailable``, worded
    without the request body (which holds the token)."""

    def __init__(self, client: object) -> None:
        self._client = client

    async def post(self, path: str, body: bytes) -> bytes:
        from plumbing.kube import KubeApiError, KubeClient

        assert isinstance(self._client, KubeClient)
        try:
            response = await self._client.request("POST", path, body=body, content_type="application/json", timeout=10)
        except KubeApiError as exc:
            raise Unavailable(
                f"the API server did not answer {path.rsplit('/', 1)[-1]}: {exc.status} {exc.reason}"
            ) from None
        return response.body
