"""JAX: ``JAX_*`` distributed env and the trainer port on the trainer ``node`` container.

Runtimes are shaped like Trainer's ``jax-distributed``; expected values follow ``jax.go`` and its tests at
v2.3.0, except the deliberate deviation for upstream #4076 (env injected when ``spec.trainer`` is omitted).
"""

from __future__ import annotations

from typing import Any

import msgspec

from contracts import messages as m
from contracts.trainer import TrainingRuntime, TrainJob
from planner.core import plan
from planner.framework import Framework
from planner.plugins.coscheduling import CoScheduling
from planner.plugins.jax import JAX
from planner.plugins.jobset import JobSetPlugin
from planner.plugins.plainml import PlainML
from planner.plugins.torch import Torch
from planner.plugins.volcano import Volcano
from planner.plugins.xgboost import XGBoost

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
RANK = {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
NAME = "jx"
NAMESPACE = "ml"
UID = "9c2e-uid"
OWNER = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "name": NAME,
    "uid": UID,
    "controller": True,
    "blockOwnerDeletion": True,
}
IMAGE = "nvcr.io/nvidia/jax:25.10-py3"


def runtime(*, env: list[Obj] | None = None, ml_policy: Obj | None = None, ancestor: str = "trainer") -> Obj:
    container: Obj = {"name": "node", "image": IMAGE}
    if env is not None:
        container["env"] = env
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "jax-distributed"},
        "spec": {
            "mlPolicy": ml_policy if ml_policy is not None else {"numNodes": 1, "jax": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {"labels": {ANCESTOR: ancestor}},
                                "spec": {"template": {"spec": {"containers": [container]}}},
                            },
                        }
                    ]
                }
            },
        },
    }


def trainjob(trainer: Obj | None = None) -> Obj:
    spec: Obj = {"runtimeRef": {"name": "jax-distributed"}}
    if trainer is not None:
        spec["trainer"] = trainer
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": UID},
        "spec": spec,
    }


def jobset(job: Obj, rt: Obj) -> Obj:
    event = m.TrainJobObserved(
        trainjob=msgspec.convert(job, TrainJob),
        runtime=msgspec.convert(rt, TrainingRuntime),
        observed_at=1_700_000_000.0,
        priority_classes=None,
    )
    p = plan(event, source_seq=1, framework=FRAMEWORK)
    messages = [a for a in p.applies if isinstance(a, m.ApplyJobSet)]
    assert len(messages) == 1, p
    out: Obj = msgspec.to_builtins(messages[0].object)
    return out


def node(js: Obj) -> Obj:
    container: Obj = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
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
