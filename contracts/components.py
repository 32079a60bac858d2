"""The component kinds: every object a plan may write besides the TrainJob's status, and how it is followed.

In Trainer, a plugin that builds an object also says that the controller watches it: the JobSet plugin's
``ReconcilerBuilders`` (its watch extension point) has the manager own JobSets, so a JobSet's change
enqueues the TrainJob that controls it. Here the plugins live in the planner and the watching in the
watcher, and neither may import the other, so the same statement is made once, in the vocabulary both
share: one ``ComponentKind`` per apply message that carries a component, naming the resource it writes and
how the watcher follows it. The watcher makes its informers from ``COMPONENT_KINDS`` and nothing else, so a
plugin that builds a new kind adds its row here and needs no watcher edit.

A row's ``watch`` says what the watcher keeps of each object (``keep``). ``identity`` (name, namespace,
uid, version, owners) is all a kind needs whose change only means "plan the owning TrainJob again": the
planner plans from the TrainJob and its runtime, and a changed or deleted component is drift to repair.
The two kinds an observation carries have a keep of their own: the JobSet, whose status becomes the
TrainJob's, and the ConfigMap, since a TrainJob's runtime snapshot is one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from contracts import labels, resources
from contracts.messages import (
    ApplyConfigMap,
    ApplyJobSet,
    ApplyPodGroup,
    ApplySecret,
    ApplyTrainJobStatus,
    ApplyVolcanoPodGroup,
    ObjectApply,
)
from contracts.resources import Resource

Keep = Literal["identity", "jobset", "runtime-snapshot"]
"""What the watcher keeps of each object: its identity only, or what an observation carries of it."""


@dataclass(frozen=True, kw_only=True)
class Watch:
    """How the watcher follows one component kind."""

    keep: Keep = "identity"
    label_selector: str | None = None
    """Asked of the API server, so objects without the label never reach the watcher."""
    controlled_only: bool = True
    """Cache only objects a TrainJob controls (the rest cannot make a TrainJob's change)."""
    listed_first: bool = False
    """Listed before the first TrainJob event goes out, because an observation carries it; a kind that
    only triggers re-plans is not waited for, so a missing optional CRD does not hold up the start."""


@dataclass(frozen=True, kw_only=True)
class ComponentKind:
    message: type[ObjectApply]
    """The apply message that carries it."""
    resource: Resource
    """The one resource that message may write."""
    watch: Watch | None
    """How the watcher follows it; ``None`` for a kind it must not watch (the row says why)."""


COMPONENT_KINDS: tuple[ComponentKind, ...] = (
    # All JobSets are cached, controlled or not: an observation's JobSet is looked up by the TrainJob's
    # name, and the lookup checks the controller.
    ComponentKind(
        message=ApplyJobSet,
        resource=resources.JOBSET,
        watch=Watch(keep="jobset", controlled_only=False, listed_first=True),
    ),
    # Only the ConfigMaps this pipeline wrote, by its label (contracts.labels); read whole, since the
    # runtime snapshot's data is needed and none of them holds a secret.
    ComponentKind(
        message=ApplyConfigMap,
        resource=resources.CONFIG_MAP,
        watch=Watch(keep="runtime-snapshot", label_selector=labels.OWNED_SELECTOR, listed_first=True),
    ),
    # Not watched at all: a role that may list or watch Secrets reads every Secret's data, whatever the
    # client asks for (RBAC has no metadata-only read). The applier keeps the record of the Secrets it
    # created in its ledger; a deleted one is made again when someone next changes its TrainJob
    # (contracts.messages.ApplySecret.recheck).
    ComponentKind(message=ApplySecret, resource=resources.SECRET, watch=None),
    ComponentKind(message=ApplyPodGroup, resource=resources.POD_GROUP, watch=Watch()),
    ComponentKind(message=ApplyVolcanoPodGroup, resource=resources.VOLCANO_POD_GROUP, watch=Watch()),
)


def _check(kinds: tuple[ComponentKind, ...]) -> None:
    messages = [kind.message for kind in kinds]
    carried = set(get_args(ObjectApply)) - {ApplyTrainJobStatus}
    if len(set(messages)) != len(messages) or set(messages) != carried:
        missing = sorted(m.__name__ for m in carried - set(messages))
        raise TypeError(f"COMPONENT_KINDS must name each component message of ObjectApply once (missing: {missing})")
    resources_ = [(kind.resource.api_version, kind.resource.kind) for kind in kinds]
    if len(set(resources_)) != len(resources_):
        raise TypeError("COMPONENT_KINDS names one resource for two messages")


_check(COMPONENT_KINDS)

WATCHED: tuple[ComponentKind, ...] = tuple(kind for kind in COMPONENT_KINDS if kind.watch is not None)
"""The component kinds the watcher has an informer for, in this order."""
