"""Session-wide infrastructure for the test suite: one NATS server and one Kubernetes API per run.

Why session scope: starting etcd and kube-apiserver costs a few seconds, and a cold machine first has
to build them, so every test shares one control plane and isolates itself with its own namespace
instead. Why environment overrides: `NATS_URL` and `KUBECONFIG` let the same tests run against real
servers (a CI service container, a kind or k3s cluster) without changing any test.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client as kube_client

from tjpipe.local.crds import crd_manifests, install_crds
from tjpipe.local.kubeapi import LocalKube, new_api_client, start_kube
from tjpipe.local.natsd import start_nats


@dataclass(frozen=True)
class KubeCluster:
    """The cluster the tests talk to: our local apiserver (`local` set) or the one `KUBECONFIG` names."""

    kubeconfig: Path
    local: LocalKube | None

    def api_client(self) -> kube_client.ApiClient:
        return new_api_client(self.kubeconfig)


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tjpipe-state")


@pytest.fixture(scope="session")
def nats_url(state_dir: Path) -> Iterator[str]:
    configured = os.environ.get("NATS_URL")
    if configured:
        yield configured
        return
    local = start_nats(store_dir=state_dir / "nats" / "store", log_dir=state_dir / "logs")
    try:
        yield local.url
    finally:
        local.stop()


@pytest.fixture(scope="session")
def kube(state_dir: Path, request: pytest.FixtureRequest) -> Iterator[KubeCluster]:
    configured = os.environ.get("KUBECONFIG")
    if configured:
        paths = [path for path in configured.split(os.pathsep) if path]
        if len(paths) != 1:
            raise pytest.UsageError(f"KUBECONFIG must name exactly one file for the tests: {configured!r}")
        yield KubeCluster(kubeconfig=Path(paths[0]).expanduser(), local=None)
        return

    progress = _uncaptured_progress(request)
    local = start_kube(
        work_dir=state_dir / "kube",
        log_dir=state_dir / "logs",
        kubeconfig_path=state_dir / "kubeconfig",
        progress=progress,
    )
    try:
        with local.api_client() as api_client:
            install_crds(api_client, crd_manifests())
        yield KubeCluster(kubeconfig=local.kubeconfig, local=local)
    finally:
        local.stop()


@pytest.fixture
def namespace(kube: KubeCluster) -> str:
    """A fresh namespace per test; never deleted, as nothing would ever finish deleting it on envtest."""
    name = f"t-{secrets.token_hex(4)}"
    with kube.api_client() as api_client:
        kube_client.CoreV1Api(api_client).create_namespace(
            kube_client.V1Namespace(metadata=kube_client.V1ObjectMeta(name=name))
        )
    return name


def _uncaptured_progress(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Progress lines that reach the terminal even under output capture: a cold build takes minutes."""
    capture_manager = request.config.pluginmanager.getplugin("capturemanager")

    def progress(line: str) -> None:
        if capture_manager is None:
            print(f"[tjpipe] {line}", file=sys.stderr, flush=True)
            return
        with capture_manager.global_and_fixture_disabled():
            print(f"[tjpipe] {line}", file=sys.stderr, flush=True)

    return progress
