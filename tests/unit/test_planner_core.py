"""``planner.core.plan``: the whole planner as a pure function of one event.

Every fixture here is a small hand-written dict stating a fact about Trainer v2.3.0's behaviour (see
``/work/shared/reference/trainer-v2.3.0.md`` §3-§5); the assertions compare the exact builtins of the
apply messages the planner emits.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest

from contracts import messages as m
from planner.core import plan

from .builders import (
    ANCESTOR,
    JOBSET_API,
    RANK,
    TRAINER_API,
    Obj,
    applies_of,
    job_patch,
    jobset_of,
    only_object,
    owner_reference,
    pod_spec,
    replicated_job,
    runtime_dict,
    runtime_patch,
    suspended_condition,
    trainjob_dict,
    trainjob_observed,
)

OBSERVED_AT = 1_700_000_000.9
"""The watcher's clock for every event here; the planner must render it truncated to whole seconds."""
NOW = "2023-11-14T22:13:20Z"
EARLIER = "2023-01-01T00:00:00Z"

NAME = "mnist"
NAMESPACE = "team-a"
UID = "0b6f7c3e-uid"
SEQ = 42
OWNER = owner_reference(NAME, UID)


# ------------------------------------------------------------------------------------------ fixtures


def container(name: str, **fields: Any) -> Obj:
    return {"name": name, **fields}


def runtime(
    replicated_jobs: list[Obj] | None = None,
    *,
    ml_policy: Obj | None = None,
    labels: Obj | None = None,
    annotations: Obj | None = None,
    kind: str = "ClusterTrainingRuntime",
    name: str = "torch-small",
    **spec: Any,
) -> Obj:
    """A runtime: by default one ``node`` job, ancestor trainer, container ``node``, torch policy."""
    if replicated_jobs is None:
        replicated_jobs = [replicated_job("node", [container("node", image="example.com/torch:1")], ancestor="trainer")]
    metadata: Obj = {}
    if labels is not None:
        metadata["labels"] = labels
    if annotations is not None:
        metadata["annotations"] = annotations
    return runtime_dict(
        replicated_jobs,
        name=name,
        kind=kind,
        # Like the shipped runtimes: Trainer's webhook never checked them, so their replicas are not refused.
        metadata={"resourceVersion": "11", "labels": {"trainer.kubeflow.org/webhook-validation": "disabled"}},
        ml_policy=ml_policy,
        template_metadata=metadata if metadata else None,
        jobset_spec=spec,
    )


def node_runtime(*containers: Obj, ml_policy: Obj | None, parallelism: int | None = None, **fields: Any) -> Obj:
    """A runtime whose one replicated job, ``node``, is the trainer's and runs ``containers``."""
    return runtime(
        [replicated_job("node", list(containers), ancestor="trainer", parallelism=parallelism)],
        ml_policy=ml_policy,
        **fields,
    )


TORCH = {"numNodes": 1, "torch": {}}


def trainjob(spec: Obj | None = None, *, status: Obj | None = None, **metadata: Any) -> Obj:
    return trainjob_dict(
        name=NAME,
        namespace=NAMESPACE,
        uid=UID,
        runtime="torch-small",
        spec=spec,
        metadata={"resourceVersion": "5", **metadata},
        status=status,
    )


def jobset(status: Obj, *, suspend: bool = False) -> Obj:
    return {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "resourceVersion": "77"},
        "spec": {"suspend": suspend},
        "status": status,
    }


def observed(job: Obj, rt: Obj | None = None, js: Obj | None = None, trace_id: str = "") -> m.TrainJobObserved:
    return trainjob_observed(
        job,
        rt,
        # As if the runtime snapshot exists already; tests of the snapshot itself say "live".
        runtime_source="snapshot" if rt is not None else "none",
        jobset=js,
        observed_at=OBSERVED_AT,
        cause="TrainJob MODIFIED",
        trace_id=trace_id,
    )


def run(job: Obj, rt: Obj | None = None, js: Obj | None = None) -> m.Plan:
    return plan(observed(job, rt, js), source_seq=SEQ)


def jobset_messages(p: m.Plan) -> list[m.ApplyJobSet]:
    return applies_of(p, m.ApplyJobSet)


def status_messages(p: m.Plan) -> list[m.ApplyTrainJobStatus]:
    return applies_of(p, m.ApplyTrainJobStatus)


def built_status(p: m.Plan) -> Obj:
    return only_object(p, m.ApplyTrainJobStatus)


def rjobs(js: Obj) -> dict[str, Obj]:
    return {rj["name"]: rj for rj in js["spec"]["replicatedJobs"]}


def node_container(js: Obj, job_name: str = "node", name: str = "node") -> Obj:
    return next(c for c in pod_spec(js, job_name)["containers"] if c["name"] == name)


def env_of(c: Obj) -> list[tuple[str, Any]]:
    return [(e["name"], e.get("value", e.get("valueFrom"))) for e in c.get("env", [])]


def env_dict(c: Obj) -> dict[str, Any]:
    return dict(env_of(c))


