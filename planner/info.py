"""The intermediate representation every plugin shapes: Trainer's ``runtime.Info`` and ``PodSet``.

Plugins never build Kubernetes objects; they adjust pod sets (counts, containers, env, ports, volumes),
scheduler labels and the JobSet spec held here, and the component builders turn the result into apply
configurations at the end. That split is what lets a new ML policy touch the JobSet without knowing how a
JobSet is assembled, and what keeps the phase order meaningful.

The JobSet spec and the pieces plugins add are plain builtins (see ``planner.merge``): plugins mutate
them freely during one plan, and nothing here outlives that plan.

The types are msgspec Structs rather than dataclasses only for speed: every plan builds a dozen of them,
and a Struct is built several times faster (a frozen dataclass sets each field through
``object.__setattr__``). Nothing here is encoded or decoded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import msgspec

from contracts.messages import ApplyPolicy, SecretGenerator
from contracts.trainer import MLPolicy, PodGroupPolicy

Obj = dict[str, Any]


class Container(msgspec.Struct):
    name: str
    image: str = ""
    command: list[str] | None = None
    env: list[Obj] = msgspec.field(default_factory=list)
    ports: list[Obj] = msgspec.field(default_factory=list)
    volume_mounts: list[Obj] = msgspec.field(default_factory=list)


class PodSet(msgspec.Struct):
    """One replicated job of the JobSet template, index-aligned with ``replicatedJobs``."""

    name: str
    ancestor: str | None
    count: int
    containers: list[Container]
    init_containers: list[Container]
    volumes: list[Obj] = msgspec.field(default_factory=list)
    single_pod_requests: dict[str, Decimal] = msgspec.field(default_factory=dict)
    endpoints: Callable[[], Iterator[str]] | None = None

    def container(self, name: str) -> Container | None:
        """Regular containers first, then init containers, as Trainer looks them up."""
        for c in self.containers:
            if c.name == name:
                return c
        for c in self.init_containers:
            if c.name == name:
                return c
        return None


class RuntimeInfo(msgspec.Struct):
    labels: dict[str, str]
    annotations: dict[str, str]
    ml_policy: MLPolicy | None
    pod_group_policy: PodGroupPolicy | None
    jobset_spec: Obj
    """The runtime template's JobSet spec after runtime patches and resourcesPerNode, as builtins."""
    pod_sets: list[PodSet]
    pod_labels: dict[str, str] = msgspec.field(default_factory=dict)
    pod_annotations: dict[str, str] = msgspec.field(default_factory=dict)
    trainer_command: list[str] | None = None
    """``spec.trainer.command`` as plugins rewrite it (torchtune, flux); the TrainJob itself stays frozen."""
    trainer_args: list[str] | None = None
    mpi_slots: int | None = None
    """OpenMPI slots per node, once the MPI plugin has resolved them."""
    priority_classes: frozenset[str] | None = None
    """The cluster's PriorityClass names as the watcher saw them; ``None`` when unknown (checks are skipped)."""

    def pod_set_by_ancestor(self, ancestor: str) -> PodSet | None:
        for ps in self.pod_sets:
            if ps.ancestor == ancestor:
                return ps
        return None

    def pod_set_by_name(self, name: str) -> PodSet | None:
        for ps in self.pod_sets:
            if ps.name == name:
                return ps
        return None

    def trainer_container(self, name: str) -> Container | None:
        for ps in self.pod_sets:
            if ps.ancestor == "trainer":
                for c in ps.containers:
                    if c.name == name:
                        return c
                return None
        return None


class Component(msgspec.Struct, frozen=True):
    """What a builder returns: one object to apply and the policy the applier must honour.

    ``generate`` names key material the applier adds to a Secret when it writes it; the planner never
    sees a key, so none can reach a plan, the bus or the event history.
    """

    object: Any
    policy: ApplyPolicy = "always"
    generate: SecretGenerator | None = None


class Deletion(msgspec.Struct, frozen=True):
    """A component to remove, e.g. the JobSet of a TrainJob past its active deadline."""

    api_version: str
    kind: str
    name: str
    reason: str
