"""JAX: the ``jax.distributed`` environment on the trainer ``node`` container, and the trainer port.

One JAX process per node: ``JAX_NUM_PROCESSES`` is the trainer node count, ``JAX_PROCESS_ID`` the pod's
Job completion index, and ``JAX_COORDINATOR_ADDRESS`` the first trainer pod on the trainer port
(``<tj>-node-0-0.<tj>:29500``). The plugin also sets the trainer count from ``numNodes``. It has no
validation, and it does not copy ``spec.trainer.env`` into the container itself: PlainML stands aside for
JAX, so the user's env reaches the container only through the JobSet builder, after these variables.

deviation: upstream #4076 — Trainer v2.3.0 injects neither the env nor the port when ``spec.trainer`` is
omitted, which leaves a JAX runtime used as-is without a coordinator. Here they are injected whenever
the runtime has a trainer ``node`` container.
"""

from __future__ import annotations

from contracts import trainer as t
from contracts.trainer import TrainJob
from contracts.values import is_set, name_of
from planner.framework import EnforceMLPolicy, RuntimeGated
from planner.info import RuntimeInfo
from planner.merge import env_field_ref, env_value, upsert_env, upsert_ports
from planner.runtime_info import trainer_of


class JAX:
    name = "jax"

    def enabled(self, info: RuntimeInfo) -> bool:
        policy = info.ml_policy
        return policy is not None and is_set(policy.jax)

    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        policy = info.ml_policy
        if policy is None or not is_set(policy.jax):
            return
        trainer = trainer_of(job)
        trainer_ps = info.pod_set_by_ancestor(t.ANCESTOR_TRAINER)
        if trainer_ps is not None and trainer is not None and is_set(trainer.num_nodes):
            trainer_ps.count = trainer.num_nodes

        container = info.trainer_container(t.NODE)
        if container is None:
            return
        count = trainer_ps.count if trainer_ps is not None else 1
        name = name_of(job)
        upsert_env(
            container.env,
            [
                env_value(t.JAX_ENV_NUM_PROCESSES, str(count)),
                env_field_ref(t.JAX_ENV_PROCESS_ID, t.JOB_COMPLETION_INDEX_FIELD_PATH),
                env_value(t.JAX_ENV_COORDINATOR_ADDRESS, f"{name}-{t.NODE}-0-0.{name}:{t.CONTAINER_TRAINER_PORT}"),
            ],
        )
        upsert_ports(container.ports, [{"containerPort": t.CONTAINER_TRAINER_PORT}])


# The extension points JAX implements, checked by mypy as the Go compiler checks Trainer's
# ``var _ framework.<Point>Plugin = (*JAX)(nil)``; tests/unit/test_planner_plugin_phases.py ties them to the phases.
_implements_ml_policy: EnforceMLPolicy = JAX()
_implements_gate: RuntimeGated = JAX()
