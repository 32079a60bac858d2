"""The runtime snapshot ConfigMap, as Trainer keeps it (``<trainjob>-runtime-snapshot``, key ``runtime``).

The first plan of a TrainJob records the runtime it was built from; later plans use that record instead of
the live runtime, so editing or deleting a runtime never changes a job that already exists. The ConfigMap
holds the runtime as YAML with its apiVersion and kind, like Trainer's, so either controller can read the
other's snapshot. It is created once (``if-absent``) and is controlled by the TrainJob, so it goes with it.
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec
import yaml

from contracts import trainer as t
from contracts.kube import ConfigMap, ObjectMeta
from contracts.trainer import TrainingRuntime, TrainJob
from contracts.values import name_of, namespace_of
from planner.info import Component
from planner.owners import owner_reference_struct


def snapshot_name(job_name: str) -> str:
    return job_name + t.RUNTIME_SNAPSHOT_SUFFIX


@functools.lru_cache(maxsize=256)
def _render(encoded: bytes) -> str:
    obj: dict[str, Any] = msgspec.json.decode(encoded)
    obj.get("metadata", {}).pop("managedFields", None)
    return str(yaml.dump(obj, Dumper=_Dumper, sort_keys=True, default_flow_style=False))


_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def runtime_snapshot(job: TrainJob, runtime: TrainingRuntime, *, encoded: bytes | None = None) -> Component:
    """``encoded`` is ``msgspec.json.encode(runtime)`` when the caller already has it."""
    # Built as structs directly: every field is a known string, so a dict for msgspec.convert buys nothing.
    config_map = ConfigMap(
        api_version="v1",
        kind="ConfigMap",
        metadata=ObjectMeta(
            name=snapshot_name(name_of(job)),
            namespace=namespace_of(job),
            owner_references=[owner_reference_struct(job)],
        ),
        data={t.RUNTIME_SNAPSHOT_KEY: _render(msgspec.json.encode(runtime) if encoded is None else encoded)},
    )
    return Component(object=config_map, policy="if-absent")
