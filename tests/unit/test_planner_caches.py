"""What the planner remembers between plans: only runtime-derived values, never a stale or shared one.

A runtime's template, its validation errors and the plugins it enables are kept per runtime version, keyed
by the runtime's encoded bytes. These tests change a runtime under the same name (and the same
resourceVersion, which a hand-made or replayed event may well carry) and check that the next plan sees the
change; and they mutate everything a plan hands to plugins and check that the next plan is unaffected.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest

from contracts import messages as m
from contracts.trainer import TrainingRuntime, TrainJob
from planner import core, quantities, runtime_info
from planner.core import plan
from planner.runtime_info import RUNTIME_CACHE_SIZE, new_runtime_info, runtime_template

from .builders import (
    applies_of,
    only_object,
    replicated_job,
    runtime_dict,
    trainjob_dict,
    trainjob_observed,
)

Obj = dict[str, Any]

NAME = "mnist"
NAMESPACE = "team-a"
TORCH = {"numNodes": 1, "torch": {}}
RESOURCES = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2000m", "memory": "4Gi"}}


def rt(
    image: str = "example.com/torch:1",
    *,
    ml_policy: Obj | None = None,
    labels: Obj | None = None,
    node_env: list[Obj] | None = None,
) -> Obj:
    node: Obj = {"name": "node", "image": image, "resources": {"requests": {"cpu": "1"}}}
    if node_env is not None:
        node["env"] = node_env
    return runtime_dict(
        [replicated_job("node", [node], ancestor="trainer")],
        name="torch-small",
        ml_policy=TORCH if ml_policy is None else ml_policy,
        # Same name and resourceVersion in every variant: only the content tells them apart.
        metadata={
            "resourceVersion": "11",
            "labels": labels if labels is not None else {"trainer.kubeflow.org/webhook-validation": "disabled"},
        },
    )


def job(name: str = NAME, trainer: Obj | None = None) -> Obj:
    return trainjob_dict(
        {"numNodes": 2, "resourcesPerNode": RESOURCES} if trainer is None else trainer,
        name=name,
        namespace=NAMESPACE,
        uid=f"uid-{name}",
        runtime="torch-small",
        metadata={"resourceVersion": "5"},
    )


def planned(job_body: Obj, runtime_body: Obj) -> m.Plan:
    return plan(trainjob_observed(job_body, runtime_body, runtime_source="live"), source_seq=1)


def jobset_of(p: m.Plan) -> Obj:
    return only_object(p, m.ApplyJobSet)


def node(js: Obj) -> Obj:
    container: Obj = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    return container


def snapshot_text(p: m.Plan) -> str:
    (config_map,) = applies_of(p, m.ApplyConfigMap)
    data = config_map.object.data
    assert isinstance(data, dict)
    return data["runtime"]


def cold(job_body: Obj, runtime_body: Obj) -> m.Plan:
    """The plan a freshly started planner makes: every cache empty."""
    runtime_info._template.cache_clear()
    core._runtime_errors.cache_clear()
    return plan(
        trainjob_observed(job_body, runtime_body, runtime_source="live"),
        source_seq=1,
        framework=core.Framework(core.REGISTRY),
    )


# ------------------------------------------------------------------------------ a changed runtime


def test_changed_runtime_under_the_same_name_and_version_is_not_served_from_the_cache() -> None:
    first = planned(job(), rt("example.com/torch:1"))
    second = planned(job(), rt("example.com/torch:2"))
    assert node(jobset_of(first))["image"] == "example.com/torch:1"
    assert node(jobset_of(second))["image"] == "example.com/torch:2"
    assert "example.com/torch:2" in snapshot_text(second)
    assert "example.com/torch:1" not in snapshot_text(second)


def test_changed_runtime_template_is_a_new_template() -> None:
    one = msgspec.convert(rt("example.com/torch:1"), TrainingRuntime)
    two = msgspec.convert(rt("example.com/torch:2"), TrainingRuntime)
    assert runtime_template(one) is runtime_template(msgspec.convert(rt("example.com/torch:1"), TrainingRuntime))
    assert runtime_template(one) is not runtime_template(two)


def test_runtime_validated_again_when_its_labels_change() -> None:
    """The webhook label decides whether the runtime is checked; the cached answer follows the label."""
    broken = rt(labels={})
    broken["spec"]["template"]["spec"]["replicatedJobs"][0]["replicas"] = 2
    refused = planned(job(), broken)
    assert not applies_of(refused, m.ApplyJobSet)
    assert any("is invalid" in w for w in refused.warnings)

    exempt = copy.deepcopy(broken)
    exempt["metadata"]["labels"] = {"trainer.kubeflow.org/webhook-validation": "disabled"}
    assert applies_of(planned(job(), exempt), m.ApplyJobSet)
    assert not applies_of(planned(job(), broken), m.ApplyJobSet)


def test_plugins_follow_a_changed_ml_policy() -> None:
    """The plugins a runtime enables are remembered per runtime version, not per runtime name."""
    torch = planned(job(), rt())
    plain = planned(job(), rt(ml_policy={"numNodes": 1}))
    assert "PET_NNODES" in {e["name"] for e in node(jobset_of(torch)).get("env", [])}
    assert "PET_NNODES" not in {e["name"] for e in node(jobset_of(plain)).get("env", [])}


# ------------------------------------------------------------------------------ nothing leaks


def test_each_plan_gets_its_own_copy_of_the_template() -> None:
    runtime = msgspec.convert(rt(node_env=[{"name": "A", "value": "1"}]), TrainingRuntime)
    trainjob = msgspec.convert(job(), TrainJob)
    first = new_runtime_info(trainjob, runtime)
    first.jobset_spec["replicatedJobs"][0]["name"] = "mutated"
    first.jobset_spec["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["env"][0][
        "value"
    ] = "mutated"
    first.pod_sets[0].containers[0].env.append({"name": "B", "value": "2"})
    first.labels["mutated"] = "yes"

    second = new_runtime_info(trainjob, runtime)
    assert second.jobset_spec is not first.jobset_spec
    assert second.jobset_spec["replicatedJobs"][0]["name"] == "node"
    assert second.pod_sets[0].containers[0].env == [{"name": "A", "value": "1"}]
    assert "mutated" not in second.labels
    template = runtime_template(runtime)
    with pytest.raises(TypeError):
        template.labels["mutated"] = "yes"  # type: ignore[index]


def test_a_plan_after_others_equals_the_plan_of_a_fresh_planner() -> None:
    """Plans of different TrainJobs on one runtime, in any order, are what a cold planner makes of each."""
    runtime = rt(node_env=[{"name": "FROM_RUNTIME", "value": "x"}])
    jobs = [
        job("a"),
        job("b", {"numNodes": 3, "env": [{"name": "USER", "value": "u"}], "resourcesPerNode": RESOURCES}),
        job("c", {"numNodes": 4, "numProcPerNode": 2, "command": ["python", "train.py"]}),
    ]
    expected = [msgspec.to_builtins(cold(j, runtime)) for j in jobs]
    for _ in range(2):
        for j, want in zip(jobs, expected, strict=True):
            assert msgspec.to_builtins(planned(j, runtime)) == want
    for j, want in reversed(list(zip(jobs, expected, strict=True))):
        assert msgspec.to_builtins(planned(j, runtime)) == want


def test_mutating_a_planned_jobset_does_not_reach_the_next_plan() -> None:
    runtime = rt(node_env=[{"name": "FROM_RUNTIME", "value": "x"}])
    first = planned(job(), runtime)
    js = applies_of(first, m.ApplyJobSet)[0].object
    containers = js.spec.replicated_jobs[0].template.spec.template.spec.containers
    containers[0].env.append(containers[0].env[0])
    containers.clear()
    assert msgspec.to_builtins(planned(job(), runtime)) == msgspec.to_builtins(cold(job(), runtime))


# ------------------------------------------------------------------------------ bounded


def test_runtime_caches_are_bounded() -> None:
    for i in range(RUNTIME_CACHE_SIZE + 5):
        planned(job(), rt(f"example.com/torch:{i}"))
    assert runtime_info._template.cache_info().currsize <= RUNTIME_CACHE_SIZE
    assert core._runtime_errors.cache_info().currsize <= RUNTIME_CACHE_SIZE
    assert len(core.FRAMEWORK._by_runtime) <= RUNTIME_CACHE_SIZE


def test_canonical_quantities_memo_is_bounded() -> None:
    for i in range(quantities._CANONICAL_SIZE + 10):
        value = f"{i}000m"
        canonical = quantities.canonical_resources({"requests": {"cpu": value}})
        assert canonical == {"requests": {"cpu": quantities.canonical_quantity(value)}}
    assert len(quantities._CANONICAL) <= quantities._CANONICAL_SIZE
