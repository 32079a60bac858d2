"""JAX: ``JAX_*`` distributed env and the trainer port on the trainer ``node`` container.

Runtimes are shaped like Trainer's ``jax-distributed``; expected values follow ``jax.go`` and its tests at
v2.3.0, except the deliberate deviation for upstream #4076 (env injected when ``spec.trainer`` is omitted).
"""

from __future__ import annotations

from contracts import messages as m

from .builders import (
    ANCESTOR,
    FRAMEWORK_WITHOUT_FLUX_AND_MPI,
    RANK,
    Obj,
    only_object,
    owner_reference,
    plan_with,
    pod_spec,
    replicated_job,
    runtime_dict,
    trainjob_dict,
    trainjob_observed,
)

NAME = "jx"
NAMESPACE = "ml"
UID = "9c2e-uid"
OWNER = owner_reference(NAME, UID)
IMAGE = "nvcr.io/nvidia/jax:25.10-py3"


def runtime(*, env: list[Obj] | None = None, ml_policy: Obj | None = None, ancestor: str = "trainer") -> Obj:
    container: Obj = {"name": "node", "image": IMAGE}
    if env is not None:
        container["env"] = env
    return runtime_dict(
        [replicated_job("node", [container], ancestor=ancestor)],
        name="jax-distributed",
        ml_policy=ml_policy if ml_policy is not None else {"numNodes": 1, "jax": {}},
    )


def trainjob(trainer: Obj | None = None) -> Obj:
    return trainjob_dict(trainer, name=NAME, namespace=NAMESPACE, uid=UID, runtime="jax-distributed")


def jobset(job: Obj, rt: Obj) -> Obj:
    return only_object(plan_with(FRAMEWORK_WITHOUT_FLUX_AND_MPI, trainjob_observed(job, rt)), m.ApplyJobSet)


def node(js: Obj) -> Obj:
    container: Obj = pod_spec(js, "node")["containers"][0]
    return container


def jax_env(processes: str) -> list[Obj]:
    return [
        {"name": "JAX_NUM_PROCESSES", "value": processes},
        {"name": "JAX_PROCESS_ID", "valueFrom": RANK},
        {"name": "JAX_COORDINATOR_ADDRESS", "value": f"{NAME}-node-0-0.{NAME}:29500"},
    ]


def test_multi_node_jobset_is_exact() -> None:
    job = trainjob({"numNodes": 2, "command": ["python", "train.py"], "env": [{"name": "FOO", "value": "bar"}]})
    assert jobset(job, runtime()) == {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "ownerReferences": [OWNER]},
        "spec": {
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
                                            "image": IMAGE,
                                            "command": ["python", "train.py"],
                                            # JAX does not copy the user's env itself (PlainML stands aside
                                            # for JAX), so the builder appends it after the JAX variables.
                                            "env": [*jax_env("2"), {"name": "FOO", "value": "bar"}],
                                            "ports": [{"containerPort": 29500}],
                                            "resources": {},
                                        }
                                    ]
                                },
                            },
                        },
                    },
                }
            ]
        },
    }


def test_single_node_uses_the_runtime_node_count() -> None:
    c = node(jobset(trainjob({"image": "example.com/jax:2"}), runtime(ml_policy={"numNodes": 3, "jax": {}})))
    assert c["env"] == jax_env("3")
    assert c["image"] == "example.com/jax:2"


def test_deviation_4076_env_and_port_without_spec_trainer() -> None:
    c = node(jobset(trainjob(), runtime()))
    assert c["env"] == jax_env("1")
    assert c["ports"] == [{"containerPort": 29500}]


def test_runtime_env_comes_first_and_user_env_wins_by_name() -> None:
    job = trainjob({"env": [{"name": "JAX_NUM_PROCESSES", "value": "7"}, {"name": "XLA_FLAGS", "value": "x"}]})
    c = node(jobset(job, runtime(env=[{"name": "TF_CPP_MIN_LOG_LEVEL", "value": "0"}])))
    assert c["env"] == [
        {"name": "TF_CPP_MIN_LOG_LEVEL", "value": "0"},
        {"name": "JAX_NUM_PROCESSES", "value": "7"},
        *jax_env("1")[1:],
        {"name": "XLA_FLAGS", "value": "x"},
    ]


def test_no_trainer_pod_set_means_nothing_to_inject() -> None:
    c = node(jobset(trainjob({"numNodes": 2}), runtime(ancestor="worker")))
    assert c == {"name": "node", "image": IMAGE, "resources": {}}


def test_other_policies_get_no_jax_env() -> None:
    c = node(jobset(trainjob({"numNodes": 2}), runtime(ml_policy={"numNodes": 1, "xgboost": {}})))
    assert not any(e["name"].startswith("JAX_") for e in c["env"])
