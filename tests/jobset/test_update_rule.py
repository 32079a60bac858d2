"""Upstream #3008 against a real apiserver: JobSet's update rule, installed as a ValidatingAdmissionPolicy.

Our apiserver has no JobSet webhook. ``tjpipe.local.jobset_policy`` writes the webhook's update rule as a
ValidatingAdmissionPolicy, and this test installs it, bound only to the test's namespace. With the rule in
place, two ways of resuming the same suspended TrainJob, whose runtime patch adds a volume, give opposite
results. Trainer re-applies the whole JobSet, and the apiserver rejects it. The planner plans against the
live JobSet, so only the mutable fields change, and the apiserver accepts it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException

from tjpipe.contracts import messages as m
from tjpipe.contracts.jobset import JobSet
from tjpipe.contracts.trainer import TrainingRuntime, TrainJob
from tjpipe.local.crds import APPLY_PATCH_CONTENT_TYPE, apply_objects, crd_manifests, shipped_runtimes
from tjpipe.local.jobset_policy import (
    MESSAGE_JOB_NAMES,
    MESSAGE_MANAGED_BY,
    MESSAGE_REPLICATED_JOBS,
    POLICY_NAME,
    jobset_update_policy,
)
from tjpipe.planner.core import plan

if TYPE_CHECKING:
    from conftest import KubeCluster

Obj = dict[str, Any]

JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
TRAINJOB = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
JOBSET_CRD = "jobsets.jobset.x-k8s.io"
RUNTIME = "torch-distributed"
NAME = "resume"
TRAINER_MANAGER = "trainer"
USER_MANAGER = "tjpipe-test-user"
POLICY_MANAGER = "tjpipe-test-setup"
PATCH_MANAGER = "example.com/platform"
ENFORCED_WITHIN_SECONDS = 20.0

POD_SPEC = "spec.replicatedJobs[0].template.spec.template.spec"
POD_METADATA = "spec.replicatedJobs[0].template.spec.template.metadata"
NODE_SELECTOR = {"example.com/pool": "a100"}
SCRATCH_VOLUME = {"name": "scratch", "emptyDir": {}}


# --- requests -------------------------------------------------------------------------------------------


def _apply(api_client: kube_client.ApiClient, obj: Obj, *, manager: str, dry_run: bool = False) -> Obj:
    """Server-side apply one namespaced custom object (force, like Trainer), returning what the server stored."""
    group, version, plural = JOBSET if obj["kind"] == "JobSet" else TRAINJOB
    # Unparsed: the generated client does not deserialize an apply response into a dict.
    response: Any = kube_client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        group,
        version,
        obj["metadata"]["namespace"],
        plural,
        obj["metadata"]["name"],
        obj,
        field_manager=manager,
        force=True,
        dry_run="All" if dry_run else None,
        _content_type=APPLY_PATCH_CONTENT_TYPE,
        _preload_content=False,
    )
    stored: Obj = json.loads(response.data)
    return stored


def _get(api_client: kube_client.ApiClient, resource: tuple[str, str, str], namespace: str, name: str) -> Obj:
    stored = kube_client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        *resource[:2], namespace, resource[2], name
    )
    assert isinstance(stored, dict)
    return stored


def _denial(call: Callable[[], object]) -> str:
    """The message of the 422 Invalid the call must fail with."""
    with pytest.raises(ApiException) as caught:
        call()
    assert caught.value.status == 422, caught.value.body
    status = json.loads(caught.value.body or "{}")
    assert status["reason"] == "Invalid", status
    message: str = status["message"]
    assert f"ValidatingAdmissionPolicy '{POLICY_NAME}'" in message, message
    return message


def _changed(message: str) -> list[str]:
    """The paths a denial of spec.replicatedJobs names."""
    _, found, paths = message.partition(": changed ")
    assert found, message
    return paths.split(", ")


@contextmanager
def _update_rule(api_client: kube_client.ApiClient, namespace: str, probe: Callable[[], object]) -> Iterator[None]:
    """JobSet's update rule, bound to ``namespace`` only, from once ``probe`` is denied until the block ends."""
    (crd,) = [c for c in crd_manifests(progress=lambda _line: None) if c["metadata"]["name"] == JOBSET_CRD]
    admission = kube_client.AdmissionregistrationV1Api(api_client)
    try:
        apply_objects(api_client, jobset_update_policy(crd, namespace=namespace), field_manager=POLICY_MANAGER)
        # The admission plugin picks a new policy and binding up from its informers a moment later.
        deadline = time.monotonic() + ENFORCED_WITHIN_SECONDS
        while True:
            try:
                probe()
            except ApiException as error:
                if error.status == 422 and POLICY_NAME in (error.body or ""):
                    break
                raise
            if time.monotonic() > deadline:
                pytest.fail(f"{POLICY_NAME} not enforced within {ENFORCED_WITHIN_SECONDS:.0f}s")
            time.sleep(0.2)
        yield
    finally:
        for delete in (
            admission.delete_validating_admission_policy_binding,
            admission.delete_validating_admission_policy,
        ):
            try:
                delete(POLICY_NAME)
            except ApiException as error:
                if error.status != 404:
                    raise


# --- the planner ----------------------------------------------------------------------------------------


def _trainjob(namespace: str, *, suspend: bool, patched: bool) -> Obj:
    """The TrainJob as its user applies it; the patch adds a volume (immutable) and a nodeSelector (mutable)."""
    spec: Obj = {"runtimeRef": {"name": RUNTIME}, "suspend": suspend}
    if patched:
        pod_spec = {"nodeSelector": NODE_SELECTOR, "volumes": [SCRATCH_VOLUME]}
        node = {"name": "node", "template": {"spec": {"template": {"spec": pod_spec}}}}
        spec["runtimePatches"] = [
            {
                "manager": PATCH_MANAGER,
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node]}}},
            }
        ]
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": spec,
    }


