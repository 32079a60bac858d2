"""Volcano: queue and PriorityClass validation, the group-name annotation, and the v1beta1 PodGroup.

Runtimes are shaped like Trainer's ``torch-distributed`` with a ``podGroupPolicy.volcano`` (plus an
initializer job where the sum over pod sets matters); expected values follow ``volcano.go`` and its tests
at v2.3.0, except that an unset ``highestTierAllowed`` is left out instead of dereferenced.
"""

from __future__ import annotations

from typing import Any

import msgspec

from contracts import messages as m
from contracts.trainer import TrainingRuntime, TrainJob
from planner.core import plan
from planner.framework import FieldError, Framework
from planner.plugins.coscheduling import CoScheduling
from planner.plugins.jax import JAX
from planner.plugins.jobset import JobSetPlugin
from planner.plugins.plainml import PlainML
from planner.plugins.torch import Torch
from planner.plugins.volcano import Volcano
from planner.plugins.xgboost import XGBoost
from planner.runtime_info import new_runtime_info

Obj = dict[str, Any]

FRAMEWORK = Framework(
    [
        ("coscheduling", CoScheduling),
        ("volcano", Volcano),
        ("plainml", PlainML),
        ("torch", Torch),
        ("jobset", JobSetPlugin),
        ("jax", JAX),
        ("xgboost", XGBoost),
    ]
)

ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
QUEUE = "scheduling.volcano.sh/queue-name"
GROUP_NAME = "scheduling.k8s.io/group-name"
NAME = "resnet"
NAMESPACE = "vision"
UID = "77aa-uid"
OWNER = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "name": NAME,
    "uid": UID,
    "controller": True,
    "blockOwnerDeletion": True,
}
PRIORITY_CLASSES = ("low-priority", "high-priority")


def rjob(name: str, ancestor: str, requests: Obj, priority_class: str | None = None) -> Obj:
    container = {"name": "node" if ancestor == "trainer" else name, "image": f"example.com/{name}"}
    pod_spec: Obj = {"containers": [{**container, "resources": {"requests": requests}}]}
    if priority_class is not None:
        pod_spec["priorityClassName"] = priority_class
    return {
        "name": name,
        "template": {"metadata": {"labels": {ANCESTOR: ancestor}}, "spec": {"template": {"spec": pod_spec}}},
    }


def runtime(jobs: list[Obj] | None = None, *, volcano: Obj | None = None, annotations: Obj | None = None) -> Obj:
    if jobs is None:
        jobs = [
            rjob("dataset-initializer", "dataset-initializer", {"cpu": "300m", "memory": "1Gi"}, "low-priority"),
            rjob("node", "trainer", {"cpu": "500m", "memory": "0.5Gi"}, "high-priority"),
        ]
    template: Obj = {"spec": {"replicatedJobs": jobs}}
    if annotations is not None:
        template["metadata"] = {"annotations": annotations}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch-distributed"},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "podGroupPolicy": {"volcano": volcano if volcano is not None else {}},
            "template": template,
        },
    }


def trainjob(trainer: Obj | None = None, **spec: Any) -> Obj:
    body: Obj = {"runtimeRef": {"name": "torch-distributed"}, **spec}
    if trainer is not None:
        body["trainer"] = trainer
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": UID},
        "spec": body,
    }


def run(job: Obj, rt: Obj, priority_classes: tuple[str, ...] | None = PRIORITY_CLASSES) -> m.Plan:
    event = m.TrainJobObserved(
        trainjob=msgspec.convert(job, TrainJob),
        runtime=msgspec.convert(rt, TrainingRuntime),
        observed_at=1_700_000_000.0,
        priority_classes=priority_classes,
    )
    return plan(event, source_seq=3, framework=FRAMEWORK)


def validate(job: Obj, rt: Obj, priority_classes: frozenset[str] | None = frozenset(PRIORITY_CLASSES)) -> list[str]:
    tj = msgspec.convert(job, TrainJob)
    info = new_runtime_info(tj, msgspec.convert(rt, TrainingRuntime))
    info.priority_classes = priority_classes
    errors: list[FieldError] = FRAMEWORK.validate(info, tj)
    return [str(e) for e in errors]