def pet_env(nnodes: str, nproc: str, name: str = NAME) -> list[Obj]:
    return [
        {"name": "PET_NNODES", "value": nnodes},
        {"name": "PET_NPROC_PER_NODE", "value": nproc},
        {"name": "PET_NODE_RANK", "valueFrom": RANK},
        {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
        {"name": "PET_MASTER_PORT", "value": "29500"},
    ]


def with_status(job: Obj, p: m.Plan) -> Obj:
    """The TrainJob as it reads after the planned status was applied."""
    fed = copy.deepcopy(job)
    fed["status"] = built_status(p)["status"]
    return fed


# ------------------------------------------------------------------------------------ torch: full shape


def test_torch_jobset_exact_shape() -> None:
    rt = node_runtime(
        container(
            "node",
            image="example.com/torch:1",
            command=["torchrun", "train.py"],
            env=[{"name": "LOG_LEVEL", "value": "info"}],
            resources={"limits": {"memory": "8Gi"}, "requests": {"cpu": "2", "memory": "4Gi"}},
        ),
        ml_policy=TORCH,
        labels={"team": "ml"},
        annotations={"note": "from-runtime"},
    )
    job = trainjob(
        {
            "suspend": True,
            "trainer": {
                "image": "example.com/torch:2",
                "command": ["python"],
                "args": ["train.py", "--epochs=1"],
                "numNodes": 2,
                "numProcPerNode": 4,
                "env": [{"name": "LOG_LEVEL", "value": "debug"}, {"name": "EXTRA", "value": "1"}],
                "resourcesPerNode": {"requests": {"cpu": "8"}, "limits": {"nvidia.com/gpu": "1"}},
            },
        },
        labels={"own": "never-propagated"},
        annotations={"own": "never-propagated"},
    )
    p = plan(observed(job, rt, trace_id="trace-1"), source_seq=SEQ)

    assert p.trainjob == m.ObjectKey(namespace=NAMESPACE, name=NAME)
    assert p.trainjob_uid == UID
    assert p.source_seq == SEQ
    assert p.warnings == ()
    message = jobset_messages(p)[0]
    assert message.policy == "while-suspended"
    assert message.source_seq == SEQ
    assert message.trainjob == m.ObjectKey(namespace=NAMESPACE, name=NAME)
    assert message.trainjob_uid == UID
    assert message.trace_id == "trace-1"
    assert message.field_manager == "trainer"
    assert message.force is True
    assert message.target == m.Target(api_version=JOBSET_API, kind="JobSet", namespace=NAMESPACE, name=NAME)
    assert message.target.subresource is None

    assert msgspec.to_builtins(message.object) == {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": {
            "name": NAME,
            "namespace": NAMESPACE,
            "labels": {"team": "ml"},
            "annotations": {"note": "from-runtime"},
            "ownerReferences": [OWNER],
        },
        "spec": {
            "suspend": True,
            "replicatedJobs": [
                {
                    "name": "node",
                    "replicas": 1,
                    "template": {
                        "metadata": {"labels": {ANCESTOR: "trainer"}},
                        "spec": {
                            "parallelism": 2,
                            "completions": 2,
                            "template": {
                                "metadata": {},
                                "spec": {
                                    "containers": [
                                        {
                                            "name": "node",
                                            "image": "example.com/torch:2",
                                            "command": ["python"],
                                            "args": ["train.py", "--epochs=1"],
                                            "env": [
                                                {"name": "LOG_LEVEL", "value": "debug"},
                                                {"name": "EXTRA", "value": "1"},
                                                *pet_env("2", "4"),
                                            ],
                                            "ports": [{"containerPort": 29500}],
                                            "resources": {
                                                "limits": {"memory": "8Gi", "nvidia.com/gpu": "1"},
                                                "requests": {"cpu": "8", "memory": "4Gi"},
                                            },
                                        }
                                    ]
                                },
                            },
                        },
                    },
                }
            ],
        },
    }


def test_torch_minimal_trainjob_uses_runtime_values() -> None:
    rt = runtime(ml_policy=TORCH)
    js = jobset_of(run(trainjob({"trainer": {}, "suspend": False}), rt))
    assert js["spec"]["suspend"] is False
    rj = rjobs(js)["node"]
    assert rj["replicas"] == 1
    assert rj["template"]["spec"]["parallelism"] == 1
    assert rj["template"]["spec"]["completions"] == 1
    assert node_container(js) == {
        "name": "node",
        "image": "example.com/torch:1",
        "env": pet_env("1", "1"),
        "ports": [{"containerPort": 29500}],
        "resources": {},
    }
    # No runtime template metadata: no labels or annotations on the JobSet, TrainJob's own are not copied.
    assert "labels" not in js["metadata"]
    assert "annotations" not in js["metadata"]


def test_torch_num_nodes_defaults_to_ml_policy() -> None:
    rt = runtime(ml_policy={"numNodes": 3, "torch": {}})
    js = jobset_of(run(trainjob({"trainer": {}}), rt))
    assert rjobs(js)["node"]["template"]["spec"]["parallelism"] == 3
    assert rjobs(js)["node"]["template"]["spec"]["completions"] == 3
    assert env_dict(node_container(js))["PET_NNODES"] == "3"


def test_torch_ml_policy_without_num_nodes_counts_one() -> None:
    rt = node_runtime(container("node", image="i"), ml_policy={"torch": {}}, parallelism=5)
    js = jobset_of(run(trainjob({"trainer": {}}), rt))
    assert rjobs(js)["node"]["template"]["spec"]["parallelism"] == 1
    assert env_dict(node_container(js))["PET_NNODES"] == "1"


@pytest.mark.parametrize(
    ("runtime_resources", "trainer", "expected"),
    [
        pytest.param(
            None,
            {"numProcPerNode": 3, "resourcesPerNode": {"limits": {"nvidia.com/gpu": "8"}}},
            "3",
            id="numProcPerNode-wins-over-gpus",
        ),
        pytest.param(None, {"resourcesPerNode": {"requests": {"nvidia.com/gpu": "2"}}}, "auto", id="gpu-request-auto"),
        pytest.param(None, {"resourcesPerNode": {"limits": {"nvidia.com/gpu": "2"}}}, "auto", id="gpu-limit-only-auto"),
        pytest.param(None, {"resourcesPerNode": {"requests": {"cpu": "2500m"}}}, "3", id="cpu-2500m-ceil-3"),
        pytest.param(None, {"resourcesPerNode": {"limits": {"cpu": "4"}}}, "4", id="cpu-limit-only"),
        pytest.param(None, {"resourcesPerNode": {"requests": {"cpu": "100m"}}}, "1", id="cpu-100m-ceil-1"),
        pytest.param(None, {}, "1", id="nothing-1"),
        pytest.param({"limits": {"nvidia.com/gpu": "1"}}, {}, "auto", id="runtime-gpu-auto"),
        pytest.param({"requests": {"cpu": "6"}}, {}, "6", id="runtime-cpu"),
        # resourcesPerNode is taken as a whole, not merged with the runtime's, for this decision.
        pytest.param(
            {"limits": {"nvidia.com/gpu": "1"}},
            {"resourcesPerNode": {"requests": {"cpu": "4"}}},
            "4",
            id="resourcesPerNode-whole-hides-runtime-gpu",
        ),
    ],
)
def test_pet_nproc_per_node(runtime_resources: Obj | None, trainer: Obj, expected: str) -> None:
    node = container("node", image="i")
    if runtime_resources is not None:
        node["resources"] = runtime_resources
    rt = node_runtime(node, ml_policy=TORCH)
    js = jobset_of(run(trainjob({"trainer": trainer}), rt))
    assert env_dict(node_container(js))["PET_NPROC_PER_NODE"] == expected


