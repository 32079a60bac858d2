"""CoScheduling: the pod-group label on every pod and the ``scheduling.x-k8s.io/v1alpha1`` PodGroup.

Runtimes are shaped like Trainer's ``torch-distributed`` plus the torchtune initializers, with a
``podGroupPolicy.coscheduling``; expected values follow ``coscheduling.go`` and its tests at v2.3.0.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import msgspec

from contracts import messages as m
from planner.pod_groups import pod_request_formats
from planner.quantities import QuantityFormat, format_quantity, quantity_format

from .builders import (
    FRAMEWORK_WITHOUT_FLUX_AND_MPI,
    Obj,
    applies_of,
    jobset_of,
    only_object,
    owner_reference,
    plan_with,
    pod_set,
    runtime_dict,
    trainjob_dict,
    trainjob_observed,
)

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
NAME = "fine-tune"
NAMESPACE = "team-b"
UID = "5e1d-uid"
OWNER = owner_reference(NAME, UID)


def runtime(jobs: list[Obj], coscheduling: Obj | None = None, **extra_policy: Any) -> Obj:
    policy: Obj = dict(extra_policy)
    if coscheduling is not None:
        policy["coscheduling"] = coscheduling
    return runtime_dict(
        jobs,
        name="torch-distributed",
        ml_policy={"numNodes": 1, "torch": {}},
        pod_group_policy=policy if policy else None,
    )


INITIALIZED = [
    pod_set("dataset-initializer", "dataset-initializer", {"cpu": "500m", "memory": "1Gi"}),
    pod_set("model-initializer", "model-initializer", {"cpu": "250m", "memory": "512Mi"}),
    pod_set("node", "trainer", {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": 1}),
]


def trainjob(trainer: Obj | None = None, *, suspend: bool | None = None) -> Obj:
    spec = {"suspend": suspend} if suspend is not None else None
    return trainjob_dict(trainer, name=NAME, namespace=NAMESPACE, uid=UID, runtime="torch-distributed", spec=spec)


def run(job: Obj, rt: Obj) -> m.Plan:
    return plan_with(FRAMEWORK_WITHOUT_FLUX_AND_MPI, trainjob_observed(job, rt, priority_classes=()))


def pod_group_messages(p: m.Plan) -> list[m.ApplyPodGroup]:
    return applies_of(p, m.ApplyPodGroup)


def pod_group(p: m.Plan) -> Obj:
    return only_object(p, m.ApplyPodGroup)


def pod_labels(js: Obj) -> dict[str, Obj]:
    return {
        rj["name"]: rj["template"]["spec"]["template"].get("metadata", {}).get("labels", {})
        for rj in js["spec"]["replicatedJobs"]
    }


# ------------------------------------------------------------------------------------------ the PodGroup


def test_pod_group_sums_every_pod_set_and_carries_timeout_and_owner() -> None:
    p = run(trainjob({"numNodes": 3}), runtime(INITIALIZED, {"scheduleTimeoutSeconds": 120}))
    assert pod_group(p) == {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "ownerReferences": [OWNER]},
        "spec": {
            "minMember": 5,
            # 500m + 250m + 3 x 2; 1Gi + 512Mi + 3 x 4Gi = 13.5Gi, shown exactly as Quantity.String() does.
            "minResources": {"cpu": "6750m", "memory": "13824Mi", "nvidia.com/gpu": "3"},
            "scheduleTimeoutSeconds": 120,
        },
    }


def test_pod_group_message_is_while_suspended_with_target_and_suspend_flag() -> None:
    p = run(trainjob(suspend=True), runtime(INITIALIZED, {"scheduleTimeoutSeconds": 60}))
    (message,) = pod_group_messages(p)
    assert message.policy == "while-suspended"
    assert message.trainjob_suspended is True
    assert message.target == m.Target(
        api_version="scheduling.x-k8s.io/v1alpha1", kind="PodGroup", namespace=NAMESPACE, name=NAME
    )
    assert message.source_seq == 1


def test_not_suspended_job_still_plans_the_pod_group_for_the_applier_to_gate() -> None:
    (message,) = pod_group_messages(run(trainjob(), runtime(INITIALIZED, {})))
    assert message.trainjob_suspended is False
    assert message.policy == "while-suspended"


def test_resources_per_node_changes_the_trainer_requests_in_the_sum() -> None:
    job = trainjob({"numNodes": 2, "resourcesPerNode": {"requests": {"cpu": "1", "memory": "3Gi"}}})
    spec = pod_group(run(job, runtime(INITIALIZED, {})))["spec"]
    assert spec["minMember"] == 4
    assert spec["minResources"] == {"cpu": "2750m", "memory": "7680Mi", "nvidia.com/gpu": "2"}


def test_schedule_timeout_defaults_to_sixty_when_the_runtime_omits_it() -> None:
    assert pod_group(run(trainjob(), runtime(INITIALIZED, {})))["spec"]["scheduleTimeoutSeconds"] == 60


def test_no_requests_gives_empty_min_resources_that_is_still_sent() -> None:
    p = run(trainjob(), runtime([pod_set("node", "trainer")], {}))
    assert pod_group(p)["spec"] == {"minMember": 1, "minResources": {}, "scheduleTimeoutSeconds": 60}
    (message,) = pod_group_messages(p)
    assert b'"minResources":{}' in msgspec.json.encode(message.object)


def test_decimal_si_memory_stays_decimal() -> None:
    jobs = [pod_set("node", "trainer", {"memory": "1G", "cpu": "100m"})]
    spec = pod_group(run(trainjob({"numNodes": 2}), runtime(jobs, {})))["spec"]
    assert spec["minResources"] == {"cpu": "200m", "memory": "2G"}


def test_format_of_the_first_pod_set_wins_as_in_quantity_add() -> None:
    jobs = [
        pod_set("dataset-initializer", "dataset-initializer", {"memory": "1G"}),
        pod_set("node", "trainer", {"memory": "1Gi"}),
    ]
    spec = pod_group(run(trainjob(), runtime(jobs, {})))["spec"]
    assert spec["minResources"] == {"memory": "2073741824"}


def test_larger_init_container_sets_value_and_format_of_a_pod() -> None:
    jobs = [
        pod_set(
            "node",
            "trainer",
            {"memory": "1Gi", "cpu": "1"},
            init_containers=[{"name": "warmup", "resources": {"requests": {"memory": "8G"}}}],
        )
    ]
    spec = pod_group(run(trainjob({"numNodes": 2}), runtime(jobs, {})))["spec"]
    assert spec["minResources"] == {"cpu": "2", "memory": "16G"}


def test_sidecar_adds_to_the_running_pod() -> None:
    jobs = [
        pod_set(
            "node",
            "trainer",
            {"cpu": "1"},
            init_containers=[{"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "500m"}}}],
        )
    ]
    assert pod_group(run(trainjob(), runtime(jobs, {})))["spec"]["minResources"] == {"cpu": "1500m"}


# ----------------------------------------------------------------------------------------- pod labels


def test_every_pod_template_gets_the_pod_group_label() -> None:
    js = jobset_of(run(trainjob(), runtime(INITIALIZED, {})))
    assert pod_labels(js) == {
        "dataset-initializer": {POD_GROUP_LABEL: NAME},
        "model-initializer": {POD_GROUP_LABEL: NAME},
        "node": {POD_GROUP_LABEL: NAME},
    }


def test_without_coscheduling_policy_there_is_no_pod_group_and_no_label() -> None:
    p = run(trainjob(), runtime(INITIALIZED))
    assert pod_group_messages(p) == []
    assert pod_labels(jobset_of(p)) == {"dataset-initializer": {}, "model-initializer": {}, "node": {}}


def test_coscheduling_and_volcano_both_act_when_both_are_set() -> None:
    p = run(trainjob(), runtime(INITIALIZED, {}, volcano={}))
    kinds = [type(a).__name__ for a in p.applies if not isinstance(a, m.ApplyConfigMap | m.ApplyTrainJobStatus)]
    assert kinds == ["ApplyPodGroup", "ApplyVolcanoPodGroup", "ApplyJobSet"]
    node = jobset_of(p)["spec"]["replicatedJobs"][2]["template"]["spec"]["template"]["metadata"]
    assert node == {"labels": {POD_GROUP_LABEL: NAME}, "annotations": {"scheduling.k8s.io/group-name": NAME}}


# ------------------------------------------------------------------------------ quantity rendering


def test_quantity_format_follows_the_suffix() -> None:
    assert [quantity_format(q) for q in ("500m", "2", 2, "1Gi", "1G", "1e3", "1E3", "1E", "12Ki")] == [
        "DecimalSI",
        "DecimalSI",
        "DecimalSI",
        "BinarySI",
        "DecimalSI",
        "DecimalExponent",
        "DecimalExponent",
        "DecimalSI",
        "BinarySI",
    ]


def test_format_quantity_matches_kubernetes_canonical_strings() -> None:
    cases: list[tuple[Decimal, QuantityFormat, str]] = [
        (Decimal("3"), "DecimalSI", "3"),
        (Decimal("0.5"), "DecimalSI", "500m"),
        (Decimal("1.25"), "DecimalSI", "1250m"),
        (Decimal("2300"), "DecimalSI", "2300"),
        (Decimal("2000000000"), "DecimalSI", "2G"),
        (Decimal(6 * 2**30), "BinarySI", "6Gi"),
        (Decimal(int(1.5 * 2**30)), "BinarySI", "1536Mi"),
        (Decimal("2000000000"), "BinarySI", "1953125Ki"),
        (Decimal("100"), "BinarySI", "100"),
        (Decimal("1536.5"), "BinarySI", "1536500m"),
        (Decimal("1500000"), "DecimalExponent", "1500e3"),
        (Decimal("0.0000000001"), "DecimalSI", "1n"),
        (Decimal("0"), "BinarySI", "0"),
    ]
    assert [format_quantity(v, f) for v, f, _ in cases] == [want for _, _, want in cases]


def test_pod_request_formats_follow_pod_requests() -> None:
    pod_spec = {
        "containers": [
            {"name": "a", "resources": {"requests": {"cpu": "0", "memory": "1Gi"}}},
            {"name": "b", "resources": {"requests": {"cpu": "1e3", "memory": "1G"}}},
        ],
        "initContainers": [{"name": "i", "resources": {"requests": {"memory": "9G"}}}],
        "overhead": {"ephemeral-storage": "1Ki"},
    }
    assert pod_request_formats(pod_spec) == {
        "cpu": "DecimalExponent",
        "memory": "DecimalSI",
        "ephemeral-storage": "BinarySI",
    }
