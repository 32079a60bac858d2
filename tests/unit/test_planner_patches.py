"""``planner.patches``: strategic merge with the JobSetSpec merge keys, and runtimePatches in order."""

from __future__ import annotations

import copy
from typing import Any

from planner.patches import apply_runtime_patches, strategic_merge

Obj = dict[str, Any]


def test_maps_merge_scalars_replace_and_null_deletes() -> None:
    base = {"a": 1, "b": {"c": 2, "d": 3}, "e": "keep"}
    patch = {"a": 9, "b": {"d": None, "f": 4}, "g": [1]}
    assert strategic_merge(base, patch) == {"a": 9, "b": {"c": 2, "f": 4}, "e": "keep", "g": [1]}


def test_lists_without_merge_key_replace_whole() -> None:
    base = {"tolerations": [{"key": "a", "operator": "Exists"}], "args": ["x", "y"]}
    patch = {"tolerations": [{"key": "b", "operator": "Exists"}], "args": ["z"]}
    assert strategic_merge(base, patch) == {"tolerations": [{"key": "b", "operator": "Exists"}], "args": ["z"]}


def test_containers_env_mounts_merge_by_key() -> None:
    base = {
        "containers": [
            {
                "name": "node",
                "image": "i",
                "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                "volumeMounts": [{"name": "v", "mountPath": "/v"}],
            },
            {"name": "side", "image": "s"},
        ],
        "initContainers": [{"name": "init", "image": "x"}],
    }
    patch = {
        "containers": [
            {"name": "side", "env": [{"name": "S", "value": "s"}]},
            {
                "name": "node",
                "env": [{"name": "B", "value": "b"}, {"name": "C", "value": "c"}],
                "volumeMounts": [{"name": "w", "mountPath": "/v", "readOnly": True}, {"name": "x", "mountPath": "/x"}],
            },
        ],
        "initContainers": [{"name": "init", "securityContext": {"runAsUser": 1}}],
    }
    assert strategic_merge(base, patch) == {
        "containers": [
            {
                "name": "node",
                "image": "i",
                "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "b"}, {"name": "C", "value": "c"}],
                "volumeMounts": [{"name": "w", "mountPath": "/v", "readOnly": True}, {"name": "x", "mountPath": "/x"}],
            },
            {"name": "side", "image": "s", "env": [{"name": "S", "value": "s"}]},
        ],
        "initContainers": [{"name": "init", "image": "x", "securityContext": {"runAsUser": 1}}],
    }


