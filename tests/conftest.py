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
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client as kube_client
from nats.aio.client import Client as NATS
from phase_times import PhaseTimes

from plumbing import bus
from tjpipe.credentials import Credentials, generate_credentials, server_authorization
from tjpipe.local.cluster import SimulatedCluster, start_simulated_cluster
from tjpipe.local.crds import crd_manifests, install_crds
from tjpipe.local.kubeapi import LocalKube, new_api_client, start_kube
from tjpipe.local.natsd import start_nats
from tjpipe.local.stack import nats_connect_options, setup_bus_as_admin

TEST_USERS = {"alice": ("history-viewers",), "bob": ()}
"""Plain users of the session's own apiserver (``kube.local.user_tokens``), bound to nothing by default."""


def pytest_configure(config: pytest.Config) -> None:
    # Wall time per test folder for the phase table scripts/test.sh prints (tests/phase_times.py).
    config.pluginmanager.register(PhaseTimes(config.rootpath), "phase-times")


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
def nats_credentials(state_dir: Path) -> Credentials | None:
    """The NATS identities' seeds the session's server trusts; ``TJPIPE_NATS_CREDS_DIR`` with ``NATS_URL``."""
    if os.environ.get("NATS_URL"):
        folder = os.environ.get("TJPIPE_NATS_CREDS_DIR")
        return Credentials(Path(folder)) if folder else None
    return generate_credentials(state_dir / "creds")


@pytest.fixture(scope="session")
def nats_url(state_dir: Path, nats_credentials: Credentials | None) -> Iterator[str]:
    """A server that refuses anonymous clients, with the bus set up by the admin identity.

    Connect with ``nats_connect`` (or ``plumbing.bus.connect(..., creds=nats_credentials.seed_file(id))``);
    a bare ``nats.connect(nats_url)`` is refused, as it is in production.
    """
    configured = os.environ.get("NATS_URL")
    if configured:
        setup_bus_as_admin(configured, nats_credentials)
        yield configured
        return
    assert nats_credentials is not None
    local = start_nats(
        store_dir=state_dir / "nats" / "store",
        log_dir=state_dir / "logs",
        authorization=server_authorization(nats_credentials),
    )
    try:
        setup_bus_as_admin(local.url, nats_credentials)
        yield local.url
    finally:
        local.stop()


@pytest.fixture(scope="session")
def nats_connect(nats_url: str, nats_credentials: Credentials | None) -> Callable[..., Awaitable[NATS]]:
    """``await nats_connect()`` is an admin connection to the session's server; ``nats_connect("reader")``
    connects as another identity."""

    async def connect(identity: str = "admin") -> NATS:
        return await bus.connect(nats_url, name=f"test-{identity}", **nats_connect_options(nats_credentials, identity))

    return connect


@pytest.fixture(scope="session")
def kube(state_dir: Path, uncaptured_progress: Callable[[str], None]) -> Iterator[KubeCluster]:
    configured = os.environ.get("KUBECONFIG")
    if configured:
        paths = [path for path in configured.split(os.pathsep) if path]
        if len(paths) != 1:
            raise pytest.UsageError(f"KUBECONFIG must name exactly one file for the tests: {configured!r}")
        yield KubeCluster(kubeconfig=Path(paths[0]).expanduser(), local=None)
        return

    local = start_kube(
        work_dir=state_dir / "kube",
        log_dir=state_dir / "logs",
        kubeconfig_path=state_dir / "kubeconfig",
        progress=uncaptured_progress,
        users=TEST_USERS,
    )
    try:
        with local.api_client() as api_client:
            install_crds(api_client, crd_manifests())
        yield KubeCluster(kubeconfig=local.kubeconfig, local=local)
    finally:
        local.stop()


@pytest.fixture(scope="session")
def sim_cluster(
    tmp_path_factory: pytest.TempPathFactory, uncaptured_progress: Callable[[str], None]
) -> Iterator[SimulatedCluster]:
    """A whole simulated cluster (``tjpipe.local.cluster``) on an apiserver of its own, with the CRDs installed:
    kube-controller-manager, kube-scheduler, JobSet's manager with its webhooks (``failurePolicy: Fail``, so
    nobody else's apiserver gets them) and 4 kwok nodes whose Job pods run 3 s. ``.kube`` is its
    ``LocalKube``, ``.kubeconfig`` its kubeconfig; ``ensure_nodes(n)`` adds nodes. Not started unless asked for.
    """
    root = tmp_path_factory.mktemp("sim-cluster")
    cluster = start_simulated_cluster(
        work_dir=root,
        log_dir=root / "logs",
        kubeconfig_path=root / "kubeconfig",
        progress=uncaptured_progress,
        pod_run_seconds=3.0,
    )
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def namespace(kube: KubeCluster) -> str:
    """A fresh namespace per test; never deleted, as nothing would ever finish deleting it on envtest."""
    name = f"t-{secrets.token_hex(4)}"
    with kube.api_client() as api_client:
        kube_client.CoreV1Api(api_client).create_namespace(
            kube_client.V1Namespace(metadata=kube_client.V1ObjectMeta(name=name))
        )
    return name


@pytest.fixture(scope="session")
def uncaptured_progress(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Progress lines that reach the terminal even under output capture: a cold build takes minutes."""
    capture_manager = request.config.pluginmanager.getplugin("capturemanager")

    def progress(line: str) -> None:
        if capture_manager is None:
            print(f"[tjpipe] {line}", file=sys.stderr, flush=True)
            return
        with capture_manager.global_and_fixture_disabled():
            print(f"[tjpipe] {line}", file=sys.stderr, flush=True)

    return progress
