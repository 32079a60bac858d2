"""The pipeline's own Kubernetes identities on the stack's API server, and a kubeconfig per service for them.

With the admin's kubeconfig the services could do anything, and the RBAC rules and admission policies that
confine a stolen token (deploy/base/rbac.yaml, applier-policy.yaml) would hold only in deployments, never
where the pipeline is tried and tested. So the local stack applies deploy/'s own ServiceAccounts, roles,
bindings and policies (read from the files, not copied), and runs each service with a token of its own
ServiceAccount from the TokenRequest API, in a kubeconfig ``tokenFile`` the client watches. The planner
talks to no API server and gets no kubeconfig at all.
"""

from __future__ import annotations

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
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
IDENTITY_FILES = (
    DEPLOY / "base" / "namespace.yaml",
    DEPLOY / "base" / "rbac.yaml",
    DEPLOY / "base" / "applier-policy.yaml",
    DEPLOY / "base" / "webhook.yaml",
    DEPLOY / "components" / "one-process" / "controller.yaml",
    DEPLOY / "components" / "history-server" / "history-server.yaml",
)
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
POLICY_PARAMS = "tjpipe-applier-policy"
"""The ConfigMap the excluded-namespaces policy reads its list from."""
SERVICE_ACCOUNTS: Mapping[str, str] = {
    "watcher": "tjpipe-watcher",
    "applier": "tjpipe-applier",
    "webhook": "tjpipe-webhook",
    "controller": "tjpipe-controller",
    "history-server": "tjpipe-history-server",
}
"""The ServiceAccount each service that talks to the API server runs as."""
TOKEN_SECONDS = 30 * 24 * 3600
"""A stack's tokens last 30 days; ``tjpipe up`` requests new ones at every start."""
FIELD_MANAGER = "tjpipe-up"


def identity_objects() -> list[dict[str, Any]]:
    """deploy/'s identity objects, in the pipeline's namespace: ServiceAccounts, roles, bindings, policies."""
    objects: list[dict[str, Any]] = []
    for path in IDENTITY_FILES:
        for obj in _load_yaml_documents(path):
            wanted = obj["kind"] in IDENTITY_KINDS or (
                obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == POLICY_PARAMS
            )
            if not wanted:
                continue
            if obj["kind"] in ("ServiceAccount", "ConfigMap"):
                obj["metadata"].setdefault("namespace", NAMESPACE)
            objects.append(obj)
    return objects


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
    cluster = _cluster_of(admin_kubeconfig)
    core = kube_client.CoreV1Api(api_client)
    folder.mkdir(parents=True, exist_ok=True)
    kubeconfigs = ServiceKubeconfigs(folder)
    for service, account in SERVICE_ACCOUNTS.items():
        token = request_token(core, account)
        token_file = folder / f"{service}.token"
        write_private_file(token_file, token)
        write_private_file(kubeconfigs.path(service), _kubeconfig(cluster, account, token_file.name))
    return kubeconfigs


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