def test_user_env_first_then_pet_and_same_name_replaced_in_place() -> None:
    rt = node_runtime(
        container(
            "node",
            image="i",
            env=[
                {"name": "A", "value": "runtime-a"},
                {"name": "B", "value": "runtime-b"},
                {"name": "C", "value": "runtime-c"},
            ],
        ),
        ml_policy=TORCH,
    )
    job = trainjob({"trainer": {"env": [{"name": "B", "value": "user-b"}, {"name": "D", "value": "user-d"}]}})
    js = jobset_of(run(job, rt))
    assert node_container(js)["env"] == [
        {"name": "A", "value": "runtime-a"},
        {"name": "B", "value": "user-b"},
        {"name": "C", "value": "runtime-c"},
        {"name": "D", "value": "user-d"},
        *pet_env("1", "1"),
    ]


def test_runtime_pet_env_is_replaced_in_place_by_plugin_value() -> None:
    rt = node_runtime(
        container(
            "node",
            image="i",
            env=[
                {"name": "PET_NNODES", "value": "99"},
                {"name": "KEEP", "value": "k"},
            ],
        ),
        ml_policy=TORCH,
    )
    js = jobset_of(run(trainjob({"trainer": {"numNodes": 2}}), rt))
    env = node_container(js)["env"]
    assert env[0] == {"name": "PET_NNODES", "value": "2"}
    assert env[1] == {"name": "KEEP", "value": "k"}
    assert [e["name"] for e in env[2:]] == [
        "PET_NPROC_PER_NODE",
        "PET_NODE_RANK",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
    ]


def test_resources_per_node_merged_per_key_over_runtime() -> None:
    rt = node_runtime(
        container(
            "node",
            image="i",
            resources={
                "limits": {"cpu": "4", "memory": "16Gi"},
                "requests": {"cpu": "2", "memory": "8Gi", "ephemeral-storage": "1Gi"},
            },
        ),
        ml_policy=TORCH,
    )
    job = trainjob(
        {
            "trainer": {
                "resourcesPerNode": {
                    "limits": {"memory": "32Gi", "nvidia.com/gpu": "2"},
                    "requests": {"memory": "24Gi"},
                }
            }
        }
    )
    js = jobset_of(run(job, rt))
    assert node_container(js)["resources"] == {
        "limits": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "2"},
        "requests": {"cpu": "2", "memory": "24Gi", "ephemeral-storage": "1Gi"},
    }


def test_resources_per_node_only_touch_the_node_container() -> None:
    rt = node_runtime(
        container("sidecar", image="s", resources={"requests": {"cpu": "1"}}),
        container("node", image="i"),
        ml_policy=TORCH,
    )
    job = trainjob({"trainer": {"resourcesPerNode": {"requests": {"cpu": "3"}}}})
    js = jobset_of(run(job, rt))
    assert node_container(js, name="sidecar")["resources"] == {"requests": {"cpu": "1"}}
    assert node_container(js)["resources"] == {"requests": {"cpu": "3"}}
    assert "env" not in node_container(js, name="sidecar")


@pytest.mark.parametrize("suspend", [True, False])
def test_suspend_copied_to_jobset(suspend: bool) -> None:
    js = jobset_of(run(trainjob({"suspend": suspend, "trainer": {}}), runtime(ml_policy=TORCH)))
    assert js["spec"]["suspend"] is suspend


def test_source_seq_and_trace_id_carried_to_every_message() -> None:
    job = trainjob({"suspend": True, "trainer": {}})
    p = plan(observed(job, runtime(ml_policy=TORCH), trace_id="t-9"), source_seq=1234)
    assert p.source_seq == 1234
    assert len(p.applies) == 2
    assert {a.source_seq for a in p.applies} == {1234}
    assert {a.trace_id for a in p.applies} == {"t-9"}
    assert {a.trainjob_uid for a in p.applies} == {UID}


def test_env_injection_targets_get_pet_env_but_no_port() -> None:
    rt = node_runtime(
        container("node", image="i"),
        container("helper", image="h", env=[{"name": "H", "value": "h"}]),
        ml_policy={
            "numNodes": 2,
            "torch": {
                "envInjection": {
                    "targets": [
                        {"jobName": "node", "containerNames": ["helper"]},
                    ]
                }
            },
        },
    )
    js = jobset_of(run(trainjob({"trainer": {}}), rt))
    helper = node_container(js, name="helper")
    assert helper["env"] == [{"name": "H", "value": "h"}, *pet_env("2", "1")]
    assert "ports" not in helper
    assert node_container(js)["ports"] == [{"containerPort": 29500}]


def test_env_injection_target_missing_is_a_validation_warning() -> None:
    rt = runtime(
        ml_policy={"torch": {"envInjection": {"targets": [{"jobName": "node", "containerNames": ["ghost"]}]}}},
    )
    p = run(trainjob({"trainer": {}}), rt)
    assert jobset_messages(p) == []
    assert len(p.warnings) == 1
    assert "ghost" in p.warnings[0]
    assert "spec.runtimeRef" in p.warnings[0]


# ----------------------------------------------------------------------------- torch: deviations, errors


def test_trainer_omitted_still_gets_pet_env() -> None:
    """Documented deviation: Trainer v2.3.0 injects nothing without ``spec.trainer`` (upstream #4076)."""
    rt = node_runtime(
        container(
            "node",
            image="example.com/torch:1",
            command=["torchrun"],
            env=[{"name": "LOG_LEVEL", "value": "info"}],
            resources={"requests": {"cpu": "2"}},
        ),
        ml_policy={"numNodes": 2, "torch": {}},
    )
    js = jobset_of(run(trainjob(), rt))
    assert node_container(js) == {
        "name": "node",
        "image": "example.com/torch:1",
        "command": ["torchrun"],
        "env": [{"name": "LOG_LEVEL", "value": "info"}, *pet_env("2", "2")],
        "ports": [{"containerPort": 29500}],
        "resources": {"requests": {"cpu": "2"}},
    }
    assert rjobs(js)["node"]["template"]["spec"]["parallelism"] == 2