def volcano_messages(p: m.Plan) -> list[m.ApplyVolcanoPodGroup]:
    return [a for a in p.applies if isinstance(a, m.ApplyVolcanoPodGroup)]


def pod_group(p: m.Plan) -> Obj:
    messages = volcano_messages(p)
    assert len(messages) == 1, p
    out: Obj = msgspec.to_builtins(messages[0].object)
    return out


def jobset(p: m.Plan) -> Obj:
    messages = [a for a in p.applies if isinstance(a, m.ApplyJobSet)]
    assert len(messages) == 1, p
    out: Obj = msgspec.to_builtins(messages[0].object)
    return out


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
        rjob("dataset-initializer", "dataset-initializer", {"cpu": "1"}, "high-priority"),
        rjob("node", "trainer", {"cpu": "1"}, "low-priority"),
        rjob("sidecar-job", "none", {"cpu": "1"}),
    ]
    assert pod_group(run(trainjob(), runtime(jobs)))["spec"]["priorityClassName"] == "low-priority"


def test_without_queue_annotation_or_priority_class_those_fields_are_left_out() -> None:
    jobs = [rjob("node", "trainer", {"cpu": "2"})]
    assert pod_group(run(trainjob(), runtime(jobs)))["spec"] == {"minMember": 1, "minResources": {"cpu": "2"}}


def test_queue_comes_from_runtime_patch_annotations() -> None:
    patch = {
        "manager": "kueue.x-k8s.io/manager",
        "trainingRuntimeSpec": {"template": {"metadata": {"annotations": {QUEUE: "from-patch"}}}},
    }
    p = run(trainjob(runtimePatches=[patch]), runtime(annotations={QUEUE: "from-runtime"}))
    assert pod_group(p)["spec"]["queue"] == "from-patch"


def test_unset_highest_tier_is_left_out_instead_of_dereferenced() -> None:
    p = run(trainjob(), runtime(volcano={"networkTopology": {"mode": "soft"}}))
    assert pod_group(p)["spec"]["networkTopology"] == {"mode": "soft"}


def test_suspended_job_marks_the_message() -> None:
    (message,) = volcano_messages(run(trainjob(suspend=True), runtime()))
    assert message.trainjob_suspended is True


def test_every_pod_template_gets_the_group_name_annotation() -> None:
    js = jobset(run(trainjob(), runtime()))
    annotations = [rj["template"]["spec"]["template"]["metadata"] for rj in js["spec"]["replicatedJobs"]]
    assert annotations == [{"annotations": {GROUP_NAME: NAME}}, {"annotations": {GROUP_NAME: NAME}}]


def test_without_volcano_policy_nothing_happens() -> None:
    rt = runtime(annotations={QUEUE: ""})
    del rt["spec"]["podGroupPolicy"]
    p = run(trainjob(), rt, priority_classes=())
    assert volcano_messages(p) == []
    js = jobset(p)
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
        rjob("dataset-initializer", "dataset-initializer", {"cpu": "1"}, "missing-before"),
        rjob("model-initializer", "model-initializer", {"cpu": "1"}, "system-node-critical"),
        rjob("node", "trainer", {"cpu": "1"}, "missing-after"),
    ]
    rt = runtime(jobs, annotations={QUEUE: ""})
    assert validate(trainjob(), rt, frozenset()) == [
        "spec.annotations[scheduling.volcano.sh/queue-name]: Volcano queue name must not be empty",
        'spec.templateSpec.priorityClassName: PriorityClass "missing-before" doesn\'t exist: '
        'priorityclasses.scheduling.k8s.io "missing-before" not found',
    ]


def test_system_cluster_critical_needs_no_priority_class_object() -> None:
    jobs = [rjob("node", "trainer", {"cpu": "1"}, "system-cluster-critical")]
    assert validate(trainjob(), runtime(jobs), frozenset()) == []
    assert pod_group(run(trainjob(), runtime(jobs), ()))["spec"]["priorityClassName"] == "system-cluster-critical"


def test_missing_priority_class_from_the_event_blocks_the_plan() -> None:
    p = run(trainjob(), runtime(), priority_classes=("low-priority",))
    assert volcano_messages(p) == []
    assert [a for a in p.applies if isinstance(a, m.ApplyJobSet)] == []
    assert any('PriorityClass "high-priority" doesn\'t exist' in w for w in p.warnings)
