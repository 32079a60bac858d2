"""Credentials that rotate under a running client: applies keep working, the old credential stops working.

The API server here accepts short-lived service-account tokens from the TokenRequest API, each bound to a
Secret: deleting that Secret makes the server refuse the token at once (after its authentication cache of
a few seconds), which is what an expired token looks like to a client. The client reads the token from a
kubeconfig ``tokenFile`` (as a projected service-account token is read), or from an exec plugin (as EKS
and GKE credentials are). Each rotation writes a new token, then revokes the old one; applies go on
throughout, and none may fail.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as kube_client

from contracts.resources import CONFIG_MAP
from plumbing import kube as kube_module
from plumbing.kube import KubeClient, KubeConfig

pytestmark = [pytest.mark.cluster]

SERVICE_ACCOUNT = "rotating-applier"
ROTATIONS = 2
REVOKED_WITHIN_SECONDS = 60.0


class TokenIssuer:
    """Issues tokens for one ServiceAccount that may write ConfigMaps in one namespace, and revokes them."""

    def __init__(self, api: kube_client.ApiClient, namespace: str) -> None:
        self.core = kube_client.CoreV1Api(api)
        self.namespace = namespace
        self.issued = 0
        rbac = kube_client.RbacAuthorizationV1Api(api)
        self.core.create_namespaced_service_account(namespace, {"metadata": {"name": SERVICE_ACCOUNT}})
        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": SERVICE_ACCOUNT},
                "rules": [
                    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "create", "patch"]}
                ],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": SERVICE_ACCOUNT},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SERVICE_ACCOUNT},
                "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}],
            },
        )

    def issue(self) -> tuple[str, str]:
        """A new token, bound to a new Secret; returns (token, the Secret's name)."""
        self.issued += 1
        name = f"binding-{self.issued}"
        secret = self.core.create_namespaced_secret(self.namespace, {"metadata": {"name": name}})
        request = {
            "spec": {
                "expirationSeconds": 600,  # the API's minimum; revocation comes from deleting the Secret
                "boundObjectRef": {"apiVersion": "v1", "kind": "Secret", "name": name, "uid": secret.metadata.uid},
            }
        }
        token = self.core.create_namespaced_service_account_token(SERVICE_ACCOUNT, self.namespace, request)
        return str(token.status.token), name

    def issue_into(self, path: Path) -> tuple[str, str]:
        """``issue``, with the token written to ``path`` as a rotator writes it (whole, mode 0600)."""
        token, binding = self.issue()
        write_atomically(path, token)
        return token, binding

    def revoke(self, binding: str) -> None:
        self.core.delete_namespaced_secret(binding, self.namespace)


def status_with(server: str, ca_file: str, token: str, namespace: str) -> int:
    """The status the API server answers a GET of the namespace's ConfigMaps with, sent with ``token``."""
    request = urllib.request.Request(
        f"{server}/api/v1/namespaces/{namespace}/configmaps", headers={"Authorization": f"Bearer {token}"}
    )
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=ca_file))
    )
    try:
        with opener.open(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


async def until_refused(server: str, ca_file: str, token: str, namespace: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + REVOKED_WITHIN_SECONDS
    while (status := await asyncio.to_thread(status_with, server, ca_file, token, namespace)) != 401:
        assert status == 200, status
        assert loop.time() < deadline, f"a revoked token was still accepted after {REVOKED_WITHIN_SECONDS}s"
        await asyncio.sleep(0.5)


def write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    partial.chmod(0o600)
    os.replace(partial, path)


def write_kubeconfig(path: Path, admin: KubeConfig, user: dict[str, Any]) -> None:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "local", "cluster": {"server": admin.server, "certificate-authority": admin.ca_file}}
                ],
                "users": [{"name": SERVICE_ACCOUNT, "user": user}],
                "contexts": [{"name": "rotating", "context": {"cluster": "local", "user": SERVICE_ACCOUNT}}],
                "current-context": "rotating",
            }
        )
    )
    path.chmod(0o600)


def configmap(name: str, namespace: str, value: int) -> bytes:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}}
    return json.dumps({**body, "data": {"n": str(value)}}).encode()


async def apply_continuously(client: KubeClient, namespace: str, stop: asyncio.Event) -> int:
    """Server-side applies, one after another, until ``stop``; any failure fails the test. Returns the count."""
    count = 0
    while not stop.is_set():
        count += 1
        await client.apply(
            CONFIG_MAP,
            namespace=namespace,
            name="rotating",
            body=configmap("rotating", namespace, count),
            field_manager="trainer",
        )
        await asyncio.sleep(0.05)
    return count


