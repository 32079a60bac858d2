"""Upstream #3008: an update of an existing JobSet stays within JobSet v0.12.0's update rule."""

from __future__ import annotations

from typing import Any

import msgspec

from contracts.jobset import JobSet
from planner.immutability import restrict_to_mutable


def jobset(
    *,
    suspend: bool,
    node_selector: dict[str, str] | None = None,
    volumes: list[Any] | None = None,
    parallelism: int = 2,
    labels: dict[str, str] | None = None,
) -> JobSet:
    pod_spec: dict[str, Any] = {"containers": [{"name": "node", "image": "img"}]}
    if node_selector is not None:
        pod_spec["nodeSelector"] = node_selector
    if volumes is not None:
        pod_spec["volumes"] = volumes
    template: dict[str, Any] = {"spec": pod_spec}
    if labels is not None:
        template["metadata"] = {"labels": labels}
    return msgspec.convert(
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "tj", "namespace": "ns"},
            "spec": {
                "suspend": suspend,
                "replicatedJobs": [
                    {
                        "name": "node",
                        "replicas": 1,
                        "template": {
                            "spec": {"parallelism": parallelism, "completions": parallelism, "template": template}
                        },
                    }
                ],
            },
        },
        JobSet,
    )


def pod_spec(js: JobSet) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(js)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    return out


def test_mutable_fields_are_carried_over() -> None:
    live = jobset(suspend=True)
    desired = jobset(suspend=False, node_selector={"pool": "a100"}, labels={"team": "x"})
    result, dropped = restrict_to_mutable(desired, live)
    assert dropped == []
    assert pod_spec(result)["nodeSelector"] == {"pool": "a100"}
    assert msgspec.to_builtins(result)["spec"]["suspend"] is False
    template = msgspec.to_builtins(result)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert template["metadata"]["labels"] == {"team": "x"}


def test_immutable_changes_are_kept_from_the_live_object_and_reported() -> None:
    live = jobset(suspend=True)
    desired = jobset(suspend=False, volumes=[{"name": "data", "emptyDir": {}}], parallelism=4)
    result, dropped = restrict_to_mutable(desired, live)
    assert "volumes" not in pod_spec(result)
    job_spec = msgspec.to_builtins(result)["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job_spec["parallelism"] == 2
    assert sorted(dropped) == sorted(
        [
            "spec.replicatedJobs[0].template.spec.parallelism",
            "spec.replicatedJobs[0].template.spec.completions",
            "spec.replicatedJobs[0].template.spec.template.spec.volumes",
        ]
    )


def test_identical_plan_changes_nothing() -> None:
    live = jobset(suspend=True, node_selector={"a": "b"})
    result, dropped = restrict_to_mutable(jobset(suspend=True, node_selector={"a": "b"}), live)
    assert dropped == []
    assert msgspec.to_builtins(result) == msgspec.to_builtins(live)


def _with_spec(js: JobSet, **fields: Any) -> JobSet:
    raw = msgspec.to_builtins(js)
    raw["spec"].update(fields)
    return msgspec.convert(raw, JobSet)


def test_a_removed_patch_removes_its_mutable_fields() -> None:
    """Issue #17: the five fields are taken as planned, absent ones included."""
    live = jobset(suspend=True, node_selector={"pool": "a100"}, labels={"team": "x"})
    result, dropped = restrict_to_mutable(jobset(suspend=False), live)
    assert dropped == []
    assert "nodeSelector" not in pod_spec(result)
    template = msgspec.to_builtins(result)["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert "metadata" not in template


def test_what_jobsets_defaulting_added_to_immutable_fields_is_sent_back() -> None:
    """Issue #17: the atomic volumeClaimPolicies with its defaulted retentionPolicy, and the other
    fields JobSet's webhook fills in at creation, come from the live object."""
    claim = {"templates": [{"metadata": {"name": "model"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]}
    defaulted = {**claim, "retentionPolicy": {"whenDeleted": "Delete"}}
    live = _with_spec(
        jobset(suspend=False),
        volumeClaimPolicies=[defaulted],
        network={"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        successPolicy={"operator": "All"},
        startupPolicy={"startupPolicyOrder": "AnyOrder"},
    )
    desired = _with_spec(jobset(suspend=True), volumeClaimPolicies=[claim], network={"enableDNSHostnames": True})
    result, dropped = restrict_to_mutable(desired, live)
    assert dropped == []
    spec = msgspec.to_builtins(result)["spec"]
    assert spec["volumeClaimPolicies"] == [defaulted]
    assert spec["network"] == {"enableDNSHostnames": True, "publishNotReadyAddresses": True}
    assert spec["successPolicy"] == {"operator": "All"}
    assert spec["startupPolicy"] == {"startupPolicyOrder": "AnyOrder"}
    assert spec["suspend"] is True


def test_planned_changes_to_immutable_fields_are_reported() -> None:
    live = _with_spec(jobset(suspend=True), managedBy="example.com/a")
    desired = _with_spec(
        jobset(suspend=True), managedBy="example.com/b", failurePolicy={"maxRestarts": 3}, ttlSecondsAfterFinished=60
    )
    result, dropped = restrict_to_mutable(desired, live)
    spec = msgspec.to_builtins(result)["spec"]
    assert spec["managedBy"] == "example.com/a"
    assert "failurePolicy" not in spec
    assert spec["ttlSecondsAfterFinished"] == 60  # mutable
    assert sorted(dropped) == ["spec.failurePolicy", "spec.managedBy"]


def test_an_empty_pod_template_metadata_the_plan_carries_is_kept() -> None:
    """Trainer's builder sends ``template.metadata: {}``; a JobSet it made keeps it when the pipeline takes over."""
    live = msgspec.to_builtins(jobset(suspend=True))
    live["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"] = {}
    planned = msgspec.convert(live, JobSet)
    result, dropped = restrict_to_mutable(planned, msgspec.convert(live, JobSet))
    assert dropped == []
    assert msgspec.to_builtins(result) == live
