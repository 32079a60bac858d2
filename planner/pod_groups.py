"""Pod-group sizes: ``minMember`` and ``minResources`` as Trainer's PodGroup plugins compute them.

Both gang-scheduling plugins (coscheduling and Volcano) size their PodGroup the same way, so the sums live
here rather than in one of them: plugins import only the framework and shared modules, never each other.

* ``minMember`` is the sum of the pod counts of **all** pod sets (initializers and launchers included);
* ``minResources`` is the sum over pod sets of one pod's effective requests times its count.

Sums are exact decimals, rendered as Kubernetes' ``resource.Quantity.String()`` renders the sum Trainer
computes: the canonical form in the number format (decimal SI, binary SI or decimal exponent) that Go's
quantity arithmetic carries through ``PodRequests``, ``Mul`` and ``Add`` from the request strings of the
runtime.
"""

from __future__ import annotations

import decimal
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import msgspec

from contracts.scheduling import PodGroup, VolcanoPodGroup
from planner.framework import BuildError
from planner.info import Component, RuntimeInfo
from planner.merge import Obj, parse_quantity
from planner.quantities import EXACT, NANO, QuantityFormat, format_quantity, quantity_format


class _Q:
    """A quantity as Go's arithmetic treats it: a value and the format it carries along."""

    __slots__ = ("fmt", "value")

    def __init__(self, value: Decimal, fmt: QuantityFormat) -> None:
        self.value = value
        self.fmt = fmt

    def add(self, other: _Q) -> None:
        # Quantity.Add: a zero left-hand side takes the other's format; otherwise its own is kept.
        if self.value == 0:
            self.fmt = other.fmt
        with decimal.localcontext(EXACT):
            self.value = self.value + other.value


def _requests(container: Obj) -> dict[str, _Q]:
    raw: Mapping[str, Any] = (container.get("resources") or {}).get("requests") or {}
    return {k: _Q(parse_quantity(v), quantity_format(v)) for k, v in raw.items()}


def _add_list(into: dict[str, _Q], more: Mapping[str, _Q]) -> None:
    for name, q in more.items():
        if name in into:
            into[name].add(q)
        else:
            into[name] = _Q(q.value, q.fmt)


def _max_list(into: dict[str, _Q], more: Mapping[str, _Q]) -> None:
    for name, q in more.items():
        if name not in into or q.value > into[name].value:
            into[name] = _Q(q.value, q.fmt)


def pod_request_formats(pod_spec: Obj) -> dict[str, QuantityFormat]:
    """The format each resource of a pod's effective requests ends up in, following ``PodRequests``."""
    reqs: dict[str, _Q] = {}
    for container in pod_spec.get("containers") or []:
        _add_list(reqs, _requests(container))
    sidecars: dict[str, _Q] = {}
    init_peak: dict[str, _Q] = {}
    for container in pod_spec.get("initContainers") or []:
        step: dict[str, _Q]
        if container.get("restartPolicy") == "Always":
            _add_list(reqs, _requests(container))
            _add_list(sidecars, _requests(container))
            step = sidecars
        else:
            step = {}
            _add_list(step, _requests(container))
            _add_list(step, sidecars)
        _max_list(init_peak, step)
    _max_list(reqs, init_peak)
    overhead = {k: _Q(parse_quantity(v), quantity_format(v)) for k, v in (pod_spec.get("overhead") or {}).items()}
    _add_list(reqs, overhead)
    return {name: q.fmt for name, q in reqs.items()}


def _pod_specs(info: RuntimeInfo) -> list[Obj]:
    specs: list[Obj] = []
    for rjob in info.jobset_spec.get("replicatedJobs") or []:
        template = ((rjob.get("template") or {}).get("spec") or {}).get("template") or {}
        specs.append(template.get("spec") or {})
    return specs


def pod_group_totals(info: RuntimeInfo) -> tuple[int, dict[str, str]]:
    """``(minMember, minResources)``: Σ count, and Σ single-pod requests times count as quantity strings."""
    specs = _pod_specs(info)
    members = 0
    totals: dict[str, _Q] = {}
    for index, ps in enumerate(info.pod_sets):
        members += ps.count
        formats = pod_request_formats(specs[index]) if index < len(specs) else {}
        for name, value in ps.single_pod_requests.items():
            with decimal.localcontext(EXACT):
                # Kubernetes rounds a parsed quantity up to a whole nano unit before any arithmetic.
                single = value.quantize(NANO, rounding=decimal.ROUND_UP)
                scaled = _Q(single * ps.count, formats.get(name, "DecimalSI"))
            current = totals.setdefault(name, _Q(Decimal(0), "DecimalSI"))
            current.add(scaled)
    return members, {name: format_quantity(q.value, q.fmt) for name, q in sorted(totals.items())}


def pod_group_component(body: Obj, kind: type[PodGroup] | type[VolcanoPodGroup], what: str) -> Component:
    """The PodGroup ``body`` describes, as a component updated only while the TrainJob is suspended.

    A body that is no valid ``kind`` (e.g. a quantity that does not parse) stops the plan with a
    ``BuildError`` naming ``what``: the coscheduling or the Volcano PodGroup.
    """
    try:
        pod_group = msgspec.convert(body, kind)
    except msgspec.ValidationError as exc:
        raise BuildError(f"the {what} PodGroup is not valid: {exc}") from exc
    return Component(object=pod_group, policy="while-suspended")