@pytest.mark.parametrize(
    "reserved", ["PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"]
)
def test_reserved_env_blocks_the_jobset_with_a_warning(reserved: str) -> None:
    job = trainjob(
        {"suspend": True, "trainer": {"env": [{"name": "OK", "value": "1"}, {"name": reserved, "value": "5"}]}}
    )
    p = run(job, runtime(ml_policy=TORCH))
    assert jobset_messages(p) == []
    assert len(p.warnings) == 1
    assert reserved in p.warnings[0]
    assert "OK" not in p.warnings[0]
    assert p.warnings[0].startswith("spec.trainer.env")
    # No webhook stands in front of the pipeline: the TrainJob fails, with the reason, instead.
    conditions = built_status(p)["status"]["conditions"]
    assert [c["type"] for c in conditions] == ["Suspended", "Failed"]
    assert conditions[1]["reason"] == "ValidationFailed"
    assert conditions[1]["message"] == p.warnings[0]


def test_reserved_env_allowed_without_torch_policy() -> None:
    """The reserved-name check belongs to the torch plugin; a plain runtime accepts the names."""
    job = trainjob({"trainer": {"env": [{"name": "PET_NNODES", "value": "5"}]}})
    js = jobset_of(run(job, runtime()))
    assert node_container(js)["env"] == [{"name": "PET_NNODES", "value": "5"}]


# --------------------------------------------------------------------------------------------- plainml


def test_plain_runtime_without_ml_policy_keeps_template_parallelism() -> None:
    rt = node_runtime(container("node", image="i"), ml_policy=None, parallelism=2)
    js = jobset_of(run(trainjob({"trainer": {}}), rt))
    spec = rjobs(js)["node"]["template"]["spec"]
    assert (spec["parallelism"], spec["completions"]) == (2, 2)
    assert node_container(js) == {"name": "node", "image": "i", "resources": {}}


def test_plain_runtime_without_ml_policy_num_nodes_env_overrides_but_no_resources() -> None:
    """PlainML sets the count and env even without an mlPolicy; resourcesPerNode needs an mlPolicy."""
    rt = node_runtime(
        container("node", image="i", env=[{"name": "A", "value": "1"}], resources={"requests": {"cpu": "1"}}),
        ml_policy=None,
        parallelism=2,
    )
    job = trainjob(
        {
            "trainer": {
                "numNodes": 3,
                "image": "j",
                "command": ["run"],
                "args": ["--x"],
                "env": [{"name": "A", "value": "2"}, {"name": "B", "value": "3"}],
                "resourcesPerNode": {"requests": {"cpu": "8"}},
            }
        }
    )
    js = jobset_of(run(job, rt))
    spec = rjobs(js)["node"]["template"]["spec"]
    assert (spec["parallelism"], spec["completions"]) == (3, 3)
    assert node_container(js) == {
        "name": "node",
        "image": "j",
        "command": ["run"],
        "args": ["--x"],
        "env": [{"name": "A", "value": "2"}, {"name": "B", "value": "3"}],
        "resources": {"requests": {"cpu": "1"}},
    }


def test_plain_ml_policy_counts_from_num_nodes_and_merges_resources() -> None:
    rt = node_runtime(
        container("node", image="i", resources={"requests": {"cpu": "1"}}), ml_policy={"numNodes": 4}, parallelism=7
    )
    js = jobset_of(run(trainjob({"trainer": {"resourcesPerNode": {"limits": {"cpu": "2"}}}}), rt))
    spec = rjobs(js)["node"]["template"]["spec"]
    assert (spec["parallelism"], spec["completions"]) == (4, 4)
    c = node_container(js)
    assert c["resources"] == {"requests": {"cpu": "1"}, "limits": {"cpu": "2"}}
    assert "env" not in c
    assert "ports" not in c

    js = jobset_of(run(trainjob({"trainer": {"numNodes": 2}}), rt))
    spec = rjobs(js)["node"]["template"]["spec"]
    assert (spec["parallelism"], spec["completions"]) == (2, 2)


def test_job_without_ancestor_keeps_its_parallelism_and_replicas() -> None:
    rt = runtime(
        [
            replicated_job("node", [container("node", image="i")], ancestor="trainer"),
            replicated_job("workers", [container("node", image="w")], replicas=3, parallelism=5),
        ],
        ml_policy={"numNodes": 2, "torch": {}},
    )
    job = trainjob({"trainer": {"numNodes": 4, "image": "new", "env": [{"name": "U", "value": "u"}]}})
    js = jobset_of(run(job, rt))
    workers = rjobs(js)["workers"]
    assert workers["replicas"] == 3
    assert (workers["template"]["spec"]["parallelism"], workers["template"]["spec"]["completions"]) == (5, 5)
    assert node_container(js, "workers") == {"name": "node", "image": "w", "resources": {}}
    assert rjobs(js)["node"]["template"]["spec"]["parallelism"] == 4


def test_trainer_replicas_forced_to_one() -> None:
    rt = node_runtime(container("node", image="i"), ml_policy=TORCH)
    rt["spec"]["template"]["spec"]["replicatedJobs"][0]["replicas"] = 4
    js = jobset_of(run(trainjob({"trainer": {}}), rt))
    assert rjobs(js)["node"]["replicas"] == 1


# ------------------------------------------------------------------------------------------ initializers


def initializer_runtime() -> Obj:
    return runtime(
        [
            replicated_job(
                "dataset-initializer",
                [
                    container(
                        "dataset-initializer",
                        image="d",
                        env=[{"name": "STORAGE_URI", "value": "hf://default"}, {"name": "KEEP", "value": "1"}],
                        volumeMounts=[{"name": "initializer", "mountPath": "/workspace"}],
                    ),
                    container("helper", image="h"),
                ],
                ancestor="dataset-initializer",
            ),
            replicated_job(
                "model-initializer",
                [
                    container(
                        "model-initializer",
                        image="m",
                        envFrom=[{"configMapRef": {"name": "defaults"}}],
                        volumeMounts=[{"name": "initializer", "mountPath": "/workspace"}],
                    ),
                ],
                ancestor="model-initializer",
            ),
            replicated_job("node", [container("node", image="i")], ancestor="trainer"),
        ],
        ml_policy=TORCH,
    )


