"""Two namespaces with a recorded TrainJob each, their readers, and a history server in front of them.

Everything is real: the history is on the session's nats-server, read by the server as ``reader``; the
readers are a ServiceAccount of namespace A with a RoleBinding there, the plain user ``alice`` whose group
is bound in namespace B, ``bob`` who is bound nowhere, and the apiserver's admin; the server asks the
session's kube-apiserver about each of them.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kube_client

from plumbing import bus

from .keep_support import kept  # noqa: F401  (the retention and Run again tests' namespaces and server)
from .logs_support import kept_logs  # noqa: F401  (the kept logs of the logs tests)
from .progress_support import story  # noqa: F401  (the recorded story of the progress and timeline tests)
from .support import Recorded, Server, record, run_async, start_server

pytestmark = [pytest.mark.cluster, pytest.mark.nats]

READ_TRAINJOBS = kube_client.V1PolicyRule(
    api_groups=["trainer.kubeflow.org"], resources=["trainjobs"], verbs=["get", "list"]
)


@dataclass
class World:
    a: Recorded
    b: Recorded
    server: Server
    tokens: dict[str, str]
    """``viewer-a`` (ServiceAccount of A), ``alice`` (group bound in B), ``bob`` (bound nowhere), ``admin``."""
    api: Any

    def token(self, who: str) -> str:
        if who not in self.tokens:
            pytest.skip(f"{who} is a user of the tests' own apiserver (KUBECONFIG names another cluster)")
        return self.tokens[who]


def _namespace(core: kube_client.CoreV1Api, prefix: str) -> str:
    name = f"{prefix}-{secrets.token_hex(3)}"
    core.create_namespace(kube_client.V1Namespace(metadata=kube_client.V1ObjectMeta(name=name)))
    return name


def _bind(rbac: kube_client.RbacAuthorizationV1Api, namespace: str, name: str, subject: dict[str, str]) -> None:
    rbac.create_namespaced_role(
        namespace, kube_client.V1Role(metadata=kube_client.V1ObjectMeta(name=name), rules=[READ_TRAINJOBS])
    )
    rbac.create_namespaced_role_binding(
        namespace,
        kube_client.V1RoleBinding(
            metadata=kube_client.V1ObjectMeta(name=name),
            role_ref=kube_client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=name),
            subjects=[kube_client.RbacV1Subject(**subject)],
        ),
    )


@pytest.fixture(scope="module")
def world(kube: Any, nats_url: str, nats_credentials: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    api = kube.api_client()
    core, rbac = kube_client.CoreV1Api(api), kube_client.RbacAuthorizationV1Api(api)
    ns_a, ns_b = _namespace(core, "hist-a"), _namespace(core, "hist-b")

    async def fill() -> tuple[Recorded, Recorded]:
        nc = await bus.connect(nats_url, name="test-history", creds=nats_credentials.seed_file("admin"))
        try:
            js = nc.jetstream()
            return await record(js, ns_a, "alpha"), await record(js, ns_b, "beta")
        finally:
            await nc.close()

    a, b = run_async(fill)
    core.create_namespaced_service_account(ns_a, kube_client.V1ServiceAccount(metadata={"name": "viewer"}))
    _bind(rbac, ns_a, "trainjob-reader", {"kind": "ServiceAccount", "name": "viewer", "namespace": ns_a})
    _bind(
        rbac,
        ns_b,
        "trainjob-reader",
        {"kind": "Group", "name": "history-viewers", "api_group": "rbac.authorization.k8s.io"},
    )
    request = kube_client.AuthenticationV1TokenRequest(
        spec=kube_client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    tokens = {"viewer-a": core.create_namespaced_service_account_token("viewer", ns_a, request).status.token}
    if kube.local is not None:
        tokens |= dict(kube.local.user_tokens) | {"admin": kube.local.token}
    log_dir: Path = tmp_path_factory.mktemp("history-server")
    server = start_server(
        nats_url=nats_url,
        reader_creds=nats_credentials.seed_file("reader"),
        kubeconfig=Path(kube.kubeconfig),
        log_dir=log_dir,
        extra=("--auth-cache-seconds", "1"),
    )
    try:
        yield World(a=a, b=b, server=server, tokens=tokens, api=api)
    finally:
        server.process.stop()
        log = server.log.read_text(errors="replace")
        leaked = [who for who, token in tokens.items() if token in log]
        assert not leaked, f"the server's log holds the token of {leaked}"
