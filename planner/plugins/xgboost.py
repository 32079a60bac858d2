"""XGBoost: the DMLC (Rabit) tracker environment on the trainer ``node`` container, and the trainer port.

Rank 0 runs the tracker, so ``DMLC_TRACKER_URI`` is the first trainer pod (``<tj>-node-0-0.<tj>``) and
``DMLC_TRACKER_PORT`` the trainer port; ``DMLC_TASK_ID`` is the pod's Job completion index; and
``DMLC_NUM_WORKER`` is the node count times the workers per node — one per GPU when the node has GPUs
(same detection as Torch: ``resourcesPerNode`` as a whole if set, else the runtime's ``node`` container),
otherwise one. The four names are reserved: the TrainJob may not set them in ``spec.trainer.env``.

The node count and the user's env are PlainML's work (it runs for XGBoost); this plugin sets the count
again from ``numNodes``, as Trainer does, so the order of the two cannot matter.

deviation: upstream #4076 — Trainer v2.3.0 injects neither the env nor the port when ``spec.trainer`` is
omitted, so a runtime used as-is has no tracker. Here they are injected whenever the runtime has a
trainer ``node`` container.
"""

from __future__ import annotations

from contracts import trainer as t
from contracts.trainer import TrainJob
from contracts.values import is_set, name_of, or_default
from planner.framework import CustomValidation, EnforceMLPolicy, FieldError, RuntimeGated
from planner.info import RuntimeInfo
from planner.merge import env_field_ref, env_value, gpus_per_node, upsert_env, upsert_ports
from planner.runtime_info import node_resources, trainer_of


class XGBoost:
    name = "xgboost"

    def enabled(self, info: RuntimeInfo) -> bool:
        policy = info.ml_policy
        return policy is not None and is_set(policy.xgboost)

    def validate(self, info: RuntimeInfo, job: TrainJob) -> list[FieldError]:
        policy = info.ml_policy
        if policy is None or not is_set(policy.xgboost):
            return []
        trainer = trainer_of(job)
        if trainer is None:
            return []
        return [
            FieldError(f"spec.trainer.env[{index}]", f"{env.name} is reserved for the XGBoost runtime")
            for index, env in enumerate(or_default(trainer.env, []))
            if env.name in t.XGBOOST_RESERVED_ENV_NAMES
        ]

    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        policy = info.ml_policy
        if policy is None or not is_set(policy.xgboost):
            return
        trainer_ps = info.pod_set_by_ancestor(t.ANCESTOR_TRAINER)
        if trainer_ps is None:
            return
        trainer = trainer_of(job)
        if trainer is not None and is_set(trainer.num_nodes):
            trainer_ps.count = trainer.num_nodes

        container = info.trainer_container(t.NODE)
        if container is None:
            return
        gpus = gpus_per_node(node_resources(info, job))
        workers_per_node = gpus if gpus > 0 else 1
        name = name_of(job)
        upsert_env(
            container.env,
            [
                env_value(t.XGBOOST_ENV_TRACKER_URI, f"{name}-{t.NODE}-0-0.{name}"),
                env_value(t.XGBOOST_ENV_TRACKER_PORT, str(t.CONTAINER_TRAINER_PORT)),
                env_field_ref(t.XGBOOST_ENV_TASK_ID, t.JOB_COMPLETION_INDEX_FIELD_PATH),
                env_value(t.XGBOOST_ENV_NUM_WORKER, str(trainer_ps.count * workers_per_node)),
            ],
        )
        upsert_ports(container.ports, [{"containerPort": t.CONTAINER_TRAINER_PORT}])


# The extension points XGBoost implements, checked by mypy as the Go compiler checks Trainer's
# ``var _ framework.<Point>Plugin = (*XGBoost)(nil)``; tests/unit/test_planner_plugin_phases.py ties them to the phases.
_implements_validation: CustomValidation = XGBoost()
_implements_ml_policy: EnforceMLPolicy = XGBoost()
_implements_gate: RuntimeGated = XGBoost()
