"""Volcano: queue and PriorityClass validation, the group-name annotation, and the v1beta1 PodGroup.

Runtimes are shaped like Trainer's ``torch-distributed`` with a ``podGroupPolicy.volcano`` (plus an
initializer job where the sum over pod sets matters); expected values follow ``volcano.go`` and its tests
at v2.3.0, except that an unset ``highestTierAllowed`` is left out instead of dereferenced.
"""

from __future__ import annotations

from typing import Any

from contracts import messages as m

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
    runtime_patch,
    trainjob_dict,
    trainjob_observed,
    validate_with,
)

QUEUE = "scheduling.volcano.sh/queue-name"
GROUP_NAME = "scheduling.k8s.io/group-name"
NAME = "resnet"
NAMESPACE = "vision"
UID = "77aa-uid"
OWNER = owner_reference(NAME, UID)
PRIORITY_CLASSES = ("low-priority", "high-priority")


def runtime(jobs: list[Obj] | None = None, *, volcano: Obj | None = None, annotations: Obj | None = None) -> Obj:
    if jobs is None:
        jobs = [
            pod_set("dataset-initializer", "dataset-initializer", {"cpu": "300m", "memory": "1Gi"}, "low-priority"),
            pod_set("node", "trainer", {"cpu": "500m", "memory": "0.5Gi"}, "high-priority"),
        ]
    return runtime_dict(
        jobs,
        name="torch-distributed",
        ml_policy={"numNodes": 1, "torch": {}},
        pod_group_policy={"volcano": volcano if volcano is not None else {}},
        template_metadata={"annotations": annotations} if annotations is not None else None,
    )


def trainjob(trainer: Obj | None = None, **spec: Any) -> Obj:
    return trainjob_dict(trainer, name=NAME, namespace=NAMESPACE, uid=UID, runtime="torch-distributed", spec=spec)


def run(job: Obj, rt: Obj, priority_classes: tuple[str, ...] | None = PRIORITY_CLASSES) -> m.Plan:
    event = trainjob_observed(job, rt, priority_classes=priority_classes)
    return plan_with(FRAMEWORK_WITHOUT_FLUX_AND_MPI, event, source_seq=3)


def validate(job: Obj, rt: Obj, priority_classes: frozenset[str] | None = frozenset(PRIORITY_CLASSES)) -> list[str]:
    errors = validate_with(FRAMEWORK_WITHOUT_FLUX_AND_MPI, job, rt, priority_classes=priority_classes)
    return [str(e) for e in errors]


def volcano_messages(p: m.Plan) -> list[m.ApplyVolcanoPodGroup]:
    return applies_of(p, m.ApplyVolcanoPodGroup)


def pod_group(p: m.Plan) -> Obj:
    return only_object(p, m.ApplyVolcanoPodGroup)


# ------------------------------------------------------------------------------------------ the PodGroup


def test_pod_group_has_members_resources_queue_priority_and_topology() -> None:
    rt = runtime(volcano={"networkTopology": {"mode": "hard", "highestTierAllowed": 2}}, annotations={QUEUE: "q1"})
    p = run(trainjob({"numNodes": 4}), rt)
    assert pod_group(p) == {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "ownerReferences": [OWNER]},
        "spec": {
            "minMember": 5,
            "queue": "q1",
            "priorityClassName": "high-priority",
            # 300m + 4 x 500m; 1Gi + 4 x 0.5Gi
            "minResources": {"cpu": "2300m", "memory": "3Gi"},
            "networkTopology": {"mode": "hard", "highestTierAllowed": 2},
        },
    }
    (message,) = volcano_messages(p)
    assert message.policy == "while-suspended"
    assert message.trainjob_suspended is False
    assert message.target == m.Target(
        api_version="scheduling.volcano.sh/v1beta1", kind="PodGroup", namespace=NAMESPACE, name=NAME
    )


def test_priority_class_name_is_the_last_replicated_jobs() -> None:
    jobs = [
        pod_set("dataset-initializer", "dataset-initializer", {"cpu": "1"}, "high-priority"),
        pod_set("node", "trainer", {"cpu": "1"}, "low-priority"),
        pod_set("sidecar-job", "none", {"cpu": "1"}),
    ]
    assert pod_group(run(trainjob(), runtime(jobs)))["spec"]["priorityClassName"] == "low-priority"


def test_without_queue_annotation_or_priority_class_those_fields_are_left_out() -> None:
    jobs = [pod_set("node", "trainer", {"cpu": "2"})]
    assert pod_group(run(trainjob(), runtime(jobs)))["spec"] == {"minMember": 1, "minResources": {"cpu": "2"}}


