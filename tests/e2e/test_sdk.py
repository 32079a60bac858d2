"""Issue #26: the Kubeflow SDK (``kubeflow`` 0.5.0) drives a TrainJob's whole life on ``tjpipe up``, as a user would.

Why the SDK and not our own client: users of Trainer write ``TrainerClient().train(...)``, so the pipeline is
only a replacement if that code works unchanged: it reads the runtimes, creates the TrainJob, derives
``Running`` from the pods and ``Complete`` from the conditions the pipeline writes, lists the pods as steps,
and deletes the job. The stack is the one a user starts (``tjpipe up --detach``, its own simulated cluster);
the SDK reaches it only through the stack's kubeconfig.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as kube_client
from kubernetes import config as kube_config

from tjpipe.local.crds import apply_objects, shipped_runtimes
from tjpipe.local.kubeapi import new_api_client

pytestmark = [pytest.mark.cluster, pytest.mark.nats, pytest.mark.timeout(900)]

sdk_trainer = pytest.importorskip(
    "kubeflow.trainer", reason="the Kubeflow SDK: kubeflow 0.5.0, the sdk extra (bash scripts/bootstrap.sh test,sdk)"
)

NAMESPACE = "sdk"
POD_RUN_SECONDS = 10
"""Long enough for the SDK's one-second polls to see every node pod Running before it succeeds."""
CUSTOM_RUNTIME = "torch-distributed"
BUILTIN_RUNTIME = "torchtune-llama3.2-1b"


def _tjpipe(*args: str, cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tjpipe", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``tjpipe up --detach`` in a fresh folder, two shipped runtimes and a namespace; its kubeconfig."""
    cwd = tmp_path_factory.mktemp("sdk-stack")
    env = {k: v for k, v in os.environ.items() if k not in ("NATS_URL", "KUBECONFIG")}
    up = _tjpipe("up", "--detach", "--pod-run-seconds", str(POD_RUN_SECONDS), cwd=cwd, env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        kubeconfig = cwd / ".tjpipe" / "kubeconfig"
        runtimes = shipped_runtimes()
        with new_api_client(kubeconfig) as api:
            apply_objects(
                api,
                [
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
                    runtimes[CUSTOM_RUNTIME],
                    runtimes[BUILTIN_RUNTIME],
                ],
                field_manager="tjpipe-sdk-test",
            )
        yield kubeconfig
    finally:
        down = _tjpipe("down", cwd=cwd, env=env, timeout=120)
        print(down.stdout + down.stderr)


@pytest.fixture(scope="module")
def client(stack: Path) -> Any:
    """A TrainerClient on the stack: its configuration loaded into a client configuration of its own, so the
    kubernetes package's process-wide default (what the other tests' clients use) is left alone."""
    configuration = kube_client.Configuration()
    kube_config.load_kube_config(config_file=str(stack), client_configuration=configuration)
    backend = sdk_trainer.KubernetesBackendConfig(namespace=NAMESPACE, client_configuration=configuration)
    return sdk_trainer.TrainerClient(backend_config=backend)


def _train_mnist() -> None:  # the function the SDK ships to the pods; nothing runs it on simulated nodes
    print("training")


def _whole_flow(client: Any, name: str, want_steps: list[str]) -> None:
    """Running, then Complete, the steps the SDK lists from the pods, then delete: the TrainJob goes."""
    running = client.wait_for_job_status(name, status={"Running"}, timeout=180, polling_interval=1)
    assert running.status == "Running"
    done = client.wait_for_job_status(name, status={"Complete"}, timeout=180, polling_interval=1)
    assert done.status == "Complete"
    job = client.get_job(name)
    assert job.status == "Complete"
    assert sorted(step.name for step in job.steps) == sorted(want_steps), job.steps
    assert {step.status for step in job.steps} == {"Succeeded"}, job.steps
    assert all(step.pod_name.startswith(f"{name}-") for step in job.steps), job.steps
    client.delete_job(name)
    deadline = time.monotonic() + 60
    while any(j.name == name for j in client.list_jobs()):
        assert time.monotonic() < deadline, f"TrainJob {name} still listed after delete_job"
        time.sleep(0.5)


def test_custom_trainer_runs_to_complete_through_the_sdk(client: Any) -> None:
    runtime = client.get_runtime(CUSTOM_RUNTIME)
    trainer = sdk_trainer.CustomTrainer(func=_train_mnist, num_nodes=2)
    name = client.train(runtime=runtime, trainer=trainer)
    _whole_flow(client, name, ["node-0", "node-1"])


def _has_default_storage_class(kubeconfig: Path) -> bool:
    with new_api_client(kubeconfig) as api:
        classes = kube_client.StorageV1Api(api).list_storage_class().items
    key = "storageclass.kubernetes.io/is-default-class"
    return any((c.metadata.annotations or {}).get(key) == "true" for c in classes)


def test_builtin_trainer_runs_to_complete_through_the_sdk(client: Any, stack: Path) -> None:
    if not _has_default_storage_class(stack):
        pytest.skip(
            f"{BUILTIN_RUNTIME} claims a volume (volumeClaimPolicies) and this simulated cluster has no default "
            "StorageClass: its initializer pods would stay Pending with an unbound PersistentVolumeClaim"
        )
    runtime = client.get_runtime(BUILTIN_RUNTIME)
    trainer = sdk_trainer.BuiltinTrainer(config=sdk_trainer.TorchTuneConfig(num_nodes=1))
    name = client.train(runtime=runtime, trainer=trainer)
    _whole_flow(client, name, ["dataset-initializer", "model-initializer", "node-0"])