@pytest.fixture
def issuer(kube: Any, namespace: str) -> Iterator[TokenIssuer]:
    if kube.local is None:
        pytest.skip("issues and revokes ServiceAccount tokens: local apiserver only")
    with kube.api_client() as api:
        yield TokenIssuer(api, namespace)


@pytest.mark.parametrize("check_seconds", [3600.0, 0.0], ids=["reload-on-401", "file-watched"])
async def test_applies_go_on_while_a_token_file_rotates(
    kube: Any,
    namespace: str,
    issuer: TokenIssuer,
    tmp_path: Path,
    check_seconds: float,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A kubeconfig ``tokenFile`` rewritten by a rotator, as kubelet rewrites a projected token.

    ``reload-on-401``: the client never looks at the file on its own, so each rotation reaches it as a 401
    that it answers by loading the credentials again and retrying. ``file-watched``: it notices the new file
    before using the old token, so no request is refused at all.
    """
    monkeypatch.setattr(kube_module, "REFRESH_CHECK_SECONDS", check_seconds)
    caplog.set_level(logging.INFO, logger="plumbing.kube")
    admin = KubeConfig.load(str(kube.kubeconfig))
    assert admin.ca_file is not None
    token_file = tmp_path / "token"
    token, binding = issuer.issue_into(token_file)
    kubeconfig = tmp_path / "kubeconfig"
    write_kubeconfig(kubeconfig, admin, {"tokenFile": "token"})  # relative to the kubeconfig, as kubectl reads it

    async with KubeClient(KubeConfig.load(str(kubeconfig))) as client:
        stop = asyncio.Event()
        applying = asyncio.create_task(apply_continuously(client, namespace, stop))
        try:
            for _ in range(ROTATIONS):
                await asyncio.sleep(0.5)
                new_token, new_binding = issuer.issue_into(token_file)
                issuer.revoke(binding)
                await until_refused(admin.server, admin.ca_file, token, namespace)
                token, binding = new_token, new_binding
                await asyncio.sleep(1.0)  # applies with the old token refused, before the next rotation
                assert not applying.done(), applying.exception()
        finally:
            stop.set()
        applies = await applying

    assert applies > ROTATIONS * 10
    assert client.config.token == token
    assert client.credential_reloads == ROTATIONS
    messages = [r.getMessage() for r in caplog.records if r.name == "plumbing.kube"]
    reloads_after_401 = [m for m in messages if "reloaded after a 401" in m]
    assert len(reloads_after_401) == (ROTATIONS if check_seconds else 0), messages
    stored = await asyncio.to_thread(
        lambda: kube_client.CoreV1Api(kube.api_client()).read_namespaced_config_map("rotating", namespace)
    )
    assert stored.data == {"n": str(applies)}


async def test_an_exec_plugins_token_is_fetched_again_after_a_401(
    kube: Any, namespace: str, issuer: TokenIssuer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exec plugin (here a small Python program printing an ExecCredential) runs again once its token is
    refused, even though it reported no expiry, and the apply that was refused goes through."""
    monkeypatch.setattr(kube_module, "REFRESH_CHECK_SECONDS", 3600.0)
    admin = KubeConfig.load(str(kube.kubeconfig))
    assert admin.ca_file is not None
    current = tmp_path / "current-token"
    token, binding = issuer.issue_into(current)
    runs = tmp_path / "plugin-runs"
    plugin = (
        "import json, pathlib, sys; "
        f"pathlib.Path({str(runs)!r}).open('a').write('run\\n'); "
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', 'kind': 'ExecCredential', "
        f"'status': {{'token': pathlib.Path({str(current)!r}).read_text()}}}}))"
    )
    kubeconfig = tmp_path / "kubeconfig"
    exec_user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": ["-c", plugin],
            "interactiveMode": "Never",
        }
    }
    write_kubeconfig(kubeconfig, admin, exec_user)

    async with KubeClient(KubeConfig.load(str(kubeconfig))) as client:
        await client.apply(
            CONFIG_MAP, namespace=namespace, name="exec", body=configmap("exec", namespace, 1), field_manager="trainer"
        )
        new_token, _ = issuer.issue_into(current)
        issuer.revoke(binding)
        await until_refused(admin.server, admin.ca_file, token, namespace)
        await client.apply(
            CONFIG_MAP, namespace=namespace, name="exec", body=configmap("exec", namespace, 2), field_manager="trainer"
        )
        assert client.config.token == new_token

    assert runs.read_text().count("run") == 2