def test_initializers_overrides() -> None:
    rt = initializer_runtime()
    rt["spec"]["template"]["spec"]["replicatedJobs"][0]["replicas"] = 2
    rt["spec"]["template"]["spec"]["replicatedJobs"][1]["replicas"] = 3
    job = trainjob(
        {
            "trainer": {},
            "initializer": {
                "dataset": {
                    "storageUri": "hf://org/data",
                    "env": [{"name": "KEEP", "value": "2"}, {"name": "NEW", "value": "n"}],
                    "secretRef": {"name": "hf-token"},
                },
                "model": {"storageUri": "s3://bucket/model", "secretRef": {"name": "s3-creds"}},
            },
        }
    )
    js = jobset_of(run(job, rt))
    assert [rj["name"] for rj in js["spec"]["replicatedJobs"]] == ["dataset-initializer", "model-initializer", "node"]
    assert rjobs(js)["dataset-initializer"]["replicas"] == 1
    assert rjobs(js)["model-initializer"]["replicas"] == 1
    assert node_container(js, "dataset-initializer", "dataset-initializer") == {
        "name": "dataset-initializer",
        "image": "d",
        "env": [
            {"name": "STORAGE_URI", "value": "hf://org/data"},
            {"name": "KEEP", "value": "2"},
            {"name": "NEW", "value": "n"},
        ],
        "envFrom": [{"secretRef": {"name": "hf-token"}}],
        "volumeMounts": [{"name": "initializer", "mountPath": "/workspace"}],
        "resources": {},
    }
    assert node_container(js, "dataset-initializer", "helper") == {"name": "helper", "image": "h", "resources": {}}
    assert node_container(js, "model-initializer", "model-initializer") == {
        "name": "model-initializer",
        "image": "m",
        "env": [{"name": "STORAGE_URI", "value": "s3://bucket/model"}],
        "envFrom": [{"configMapRef": {"name": "defaults"}}, {"secretRef": {"name": "s3-creds"}}],
        "volumeMounts": [{"name": "initializer", "mountPath": "/workspace"}],
        "resources": {},
    }
    # Initializer jobs get no trainer env.
    assert rjobs(js)["dataset-initializer"]["template"]["spec"]["parallelism"] == 1


def test_initializers_without_trainjob_initializer_only_force_replicas() -> None:
    rt = initializer_runtime()
    rt["spec"]["template"]["spec"]["replicatedJobs"][0]["replicas"] = 2
    js = jobset_of(run(trainjob({"trainer": {}}), rt))
    assert rjobs(js)["dataset-initializer"]["replicas"] == 1
    assert node_container(js, "dataset-initializer", "dataset-initializer")["env"] == [
        {"name": "STORAGE_URI", "value": "hf://default"},
        {"name": "KEEP", "value": "1"},
    ]
    assert "envFrom" not in node_container(js, "dataset-initializer", "dataset-initializer")


def test_initializer_env_only_without_storage_uri() -> None:
    rt = initializer_runtime()
    job = trainjob({"trainer": {}, "initializer": {"model": {"env": [{"name": "M", "value": "m"}]}}})
    js = jobset_of(run(job, rt))
    assert node_container(js, "model-initializer", "model-initializer")["env"] == [{"name": "M", "value": "m"}]
    assert node_container(js, "dataset-initializer", "dataset-initializer")["env"][0] == {
        "name": "STORAGE_URI",
        "value": "hf://default",
    }


# ------------------------------------------------------------------------------------------ runtimePatches


