"""Keeping an update of an existing JobSet inside what JobSet allows to change (upstream #3008).

Trainer re-applies the whole JobSet when a suspended TrainJob is resumed. JobSet v0.12.0, however, treats
``spec.replicatedJobs`` as immutable, except — while the old or the new JobSet is suspended — for five
pod-template fields Kueue needs: labels, annotations, nodeSelector, tolerations and schedulingGates. Any
other difference (a runtime patch that adds a volume or an affinity, a new node count) makes the API
server reject the whole apply, so the TrainJob can never resume.

Here an update of an existing JobSet takes everything in ``replicatedJobs`` from the live object and only
the five mutable fields from the plan; what could not be carried over is reported, so the user learns
that those edits need a new TrainJob instead of watching the resume fail. The five fields are taken
exactly as planned, absent ones included: a runtime patch removed while suspended removes what it added
(SSA drops fields this manager stops sending; values another manager set stay).

The other spec fields JobSet v0.12.0 never lets change after creation (``IMMUTABLE_SPEC``, from its CRD's
``self == oldSelf`` rules and its validating webhook's ``ValidateImmutableField`` calls) are taken whole
from the live object, so what JobSet's mutating webhook added at creation (``retentionPolicy`` inside the
atomic ``volumeClaimPolicies``, ``network.enableDNSHostnames``/``publishNotReadyAddresses``,
``successPolicy``, ``startupPolicy``, failure-policy rule names) is sent back unchanged instead of being
removed by the apply, which the API server would refuse. A field the live object lacks is left
out of the apply. Planned values that differ are reported like the rest.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec

from contracts.jobset import JobSet

Obj = dict[str, Any]

MUTABLE_POD_METADATA = ("labels", "annotations")
MUTABLE_POD_SPEC = ("nodeSelector", "tolerations", "schedulingGates")
IMMUTABLE_SPEC = ("network", "successPolicy", "failurePolicy", "startupPolicy", "volumeClaimPolicies", "managedBy")
"""JobSet v0.12.0's spec fields that may not change once the JobSet exists, besides ``replicatedJobs``.

The first five carry ``XValidation:rule="self == oldSelf"`` in api/jobset/v1alpha2/jobset_types.go;
``managedBy`` is checked by ``ValidateUpdate`` in pkg/webhooks/jobset_webhook.go. Still mutable:
``suspend``, ``coordinator``, ``ttlSecondsAfterFinished``.
"""


LEFT_OUT_BY_OLD_WATCHERS = ("network", "successPolicy", "failurePolicy", "startupPolicy", "volumeClaimPolicies")
"""The ``IMMUTABLE_SPEC`` fields a watcher before commit e7131db left out of the JobSet of every event."""


def carries_immutable_spec(live: JobSet) -> bool:
    """Whether an observed JobSet has any of the spec fields older watchers left out.

    An unversioned event (``contracts.messages.UNVERSIONED``) whose JobSet has none may come from an older
    watcher, which left them out: then what the live object holds is not known, and ``restrict_to_mutable``
    would take their absence for the live state, drop them from the apply and report them as kept."""
    spec = msgspec.to_builtins(live.spec) if live.spec is not msgspec.UNSET else {}
    return any(key in spec for key in LEFT_OUT_BY_OLD_WATCHERS)


def _pod_template(rjob: Obj) -> Obj:
    template: Obj = rjob.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {})
    return template


def _without_mutable(rjob: Obj) -> Obj:
    clone = copy.deepcopy(rjob)
    template = _pod_template(clone)
    metadata = template.get("metadata") or {}
    for key in MUTABLE_POD_METADATA:
        metadata.pop(key, None)
    if not metadata:
        template.pop("metadata", None)
    spec = template.get("spec") or {}
    for key in MUTABLE_POD_SPEC:
        spec.pop(key, None)
    return clone


def _diff_paths(desired: Any, live: Any, path: str, out: list[str]) -> None:
    """Paths where the plan asks for something the live object does not have.

    Only what the plan sets counts: keys the server defaulted on the live side (``protocol: TCP`` on a
    port, say) are not differences, at any depth, including inside list items matched by name.
    """
    if isinstance(desired, dict) and isinstance(live, dict):
        for key in desired:
            if key not in live:
                out.append(f"{path}.{key}")
            else:
                _diff_paths(desired[key], live[key], f"{path}.{key}", out)
        return
    if isinstance(desired, list) and isinstance(live, list) and all(isinstance(i, dict) for i in desired + live):
        if all("name" in i for i in desired + live):
            by_name = {i["name"]: i for i in live}
            for item in desired:
                if item["name"] not in by_name:
                    out.append(f"{path}[{item['name']}]")
                else:
                    _diff_paths(item, by_name[item["name"]], f"{path}[{item['name']}]", out)
            return
        if len(desired) == len(live):
            for index, (a, b) in enumerate(zip(desired, live, strict=True)):
                _diff_paths(a, b, f"{path}[{index}]", out)
            return
    if desired != live:
        out.append(path)


def restrict_to_mutable(desired: JobSet, live: JobSet) -> tuple[JobSet, list[str]]:
    """The JobSet to apply over ``live``, and the paths of planned changes JobSet would have refused.

    Only differences the plan asks for count: fields the live object has and the plan leaves out (server
    defaults, other managers' fields) are kept as they are and are not reported.
    """
    want: Obj = msgspec.to_builtins(desired)
    have: Obj = msgspec.to_builtins(live)
    live_jobs = {rj.get("name"): rj for rj in (have.get("spec") or {}).get("replicatedJobs") or []}
    dropped: list[str] = []
    result_jobs: list[Obj] = []
    for index, rjob in enumerate((want.get("spec") or {}).get("replicatedJobs") or []):
        name = rjob.get("name")
        current = live_jobs.get(name)
        path = f"spec.replicatedJobs[{index}]"
        if current is None:
            dropped.append(f"{path} ({name}: a new replicated job)")
            continue
        _diff_paths(_without_mutable(rjob), _without_mutable(current), path, dropped)
        merged = copy.deepcopy(current)
        source = _pod_template(rjob)
        target = _pod_template(merged)
        for section, keys in (("metadata", MUTABLE_POD_METADATA), ("spec", MUTABLE_POD_SPEC)):
            planned = source.get(section) or {}
            live_section = target.setdefault(section, {})
            for key in keys:
                if planned.get(key) is not None:
                    live_section[key] = planned[key]
                else:
                    live_section.pop(key, None)
        if not target["metadata"] and "metadata" not in source:
            # An empty pod-template metadata the plan carries (Trainer's builder always sends one) is sent
            # back as planned: dropping it would change a JobSet Trainer made, when the pipeline takes over from it.
            target.pop("metadata")
        result_jobs.append(merged)
    spec = dict(want.get("spec") or {})
    spec["replicatedJobs"] = result_jobs
    live_spec = have.get("spec") or {}
    for key in IMMUTABLE_SPEC:
        if key in live_spec:
            if key in spec:
                _diff_paths(spec[key], live_spec[key], f"spec.{key}", dropped)
            spec[key] = copy.deepcopy(live_spec[key])
        elif key in spec:
            dropped.append(f"spec.{key}")
            spec.pop(key)
    want["spec"] = spec
    return msgspec.convert(want, JobSet), dropped
