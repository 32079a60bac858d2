"""The pipeline on the simulated cluster: real controllers make Jobs, Pods, status and garbage collection.

``sim_cluster`` (tests/conftest.py) is the session's simulated cluster: its own kube-apiserver with
kube-controller-manager, kube-scheduler, JobSet v0.12.0's manager with its webhooks (``failurePolicy:
Fail``) and kwok nodes whose pods run a few seconds. Each test module here gets the fault harness's
pipeline on it (``faults.support.open_pipeline``: its own nats-server, the three services, the watcher
limited to one fresh namespace, the API server's write counters), started once for the module.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from faults.support import Pipeline, close_pipeline, open_pipeline

RUNTIMES = ("torch-distributed", "deepspeed-distributed", "torchtune-llama3.2-1b")


@pytest.fixture(scope="module")
def lifecycle(sim_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    pipe = open_pipeline(sim_cluster.kube, tmp_path_factory.mktemp("lifecycle"), runtimes=RUNTIMES)
    try:
        pipe.start_all()
        yield pipe
    finally:
        print(close_pipeline(pipe))


# TEMPORARY (H6): until H4's session fixture lands in tests/conftest.py.
@pytest.fixture(scope="package")
def sim_cluster(tmp_path_factory: pytest.TempPathFactory, uncaptured_progress: Any) -> Iterator[Any]:
    from tjpipe.local.cluster import start_simulated_cluster

    root = tmp_path_factory.mktemp("sim")
    cluster = start_simulated_cluster(
        work_dir=root / "work",
        log_dir=root / "logs",
        kubeconfig_path=root / "kubeconfig",
        progress=uncaptured_progress,
        pod_run_seconds=3,
    )
    try:
        yield cluster
    finally:
        cluster.stop()
