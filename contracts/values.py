"""Reading optional fields of the wire types without repeating ``is not UNSET`` everywhere.

Every field of a Kubernetes wire type may be unset, which is what keeps apply configurations honest; but a
reader usually wants "the value, or this default". These helpers narrow the types for mypy as well, so
code that reads a TrainJob states its defaults once, at the point of use.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import msgspec
from typing_extensions import TypeIs

from contracts.kube import ObjectMeta

T = TypeVar("T")
D = TypeVar("D")


def is_set(value: T | msgspec.UnsetType | None) -> TypeIs[T]:
    return value is not msgspec.UNSET and value is not None


def or_default(value: T | msgspec.UnsetType | None, default: D) -> T | D:
    return default if value is msgspec.UNSET or value is None else value


class HasMetadata(Protocol):
    @property
    def metadata(self) -> ObjectMeta | msgspec.UnsetType: ...


_EMPTY_META = ObjectMeta()


def meta(obj: HasMetadata) -> ObjectMeta:
    return or_default(obj.metadata, _EMPTY_META)


# The identity accessors are read a dozen times per plan; spelled out, each is one call instead of four.


def name_of(obj: HasMetadata) -> str:
    metadata = obj.metadata
    if metadata is msgspec.UNSET or metadata.name is msgspec.UNSET or metadata.name is None:
        return ""
    return metadata.name


def namespace_of(obj: HasMetadata) -> str:
    metadata = obj.metadata
    if metadata is msgspec.UNSET or metadata.namespace is msgspec.UNSET or metadata.namespace is None:
        return ""
    return metadata.namespace


def uid_of(obj: HasMetadata) -> str:
    metadata = obj.metadata
    if metadata is msgspec.UNSET or metadata.uid is msgspec.UNSET or metadata.uid is None:
        return ""
    return metadata.uid


def resource_version_of(obj: HasMetadata) -> str:
    metadata = obj.metadata
    if metadata is msgspec.UNSET or metadata.resource_version is msgspec.UNSET or metadata.resource_version is None:
        return ""
    return metadata.resource_version
