"""The admission webhook's AdmissionReview handling, over real HTTP (aiohttp's test server, no TLS), with the
API server reads answered by a stub: allowed and denied reviews, the uid echoed, Trainer's messages, the
update-only runtimePatches rule, and a malformed review answered with HTTP 400."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from aiohttp.test_utils import TestClient, TestServer

from contracts.resources import Resource
from planner import admission
from planner.webhook import Webhook
from plumbing.kube import RawList

from .builders import only_object, pod_set, replicated_job, runtime_dict, trainjob_dict, trainjob_observed

Obj = dict[str, Any]

RUNTIME = runtime_dict([pod_set("node", "trainer")], name="torch-distributed", ml_policy={"numNodes": 1, "torch": {}})


class StubKube:
    """Answers ``KubeClient.get`` from a dict keyed by (plural, namespace, name); records what was read."""

    def __init__(self, objects: dict[tuple[str, str | None, str], Obj]) -> None:
        self.objects = objects
        self.reads: list[tuple[str, str | None, str]] = []

    async def get(self, resource: Resource, *, namespace: str | None, name: str) -> bytes | None:
        self.reads.append((resource.plural, namespace, name))
        found = self.objects.get((resource.plural, namespace, name))
        return json.dumps(found).encode() if found is not None else None

    async def list_pages(self, resource: Resource, **_: Any) -> AsyncIterator[RawList]:
        self.reads.append((resource.plural, None, "*"))
        items = [json.dumps(o).encode() for (plural, _, _), o in self.objects.items() if plural == resource.plural]
        yield RawList(items=[msgspec.Raw(i) for i in items])


@pytest.fixture
async def kube() -> StubKube:
    return StubKube({("clustertrainingruntimes", None, "torch-distributed"): RUNTIME})


@pytest.fixture
async def client(kube: StubKube) -> AsyncIterator[TestClient[Any, Any]]:
    async with TestClient(TestServer(Webhook(kube).app())) as c:  # type: ignore[arg-type]
        yield c


def review(obj: Obj, *, operation: str = "CREATE", old: Obj | None = None, uid: str | None = None) -> Obj:
    kind = obj["kind"]
    request: Obj = {
        "uid": uid or str(uuid.uuid4()),
        "kind": {"group": "trainer.kubeflow.org", "version": "v1alpha1", "kind": kind},
        "resource": {"group": "trainer.kubeflow.org", "version": "v1alpha1", "resource": kind.lower() + "s"},
        "operation": operation,
        "name": obj["metadata"]["name"],
        "namespace": obj["metadata"].get("namespace", ""),
        "object": obj,
    }
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def job(trainer: Obj | None = None, **spec: Any) -> Obj:
    return trainjob_dict(trainer, name="mnist", namespace="team-a", runtime="torch-distributed", spec=spec)


async def post(client: TestClient[Any, Any], path: str, body: Obj) -> Obj:
    resp = await client.post(path, json=body)
    assert resp.status == 200, await resp.text()
    answer: Obj = await resp.json()
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    return answer["response"]  # type: ignore[no-any-return]


async def test_a_valid_trainjob_is_allowed_and_the_uid_echoed(client: TestClient[Any, Any]) -> None:
    body = review(job({"numNodes": 2}), uid="0b5c1e9a-1111-4222-8333-444455556666")
    response = await post(client, admission.PATH_TRAINJOB, body)
    assert response == {"uid": "0b5c1e9a-1111-4222-8333-444455556666", "allowed": True}


async def test_reserved_env_and_zero_nodes_are_denied_with_trainers_messages(client: TestClient[Any, Any]) -> None:
    body = review(job({"numNodes": 0, "env": [{"name": "PET_NNODES", "value": "3"}]}))
    response = await post(client, admission.PATH_TRAINJOB, body)
    assert response["uid"] == body["request"]["uid"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["message"] == (
        "[spec.trainer.numNodes: Invalid value: 0: must be greater than or equal to 1, "
        'spec.trainer.env: Invalid value: [{"name":"PET_NNODES","value":"3"}]: '
        "must not have reserved envs, invalid envs configured: [PET_NNODES]]"
    )


async def test_a_missing_runtime_is_denied_as_trainer_words_it(client: TestClient[Any, Any]) -> None:
    body = review(trainjob_dict(None, name="mnist", namespace="team-a", runtime="nowhere"))
    response = await post(client, admission.PATH_TRAINJOB, body)
    assert response["status"]["message"] == (
        'spec.RuntimeRef: Invalid value: {"name":"nowhere"}: '
        'clustertrainingruntimes.trainer.kubeflow.org "nowhere" not found: '
        "specified clusterTrainingRuntime must be created before the TrainJob is created"
    )


async def test_an_unsupported_runtime_kind_is_denied(client: TestClient[Any, Any]) -> None:
    obj = job()
    obj["spec"]["runtimeRef"] = {"name": "x", "kind": "Other", "apiGroup": "example.com"}
    response = await post(client, admission.PATH_TRAINJOB, review(obj))
    assert response["status"]["message"] == "unsupported runtime: Other.example.com"


PATCH = {"manager": "example.com/tool", "trainingRuntimeSpec": {"template": {"metadata": {"labels": {"a": "b"}}}}}


async def test_runtime_patches_may_change_only_while_suspended(client: TestClient[Any, Any], kube: StubKube) -> None:
    running, patched = job({"numNodes": 1}), job({"numNodes": 1}, runtimePatches=[PATCH])
    response = await post(client, admission.PATH_TRAINJOB, review(patched, operation="UPDATE", old=running))
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "spec.runtimePatches: Forbidden: RuntimePatches can only be modified when the TrainJob is suspended "
        "before or after the update"
    )
    # Suspended: allowed once the JobSet (read only now) has no active job.
    kube.reads.clear()
    suspended = job({"numNodes": 1}, suspend=True, runtimePatches=[PATCH])
    response = await post(client, admission.PATH_TRAINJOB, review(suspended, operation="UPDATE", old=running))
    assert response["allowed"] is True
    assert ("jobsets", "team-a", "mnist") in kube.reads


async def test_runtime_patches_refused_while_the_jobset_has_active_jobs(
    client: TestClient[Any, Any], kube: StubKube
) -> None:
    kube.objects[("jobsets", "team-a", "mnist")] = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "mnist", "namespace": "team-a"},
        "status": {"replicatedJobsStatus": [{"name": "node", "active": 2, "ready": 2}]},
    }
    old, new = job(suspend=False), job(suspend=True, runtimePatches=[PATCH])
    response = await post(client, admission.PATH_TRAINJOB, review(new, operation="UPDATE", old=old))
    assert response["status"]["message"] == (
        "spec.runtimePatches: Forbidden: RuntimePatches cannot be modified when the JobSet's ReplicatedJob node "
        "is still active"
    )


async def test_an_invalid_cluster_training_runtime_is_denied(client: TestClient[Any, Any]) -> None:
    bad = runtime_dict(
        [replicated_job("node", [{"name": "trainer", "image": "x"}], ancestor="trainer", replicas=2)],
        name="bad",
    )
    response = await post(client, admission.PATH_CLUSTER_TRAINING_RUNTIME, review(bad))
    assert response["allowed"] is False
    assert response["status"]["message"] == (
        "[spec.template.spec.replicatedJobs[0].replicas: Invalid value: 2: always must be 1, "
        "spec.template.spec.replicatedJobs[0].template.spec.template.spec.containers: "
        'Invalid value: [{"image":"x","name":"trainer"}]: '
        "must contain the required container for the ancestor: trainer]"
    )
    good = await post(client, admission.PATH_CLUSTER_TRAINING_RUNTIME, review(RUNTIME))
    assert good["allowed"] is True


async def test_delete_is_allowed_without_reading_anything(client: TestClient[Any, Any], kube: StubKube) -> None:
    response = await post(client, admission.PATH_TRAINJOB, review(job(), operation="DELETE"))
    assert response["allowed"] is True and kube.reads == []


@pytest.mark.parametrize(
    "body",
    [b"not json", b"{}", json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}).encode()],
)
async def test_a_malformed_review_gets_400(client: TestClient[Any, Any], body: bytes) -> None:
    for path in (admission.PATH_TRAINJOB, admission.PATH_CLUSTER_TRAINING_RUNTIME):
        resp = await client.post(path, data=body, headers={"Content-Type": "application/json"})
        assert resp.status == 400


async def test_volcano_priority_classes_are_read_and_checked(client: TestClient[Any, Any], kube: StubKube) -> None:
    runtime = runtime_dict(
        [
            replicated_job(
                "node", [{"name": "node", "image": "x"}], ancestor="trainer", pod={"priorityClassName": "gold"}
            )
        ],
        name="volcano",
        ml_policy={"numNodes": 1, "torch": {}},
        pod_group_policy={"volcano": {}},
    )
    kube.objects[("clustertrainingruntimes", None, "volcano")] = runtime
    obj = trainjob_dict(None, name="v", namespace="team-a", runtime="volcano")
    response = await post(client, admission.PATH_TRAINJOB, review(obj))
    assert response["status"]["message"] == (
        'spec.templateSpec.priorityClassName: PriorityClass "gold" doesn\'t exist: '
        'priorityclasses.scheduling.k8s.io "gold" not found'
    )
    kube.objects[("priorityclasses", None, "gold")] = {"metadata": {"name": "gold"}}
    assert (await post(client, admission.PATH_TRAINJOB, review(obj)))["allowed"] is True
    # A runtime without a Volcano policy does not list them.
    kube.reads.clear()
    await post(client, admission.PATH_TRAINJOB, review(job()))
    assert ("priorityclasses", None, "*") not in kube.reads


async def test_deprecated_cluster_runtime_warns_and_trainingruntime_updates_pass(
    client: TestClient[Any, Any], kube: StubKube
) -> None:
    deprecated = runtime_dict(
        [pod_set("node", "trainer")],
        name="old-torch",
        ml_policy={"numNodes": 1, "torch": {}},
        metadata={"labels": {"trainer.kubeflow.org/support": "deprecated"}},
    )
    created = await post(client, admission.PATH_CLUSTER_TRAINING_RUNTIME, review(deprecated))
    assert created["allowed"] is True
    assert created["warnings"] == [
        'ClusterTrainingRuntime "old-torch" is deprecated and will be removed in a future release of Kubeflow '
        f"Trainer. See runtime deprecation policy: {admission.RUNTIME_DEPRECATION_POLICY_URL}"
    ]
    kube.objects[("clustertrainingruntimes", None, "old-torch")] = deprecated
    obj = trainjob_dict(None, name="j", namespace="team-a", runtime="old-torch")
    referenced = await post(client, admission.PATH_TRAINJOB, review(obj))
    assert referenced["allowed"] is True
    assert referenced["warnings"][0].startswith('Referenced ClusterTrainingRuntime "old-torch" is deprecated')
    # Trainer's TrainingRuntime webhook checks creates only; an update of a broken one is admitted.
    broken = runtime_dict(
        [replicated_job("node", [{"name": "x", "image": "x"}], ancestor="trainer", replicas=2)],
        name="ns-runtime",
        kind="TrainingRuntime",
    )
    broken["metadata"]["namespace"] = "team-a"
    assert (await post(client, admission.PATH_TRAINING_RUNTIME, review(broken)))["allowed"] is False
    updated = await post(client, admission.PATH_TRAINING_RUNTIME, review(broken, operation="UPDATE", old=broken))
    assert updated["allowed"] is True


def test_the_planner_and_the_webhook_find_the_same_errors() -> None:
    """One implementation, two callers: what the webhook refuses is what the planner marks ValidationFailed."""
    from contracts import messages as m
    from contracts.trainer import TrainJob, decode_runtime
    from planner.core import FRAMEWORK, plan
    from planner.validation import admission_trainjob_errors

    obj = job({"numNodes": 0, "numProcPerNode": 0, "env": [{"name": "PET_NODE_RANK", "value": "1"}]})
    obj["metadata"]["uid"] = "u-1"
    failed = only_object(plan(trainjob_observed(obj, RUNTIME), source_seq=1), m.ApplyTrainJobStatus)
    [condition] = [c for c in failed["status"]["conditions"] if c["type"] == "Failed"]
    assert condition["reason"] == "ValidationFailed"
    errors = admission_trainjob_errors(msgspec.convert(obj, TrainJob), decode_runtime(json.dumps(RUNTIME)), FRAMEWORK)
    assert len(errors) == 3
    assert condition["message"] == "; ".join(str(e) for e in errors)
