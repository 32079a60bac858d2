"""PlainML: the trainer node count and the user's env, for runtimes with no framework-specific policy.

It stands in for torch, MPI and JAX only where those are absent (XGBoost and Flux rely on it for the
count), so it checks the policy instead of being switched off by the registry.
"""

from __future__ import annotations

from contracts import trainer as t
from contracts.trainer import TrainJob
from contracts.values import is_set
from planner.info import RuntimeInfo
from planner.merge import upsert_env
from planner.runtime_info import builtins, trainer_of


class PlainML:
    name = "plainml"

    def enabled(self, info: RuntimeInfo) -> bool:
        policy = info.ml_policy
        return policy is None or not (is_set(policy.torch) or is_set(policy.mpi) or is_set(policy.jax))

    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        policy = info.ml_policy
        if policy is not None and (is_set(policy.torch) or is_set(policy.mpi) or is_set(policy.jax)):
            return
        trainer = trainer_of(job)
        if trainer is None:
            return
        trainer_ps = info.pod_set_by_ancestor(t.ANCESTOR_TRAINER)
        if is_set(trainer.num_nodes) and trainer_ps is not None:
            trainer_ps.count = trainer.num_nodes
        container = info.trainer_container(t.NODE)
        if container is not None and is_set(trainer.env):
            upsert_env(container.env, builtins(trainer.env))
