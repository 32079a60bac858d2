"""The plugin registry: which plugins exist, in the order every phase runs them.

The order follows Trainer's registry listing, fixed here so that two planners — or one planner and a
replay of it — always produce the same plan. Within the build phase it puts PodGroups, ConfigMaps and
Secrets before the JobSet whose pods need them. TrainJobStatus (Trainer's alpha status server, off by
default) is not registered: nothing here serves its endpoint.

The registry is also the one place that knows how plugins relate: PlainML stands in for every ML policy
whose own plugin does not set the trainer node count and env, and ``_sets_own_node_count`` names those
policies. Plugins themselves import only the framework and shared modules (an import-linter contract).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from contracts.trainer import MLPolicy
from contracts.values import is_set
from planner.framework import PluginFactory
from planner.plugins.coscheduling import CoScheduling
from planner.plugins.flux import Flux
from planner.plugins.jax import JAX
from planner.plugins.jobset import JobSetPlugin
from planner.plugins.mpi import MPI
from planner.plugins.plainml import PlainML
from planner.plugins.torch import Torch
from planner.plugins.volcano import Volcano
from planner.plugins.xgboost import XGBoost


def _sets_own_node_count(policy: MLPolicy) -> bool:
    """The ML policies whose plugin sets the trainer node count and env itself, so PlainML stands aside.

    Torch, MPI and JAX do; XGBoost and Flux rely on PlainML for the count. A new ML policy plugin that
    sets the count itself is added here.
    """
    return is_set(policy.torch) or is_set(policy.mpi) or is_set(policy.jax)


REGISTRY: Sequence[tuple[str, PluginFactory]] = (
    ("coscheduling", CoScheduling),
    ("flux", Flux),
    ("volcano", Volcano),
    ("mpi", MPI),
    ("plainml", functools.partial(PlainML, superseded_by=_sets_own_node_count)),
    ("torch", Torch),
    ("jobset", JobSetPlugin),
    ("jax", JAX),
    ("xgboost", XGBoost),
)
