"""Which plugins join which phase, in which order — and that each plugin declares exactly those phases.

A plugin joins a phase by having the phase's method (``isinstance`` against a runtime-checkable Protocol),
so a misspelled method would silently drop it from the phase. Each plugin module therefore declares the
extension points it implements (``_implements_*: framework.<Point> = Plugin()``), which mypy checks like
Go checks Trainer's ``var _ framework.<Point>Plugin = (*Plugin)(nil)``; these tests pin the membership and
tie it to the declarations.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

import msgspec
import pytest

from contracts.trainer import (
    FluxMLPolicySource,
    JAXMLPolicySource,
    MLPolicy,
    MPIMLPolicySource,
    TorchMLPolicySource,
    XGBoostMLPolicySource,
)
from planner import framework as fw
from planner.framework import Framework, Phases
from planner.info import RuntimeInfo
from planner.plugins import REGISTRY, registry
from planner.plugins.trainjobstatus import StatusServer

POINTS: dict[str, type] = {
    "validation": fw.CustomValidation,
    "ml_policy": fw.EnforceMLPolicy,
    "pod_group_policy": fw.EnforcePodGroupPolicy,
    "pod_network": fw.PodNetwork,
    "builder": fw.ComponentBuilder,
    "gate": fw.RuntimeGated,
}


def _names(plugins: Iterable[fw.Plugin]) -> list[str]:
    return [p.name for p in plugins]


def test_the_registry_order() -> None:
    assert [name for name, _ in REGISTRY] == [
        "coscheduling",
        "flux",
        "volcano",
        "mpi",
        "plainml",
        "torch",
        "jobset",
        "jax",
        "xgboost",
    ]


def test_which_plugins_join_which_phase_in_which_order() -> None:
    phases = Phases([factory() for _, factory in REGISTRY])
    assert _names(phases.validators) == ["flux", "volcano", "mpi", "torch", "xgboost"]
    assert _names(phases.ml_policies) == ["flux", "mpi", "plainml", "torch", "jax", "xgboost"]
    assert _names(phases.pod_group_policies) == ["coscheduling", "volcano"]
    assert _names(phases.pod_networks) == ["jobset"]
    assert _names(phases.builders) == ["coscheduling", "flux", "volcano", "mpi", "jobset"]


WITH_STATUS = registry(StatusServer(url="https://status.example", ca_cert="-----BEGIN CERTIFICATE-----"))
"""The registry with Trainer's TrainJobStatus feature gate on."""


def test_with_the_trainjob_status_gate_on_its_plugin_comes_last_in_ml_policy_and_build() -> None:
    assert [name for name, _ in WITH_STATUS] == [name for name, _ in REGISTRY] + ["trainjobstatus"]
    phases = Phases([factory() for _, factory in WITH_STATUS])
    assert _names(phases.validators) == ["flux", "volcano", "mpi", "torch", "xgboost"]
    assert _names(phases.ml_policies) == ["flux", "mpi", "plainml", "torch", "jax", "xgboost", "trainjobstatus"]
    assert _names(phases.pod_group_policies) == ["coscheduling", "volcano"]
    assert _names(phases.builders) == ["coscheduling", "flux", "volcano", "mpi", "jobset", "trainjobstatus"]
    # Not runtime-gated: with the feature on, every runtime gets it, as in Trainer.
    assert "trainjobstatus" not in _names(Framework(WITH_STATUS)._gated)


def test_which_plugins_a_runtime_can_switch_off() -> None:
    built = Framework(REGISTRY)
    assert _names(built._gated) == [
        "coscheduling",
        "flux",
        "volcano",
        "mpi",
        "plainml",
        "torch",
        "jax",
        "xgboost",
    ]
    assert [p.name for p in built.plugins if not isinstance(p, fw.RuntimeGated)] == ["jobset"]


@pytest.mark.parametrize(("name", "factory"), WITH_STATUS)
def test_each_plugin_declares_exactly_the_extension_points_it_implements(name: str, factory: fw.PluginFactory) -> None:
    plugin = factory()
    module = sys.modules[type(plugin).__module__]
    declared = {
        key.removeprefix("_implements_"): annotation
        for key, annotation in vars(module).get("__annotations__", {}).items()
        if key.startswith("_implements_")
    }
    # With postponed annotations the declared type is its name; each names the Protocol of its point.
    assert declared == {point: proto.__name__ for point, proto in POINTS.items() if isinstance(plugin, proto)}, name


def _info(policy: MLPolicy | None) -> RuntimeInfo:
    return RuntimeInfo(labels={}, annotations={}, ml_policy=policy, pod_group_policy=None, jobset_spec={}, pod_sets=[])


@pytest.mark.parametrize(
    ("policy", "plain_ml_runs"),
    [
        (None, True),
        (MLPolicy(), True),
        (MLPolicy(torch=TorchMLPolicySource()), False),
        (MLPolicy(mpi=MPIMLPolicySource()), False),
        (MLPolicy(jax=JAXMLPolicySource()), False),
        (MLPolicy(xgboost=XGBoostMLPolicySource()), True),
        (MLPolicy(flux=FluxMLPolicySource()), True),
    ],
)
def test_plain_ml_stands_aside_exactly_where_the_registry_says(policy: MLPolicy | None, plain_ml_runs: bool) -> None:
    phases = Framework(REGISTRY).phases(_info(policy))
    assert ("plainml" in _names(phases.ml_policies)) is plain_ml_runs


def test_every_ml_policy_has_a_plain_ml_decision_above() -> None:
    """A new ML policy on ``MLPolicy`` fails here until the cases above say whether PlainML stands aside for it
    (the registry's ``_sets_own_node_count``), so the decision is never found only by reading."""
    sources = {f.name for f in msgspec.structs.fields(MLPolicy)} - {"num_nodes"}
    assert sources == {"torch", "mpi", "jax", "xgboost", "flux"}
