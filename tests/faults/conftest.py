"""Private servers for the fault tests: one kube-apiserver + etcd for the package, one nats-server per test.

The package's apiserver gets every CRD the project installs except Volcano's PodGroup, so that an apply
for a kind whose CRD is missing can be tested against a real 404. Tests that restart the apiserver make
their own (see test_apiserver_outage.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tjpipe.local.crds import crd_manifests, install_crds
from tjpipe.local.kubeapi import LocalKube, new_api_client, start_kube

from .support import Pipeline, close_pipeline, open_pipeline

MISSING_CRD = "podgroups.scheduling.volcano.sh"


def start_private_kube(root: Path, *, skip_crds: tuple[str, ...] = ()) -> LocalKube:
    kube = start_kube(
        work_dir=root / "kube", log_dir=root / "logs", kubeconfig_path=root / "kubeconfig", progress=lambda _: None
    )
    try:
        manifests = [m for m in crd_manifests(progress=lambda _: None) if m["metadata"]["name"] not in skip_crds]
        with new_api_client(kube.kubeconfig) as api:
            install_crds(api, manifests)
    except BaseException:
        kube.stop()
        raise
    return kube


@pytest.fixture(scope="package")
def fault_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKube]:
    kube = start_private_kube(tmp_path_factory.mktemp("fault-kube"), skip_crds=(MISSING_CRD,))
    try:
        yield kube
    finally:
        kube.stop()


@pytest.fixture
def pipeline(fault_kube: LocalKube, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Pipeline]:
    runtimes = getattr(request, "param", None) or (
        "torch-distributed",
        "deepspeed-distributed",
        "xgboost-distributed",
        "torchtune-llama3.2-1b",
    )
    pipe = open_pipeline(fault_kube, tmp_path / "pipe", runtimes=runtimes)
    try:
        yield pipe
    finally:
        print(close_pipeline(pipe))
