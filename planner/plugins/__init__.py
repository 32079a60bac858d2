"""The plugin registry: which plugins exist, in the order every phase runs them.

The order follows Trainer's registry listing (ML policies first, JobSet last among builders), fixed here
so that two planners — or one planner and a replay of it — always produce the same plan.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.framework import PluginFactory
from planner.plugins.jobset import JobSetPlugin
from planner.plugins.plainml import PlainML
from planner.plugins.torch import Torch

REGISTRY: Sequence[tuple[str, PluginFactory]] = (
    ("plainml", PlainML),
    ("torch", Torch),
    ("jobset", JobSetPlugin),
)
