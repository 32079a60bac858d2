"""PlainML: the trainer node count and the user's env, for runtimes with no framework-specific policy.

It stands in for the ML policies whose own plugin sets the count and env (torch, MPI and JAX today) only
where those are absent; XGBoost and Flux rely on it for the count. Which policies supersede it is the
registry's decision (``planner.plugins``), passed in as ``superseded_by``: this plugin knows none of its
siblings. It checks the policy on every plan instead of relying on being switched off, so a framework
built without ``RuntimeGated`` skipping still plans the same.
"""

from __future__ import annotations

from collections.abc import Callable

from contracts import trainer as t
from contracts.trainer import MLPolicy, TrainJob
from contracts.values import is_set
from planner.framework import EnforceMLPolicy, RuntimeGated
from planner.info import RuntimeInfo
from planner.merge import upsert_env
from planner.runtime_info import builtins, trainer_of


class PlainML:
    name = "plainml"

    def __init__(self, *, superseded_by: Callable[[MLPolicy], bool]) -> None:
        self._superseded_by = superseded_by

    def enabled(self, info: RuntimeInfo) -> bool:
        policy = info.ml_policy
        return policy is None or not self._superseded_by(policy)

    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None:
        if not self.enabled(info):
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


# The extension points PlainML implements, checked by mypy as the Go compiler checks Trainer's
# ``var _ framework.<Point>Plugin = (*PlainML)(nil)``; tests/unit/test_planner_plugin_phases.py ties them to the phases.
_implements_ml_policy: EnforceMLPolicy = PlainML(superseded_by=lambda policy: False)
_implements_gate: RuntimeGated = PlainML(superseded_by=lambda policy: False)