def test_runtime_patches_from_two_managers() -> None:
    rt = runtime(
        [
            replicated_job(
                "dataset-initializer", [container("dataset-initializer", image="d")], ancestor="dataset-initializer"
            ),
            replicated_job(
                "node",
                [
                    container("node", image="i", volumeMounts=[{"name": "data", "mountPath": "/data"}]),
                    container(
                        "sidecar", image="s", env=[{"name": "S", "value": "runtime"}, {"name": "T", "value": "runtime"}]
                    ),
                ],
                ancestor="trainer",
            ),
        ],
        ml_policy=TORCH,
        labels={"base": "runtime", "shared": "runtime"},
        annotations={"a": "runtime"},
    )
    node_pod = rt["spec"]["template"]["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]
    node_pod["spec"]["volumes"] = [{"name": "data", "emptyDir": {}}]
    node_pod["spec"]["tolerations"] = [{"key": "runtime", "operator": "Exists"}]
    node_pod["spec"]["nodeSelector"] = {"pool": "runtime", "zone": "runtime"}
    node_pod["metadata"] = {"labels": {"pod": "runtime"}}

    first = runtime_patch(
        "first.example.com/tool",
        metadata={"labels": {"shared": "first", "one": "1"}, "annotations": {"a": "first"}},
        replicated_jobs=[
            job_patch(
                "node",
                job_metadata={"labels": {"job": "first"}},
                pod_metadata={"labels": {"pod": "first"}},
                pod_spec={
                    "containers": [
                        {"name": "sidecar", "env": [{"name": "S", "value": "first"}, {"name": "U", "value": "first"}]}
                    ],
                    "volumes": [{"name": "data", "configMap": {"name": "cm"}}, {"name": "extra", "emptyDir": {}}],
                    "tolerations": [{"key": "first", "operator": "Exists"}],
                    "nodeSelector": {"zone": "first"},
                },
            )
        ],
    )
    second = runtime_patch(
        "second.example.com/tool",
        metadata={"labels": {"shared": "second"}},
        replicated_jobs=[
            job_patch(
                "node",
                pod_spec={
                    "containers": [
                        {"name": "sidecar", "env": [{"name": "U", "value": "second"}]},
                        {"name": "node", "volumeMounts": [{"name": "extra", "mountPath": "/x"}]},
                    ],
                    "tolerations": [{"key": "second", "operator": "Equal", "value": "v"}],
                    "nodeSelector": {"disk": "ssd"},
                },
            ),
            job_patch("dataset-initializer", pod_spec={"serviceAccountName": "reader"}),
        ],
    )
    js = jobset_of(run(trainjob({"trainer": {}, "runtimePatches": [first, second]}), rt))

    assert js["metadata"]["labels"] == {"base": "runtime", "shared": "second", "one": "1"}
    assert js["metadata"]["annotations"] == {"a": "first"}
    assert [rj["name"] for rj in js["spec"]["replicatedJobs"]] == ["dataset-initializer", "node"]

    node = rjobs(js)["node"]
    assert node["template"]["metadata"]["labels"] == {ANCESTOR: "trainer", "job": "first"}
    pod = node["template"]["spec"]["template"]
    assert pod["metadata"] == {"labels": {"pod": "first"}}
    spec = pod["spec"]
    assert [c["name"] for c in spec["containers"]] == ["node", "sidecar"]
    assert node_container(js, name="sidecar") == {
        "name": "sidecar",
        "image": "s",
        "env": [
            {"name": "S", "value": "first"},
            {"name": "T", "value": "runtime"},
            {"name": "U", "value": "second"},
        ],
        "resources": {},
    }
    assert node_container(js)["volumeMounts"] == [
        {"name": "data", "mountPath": "/data"},
        {"name": "extra", "mountPath": "/x"},
    ]
    # Volumes merge by name: the patched entry is merged (not replaced) in place, new ones are appended.
    assert spec["volumes"] == [
        {"name": "data", "emptyDir": {}, "configMap": {"name": "cm"}},
        {"name": "extra", "emptyDir": {}},
    ]
    assert spec["tolerations"] == [{"key": "second", "operator": "Equal", "value": "v"}]
    assert spec["nodeSelector"] == {"pool": "runtime", "zone": "first", "disk": "ssd"}
    assert pod_spec(js, "dataset-initializer")["serviceAccountName"] == "reader"


def test_runtime_patch_metadata_only_on_runtime_without_metadata() -> None:
    patch = runtime_patch("x.example.com/m", metadata={"labels": {"l": "v"}, "annotations": {"a": "v"}})
    js = jobset_of(run(trainjob({"trainer": {}, "runtimePatches": [patch]}), runtime(ml_policy=TORCH)))
    assert js["metadata"]["labels"] == {"l": "v"}
    assert js["metadata"]["annotations"] == {"a": "v"}


# ------------------------------------------------------------------------------------- skipped and empty


def test_runtime_missing_plans_no_component_but_status() -> None:
    p = run(trainjob({"suspend": True, "trainer": {}}), None)
    assert jobset_messages(p) == []
    message = "ClusterTrainingRuntime/torch-small not found: the runtime must exist before the TrainJob can be built"
    assert p.warnings == (message,)
    conditions = built_status(p)["status"]["conditions"]
    assert [(c["type"], c["status"], c["reason"]) for c in conditions] == [
        ("Suspended", "True", "Suspended"),
        ("ResourcesCreated", "False", "RuntimeNotFound"),
    ]
    assert conditions[1]["message"] == message


def test_runtime_missing_for_namespaced_runtime_names_the_kind() -> None:
    job = trainjob({"runtimeRef": {"name": "mine", "kind": "TrainingRuntime"}})
    p = run(job, None)
    assert jobset_messages(p) == []
    assert p.warnings == ("TrainingRuntime/mine not found: the runtime must exist before the TrainJob can be built",)


@pytest.mark.parametrize("suspend", [True, False])
def test_managed_by_multikueue_is_left_alone(suspend: bool) -> None:
    job = trainjob(
        {"managedBy": "kueue.x-k8s.io/multikueue", "suspend": suspend, "trainer": {}},
        status={
            "conditions": [
                {
                    "type": "Suspended",
                    "status": "True",
                    "reason": "Suspended",
                    "message": "TrainJob is suspended",
                    "lastTransitionTime": EARLIER,
                }
            ]
        },
    )
    p = run(
        job,
        runtime(ml_policy=TORCH),
        jobset(
            {
                "conditions": [
                    {
                        "type": "Completed",
                        "status": "True",
                        "reason": "AllJobsCompleted",
                        "message": "done",
                        "lastTransitionTime": EARLIER,
                    }
                ]
            }
        ),
    )
    assert p == m.Plan(
        trainjob=m.ObjectKey(namespace=NAMESPACE, name=NAME),
        trainjob_uid=UID,
        source_seq=SEQ,
        applies=(),
        warnings=("managed by kueue.x-k8s.io/multikueue; left alone",),
    )


def test_managed_by_trainer_controller_is_planned() -> None:
    job = trainjob({"managedBy": "trainer.kubeflow.org/trainjob-controller", "trainer": {}})
    assert len(jobset_messages(run(job, runtime(ml_policy=TORCH)))) == 1


@pytest.mark.parametrize("kind", ["Complete", "Failed"])
def test_finished_trainjob_is_not_rebuilt(kind: str) -> None:
    cond = {"type": kind, "status": "True", "reason": "X", "message": "y", "lastTransitionTime": EARLIER}
    job = trainjob({"trainer": {}}, status={"conditions": [cond]})
    p = run(job, runtime(ml_policy=TORCH))
    assert jobset_messages(p) == []
    assert p.warnings == ("finished; components are not rebuilt",)
    assert p.applies == ()


def test_condition_false_is_not_finished() -> None:
    cond = {"type": "Complete", "status": "False", "reason": "X", "message": "y", "lastTransitionTime": EARLIER}
    p = run(trainjob({"trainer": {}}, status={"conditions": [cond]}), runtime(ml_policy=TORCH))
    assert len(jobset_messages(p)) == 1


def test_trainjob_deleted_gives_empty_plan() -> None:
    event = m.TrainJobDeleted(key=m.ObjectKey(namespace=NAMESPACE, name=NAME), uid=UID, observed_at=OBSERVED_AT)
    assert plan(event, source_seq=9) == m.Plan(
        trainjob=m.ObjectKey(namespace=NAMESPACE, name=NAME), trainjob_uid=UID, source_seq=9
    )


# ---------------------------------------------------------------------------------------------- status


def suspended_true(ltt: str = NOW) -> Obj:
    return suspended_condition(True, ltt)


def test_status_suspended_exact() -> None:
    p = run(trainjob({"suspend": True, "trainer": {}}), runtime(ml_policy=TORCH))
    message = status_messages(p)[0]
    assert message.target == m.Target(
        api_version=TRAINER_API, kind="TrainJob", namespace=NAMESPACE, name=NAME, subresource="status"
    )
    assert message.policy == "always"
    assert message.source_seq == SEQ
    assert message.trainjob_uid == UID
    assert msgspec.to_builtins(message.object) == {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "resourceVersion": "5"},  # the precondition
        "status": {"conditions": [suspended_true(NOW)]},
    }
    # The status message comes after the components.
    assert isinstance(p.applies[-1], m.ApplyTrainJobStatus)


