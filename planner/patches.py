"""Strategic merge of ``spec.runtimePatches`` onto a runtime's JobSet spec.

Trainer serialises the JobSet spec and each patch to JSON and runs Kubernetes' strategic merge patch with
the ``JobSetSpec`` schema. The schema's effect is a handful of merge keys; everything else is a plain
JSON merge (maps merge key by key, scalars and unkeyed lists replace). Encoding exactly those keys here
avoids carrying a schema engine for one type. Patches apply in list order, so later managers win, and the
replicated jobs are put back into the runtime's order afterwards because the merge may reorder them.
"""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

# Path-independent merge keys of the lists that JobSetSpec → PodSpec declares with patchStrategy=merge.
_MERGE_KEYS: dict[str, str] = {
    "replicatedJobs": "name",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "volumes": "name",
    "imagePullSecrets": "name",
    "schedulingGates": "name",
    "ports": "containerPort",
    "hostAliases": "ip",
    "resourceClaims": "name",
    "topologySpreadConstraints": "topologyKey",
}


def strategic_merge(base: Any, patch: Any, field: str = "") -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            if value is None:
                merged.pop(key, None)
            elif key in merged:
                merged[key] = strategic_merge(merged[key], value, key)
            else:
                merged[key] = value
        return merged
    if isinstance(base, list) and isinstance(patch, list) and field in _MERGE_KEYS:
        key = _MERGE_KEYS[field]
        merged_list = list(base)
        for item in patch:
            if not isinstance(item, dict) or key not in item:
                merged_list.append(item)
                continue
            for i, existing in enumerate(merged_list):
                if isinstance(existing, dict) and existing.get(key) == item[key]:
                    merged_list[i] = strategic_merge(existing, item, "")
                    break
            else:
                merged_list.append(item)
        return merged_list
    return patch


def apply_runtime_patches(spec: Obj, patches: list[Obj]) -> Obj:
    """``patches`` are the ``trainingRuntimeSpec.template.spec`` objects, in TrainJob order."""
    order = {rj.get("name"): i for i, rj in enumerate(spec.get("replicatedJobs") or [])}
    for patch in patches:
        spec = strategic_merge(spec, patch)
    jobs = spec.get("replicatedJobs")
    if jobs:
        spec["replicatedJobs"] = sorted(jobs, key=lambda rj: order.get(rj.get("name"), len(order)))
    return spec