def _planned_jobset(trainjob: Obj, live: Obj | None) -> tuple[Obj, tuple[str, ...]]:
    """The JobSet the planner applies for ``trainjob`` (as stored), given the live JobSet; and its warnings."""
    event = m.TrainJobObserved(
        trainjob=msgspec.convert(trainjob, TrainJob),
        runtime=msgspec.convert(shipped_runtimes()[RUNTIME], TrainingRuntime),
        runtime_source="snapshot",
        jobset=None if live is None else msgspec.convert(live, JobSet),
        observed_at=time.time(),
    )
    result = plan(event, source_seq=1)
    (message,) = [a for a in result.applies if isinstance(a, m.ApplyJobSet)]
    assert message.field_manager == TRAINER_MANAGER and message.force
    wire: Obj = json.loads(msgspec.json.encode(message.object))
    return wire, result.warnings


def _pod_spec(jobset: Obj) -> Obj:
    spec: Obj = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return spec


# --- the test -------------------------------------------------------------------------------------------


@pytest.mark.cluster
def test_resume_keeps_within_jobsets_update_rule(kube: KubeCluster, namespace: str) -> None:
    with kube.api_client() as api_client:
        suspended = _apply(api_client, _trainjob(namespace, suspend=True, patched=False), manager=USER_MANAGER)
        created, _ = _planned_jobset(suspended, live=None)
        assert created["spec"]["suspend"] is True
        live = _apply(api_client, created, manager=TRAINER_MANAGER)

        # A known-bad update, sent as a dry run so nothing changes while we wait for enforcement.
        new_image = json.loads(json.dumps(created))
        _pod_spec(new_image)["containers"][0]["image"] = "example.com/other:1"

        def change_image() -> object:
            return _apply(api_client, new_image, manager=TRAINER_MANAGER, dry_run=True)

        with _update_rule(api_client, namespace, change_image):
            message = _denial(change_image)
            assert f"{MESSAGE_REPLICATED_JOBS} (while suspended" in message
            assert _changed(message) == [f"{POD_SPEC}.containers"]
            # Pod template metadata other than labels and annotations is immutable too. (`namespace` is a CEL
            # reserved word; an escaped `__namespace__` would never match at admission time.)
            moved = json.loads(json.dumps(created))
            moved["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"] = {"namespace": "other"}
            message = _denial(lambda: _apply(api_client, moved, manager=TRAINER_MANAGER, dry_run=True))
            assert _changed(message) == [f"{POD_METADATA}.namespace"]

            # The user resumes the TrainJob, with a runtime patch that adds a volume and a nodeSelector.
            resumed = _apply(api_client, _trainjob(namespace, suspend=False, patched=True), manager=USER_MANAGER)

            # Trainer: the whole desired JobSet, built without regard to the live one. Denied: the bug.
            trainers, _ = _planned_jobset(resumed, live=None)
            assert trainers["spec"]["suspend"] is False
            assert SCRATCH_VOLUME in _pod_spec(trainers)["volumes"]
            message = _denial(lambda: _apply(api_client, trainers, manager=TRAINER_MANAGER))
            assert _changed(message) == [f"{POD_SPEC}.volumes"]  # not nodeSelector: the old JobSet is suspended
            still = _get(api_client, JOBSET, namespace, NAME)
            assert still["spec"]["suspend"] is True
            assert still["metadata"]["resourceVersion"] == live["metadata"]["resourceVersion"]

            # The planner: plans against the live JobSet, so only the mutable fields change. Accepted.
            ours, warnings = _planned_jobset(resumed, live=still)
            assert any(f"{POD_SPEC}.volumes" in warning for warning in warnings), warnings
            _apply(api_client, ours, manager=TRAINER_MANAGER)
            running = _get(api_client, JOBSET, namespace, NAME)
            assert running["spec"]["suspend"] is False
            assert _pod_spec(running)["nodeSelector"] == NODE_SELECTOR
            assert "volumes" not in _pod_spec(running)
            assert _pod_spec(running)["containers"] == _pod_spec(still)["containers"]

            # The rule itself, now that neither side is suspended: any change to the replicated jobs is
            # denied, even a pod label; an identical re-apply is not.
            relabelled = json.loads(json.dumps(ours))
            template = relabelled["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
            template.setdefault("metadata", {}).setdefault("labels", {})["example.com/team"] = "b"
            message = _denial(lambda: _apply(api_client, relabelled, manager=TRAINER_MANAGER, dry_run=True))
            assert f"{MESSAGE_REPLICATED_JOBS} (the JobSet is not suspended)" in message
            assert _changed(message) == [f"{POD_METADATA}.labels"]

            again = _apply(api_client, ours, manager=TRAINER_MANAGER)
            assert again["metadata"]["resourceVersion"] == running["metadata"]["resourceVersion"]

            # The other two parts of the rule: the set of replicated jobs, and spec.managedBy.
            extra_job = json.loads(json.dumps(ours))
            extra_job["spec"]["replicatedJobs"].append({**extra_job["spec"]["replicatedJobs"][0], "name": "extra"})
            message = _denial(lambda: _apply(api_client, extra_job, manager=TRAINER_MANAGER, dry_run=True))
            assert MESSAGE_JOB_NAMES in message
            managed = json.loads(json.dumps(ours))
            managed["spec"]["managedBy"] = "example.com/other-controller"
            message = _denial(lambda: _apply(api_client, managed, manager=TRAINER_MANAGER, dry_run=True))
            assert MESSAGE_MANAGED_BY in message