def test_queue_comes_from_runtime_patch_annotations() -> None:
    patch = runtime_patch("kueue.x-k8s.io/manager", metadata={"annotations": {QUEUE: "from-patch"}})
    p = run(trainjob(runtimePatches=[patch]), runtime(annotations={QUEUE: "from-runtime"}))
    assert pod_group(p)["spec"]["queue"] == "from-patch"


def test_unset_highest_tier_is_left_out_instead_of_dereferenced() -> None:
    p = run(trainjob(), runtime(volcano={"networkTopology": {"mode": "soft"}}))
    assert pod_group(p)["spec"]["networkTopology"] == {"mode": "soft"}


def test_suspended_job_marks_the_message() -> None:
    (message,) = volcano_messages(run(trainjob(suspend=True), runtime()))
    assert message.trainjob_suspended is True


def test_every_pod_template_gets_the_group_name_annotation() -> None:
    js = jobset_of(run(trainjob(), runtime()))
    annotations = [rj["template"]["spec"]["template"]["metadata"] for rj in js["spec"]["replicatedJobs"]]
    assert annotations == [{"annotations": {GROUP_NAME: NAME}}, {"annotations": {GROUP_NAME: NAME}}]


def test_without_volcano_policy_nothing_happens() -> None:
    rt = runtime(annotations={QUEUE: ""})
    del rt["spec"]["podGroupPolicy"]
    p = run(trainjob(), rt, priority_classes=())
    assert volcano_messages(p) == []
    js = jobset_of(p)
    # No group-name annotation: each pod template keeps only the empty metadata of Trainer's typed round trip.
    assert [rj["template"]["spec"]["template"]["metadata"] for rj in js["spec"]["replicatedJobs"]] == [{}, {}]
    assert validate(trainjob(), rt, frozenset()) == []


# -------------------------------------------------------------------------------------------- validation


def test_empty_queue_is_invalid() -> None:
    assert validate(trainjob(), runtime(annotations={QUEUE: ""})) == [
        "spec.annotations[scheduling.volcano.sh/queue-name]: Volcano queue name must not be empty"
    ]


def test_empty_queue_blocks_the_plan() -> None:
    p = run(trainjob(), runtime(annotations={QUEUE: ""}))
    assert volcano_messages(p) == []
    assert [a for a in p.applies if isinstance(a, m.ApplyJobSet)] == []
    assert any("Volcano queue name must not be empty" in w for w in p.warnings)


def test_missing_priority_class_is_invalid() -> None:
    assert validate(trainjob(), runtime(), frozenset({"low-priority"})) == [
        'spec.templateSpec.priorityClassName: PriorityClass "high-priority" doesn\'t exist: '
        'priorityclasses.scheduling.k8s.io "high-priority" not found'
    ]


def test_unknown_priority_classes_skip_the_check() -> None:
    assert validate(trainjob(), runtime(), None) == []


def test_existing_priority_classes_plan_normally() -> None:
    assert len(volcano_messages(run(trainjob(), runtime()))) == 1


def test_system_priority_class_stops_the_check_early_as_upstream_does() -> None:
    jobs = [
        pod_set("dataset-initializer", "dataset-initializer", {"cpu": "1"}, "missing-before"),
        pod_set("model-initializer", "model-initializer", {"cpu": "1"}, "system-node-critical"),
        pod_set("node", "trainer", {"cpu": "1"}, "missing-after"),
    ]
    rt = runtime(jobs, annotations={QUEUE: ""})
    assert validate(trainjob(), rt, frozenset()) == [
        "spec.annotations[scheduling.volcano.sh/queue-name]: Volcano queue name must not be empty",
        'spec.templateSpec.priorityClassName: PriorityClass "missing-before" doesn\'t exist: '
        'priorityclasses.scheduling.k8s.io "missing-before" not found',
    ]


def test_system_cluster_critical_needs_no_priority_class_object() -> None:
    jobs = [pod_set("node", "trainer", {"cpu": "1"}, "system-cluster-critical")]
    assert validate(trainjob(), runtime(jobs), frozenset()) == []
    assert pod_group(run(trainjob(), runtime(jobs), ()))["spec"]["priorityClassName"] == "system-cluster-critical"


def test_missing_priority_class_from_the_event_blocks_the_plan() -> None:
    p = run(trainjob(), runtime(), priority_classes=("low-priority",))
    assert volcano_messages(p) == []
    assert [a for a in p.applies if isinstance(a, m.ApplyJobSet)] == []
    assert any('PriorityClass "high-priority" doesn\'t exist' in w for w in p.warnings)
