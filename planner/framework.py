"""Extension points and their fixed phase order, after Trainer's runtime framework.

Each extension point is one Protocol with one method. A plugin implements the ones it needs; the
framework finds them once, when it is built, and runs every phase in a fixed order:

    validate → ML policy → pod-group policy → pod network → parallel count → build

A plugin joins a phase by having its method (``isinstance`` against the runtime-checkable Protocol), so
each plugin module also declares the points it implements, ``_implements_<point>: <Protocol> = Plugin()``,
as Trainer writes ``var _ framework.EnforceMLPolicyPlugin = (*Torch)(nil)``: mypy then reports a
misspelled or mistyped method instead of the plugin silently missing from a phase, and
tests/unit/test_planner_plugin_phases.py ties the declarations to the phases.

Trainer collects plugins by ranging over a Go map, so the order inside a phase changes from process to
process. Here the registry is an ordered tuple, which makes plans reproducible byte for byte — a
precondition for golden tests and for replaying history against a new planner.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from contracts.trainer import TrainJob
from planner.gofmt import go_value
from planner.info import Component, RuntimeInfo
from planner.runtime_info import RUNTIME_CACHE_SIZE

NO_VALUE: Any = object()
"""``FieldError.value`` when the error carries no value (Kubernetes' ``omitValue``)."""
INVALID = "Invalid"
FORBIDDEN = "Forbidden"


@dataclass(frozen=True)
class FieldError:
    """A validation failure, in the shape of Kubernetes' field.Error."""

    path: str
    message: str
    kind: str = field(default="", compare=False)
    """field.Error's type (``Invalid``, ``Forbidden``); empty where the check does not say."""
    value: Any = field(default=NO_VALUE, compare=False)
    """The bad value of an ``Invalid`` error, as Trainer passes it (JSON-encodable). Neither this nor ``kind``
    takes part in equality: two errors are the same when they name the same field with the same message."""

    def __str__(self) -> str:
        """The planner's condition text: ``path: message``, with the type only when no value goes with it."""
        if self.kind and self.kind != INVALID:
            return f"{self.path}: {self.kind}: {self.message}"
        return f"{self.path}: {self.message}"

    def kubernetes_text(self) -> str:
        """``field.Error.Error()`` as Trainer's webhook aggregates it: ``path: Invalid value: <v>: message``."""
        if self.kind == INVALID and self.value is not NO_VALUE:
            return f"{self.path}: {INVALID} value: {go_value(self.value)}: {self.message}"
        return str(self)


class BuildError(Exception):
    """The runtime and TrainJob cannot be turned into components; reported on the TrainJob."""


class Plugin(Protocol):
    name: str


@runtime_checkable
class CustomValidation(Plugin, Protocol):
    def validate(self, info: RuntimeInfo, job: TrainJob) -> list[FieldError]: ...


@runtime_checkable
class EnforceMLPolicy(Plugin, Protocol):
    def enforce_ml_policy(self, info: RuntimeInfo, job: TrainJob) -> None: ...


@runtime_checkable
class EnforcePodGroupPolicy(Plugin, Protocol):
    def enforce_pod_group_policy(self, info: RuntimeInfo, job: TrainJob) -> None: ...


@runtime_checkable
class PodNetwork(Plugin, Protocol):
    def identify_pod_network(self, info: RuntimeInfo, job: TrainJob) -> None: ...


@runtime_checkable
class ComponentBuilder(Plugin, Protocol):
    def sync_parallel_count(self, info: RuntimeInfo) -> None: ...

    def build(self, info: RuntimeInfo, job: TrainJob) -> list[Component]: ...


@runtime_checkable
class RuntimeGated(Plugin, Protocol):
    def enabled(self, info: RuntimeInfo) -> bool:
        """False when none of the plugin's phases has anything to do for this runtime; it is then skipped.

        Reads nothing but ``info.ml_policy`` and ``info.pod_group_policy``, which come from the runtime
        alone: the answer is reused for every TrainJob on the same runtime.
        """
        ...


PluginFactory = Callable[[], Plugin]


class Phases:
    """Plugins sorted into phases, each list in registry order."""

    def __init__(self, plugins: Sequence[Plugin]) -> None:
        self.validators = [p for p in plugins if isinstance(p, CustomValidation)]
        self.ml_policies = [p for p in plugins if isinstance(p, EnforceMLPolicy)]
        self.pod_group_policies = [p for p in plugins if isinstance(p, EnforcePodGroupPolicy)]
        self.pod_networks = [p for p in plugins if isinstance(p, PodNetwork)]
        self.builders = [p for p in plugins if isinstance(p, ComponentBuilder)]

    def validate(self, info: RuntimeInfo, job: TrainJob) -> list[FieldError]:
        errors: list[FieldError] = []
        for plugin in self.validators:
            errors.extend(plugin.validate(info, job))
        return errors

    def shape(self, info: RuntimeInfo, job: TrainJob) -> None:
        for ml in self.ml_policies:
            ml.enforce_ml_policy(info, job)
        for pg in self.pod_group_policies:
            pg.enforce_pod_group_policy(info, job)
        for net in self.pod_networks:
            net.identify_pod_network(info, job)

    def build(self, info: RuntimeInfo, job: TrainJob) -> list[Component]:
        for builder in self.builders:
            builder.sync_parallel_count(info)
        components: list[Component] = []
        for builder in self.builders:
            components.extend(builder.build(info, job))
        return components


class Framework(Phases):
    """The plugins of one registry, sorted into phases once.

    A runtime usually configures one ML policy and at most one pod-group policy, so most plugins have
    nothing to do for it. ``phases`` leaves out the plugins that say so (``RuntimeGated``); the sets of
    plugins left are few, and each is sorted into phases once.
    """

    def __init__(self, registry: Sequence[tuple[str, PluginFactory]]) -> None:
        plugins = [factory() for _, factory in registry]
        names = [p.name for p in plugins]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate plugin names in registry: {names}")
        super().__init__(plugins)
        self.plugins = plugins
        self._gated = [p for p in plugins if isinstance(p, RuntimeGated)]
        self._phases: dict[tuple[bool, ...], Phases] = {}
        """By which gated plugins are enabled: at most ``2 ** len(self._gated)`` entries."""
        self._by_runtime: dict[bytes, Phases] = {}

    def phases(self, info: RuntimeInfo, runtime_key: bytes | None = None) -> Phases:
        """The plugins with something to do for ``info``, sorted into phases.

        ``runtime_key`` is the encoded runtime ``info`` was built from (``RuntimeTemplate.encoded``): the
        answer is then remembered for that runtime.
        """
        if runtime_key is not None:
            known = self._by_runtime.get(runtime_key)
            if known is not None:
                return known
        enabled = tuple([p.enabled(info) for p in self._gated])
        phases = self._phases.get(enabled)
        if phases is None:
            skipped = {id(p) for p, on in zip(self._gated, enabled, strict=True) if not on}
            phases = self._phases[enabled] = Phases([p for p in self.plugins if id(p) not in skipped])
        if runtime_key is not None:
            if len(self._by_runtime) >= RUNTIME_CACHE_SIZE:
                self._by_runtime.clear()
            self._by_runtime[runtime_key] = phases
        return phases

    def validate(self, info: RuntimeInfo, job: TrainJob) -> list[FieldError]:
        return self.phases(info).validate(info, job)

    def shape(self, info: RuntimeInfo, job: TrainJob) -> None:
        self.phases(info).shape(info, job)

    def build(self, info: RuntimeInfo, job: TrainJob) -> list[Component]:
        return self.phases(info).build(info, job)
