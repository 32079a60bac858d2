"""A private kube-apiserver with JobSet v0.12.0's own manager and admission webhooks, for this package.

The webhooks are registered cluster-wide with ``failurePolicy: Fail``, so they get an apiserver of their
own: no other test package sees them, and stopping the manager cannot break anyone else's JobSets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from faults.support import Pipeline, close_pipeline, open_pipeline

from tjpipe.local.crds import crd_manifests, install_crds, shipped_runtimes
from tjpipe.local.jobset_controller import LocalJobSet, start_jobset_manager
from tjpipe.local.kubeapi import LocalKube, new_api_client, start_kube


@pytest.fixture(scope="package")
def jobset_kube(
    tmp_path_factory: pytest.TempPathFactory, uncaptured_progress: Callable[[str], None]
) -> Iterator[LocalKube]:
    root = tmp_path_factory.mktemp("jobset-kube")
    progress = uncaptured_progress
    kube = start_kube(
        work_dir=root / "kube",
        log_dir=root / "logs",
        kubeconfig_path=root / "kubeconfig",
        progress=progress,
    )
    manager: LocalJobSet | None = None
    try:
        with new_api_client(kube.kubeconfig) as api:
            install_crds(api, crd_manifests(progress=lambda _: None))
            manager = start_jobset_manager(
                api_client=api,
                kubeconfig=kube.kubeconfig,
                work_dir=root / "jobset",
                log_dir=root / "logs",
                progress=progress,
            )
        yield kube
    finally:
        if manager is not None:
            print(f"--- jobset-manager ---\n{manager.process.log_tail(30)}")
            manager.stop()
        kube.stop()


@pytest.fixture
def pipeline(jobset_kube: LocalKube, tmp_path: Path) -> Iterator[Pipeline]:
    pipe = open_pipeline(jobset_kube, tmp_path / "pipe", runtimes=tuple(shipped_runtimes()))
    try:
        yield pipe
    finally:
        print(close_pipeline(pipe))
