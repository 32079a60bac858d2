"""The whole path on real servers: watcher → NATS → planner → NATS → applier → kube-apiserver.

The three services run as subprocesses started by the same Stack object ``tjpipe up`` uses, against the
session's nats-server and kube-apiserver (or the servers NATS_URL and KUBECONFIG name).
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import dynamic

from tjpipe.local import crds
from tjpipe.local.stack import Stack

from .support import TRAINER, condition_of, create, eventually, get

pytestmark = [pytest.mark.cluster, pytest.mark.nats]

RANK_REF = "metadata.annotations['batch.kubernetes.io/job-completion-index']"


def trainjob(name: str, namespace: str, *, suspend: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": TRAINER,
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "suspend": suspend,
            "trainer": {
                "numNodes": 2,
                "image": "example.com/train:1.0",
                "command": ["torchrun"],
                "args": ["train.py", "--epochs", "3"],
                "env": [{"name": "LR", "value": "0.1"}],
                "resourcesPerNode": {"requests": {"cpu": "3", "memory": "2Gi"}},
            },
        },
    }


def test_trainjob_gets_the_jobset_trainer_would_build(
    pipeline: Stack, dyn: dynamic.DynamicClient, namespace: str
) -> None:
    created = create(dyn, trainjob("mnist", namespace))
    jobset = eventually(lambda: get(dyn, "jobset.x-k8s.io/v1alpha2", "JobSet", namespace, "mnist"), what="the JobSet")

    runtime = crds.shipped_runtimes()["torch-distributed"]
    runtime_job = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    spec = jobset["spec"]
    assert spec["suspend"] is False
    assert [rj["name"] for rj in spec["replicatedJobs"]] == ["node"]
    rjob = spec["replicatedJobs"][0]
    assert rjob["replicas"] == 1
    assert rjob["template"]["metadata"]["labels"] == runtime_job["template"]["metadata"]["labels"]
    job_spec = rjob["template"]["spec"]
    assert job_spec["parallelism"] == 2
    assert job_spec["completions"] == 2
    containers = job_spec["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["node"]
    node = containers[0]
    assert node["image"] == "example.com/train:1.0"
    assert node["command"] == ["torchrun"]
    assert node["args"] == ["train.py", "--epochs", "3"]
    assert node["env"] == [
        {"name": "LR", "value": "0.1"},
        {"name": "PET_NNODES", "value": "2"},
        {"name": "PET_NPROC_PER_NODE", "value": "3"},
        {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": RANK_REF}}},
        {"name": "PET_MASTER_ADDR", "value": "mnist-node-0-0.mnist"},
        {"name": "PET_MASTER_PORT", "value": "29500"},
    ]
    assert node["ports"] == [{"containerPort": 29500, "protocol": "TCP"}]
    assert node["resources"]["requests"] == {"cpu": "3", "memory": "2Gi"}

    (owner,) = jobset["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": TRAINER,
        "kind": "TrainJob",
        "name": "mnist",
        "uid": created["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    managers = {(m["manager"], m["operation"]) for m in jobset["metadata"]["managedFields"]}
    assert ("trainer", "Apply") in managers
    assert managers == {("trainer", "Apply")}


def test_suspend_gives_a_suspended_jobset_and_condition_then_resume(
    pipeline: Stack, dyn: dynamic.DynamicClient, namespace: str
) -> None:
    create(dyn, trainjob("paused", namespace, suspend=True))
    eventually(
        lambda: get(dyn, "jobset.x-k8s.io/v1alpha2", "JobSet", namespace, "paused")["spec"]["suspend"] is True,
        what="a suspended JobSet",
    )
    cond = eventually(
        lambda: condition_of(get(dyn, TRAINER, "TrainJob", namespace, "paused"), "Suspended"),
        what="the Suspended condition",
    )
    assert (cond["status"], cond["reason"], cond["message"]) == ("True", "Suspended", "TrainJob is suspended")

    trainjobs = dyn.resources.get(api_version=TRAINER, kind="TrainJob")
    trainjobs.patch(
        namespace=namespace,
        name="paused",
        body={"spec": {"suspend": False}},
        content_type="application/merge-patch+json",
    )
    eventually(
        lambda: get(dyn, "jobset.x-k8s.io/v1alpha2", "JobSet", namespace, "paused")["spec"]["suspend"] is False,
        what="the JobSet to resume",
    )
    cond = eventually(
        lambda: (
            (c := condition_of(get(dyn, TRAINER, "TrainJob", namespace, "paused"), "Suspended"))
            and c["status"] == "False"
            and c
        ),
        what="the Resumed condition",
    )
    assert (cond["reason"], cond["message"]) == ("Resumed", "TrainJob is resumed")
    tj = get(dyn, TRAINER, "TrainJob", namespace, "paused")
    status_managers = {
        (m["manager"], m["operation"], m.get("subresource"))
        for m in tj["metadata"]["managedFields"]
        if m.get("subresource") == "status"
    }
    assert status_managers == {("trainer", "Apply", "status")}


def test_completed_jobset_makes_the_trainjob_complete(
    pipeline: Stack, dyn: dynamic.DynamicClient, namespace: str
) -> None:
    create(dyn, trainjob("done", namespace))
    eventually(lambda: get(dyn, "jobset.x-k8s.io/v1alpha2", "JobSet", namespace, "done"), what="the JobSet")
    jobsets = dyn.resources.get(api_version="jobset.x-k8s.io/v1alpha2", kind="JobSet")
    jobsets.status.patch(
        namespace=namespace,
        name="done",
        body={
            "status": {
                "conditions": [
                    {
                        "type": "Completed",
                        "status": "True",
                        "reason": "AllJobsCompleted",
                        "message": "jobset completed successfully",
                        "lastTransitionTime": "2026-11-29T12:00:00Z",
                    }
                ],
                "replicatedJobsStatus": [
                    {"name": "node", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0}
                ],
            }
        },
        content_type="application/merge-patch+json",
    )
    cond = eventually(
        lambda: condition_of(get(dyn, TRAINER, "TrainJob", namespace, "done"), "Complete"),
        what="the Complete condition",
    )
    assert (cond["status"], cond["reason"], cond["message"]) == (
        "True",
        "AllJobsCompleted",
        "jobset completed successfully",
    )
    assert cond["lastTransitionTime"] == "2026-11-29T12:00:00Z"
    status = get(dyn, TRAINER, "TrainJob", namespace, "done")["status"]
    assert status["jobsStatus"] == [
        {"name": "node", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0}
    ]


async def test_undecodable_messages_are_dead_lettered_and_the_pipeline_goes_on(
    pipeline: Stack, dyn: dynamic.DynamicClient, namespace: str
) -> None:
    from contracts import subjects
    from contracts.messages import decode_dead_letter

    nc = await pipeline.connect()
    try:
        js = nc.jetstream()
        # Signed as the stages sign: genuine messages whose content is garbage.
        for subject, data in (
            (subjects.event_subject(namespace, "garbage"), b"{not json"),
            (subjects.apply_subject(namespace, "garbage", "jobset"), b'{"component": "nope"}'),
        ):
            await js.publish(subject, data, headers=pipeline.sign_headers(subject, data))
        sub = await js.subscribe(f"{subjects.DLQ_PREFIX}.*.{namespace}.garbage", ordered_consumer=True)
        letters = [decode_dead_letter((await sub.next_msg(timeout=20)).data) for _ in range(2)]
        by_stage = {letter.stage: letter for letter in letters}
        assert by_stage["planner"].payload == b"{not json"
        assert by_stage["planner"].reason == "undecodable"
        assert by_stage["applier"].payload == b'{"component": "nope"}'
        assert by_stage["applier"].subject == subjects.apply_subject(namespace, "garbage", "jobset")
    finally:
        await nc.close()

    create(dyn, trainjob("after-garbage", namespace))
    eventually(
        lambda: get(dyn, "jobset.x-k8s.io/v1alpha2", "JobSet", namespace, "after-garbage"),
        what="a JobSet for a TrainJob created after the bad messages",
    )
