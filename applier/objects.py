"""What the applier reads of a Kubernetes object: one shape, one decoder.

The applier never needs a whole object, only its identity, its metadata and the few spec and status fields
its decisions look at. Every object it reads (a live target, the TrainJob, a list's head, the kube-system
namespace, the object a message plans) is of this one shape, so there is one decoder for it: a field a new
decision needs is added here, once, with a default, and everything else the API server sends is skipped
without being built.
"""

from __future__ import annotations

import msgspec


class OwnerRef(msgspec.Struct, kw_only=True):
    apiVersion: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


class ManagedEntry(msgspec.Struct, kw_only=True):
    manager: str = ""
    operation: str = ""
    subresource: str = ""
    fieldsV1: msgspec.Raw = msgspec.Raw()


class Meta(msgspec.Struct, kw_only=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""
    labels: dict[str, str] = {}
    ownerReferences: list[OwnerRef] = []
    managedFields: list[ManagedEntry] = []


class RuntimeRef(msgspec.Struct, kw_only=True):
    name: str = ""


class Spec(msgspec.Struct, kw_only=True):
    suspend: bool | None = None
    managedBy: str = ""
    """A TrainJob's: which controller manages it."""
    runtimeRef: RuntimeRef = msgspec.field(default_factory=RuntimeRef)
    """A TrainJob's: the runtime it runs on."""


class Condition(msgspec.Struct, kw_only=True):
    type: str = ""
    message: str = ""


class Status(msgspec.Struct, kw_only=True):
    conditions: list[Condition] = []


class KubeObject(msgspec.Struct, kw_only=True):
    apiVersion: str = ""
    kind: str = ""
    metadata: Meta = msgspec.field(default_factory=Meta)
    spec: Spec = msgspec.field(default_factory=Spec)
    status: Status = msgspec.field(default_factory=Status)


_decoder = msgspec.json.Decoder(KubeObject)


def read(raw: bytes) -> KubeObject:
    """The object's fields the applier looks at; raises ``msgspec.DecodeError`` for anything but JSON."""
    return _decoder.decode(raw)


def resource_version(raw: bytes) -> str:
    """The resourceVersion of an object or a list (a list's metadata carries it in the same place); ``""``
    for a body that is not JSON."""
    try:
        return read(raw).metadata.resourceVersion
    except msgspec.DecodeError:
        return ""


def resource_version_number(text: str) -> int:
    """A resourceVersion as the number etcd gives it; 0 for one that is not a number (never newer)."""
    try:
        return int(text)
    except ValueError:
        return 0