def test_status_resumed_gets_new_transition_time() -> None:
    job = trainjob({"suspend": False, "trainer": {}}, status={"conditions": [suspended_true(EARLIER)]})
    assert built_status(run(job, runtime(ml_policy=TORCH)))["status"] == {
        "conditions": [
            {
                "type": "Suspended",
                "status": "False",
                "reason": "Resumed",
                "message": "TrainJob is resumed",
                "lastTransitionTime": NOW,
            }
        ]
    }


def test_status_suspended_again_keeps_nothing_of_resume() -> None:
    resumed = suspended_condition(False, EARLIER)
    job = trainjob({"suspend": True, "trainer": {}}, status={"conditions": [resumed]})
    assert built_status(run(job, runtime(ml_policy=TORCH)))["status"] == {"conditions": [suspended_true(NOW)]}


def test_never_suspended_without_jobset_has_no_status_message() -> None:
    p = run(trainjob({"suspend": False, "trainer": {}}), runtime(ml_policy=TORCH))
    assert status_messages(p) == []


def test_resumed_condition_unchanged_when_still_running() -> None:
    resumed = suspended_condition(False, EARLIER)
    p = run(trainjob({"trainer": {}}, status={"conditions": [resumed]}), runtime(ml_policy=TORCH))
    assert status_messages(p) == []


@pytest.mark.parametrize("suspend", [True, False])
def test_status_idempotent_when_fed_back(suspend: bool) -> None:
    rt = runtime(ml_policy=TORCH)
    start = trainjob({"suspend": True, "trainer": {}})
    first = run(start, rt)
    job = with_status(start, first)
    job["spec"]["suspend"] = suspend
    second = run(job, rt)
    if suspend:
        assert status_messages(second) == []
    else:
        third = run(with_status(job, second), rt)
        assert status_messages(third) == []
    # Unchanged status: the old transition time is kept on a same-status update.
    again = run(with_status(start, first), rt)
    assert status_messages(again) == []


JOBSET_COMPLETED = {
    "conditions": [
        {
            "type": "StartupPolicyCompleted",
            "status": "True",
            "reason": "X",
            "message": "x",
            "lastTransitionTime": EARLIER,
        },
        {
            "type": "Completed",
            "status": "True",
            "reason": "AllJobsCompleted",
            "message": "jobset completed successfully",
            "lastTransitionTime": "2024-01-02T03:04:05Z",
        },
    ],
    "replicatedJobsStatus": [
        {"name": "dataset-initializer", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0},
        {"name": "node", "ready": 0, "succeeded": 2, "failed": 1, "active": 0, "suspended": 0},
    ],
}


def test_status_from_completed_jobset() -> None:
    resumed = suspended_condition(False, EARLIER)
    job = trainjob({"trainer": {}}, status={"conditions": [resumed]})
    p = run(job, runtime(ml_policy=TORCH), jobset(JOBSET_COMPLETED))
    assert built_status(p)["status"] == {
        "conditions": [
            resumed,
            {
                "type": "Complete",
                "status": "True",
                "reason": "AllJobsCompleted",
                "message": "jobset completed successfully",
                "lastTransitionTime": "2024-01-02T03:04:05Z",
            },
        ],
        "jobsStatus": [
            {"name": "dataset-initializer", "ready": 0, "succeeded": 1, "failed": 0, "active": 0, "suspended": 0},
            {"name": "node", "ready": 0, "succeeded": 2, "failed": 1, "active": 0, "suspended": 0},
        ],
    }
    # The JobSet exists and runs, so it is left alone (Trainer's rule); no message is even sent.
    assert jobset_messages(p) == []

    # Fed back: the job is now finished and the status is already what the planner wants.
    again = run(with_status(job, p), runtime(ml_policy=TORCH), jobset(JOBSET_COMPLETED))
    assert again.applies == ()
    assert again.warnings == ("finished; components are not rebuilt",)


def test_status_from_failed_jobset() -> None:
    failed = {
        "conditions": [
            {
                "type": "Failed",
                "status": "True",
                "reason": "FailedJobs",
                "message": "jobset failed due to one or more job failures",
                "lastTransitionTime": "2024-05-06T07:08:09Z",
            }
        ],
        "replicatedJobsStatus": [
            {"name": "node", "ready": 0, "succeeded": 0, "failed": 1, "active": 0, "suspended": 0}
        ],
    }
    p = run(trainjob({"trainer": {}}), runtime(ml_policy=TORCH), jobset(failed))
    assert built_status(p)["status"] == {
        "conditions": [
            {
                "type": "Failed",
                "status": "True",
                "reason": "FailedJobs",
                "message": "jobset failed due to one or more job failures",
                "lastTransitionTime": "2024-05-06T07:08:09Z",
            }
        ],
        "jobsStatus": [{"name": "node", "ready": 0, "succeeded": 0, "failed": 1, "active": 0, "suspended": 0}],
    }


