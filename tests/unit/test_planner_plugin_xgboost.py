"""XGBoost: reserved ``DMLC_*`` names, and the tracker env plus the trainer port on the ``node`` container.

Runtimes are shaped like Trainer's ``xgboost-distributed``; expected values follow ``xgboost.go`` and its
tests at v2.3.0, except the deliberate deviation for upstream #4076 (env injected when ``spec.trainer`` is
omitted).
"""

from __future__ import annotations

from contracts import messages as m

from .builders import (
    FRAMEWORK_WITHOUT_FLUX_AND_MPI,
    RANK,
    Obj,
    only_object,
    plan_with,
    replicated_job,
    runtime_dict,
    trainjob_dict,
    trainjob_observed,
    validate_with,
)

NAME = "xgb"
NAMESPACE = "tabular"
UID = "41d0-uid"
IMAGE = "ghcr.io/kubeflow/trainer/xgboost-runtime"


def runtime(*, resources: Obj | None = None, ml_policy: Obj | None = None) -> Obj:
    container: Obj = {"name": "node", "image": IMAGE}
    if resources is not None:
        container["resources"] = resources
    return runtime_dict(
        [replicated_job("node", [container], ancestor="trainer")],
        name="xgboost-distributed",
        ml_policy=ml_policy if ml_policy is not None else {"numNodes": 1, "xgboost": {}},
    )


def trainjob(trainer: Obj | None = None) -> Obj:
    return trainjob_dict(trainer, name=NAME, namespace=NAMESPACE, uid=UID, runtime="xgboost-distributed")


def run(job: Obj, rt: Obj) -> m.Plan:
    return plan_with(FRAMEWORK_WITHOUT_FLUX_AND_MPI, trainjob_observed(job, rt))


def node_spec(job: Obj, rt: Obj) -> Obj:
    out: Obj = only_object(run(job, rt), m.ApplyJobSet)["spec"]["replicatedJobs"][0]["template"]["spec"]
    return out


def node(job: Obj, rt: Obj) -> Obj:
    container: Obj = node_spec(job, rt)["template"]["spec"]["containers"][0]
    return container


def dmlc_env(workers: str) -> list[Obj]:
    return [
        {"name": "DMLC_TRACKER_URI", "value": f"{NAME}-node-0-0.{NAME}"},
        {"name": "DMLC_TRACKER_PORT", "value": "29500"},
        {"name": "DMLC_TASK_ID", "valueFrom": RANK},
        {"name": "DMLC_NUM_WORKER", "value": workers},
    ]


def validate(job: Obj, rt: Obj) -> list[str]:
    return [str(e) for e in validate_with(FRAMEWORK_WITHOUT_FLUX_AND_MPI, job, rt)]


# ------------------------------------------------------------------------------------------------ env


def test_cpu_multi_node_container_is_exact() -> None:
    job = trainjob({"numNodes": 3, "env": [{"name": "FOO", "value": "bar"}], "args": ["--rounds=10"]})
    spec = node_spec(job, runtime())
    assert (spec["parallelism"], spec["completions"]) == (3, 3)
    assert spec["template"]["spec"]["containers"] == [
        {
            "name": "node",
            "image": IMAGE,
            "args": ["--rounds=10"],
            # PlainML puts the user's env on the container before the XGBoost plugin adds DMLC_*.
            "env": [{"name": "FOO", "value": "bar"}, *dmlc_env("3")],
            "ports": [{"containerPort": 29500}],
            "resources": {},
        }
    ]


def test_one_worker_per_gpu_from_the_runtime() -> None:
    c = node(trainjob({"numNodes": 2}), runtime(resources={"limits": {"nvidia.com/gpu": 4}}))
    assert c["env"] == dmlc_env("8")


def test_resources_per_node_replace_the_runtime_resources_as_a_whole() -> None:
    rt = runtime(resources={"limits": {"nvidia.com/gpu": 4}})
    cpu_only = trainjob({"numNodes": 2, "resourcesPerNode": {"requests": {"cpu": "2"}}})
    assert node(cpu_only, rt)["env"] == dmlc_env("2")
    with_gpus = trainjob({"numNodes": 2, "resourcesPerNode": {"limits": {"example.com/gpu": "2"}}})
    assert node(with_gpus, runtime())["env"] == dmlc_env("4")


def test_deviation_4076_env_and_port_without_spec_trainer() -> None:
    c = node(trainjob(), runtime(ml_policy={"numNodes": 2, "xgboost": {}}))
    assert c["env"] == dmlc_env("2")
    assert c["ports"] == [{"containerPort": 29500}]


def test_other_policies_get_no_dmlc_env() -> None:
    c = node(trainjob({"numNodes": 2}), runtime(ml_policy={"numNodes": 1, "jax": {}}))
    assert not any(e["name"].startswith("DMLC_") for e in c["env"])


# ----------------------------------------------------------------------------------------- validation


def test_reserved_names_are_forbidden_one_error_per_entry() -> None:
    job = trainjob(
        {
            "env": [
                {"name": "FOO", "value": "1"},
                {"name": "DMLC_TRACKER_URI", "value": "x"},
                {"name": "DMLC_NUM_WORKER", "value": "9"},
            ]
        }
    )
    assert validate(job, runtime()) == [
        "spec.trainer.env[1]: DMLC_TRACKER_URI is reserved for the XGBoost runtime",
        "spec.trainer.env[2]: DMLC_NUM_WORKER is reserved for the XGBoost runtime",
    ]


def test_reserved_names_block_the_plan() -> None:
    p = run(trainjob({"env": [{"name": "DMLC_TASK_ID", "value": "0"}]}), runtime())
    assert [a for a in p.applies if isinstance(a, m.ApplyJobSet)] == []
    assert any("spec.trainer.env[0]: DMLC_TASK_ID is reserved for the XGBoost runtime" in w for w in p.warnings)


def test_reserved_names_are_only_checked_for_xgboost_runtimes() -> None:
    job = trainjob({"env": [{"name": "DMLC_TRACKER_URI", "value": "x"}]})
    assert validate(job, runtime(ml_policy={"numNodes": 1, "jax": {}})) == []
    assert validate(trainjob(), runtime()) == []
