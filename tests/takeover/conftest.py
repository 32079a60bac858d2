"""A private kube-apiserver for the takeover tests, and Trainer v2.3.0's own controller on it.

Trainer's webhooks are registered cluster-wide with ``failurePolicy: Fail`` while its controller runs, so
the package gets an apiserver of its own: nothing else sees them, and the write counts read from the
apiserver's ``/metrics`` are this package's alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tjpipe.local.crds import crd_manifests, install_crds
from tjpipe.local.kubeapi import LocalKube, new_api_client, start_kube
from tjpipe.local.trainer_controller import TrainerController


@pytest.fixture(scope="package")
def takeover_kube(
    tmp_path_factory: pytest.TempPathFactory, uncaptured_progress: Callable[[str], None]
) -> Iterator[LocalKube]:
    root = tmp_path_factory.mktemp("takeover-kube")
    kube = start_kube(
        work_dir=root / "kube", log_dir=root / "logs", kubeconfig_path=root / "kubeconfig", progress=uncaptured_progress
    )
    try:
        with new_api_client(kube.kubeconfig) as api:
            install_crds(api, crd_manifests(progress=lambda _: None))
        yield kube
    finally:
        kube.stop()


@pytest.fixture
def trainer_controller(
    takeover_kube: LocalKube, tmp_path: Path, uncaptured_progress: Callable[[str], None]
) -> Iterator[TrainerController]:
    """Trainer's controller for ``takeover_kube``, not started yet (``.start()``/``.stop()``); stopped, and its
    webhooks removed, at teardown. Built from its Go module on first use (a few minutes, progress shown)."""
    controller = TrainerController(
        kubeconfig=takeover_kube.kubeconfig, state_dir=tmp_path / "trainer", progress=uncaptured_progress
    )
    try:
        yield controller
    finally:
        print(f"--- trainer-controller ---\n{controller.log_tail(30)}")
        controller.stop()
