"""The plugin registry: which plugins exist, in the order every phase runs them.

The order follows Trainer's registry listing, fixed here so that two planners — or one planner and a
replay of it — always produce the same plan. Within the build phase it puts PodGroups, ConfigMaps and
Secrets before the JobSet whose pods need them. TrainJobStatus (Trainer's alpha status server, off by
default) is not registered: nothing here serves its endpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

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

REGISTRY: Sequence[tuple[str, PluginFactory]] = (
    ("coscheduling", CoScheduling),
    ("flux", Flux),
    ("volcano", Volcano),
    ("mpi", MPI),
    ("plainml", PlainML),
    ("torch", Torch),
    ("jobset", JobSetPlugin),
    ("jax", JAX),
    ("xgboost", XGBoost),
)
