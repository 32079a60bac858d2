"""``planner.merge``: quantities, GPU/CPU detection, resource merge and the upsert keys (Trainer's apply pkg)."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest

from planner.merge import (
    cpus_per_node,
    env_field_ref,
    env_value,
    gpus_per_node,
    merge_resources,
    parse_quantity,
    quantity_ceil,
    upsert_env,
    upsert_ports,
    upsert_volume_mounts,
    upsert_volumes,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", Decimal(1)),
        ("0", Decimal(0)),
        ("500m", Decimal("0.5")),
        ("2500m", Decimal("2.5")),
        ("1.5", Decimal("1.5")),
        (".5", Decimal("0.5")),
        ("16Gi", Decimal(16 * 2**30)),
        ("512Mi", Decimal(512 * 2**20)),
        ("1Ki", Decimal(1024)),
        ("1e3", Decimal(1000)),
        ("1E3", Decimal(1000)),
        ("2.5e-3", Decimal("0.0025")),
        ("2k", Decimal(2000)),
        ("3M", Decimal(3_000_000)),
        ("1G", Decimal(10**9)),
        ("1E", Decimal(10**18)),
        ("100n", Decimal("1e-7")),
        ("-1", Decimal(-1)),
        ("+2", Decimal(2)),
        (2, Decimal(2)),
        (1.5, Decimal("1.5")),
    ],
)
def test_parse_quantity(text: str | int | float, expected: Decimal) -> None:
    assert parse_quantity(text) == expected


def test_parse_quantity_forms_agree() -> None:
    assert parse_quantity("1") == parse_quantity("1000m") == parse_quantity("1e0") == parse_quantity("0.001k")


@pytest.mark.parametrize("text", ["bad", "", "1x", "Gi", "1GiB", "1e", "1e3m", "1.2.3", "--1", "1 Gi", "m"])
def test_parse_quantity_rejects_malformed(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("value", "expected"), [(Decimal("2.5"), 3), (Decimal("0.1"), 1), (Decimal(2), 2), (Decimal(0), 0)]
)
def test_quantity_ceil(value: Decimal, expected: int) -> None:
    assert quantity_ceil(value) == expected


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        (None, 0),
        ({}, 0),
        ({"requests": {"cpu": "4"}}, 0),
        ({"requests": {"nvidia.com/gpu": "2"}}, 2),
        ({"limits": {"nvidia.com/gpu": 4}}, 4),
        ({"requests": {"nvidia.com/gpu": "0"}, "limits": {"nvidia.com/gpu": "2"}}, 2),
        ({"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "8"}}, 1),
        ({"requests": {"example.com/GPU-big": "3"}}, 3),
        ({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"amd.com/gpu": "1"}}, 1),
    ],
)
def test_gpus_per_node(resources: dict[str, dict[str, object]] | None, expected: int) -> None:
    assert gpus_per_node(resources) == expected


def test_gpus_per_node_is_deterministic_with_two_gpu_resources() -> None:
    a = {"requests": {"nvidia.com/gpu": "2", "amd.com/gpu": "5"}}
    b = {"requests": {"amd.com/gpu": "5", "nvidia.com/gpu": "2"}}
    assert gpus_per_node(a) == gpus_per_node(b)


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        (None, 0),
        ({}, 0),
        ({"requests": {"cpu": "2500m"}}, 3),
        ({"requests": {"cpu": "100m"}}, 1),
        ({"requests": {"cpu": "2"}, "limits": {"cpu": "8"}}, 2),
        ({"limits": {"cpu": "3"}}, 3),
        ({"requests": {"cpu": "0"}, "limits": {"cpu": "2"}}, 2),
        ({"requests": {"memory": "1Gi"}}, 0),
    ],
)
def test_cpus_per_node(resources: dict[str, dict[str, str]] | None, expected: int) -> None:
    assert cpus_per_node(resources) == expected


def test_merge_resources_per_key() -> None:
    base = {
        "limits": {"cpu": "4", "memory": "8Gi"},
        "requests": {"cpu": "2"},
        "claims": [{"name": "gpu"}, {"name": "nic", "request": "a"}],
    }
    before = copy.deepcopy(base)
    override = {
        "limits": {"memory": "16Gi", "nvidia.com/gpu": "1"},
        "requests": {"memory": "4Gi"},
        "claims": [{"name": "nic", "request": "b"}, {"name": "fpga"}],
    }
    assert merge_resources(base, override) == {
        "limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
        "requests": {"cpu": "2", "memory": "4Gi"},
        "claims": [{"name": "gpu"}, {"name": "nic", "request": "b"}, {"name": "fpga"}],
    }
    assert base == before


def test_merge_resources_from_nothing_and_partial() -> None:
    assert merge_resources(None, {"requests": {"cpu": "1"}}) == {"requests": {"cpu": "1"}}
    assert merge_resources({"limits": {"cpu": "1"}}, {}) == {"limits": {"cpu": "1"}}
    assert merge_resources({"limits": {"cpu": "1"}}, {"requests": {"cpu": "1"}}) == {
        "limits": {"cpu": "1"},
        "requests": {"cpu": "1"},
    }


def test_upsert_env_by_name_in_place_then_append() -> None:
    items = [env_value("A", "1"), env_value("B", "2")]
    upsert_env(items, [env_value("B", "x"), env_field_ref("C", "metadata.name"), env_value("A", "y")])
    assert items == [
        {"name": "A", "value": "y"},
        {"name": "B", "value": "x"},
        {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]


def test_upsert_env_replaces_whole_item() -> None:
    items = [env_field_ref("A", "metadata.name")]
    upsert_env(items, [env_value("A", "1")])
    assert items == [{"name": "A", "value": "1"}]


def test_upsert_ports_by_container_port_or_name() -> None:
    items: list[dict[str, Any]] = [{"name": "http", "containerPort": 80}, {"containerPort": 8080}]
    upsert_ports(items, [{"name": "http", "containerPort": 81}])
    assert items == [{"name": "http", "containerPort": 81}, {"containerPort": 8080}]
    upsert_ports(items, [{"name": "alt", "containerPort": 8080}])
    assert items == [{"name": "http", "containerPort": 81}, {"name": "alt", "containerPort": 8080}]
    upsert_ports(items, [{"containerPort": 29500}])
    assert items[-1] == {"containerPort": 29500}
    assert len(items) == 3


def test_upsert_volumes_by_name() -> None:
    items = [{"name": "a", "emptyDir": {}}, {"name": "b", "emptyDir": {}}]
    upsert_volumes(items, [{"name": "b", "configMap": {"name": "cm"}}, {"name": "c", "emptyDir": {}}])
    assert items == [
        {"name": "a", "emptyDir": {}},
        {"name": "b", "configMap": {"name": "cm"}},
        {"name": "c", "emptyDir": {}},
    ]


def test_upsert_volume_mounts_by_mount_path() -> None:
    items = [{"name": "a", "mountPath": "/a"}]
    upsert_volume_mounts(items, [{"name": "other", "mountPath": "/a"}, {"name": "a", "mountPath": "/b"}])
    assert items == [{"name": "other", "mountPath": "/a"}, {"name": "a", "mountPath": "/b"}]
