"""The pipeline's own Kubernetes identities on the stack's API server, and a kubeconfig per service for them.

With the admin's kubeconfig the services could do anything, and the RBAC rules and admission policies that
confine a stolen token (deploy/base/rbac.yaml, applier-policy.yaml) would hold only in deployments, never
where the pipeline is tried and tested. So the local stack applies deploy/'s own ServiceAccounts, roles,
bindings and policies (read from the files, not copied), and runs each service with a token of its own
ServiceAccount from the TokenRequest API, in a kubeconfig ``tokenFile`` the client watches. The planner
talks to no API server and gets no kubeconfig at all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as kube_client
from kubernetes.client import ApiClient

from tjpipe.local.crds import _load_yaml_documents, apply_objects
from tjpipe.private_files import write_private_file

NAMESPACE = "trainjob-pipeline"
"""The pipeline's namespace, as deploy/base names it: its ServiceAccounts live there."""
DEPLOY_ENV = "TJPIPE_DEPLOY_DIR"
"""Where deploy/ is when this module is not in a checkout (the compose stack's init image copies it there)."""
IDENTITY_FILES = (
    Path("base/namespace.yaml"),
    Path("base/rbac.yaml"),
    Path("base/applier-policy.yaml"),
    Path("base/webhook.yaml"),
    Path("components/one-process/controller.yaml"),
    Path("components/history-server/history-server.yaml"),
    Path("components/status-server/status-server.yaml"),
)
"""The files under deploy/ the identity objects are read from."""


def deploy_dir() -> Path:
    """The checkout's deploy/, or ``$TJPIPE_DEPLOY_DIR``."""
    return Path(os.environ.get(DEPLOY_ENV) or Path(__file__).resolve().parents[2] / "deploy")


IDENTITY_KINDS = frozenset(
    {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
)
SERVICE_ACCOUNTS: Mapping[str, str] = {
    "watcher": "tjpipe-watcher",
    "applier": "tjpipe-applier",
    "webhook": "tjpipe-webhook",
    "controller": "tjpipe-controller",
    "history-server": "tjpipe-history-server",
    "status-server": "tjpipe-status-server",
}
"""The ServiceAccount each service that talks to the API server runs as."""
TOKEN_SECONDS = 30 * 24 * 3600
"""A stack's tokens last 30 days; ``tjpipe up`` requests new ones at every start."""
FIELD_MANAGER = "tjpipe-up"


def identity_objects() -> list[dict[str, Any]]:
    """deploy/'s identity objects, in the pipeline's namespace: ServiceAccounts, roles, bindings, policies."""
    objects: list[dict[str, Any]] = []
    deploy = deploy_dir()
    for path in IDENTITY_FILES:
        for obj in _load_yaml_documents(deploy / path):
            if obj["kind"] not in IDENTITY_KINDS:
                continue
            if obj["kind"] == "ServiceAccount":
                obj["metadata"].setdefault("namespace", NAMESPACE)
            objects.append(obj)
    # A policy binding goes last, after the policy it binds: the API server takes a binding whose policy is not
    # there yet for a misconfiguration until the policy arrives.
    return sorted(objects, key=lambda obj: obj["kind"] == "ValidatingAdmissionPolicyBinding")


@dataclass(frozen=True)
class ServiceKubeconfigs:
    """Where each service's kubeconfig is; ``for_service`` is ``None`` for a service that gets none."""

    folder: Path

    def path(self, service: str) -> Path:
        return self.folder / f"{service}.kubeconfig"

    def for_service(self, service: str) -> Path | None:
        path = self.path(service)
        return path if service in SERVICE_ACCOUNTS and path.is_file() else None


def install_identities(api_client: ApiClient, *, admin_kubeconfig: Path, folder: Path) -> ServiceKubeconfigs:
    """Apply the identity objects, then write a kubeconfig with a fresh ServiceAccount token for each service."""
    apply_objects(api_client, identity_objects(), field_manager=FIELD_MANAGER)
    folder.mkdir(parents=True, exist_ok=True)
    kubeconfigs = ServiceKubeconfigs(folder)
    for service in SERVICE_ACCOUNTS:
        write_service_kubeconfig(
            api_client,
            service,
            admin_kubeconfig=admin_kubeconfig,
            kubeconfig=kubeconfigs.path(service),
            token_file=folder / f"{service}.token",
        )
    return kubeconfigs


def write_service_kubeconfig(
    api_client: ApiClient, service: str, *, admin_kubeconfig: Path, kubeconfig: Path, token_file: Path
) -> None:
    """A fresh token of ``service``'s ServiceAccount into ``token_file``, and a kubeconfig beside it that reads
    it (the same server and CA as ``admin_kubeconfig``)."""
    account = SERVICE_ACCOUNTS[service]
    if token_file.parent != kubeconfig.parent:
        raise ValueError(f"{token_file} must be in the folder of {kubeconfig}: the kubeconfig names it relatively")
    write_private_file(token_file, request_token(kube_client.CoreV1Api(api_client), account))
    write_private_file(kubeconfig, _kubeconfig(_cluster_of(admin_kubeconfig), account, token_file.name))


def request_token(core: kube_client.CoreV1Api, account: str, *, seconds: int = TOKEN_SECONDS) -> str:
    """A bound token of the pipeline's ServiceAccount ``account``, from the TokenRequest API."""
    review = core.create_namespaced_service_account_token(
        account,
        NAMESPACE,
        kube_client.AuthenticationV1TokenRequest(
            spec=kube_client.V1TokenRequestSpec(audiences=[], expiration_seconds=seconds)
        ),
    )
    if review.status is None or not review.status.token:
        raise RuntimeError(f"the API server issued no token for ServiceAccount {NAMESPACE}/{account}")
    token: str = review.status.token
    return token


def _cluster_of(kubeconfig: Path) -> dict[str, Any]:
    """The current context's cluster entry (server, CA) of a kubeconfig the stack wrote."""
    config = yaml.safe_load(kubeconfig.read_text())
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    cluster: dict[str, Any] = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    return cluster


def _kubeconfig(cluster: Mapping[str, Any], account: str, token_file: str) -> str:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "tjpipe", "cluster": dict(cluster)}],
        "users": [{"name": account, "user": {"tokenFile": token_file}}],
        "contexts": [{"name": account, "context": {"cluster": "tjpipe", "user": account}}],
        "current-context": account,
        "preferences": {},
    }
    return yaml.safe_dump(config, sort_keys=False)
