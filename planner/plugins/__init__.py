"""The plugin registry: which plugins exist, in the order every phase runs them.

The order follows Trainer's registry listing, fixed here so that two planners — or one planner and a
replay of it — always produce the same plan. Within the build phase it puts PodGroups, ConfigMaps and
Secrets before the JobSet whose pods need them, except TrainJobStatus's ConfigMap: that plugin comes last
in Trainer's listing, and so it does here, so that the env it adds follows every ML policy's as in the
golden cases. (The applier writes different components in parallel anyway; a pod whose projected
ConfigMap is not there yet waits for it.)

TrainJobStatus is Trainer's alpha feature, off by default there and here: ``registry()`` takes it only
when given the status server (``--trainjob-status``), as Trainer's registry takes it only with the feature
gate on. ``REGISTRY`` is the registry with it off.

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
from planner.plugins.trainjobstatus import StatusServer, TrainJobStatus
from planner.plugins.volcano import Volcano
from planner.plugins.xgboost import XGBoost


def _sets_own_node_count(policy: MLPolicy) -> bool:
    """The ML policies whose plugin sets the trainer node count and env itself, so PlainML stands aside.

    Torch, MPI and JAX do; XGBoost and Flux rely on PlainML for the count. A new ML policy plugin that
    sets the count itself is added here.
    """
    return is_set(policy.torch) or is_set(policy.mpi) or is_set(policy.jax)


def registry(status_server: StatusServer | None = None) -> Sequence[tuple[str, PluginFactory]]:
    """The plugins in phase order; with ``status_server``, TrainJobStatus too (Trainer's feature gate on)."""
    plugins: list[tuple[str, PluginFactory]] = [
        ("coscheduling", CoScheduling),
        ("flux", Flux),
        ("volcano", Volcano),
        ("mpi", MPI),
        ("plainml", functools.partial(PlainML, superseded_by=_sets_own_node_count)),
        ("torch", Torch),
        ("jobset", JobSetPlugin),
        ("jax", JAX),
        ("xgboost", XGBoost),
    ]
    if status_server is not None:
        plugins.append(("trainjobstatus", functools.partial(TrainJobStatus, status_server)))
    return tuple(plugins)


REGISTRY: Sequence[tuple[str, PluginFactory]] = registry()
"""The registry with the TrainJobStatus feature off, Trainer's default."""