def test_status_jobset_conditions_not_true_are_not_copied() -> None:
    js_status = {
        "conditions": [
            {"type": "Completed", "status": "False", "reason": "R", "message": "m", "lastTransitionTime": EARLIER}
        ],
        "replicatedJobsStatus": [
            {"name": "node", "ready": 2, "succeeded": 0, "failed": 0, "active": 2, "suspended": 0}
        ],
    }
    p = run(trainjob({"trainer": {}}), runtime(ml_policy=TORCH), jobset(js_status))
    assert built_status(p)["status"] == {
        "jobsStatus": [{"name": "node", "ready": 2, "succeeded": 0, "failed": 0, "active": 2, "suspended": 0}],
    }


def test_status_jobs_status_replaced_from_jobset() -> None:
    old = [
        {"name": "node", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 1},
        {"name": "gone", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 1},
    ]
    js_status = {
        "replicatedJobsStatus": [{"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}]
    }
    job = trainjob({"trainer": {}}, status={"jobsStatus": old})
    p = run(job, runtime(ml_policy=TORCH), jobset(js_status))
    assert built_status(p)["status"]["jobsStatus"] == [
        {"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0},
    ]
    # Same jobsStatus again: nothing to write.
    again = run(with_status(job, p), runtime(ml_policy=TORCH), jobset(js_status))
    assert status_messages(again) == []


def test_status_complete_keeps_transition_time_when_already_true() -> None:
    current = {"type": "Complete", "status": "True", "reason": "Old", "message": "old", "lastTransitionTime": EARLIER}
    job = trainjob({"trainer": {}}, status={"conditions": [current]})
    p = run(job, runtime(ml_policy=TORCH), jobset(JOBSET_COMPLETED))
    cond = built_status(p)["status"]["conditions"][0]
    assert cond == {
        "type": "Complete",
        "status": "True",
        "reason": "AllJobsCompleted",
        "message": "jobset completed successfully",
        "lastTransitionTime": EARLIER,
    }


def test_status_planned_for_runtime_missing_with_jobset() -> None:
    p = run(trainjob({"trainer": {}}), None, jobset(JOBSET_COMPLETED))
    assert [c["type"] for c in built_status(p)["status"]["conditions"]] == ["Complete", "ResourcesCreated"]


# --------------------------------------------------------------------------------- purity, determinism


def test_same_event_twice_gives_identical_bytes() -> None:
    rt = initializer_runtime()
    job = trainjob(
        {
            "suspend": True,
            "trainer": {
                "numNodes": 2,
                "env": [{"name": "A", "value": "1"}],
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": "1", "amd.com/gpu": "2"}},
            },
            "initializer": {"dataset": {"storageUri": "hf://x"}},
            "runtimePatches": [
                runtime_patch(
                    "x.example.com/m", replicated_jobs=[job_patch("node", pod_spec={"nodeSelector": {"a": "b"}})]
                )
            ],
        }
    )
    event = observed(job, rt, jobset(JOBSET_COMPLETED, suspend=True), trace_id="t")
    before = m.encode(event)
    one = m.encode(plan(event, source_seq=3))
    two = m.encode(plan(event, source_seq=3))
    assert one == two
    assert m.encode(event) == before
    # A decoded copy of the event plans the same bytes too.
    assert m.encode(plan(m.decode_event(before), source_seq=3)) == one


def test_plan_messages_round_trip_through_the_wire() -> None:
    p = run(trainjob({"suspend": True, "trainer": {}}), runtime(ml_policy=TORCH), jobset(JOBSET_COMPLETED))
    assert len(p.applies) == 2
    for message in p.applies:
        assert m.decode_apply(m.encode(message)) == message


def test_status_suspended_already_true_is_left_alone() -> None:
    job = trainjob({"suspend": True, "trainer": {}}, status={"conditions": [suspended_true(EARLIER)]})
    assert status_messages(run(job, runtime(ml_policy=TORCH))) == []


# ------------------------------------------------------------------------------- known gaps (strict xfail)


def test_torchtune_command_rewritten_and_no_master_env() -> None:
    runtime_command = [
        "tune",
        "run",
        "--config",
        "base",
        "output_dir=/workspace/output",
        "tokenizer.path=/workspace/model/tokenizer.model",
        "epochs=1",
    ]
    rt = node_runtime(
        container("node", image="tt", command=runtime_command, resources={"limits": {"nvidia.com/gpu": "2"}}),
        ml_policy=TORCH,
        name="torchtune-llama3.2-1b",
    )
    job = trainjob({"runtimeRef": {"name": "torchtune-llama3.2-1b"}, "trainer": {"command": ["tune", "run"]}})
    c = node_container(jobset_of(run(job, rt)))
    assert c["command"] == [
        "tune",
        "run",
        f"--rdzv_endpoint={NAME}-node-0-0.{NAME}:29500",
        "full_finetune_distributed",
        "--config",
        "llama3_2/1B_full",
        "output_dir=/workspace/output",
        "tokenizer.path=/workspace/model/tokenizer.model",
    ]
    assert [e["name"] for e in c["env"]] == ["PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK"]
    assert env_dict(c)["PET_NPROC_PER_NODE"] == "auto"


# ------------------------------------------------------------------------------- observed absence


def test_components_the_observation_shows_absent_are_marked_so() -> None:
    """A new TrainJob: no JobSet and no snapshot yet, so the applier may create both without reading them."""
    rt = runtime(ml_policy=TORCH)
    job = trainjob({"trainer": {}, "suspend": False})
    fresh = plan(
        trainjob_observed(job, rt, runtime_source="live", observed_at=OBSERVED_AT, cause="TrainJob ADDED"),
        source_seq=SEQ,
    )
    marked = {(a.target.kind, a.target.name): a.observed_absent for a in fresh.applies}
    assert marked == {("ConfigMap", f"{NAME}-runtime-snapshot"): True, ("JobSet", NAME): True}


def test_components_the_observation_holds_are_not_marked() -> None:
    rt = runtime(ml_policy=TORCH)
    job = trainjob({"trainer": {}, "suspend": True})
    suspended_jobset = {
        "apiVersion": JOBSET_API,
        "kind": "JobSet",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "resourceVersion": "77"},
        "spec": {"suspend": True},
    }
    again = plan(observed(job, rt, suspended_jobset), source_seq=SEQ)
    assert [a.target.kind for a in again.applies if isinstance(a, m.ApplyJobSet)] == ["JobSet"]
    assert not any(a.observed_absent for a in again.applies)
