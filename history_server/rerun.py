"""Run again: a new TrainJob made from a finished one's recorded spec, created with the caller's own token.

Why the caller's token and not the server's identity: the history server's ServiceAccount may create
TokenReviews and SubjectAccessReviews and nothing else, and it must stay so; a server that created objects as
itself would let anyone who can read a namespace's history write there with the server's rights. So the
server asks a SubjectAccessReview first (``create`` on ``trainjobs.trainer.kubeflow.org`` in the namespace,
to offer the button only to those who may), and then sends the create to the API server with the caller's
bearer token alone: no client certificate or token of the server's goes with it, so the API server's own
authentication, RBAC and admission decide, exactly as for ``kubectl create``.

Why from the record: the TrainJob may be gone (deleted, or removed by a ``ttlSecondsAfterFinished``), and
its newest recorded event holds the whole object as the API server returned it. The new TrainJob takes its
``spec``, labels and annotations as they were (every field, also ones this project does not model), gets
the new name, and an annotation naming what it was made from; the status and every field the API server
owns (uid, resourceVersion, managedFields, ownerReferences, ...) stay behind.

Why the rules of a write: the token comes in the ``Authorization`` header only (never a cookie or a query
string), so no other site can make a browser send it; the request must say ``Content-Type:
application/json``, which a plain HTML form cannot, and a request whose ``Origin`` is not this server is
refused, so a page elsewhere cannot make a user's browser post here either.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiohttp

    from plumbing.kube import KubeConfig

RUN_AGAIN_OF = "trainjob-pipeline/run-again-of"
"""Annotation on a TrainJob made by Run again: ``NAMESPACE/NAME (uid UID)`` of the one it was made from."""
FINISHED = ("Complete", "Failed", "Deleted")
"""States from which Run again is offered."""
_DROPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)
TRAINJOBS = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs"


class RunAgainError(Exception):
    """The API server refused the create: its status and message, passed on to the caller."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def recorded_trainjob(events: list[bytes]) -> dict[str, Any] | None:
    """The newest TrainJob object among a TrainJob's recorded events (oldest first), as recorded; ``None``
    when none holds one."""
    for data in reversed(events):
        try:
            event = json.loads(data)
        except ValueError:
            continue
        if (
            isinstance(event, dict)
            and event.get("type") == "trainjob.observed"
            and isinstance(event.get("trainjob"), dict)
        ):
            job: dict[str, Any] = event["trainjob"]
            return job
    return None


def again(recorded: dict[str, Any], namespace: str, name: str) -> dict[str, Any]:
    """The new TrainJob: the recorded one's spec, labels and annotations under ``name``."""
    meta = recorded.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in _DROPPED_ANNOTATIONS}
    annotations[RUN_AGAIN_OF] = f"{namespace}/{meta.get('name', '')} (uid {meta.get('uid', '')})"
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": annotations}
    if meta.get("labels"):
        metadata["labels"] = dict(meta["labels"])
    return {
        "apiVersion": recorded.get("apiVersion") or "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": metadata,
        "spec": copy.deepcopy(recorded.get("spec") or {}),
    }


@dataclass(frozen=True)
class Creator:
    """Creates TrainJobs at the API server the server's kubeconfig names, with the caller's token only."""

    server: str
    ssl: Any
    """What aiohttp verifies the API server with (the kubeconfig's CA), carrying no client certificate."""

    @classmethod
    def of(cls, config: KubeConfig) -> Creator:
        bare = replace(config, token=None, cert_file=None, key_file=None, source=None)
        return cls(server=config.server.rstrip("/"), ssl=bare.ssl_context())

    async def create(self, session: aiohttp.ClientSession, token: str, body: dict[str, Any]) -> dict[str, Any]:
        namespace = body["metadata"]["namespace"]
        async with session.post(
            self.server + TRAINJOBS.format(namespace=namespace),
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            ssl=self.ssl,
        ) as response:
            text = await response.text()
            if response.status >= 300:
                try:
                    message = str(json.loads(text).get("message") or response.reason)
                except ValueError:
                    message = response.reason or "refused"
                raise RunAgainError(response.status, message)
            created: dict[str, Any] = json.loads(text)
            return created
