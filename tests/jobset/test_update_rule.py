"""Upstream #3008 against JobSet v0.12.0's own validating webhook: Trainer's resume is refused, ours is not.

Two ways of resuming the same suspended TrainJob, whose runtime patch adds a volume and a nodeSelector,
give opposite results. Trainer re-applies the whole JobSet it builds, and JobSet's webhook refuses it
(``spec.replicatedJobs`` is immutable but for five pod-template fields while suspended). The planner plans
against the live JobSet, so only those fields change, and the webhook admits it. The rest of the rule is
pinned too: a running JobSet takes no change to its replicated jobs at all (an identical re-apply is not a
change), and neither the set of replicated jobs nor ``spec.managedBy`` may change.

This once ran against a ValidatingAdmissionPolicy written to mimic the webhook, when the local apiserver had
no JobSet manager; the package's apiserver now runs the real one (``conftest.jobset_kube``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from faults.support import new_namespace
from kubernetes import client as kube_client
from kubernetes.client.exceptions import ApiException

from contracts import messages as m
from contracts.jobset import JobSet
from contracts.trainer import TrainingRuntime, TrainJob
from planner.core import plan
from tjpipe.local.crds import APPLY_PATCH_CONTENT_TYPE, shipped_runtimes
from tjpipe.local.kubeapi import LocalKube, new_api_client

Obj = dict[str, Any]

JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
TRAINJOB = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
RUNTIME = "torch-distributed"
NAME = "resume"
TRAINER_MANAGER = "trainer"
USER_MANAGER = "tjpipe-test-user"
PATCH_MANAGER = "example.com/platform"

JOBSET_WEBHOOK = 'admission webhook "vjobset.kb.io" denied the request'
IMMUTABLE_JOBS = "spec.replicatedJobs: Invalid value"
IMMUTABLE_MANAGED_BY = "spec.managedBy"
NODE_SELECTOR = {"example.com/pool": "a100"}
SCRATCH_VOLUME = {"name": "scratch", "emptyDir": {}}

pytestmark = [pytest.mark.cluster]


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
    assert "immutable" in message, message[-300:]
    return message


def _webhook_denial(call: Callable[[], object]) -> str:
    """A 422 from JobSet's validating webhook: the replicated jobs are immutable."""
    message = _denial(call)
    assert message.startswith(JOBSET_WEBHOOK), message[:300]
    assert IMMUTABLE_JOBS in message, message[:300]
    assert message.endswith("field is immutable"), message[-300:]
    return message


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


def _copy(obj: Obj) -> Obj:
    copied: Obj = json.loads(json.dumps(obj))
    return copied


# --- the test -------------------------------------------------------------------------------------------


def test_resume_keeps_within_jobsets_update_rule(jobset_kube: LocalKube) -> None:
    with new_api_client(jobset_kube.kubeconfig) as api_client:
        namespace = new_namespace(api_client, prefix="rule")
        suspended = _apply(api_client, _trainjob(namespace, suspend=True, patched=False), manager=USER_MANAGER)
        created, _ = _planned_jobset(suspended, live=None)
        assert created["spec"]["suspend"] is True
        live = _apply(api_client, created, manager=TRAINER_MANAGER)

        # While suspended: a new image is refused, and so is pod template metadata other than labels and
        # annotations.
        new_image = _copy(created)
        _pod_spec(new_image)["containers"][0]["image"] = "example.com/other:1"
        _webhook_denial(lambda: _apply(api_client, new_image, manager=TRAINER_MANAGER, dry_run=True))
        moved = _copy(created)
        moved["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"] = {"namespace": "other"}
        _webhook_denial(lambda: _apply(api_client, moved, manager=TRAINER_MANAGER, dry_run=True))

        # The user resumes the TrainJob, with a runtime patch that adds a volume and a nodeSelector.
        resumed = _apply(api_client, _trainjob(namespace, suspend=False, patched=True), manager=USER_MANAGER)

        # Trainer: the whole desired JobSet, built without regard to the live one. Refused: the bug. Without
        # the volume the same apply is admitted (nodeSelector may change: the old JobSet is suspended), so
        # the volume is what the webhook refuses.
        trainers, _ = _planned_jobset(resumed, live=None)
        assert trainers["spec"]["suspend"] is False
        assert SCRATCH_VOLUME in _pod_spec(trainers)["volumes"]
        _webhook_denial(lambda: _apply(api_client, trainers, manager=TRAINER_MANAGER))
        without_volume = _copy(trainers)
        _pod_spec(without_volume)["volumes"].remove(SCRATCH_VOLUME)
        if not _pod_spec(without_volume)["volumes"]:
            del _pod_spec(without_volume)["volumes"]
        _apply(api_client, without_volume, manager=TRAINER_MANAGER, dry_run=True)
        still = _get(api_client, JOBSET, namespace, NAME)
        assert still["spec"]["suspend"] is True
        assert still["metadata"]["generation"] == live["metadata"]["generation"]

        # The planner: plans against the live JobSet, so only the mutable fields change. Admitted.
        ours, warnings = _planned_jobset(resumed, live=still)
        assert any("template.spec.volumes" in warning for warning in warnings), warnings
        _apply(api_client, ours, manager=TRAINER_MANAGER)
        running = _get(api_client, JOBSET, namespace, NAME)
        assert running["spec"]["suspend"] is False
        assert _pod_spec(running)["nodeSelector"] == NODE_SELECTOR
        assert "volumes" not in _pod_spec(running)
        assert _pod_spec(running)["containers"] == _pod_spec(still)["containers"]

        # The rule itself, now that neither side is suspended: any change to the replicated jobs is
        # refused, even a pod label; an identical re-apply is not a change.
        relabelled = _copy(ours)
        template = relabelled["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
        template.setdefault("metadata", {}).setdefault("labels", {})["example.com/team"] = "b"
        _webhook_denial(lambda: _apply(api_client, relabelled, manager=TRAINER_MANAGER, dry_run=True))
        again = _apply(api_client, ours, manager=TRAINER_MANAGER)
        assert again["metadata"]["generation"] == running["metadata"]["generation"]
        assert again["spec"] == running["spec"]

        # The other two parts of the rule: the set of replicated jobs, and spec.managedBy (which the CRD's
        # own validation rule refuses before the webhook is asked).
        extra_job = _copy(ours)
        extra_job["spec"]["replicatedJobs"].append({**extra_job["spec"]["replicatedJobs"][0], "name": "extra"})
        _webhook_denial(lambda: _apply(api_client, extra_job, manager=TRAINER_MANAGER, dry_run=True))
        managed = _copy(ours)
        managed["spec"]["managedBy"] = "example.com/other-controller"
        assert IMMUTABLE_MANAGED_BY in _denial(
            lambda: _apply(api_client, managed, manager=TRAINER_MANAGER, dry_run=True)
        )
