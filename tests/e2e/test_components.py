"""Components beyond the JobSet, on the real servers: MPI Secret and hostfile, snapshots, deadlines.

These reuse the pipeline started in test_pipeline.py's module fixture style: one Stack per module.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import pytest
from kubernetes import dynamic
from kubernetes.dynamic.exceptions import NotFoundError

from contracts import streams
from tjpipe.local.stack import Stack

from .support import TRAINER, condition_of, create, eventually, get

pytestmark = [pytest.mark.cluster, pytest.mark.nats]


def job(name: str, namespace: str, runtime: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": TRAINER,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"runtimeRef": {"name": runtime}, **spec},
    }


async def _stream_bytes(stack: Stack) -> bytes:
    """Every message body and header in every pipeline stream, concatenated."""
    nc = await stack.connect()
    js = nc.jetstream()
    collected = bytearray()
    try:
        for spec in streams.ALL_STREAMS:
            info = await js.stream_info(spec.name)
            for seq in range(info.state.first_seq, info.state.last_seq + 1):
                try:
                    msg = await js.get_msg(spec.name, seq)
                except Exception:
                    continue
                collected += msg.data or b""
                collected += repr(msg.headers).encode()
    finally:
        await nc.close()
    return bytes(collected)


async def test_mpi_secret_is_generated_by_the_applier_and_never_on_the_bus(
    pipeline: Stack, dyn: dynamic.DynamicClient, namespace: str
) -> None:
    create(dyn, job("ds", namespace, "deepspeed-distributed", trainer={"numNodes": 3}))
    secret = eventually(lambda: get(dyn, "v1", "Secret", namespace, "ds-mpi-ssh-auth"), what="the SSH Secret")
    assert secret["type"] == "kubernetes.io/ssh-auth"
    assert secret["immutable"] is True
    private = base64.b64decode(secret["data"]["ssh-privatekey"])
    public = base64.b64decode(secret["data"]["ssh-publickey"])
    assert private.startswith(b"-----BEGIN EC " + b"PRIVATE KEY-----")  # split: no key-like text in the repo
    assert public.startswith(b"ecdsa-sha2-nistp521 ")
    hostfile = eventually(lambda: get(dyn, "v1", "ConfigMap", namespace, "ds-mpi-hostfile"), what="the hostfile")
    assert hostfile["data"]["hostfile"].splitlines() == [
        # Replicated-job order of the runtime (node, then launcher); the launcher runs as a node here.
        f"ds-{rj}-0-{i}.ds slots=1"
        for rj, i in (("node", 0), ("node", 1), ("launcher", 0))
    ]
    eventually(lambda: get(dyn, "jobset.x-k8s.io/v1alpha2", "JobSet", namespace, "ds"), what="the JobSet")
    # The key exists only in the Secret: no stream holds it, in any form.
    recorded = await _stream_bytes(pipeline)
    assert b"PRIVATE KEY" not in recorded
    assert secret["data"]["ssh-privatekey"].encode() not in recorded
    assert private.split(b"\n")[1] not in recorded


def test_a_component_deleted_or_edited_by_hand_is_made_again(
    pipeline: Stack, dyn: dynamic.DynamicClient, namespace: str
) -> None:
    """Drift repair of what an event does not carry. The MPI hostfile (a ConfigMap the watcher follows),
    edited by hand, is put back at once: the TrainJob and its JobSet are as they were, so only the
    ConfigMap's own version tells this observation from the last, and without it the stream would take the
    repair for a repeat. The SSH Secret, which nothing here may watch (contracts.components), deleted by
    hand, is made again the next time its TrainJob is planned."""
    create(dyn, job("drift", namespace, "deepspeed-distributed", trainer={"numNodes": 2}))
    trainjobs = dyn.resources.get(api_version=TRAINER, kind="TrainJob")
    secrets = dyn.resources.get(api_version="v1", kind="Secret")
    config_maps = dyn.resources.get(api_version="v1", kind="ConfigMap")
    old = eventually(lambda: get(dyn, "v1", "Secret", namespace, "drift-mpi-ssh-auth"), what="the SSH Secret")
    hostfile = eventually(lambda: get(dyn, "v1", "ConfigMap", namespace, "drift-mpi-hostfile"), what="the hostfile")
    eventually(lambda: get(dyn, "jobset.x-k8s.io/v1alpha2", "JobSet", namespace, "drift"), what="the JobSet")
    planned = hostfile["data"]["hostfile"]

    for attempt in ("elsewhere slots=8\n", "elsewhere slots=16\n"):  # the second edit is no repeat of the first
        config_maps.patch(
            namespace=namespace,
            name="drift-mpi-hostfile",
            body={"data": {"hostfile": attempt}},
            content_type="application/merge-patch+json",
        )
        eventually(
            lambda: get(dyn, "v1", "ConfigMap", namespace, "drift-mpi-hostfile")["data"]["hostfile"] == planned,
            what=f"the hostfile edited by hand ({attempt.strip()}) put back",
        )

    secrets.delete(namespace=namespace, name="drift-mpi-ssh-auth")
    trainjobs.patch(
        namespace=namespace,
        name="drift",
        body={"metadata": {"labels": {"touched": "yes"}}},
        content_type="application/merge-patch+json",
    )

    def secret_again() -> dict[str, Any] | None:
        try:
            secret: dict[str, Any] = get(dyn, "v1", "Secret", namespace, "drift-mpi-ssh-auth")
        except NotFoundError:
            return None
        return secret if secret["metadata"]["uid"] != old["metadata"]["uid"] else None

    again = eventually(secret_again, what="the deleted SSH Secret made again once its TrainJob is planned")
    assert again["type"] == "kubernetes.io/ssh-auth" and again["data"]["ssh-privatekey"]


def test_runtime_snapshot_keeps_the_job_on_the_runtime_it_started_with(
    pipeline: Stack, dyn: dynamic.DynamicClient, namespace: str
) -> None:
    create(dyn, job("snap", namespace, "torch-distributed", suspend=True))
    snapshot = eventually(
        lambda: get(dyn, "v1", "ConfigMap", namespace, "snap-runtime-snapshot"), what="the runtime snapshot"
    )
    assert "kind: ClusterTrainingRuntime" in snapshot["data"]["runtime"]
    assert snapshot["metadata"]["ownerReferences"][0]["kind"] == "TrainJob"
    eventually(lambda: get(dyn, "jobset.x-k8s.io/v1alpha2", "JobSet", namespace, "snap"), what="the JobSet")


def test_missing_runtime_is_reported_then_built_once_it_exists(
    pipeline: Stack, dyn: dynamic.DynamicClient, namespace: str
) -> None:
    create(dyn, job("late", namespace, "late-runtime", trainer={"numNodes": 1}))
    cond = eventually(
        lambda: condition_of(get(dyn, TRAINER, "TrainJob", namespace, "late"), "ResourcesCreated"),
        what="the ResourcesCreated condition",
    )
    assert (cond["status"], cond["reason"]) == ("False", "RuntimeNotFound")
    runtime = dyn.resources.get(api_version=TRAINER, kind="ClusterTrainingRuntime").get(name="torch-distributed")
    body = runtime.to_dict()
    body["metadata"] = {"name": "late-runtime"}
    dyn.resources.get(api_version=TRAINER, kind="ClusterTrainingRuntime").create(body=body)
    eventually(lambda: get(dyn, "jobset.x-k8s.io/v1alpha2", "JobSet", namespace, "late"), what="the JobSet")
    cond = eventually(
        lambda: (
            (c := condition_of(get(dyn, TRAINER, "TrainJob", namespace, "late"), "ResourcesCreated"))
            and c["status"] == "True"
            and c
        ),
        what="ResourcesCreated=True",
    )
    assert cond["reason"] == "ResourcesCreated"


def test_a_runtime_made_just_after_its_trainjob_is_waited_for(
    pipeline: Stack, dyn: dynamic.DynamicClient, namespace: str
) -> None:
    """Applied together, a TrainJob can reach the watcher before its runtime does. Trainer's reconcile fails
    and is retried, and the TrainJob says nothing of it; the watcher holds the new TrainJob for its runtime a
    moment (watcher.service.RUNTIME_HOLD_SECONDS), so no RuntimeNotFound is reported in between either."""
    create(dyn, job("together", namespace, "together-runtime", trainer={"numNodes": 1}))
    time.sleep(1.5)  # long enough for a RuntimeNotFound to be written, well inside the hold
    runtimes = dyn.resources.get(api_version=TRAINER, kind="ClusterTrainingRuntime")
    body = runtimes.get(name="torch-distributed").to_dict()
    body["metadata"] = {"name": "together-runtime"}
    runtimes.create(body=body)
    try:
        eventually(lambda: get(dyn, "jobset.x-k8s.io/v1alpha2", "JobSet", namespace, "together"), what="the JobSet")
        time.sleep(1.0)  # a status write would follow the JobSet closely
        trainjob = get(dyn, TRAINER, "TrainJob", namespace, "together")
        assert condition_of(trainjob, "ResourcesCreated") is None, trainjob.get("status")
    finally:
        runtimes.delete(name="together-runtime")


def test_deadline_fails_the_job_and_deletes_its_jobset(
    pipeline: Stack, dyn: dynamic.DynamicClient, namespace: str
) -> None:
    create(dyn, job("short", namespace, "torch-distributed", activeDeadlineSeconds=4))
    eventually(lambda: get(dyn, "jobset.x-k8s.io/v1alpha2", "JobSet", namespace, "short"), what="the JobSet")
    cond = eventually(
        lambda: condition_of(get(dyn, TRAINER, "TrainJob", namespace, "short"), "Failed"),
        timeout=30,
        what="the DeadlineExceeded condition",
    )
    assert (cond["status"], cond["reason"]) == ("True", "DeadlineExceeded")

    def jobset_gone() -> bool:
        """Gone is the apiserver's 404 and nothing else: any other error is raised, not taken for gone."""
        try:
            get(dyn, "jobset.x-k8s.io/v1alpha2", "JobSet", namespace, "short")
        except NotFoundError:
            return True
        return False

    eventually(jobset_gone, what="the JobSet to be deleted")
    time.sleep(2)
    assert jobset_gone(), "a failed job must not be rebuilt"


def test_invalid_trainjob_fails_with_the_reasons(pipeline: Stack, dyn: dynamic.DynamicClient, namespace: str) -> None:
    create(
        dyn,
        job("bad", namespace, "torch-distributed", trainer={"env": [{"name": "PET_NNODES", "value": "9"}]}),
    )
    cond = eventually(
        lambda: condition_of(get(dyn, TRAINER, "TrainJob", namespace, "bad"), "Failed"), what="the Failed condition"
    )
    assert cond["reason"] == "ValidationFailed"
    assert "PET_NNODES" in cond["message"]