def test_env_item_merge_is_a_map_merge() -> None:
    """SMP merges the matched item map; a patch with only ``value`` keeps sibling keys it does not name."""
    base = {"env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}
    patch = {"env": [{"name": "A", "value": "1"}]}
    assert strategic_merge(base, patch) == {
        "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "x"}}, "value": "1"}]
    }


def test_volumes_pull_secrets_gates_by_name_and_maps_merge() -> None:
    base = {
        "volumes": [{"name": "a", "emptyDir": {}}],
        "imagePullSecrets": [{"name": "r1"}],
        "schedulingGates": [{"name": "g1"}],
        "nodeSelector": {"zone": "a", "pool": "p"},
        "affinity": {"nodeAffinity": {"x": 1}},
        "securityContext": {"runAsUser": 1},
    }
    patch = {
        "volumes": [{"name": "b", "emptyDir": {}}],
        "imagePullSecrets": [{"name": "r1"}, {"name": "r2"}],
        "schedulingGates": [{"name": "g2"}],
        "nodeSelector": {"zone": "b", "disk": "ssd"},
        "affinity": {"podAffinity": {"y": 2}},
        "securityContext": {"fsGroup": 2},
    }
    assert strategic_merge(base, patch) == {
        "volumes": [{"name": "a", "emptyDir": {}}, {"name": "b", "emptyDir": {}}],
        "imagePullSecrets": [{"name": "r1"}, {"name": "r2"}],
        "schedulingGates": [{"name": "g1"}, {"name": "g2"}],
        "nodeSelector": {"zone": "b", "pool": "p", "disk": "ssd"},
        "affinity": {"nodeAffinity": {"x": 1}, "podAffinity": {"y": 2}},
        "securityContext": {"runAsUser": 1, "fsGroup": 2},
    }


def test_strategic_merge_leaves_inputs_alone() -> None:
    base = {"replicatedJobs": [{"name": "a", "template": {"metadata": {"labels": {"x": "1"}}}}], "m": {"k": "v"}}
    patch = {"replicatedJobs": [{"name": "a", "template": {"metadata": {"labels": {"y": "2"}}}}], "m": {"k": None}}
    base_before, patch_before = copy.deepcopy(base), copy.deepcopy(patch)
    merged = strategic_merge(base, patch)
    assert merged == {
        "replicatedJobs": [{"name": "a", "template": {"metadata": {"labels": {"x": "1", "y": "2"}}}}],
        "m": {},
    }
    assert base == base_before
    assert patch == patch_before


def pod(rjob_name: str, pod_spec: Obj, job_labels: Obj | None = None) -> Obj:
    template: Obj = {"spec": {"template": {"spec": pod_spec}}}
    if job_labels is not None:
        template["metadata"] = {"labels": job_labels}
    return {"name": rjob_name, "template": template}


def test_apply_runtime_patches_in_order_later_wins_and_order_kept() -> None:
    spec = {
        "network": {"enableDNSHostnames": True},
        "replicatedJobs": [
            pod("init", {"containers": [{"name": "init", "image": "i"}]}),
            pod(
                "node",
                {
                    "containers": [{"name": "node", "image": "n"}],
                    "tolerations": [{"key": "t0"}],
                    "nodeSelector": {"a": "0"},
                },
                {"l": "0"},
            ),
            pod("extra", {"containers": [{"name": "extra", "image": "e"}]}),
        ],
    }
    first = {
        "replicatedJobs": [
            pod("extra", {"nodeSelector": {"x": "1"}}),
            pod("node", {"tolerations": [{"key": "t1"}], "nodeSelector": {"a": "1", "b": "1"}}, {"l": "1", "m": "1"}),
        ]
    }
    second = {
        "replicatedJobs": [
            pod("node", {"tolerations": [{"key": "t2"}], "nodeSelector": {"b": "2"}}),
            pod("init", {"serviceAccountName": "sa"}),
        ]
    }
    merged = apply_runtime_patches(spec, [first, second])
    assert [rj["name"] for rj in merged["replicatedJobs"]] == ["init", "node", "extra"]
    assert merged["network"] == {"enableDNSHostnames": True}
    jobs = {rj["name"]: rj for rj in merged["replicatedJobs"]}
    node_pod = jobs["node"]["template"]["spec"]["template"]["spec"]
    assert node_pod == {
        "containers": [{"name": "node", "image": "n"}],
        "tolerations": [{"key": "t2"}],
        "nodeSelector": {"a": "1", "b": "2"},
    }
    assert jobs["node"]["template"]["metadata"] == {"labels": {"l": "1", "m": "1"}}
    assert jobs["init"]["template"]["spec"]["template"]["spec"] == {
        "containers": [{"name": "init", "image": "i"}],
        "serviceAccountName": "sa",
    }
    assert jobs["extra"]["template"]["spec"]["template"]["spec"] == {
        "containers": [{"name": "extra", "image": "e"}],
        "nodeSelector": {"x": "1"},
    }


def test_apply_runtime_patches_restores_runtime_order_for_unknown_names_last() -> None:
    spec = {"replicatedJobs": [pod("b", {}), pod("a", {})]}
    merged = apply_runtime_patches(spec, [{"replicatedJobs": [pod("new", {}), pod("a", {"x": 1})]}])
    assert [rj["name"] for rj in merged["replicatedJobs"]] == ["b", "a", "new"]


def test_apply_runtime_patches_without_patches_is_identity() -> None:
    spec = {"replicatedJobs": [pod("b", {}), pod("a", {})]}
    assert apply_runtime_patches(copy.deepcopy(spec), []) == spec
