"""List and resource merge rules, as Trainer applies them to apply configurations.

Trainer merges a TrainJob onto its runtime with "upsert" semantics: an item whose key matches is replaced
in place, anything else is appended, and the order of the runtime template is kept. The keys differ by
list (env by name, ports by containerPort or name, volumes by name, volume mounts by mount path), so each
list gets a named function rather than one helper with a key argument at every call site.

The IR keeps Kubernetes objects as plain builtins (what ``msgspec.to_builtins`` produces from the wire
types): plugins change them in place, and only the builders turn the result back into typed structs.
Quantities are compared as ``Decimal`` so that ``"1"``, ``"1000m"`` and ``"1e3m"`` agree.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

Obj = dict[str, Any]


def _upsert(items: list[Obj], new: Iterable[Obj], same: Any) -> None:
    for item in new:
        for i, existing in enumerate(items):
            if same(existing, item):
                items[i] = item
                break
        else:
            items.append(item)


def _upsert_by(items: list[Obj], new: Iterable[Obj], key: str) -> None:
    """``_upsert`` for lists whose items are the same when one field is equal (missing equals missing)."""
    if not items:
        new = new if isinstance(new, list) else list(new)
        try:
            distinct = len({item.get(key) for item in new}) == len(new)
        except TypeError:  # an unhashable key: take the general path
            distinct = False
        if distinct:
            items.extend(new)  # the usual case: nothing to replace, in the list or among the new items
            return
    keys = [existing.get(key) for existing in items]
    for item in new:
        value = item.get(key)
        if value in keys:
            i = keys.index(value)
            items[i] = item
            keys[i] = value
        else:
            items.append(item)
            keys.append(value)


def upsert_env(items: list[Obj], new: Iterable[Obj]) -> None:
    _upsert_by(items, new, "name")


def upsert_ports(items: list[Obj], new: Iterable[Obj]) -> None:
    for item in new:
        name = item.get("name")
        port = item.get("containerPort")
        for i, existing in enumerate(items):
            if (name and existing.get("name") == name) or (
                existing.get("containerPort") is not None and existing.get("containerPort") == port
            ):
                items[i] = item
                break
        else:
            items.append(item)


def upsert_volumes(items: list[Obj], new: Iterable[Obj]) -> None:
    _upsert_by(items, new, "name")


def upsert_volume_mounts(items: list[Obj], new: Iterable[Obj]) -> None:
    _upsert_by(items, new, "mountPath")


def env_value(name: str, value: str) -> Obj:
    return {"name": name, "value": value}


def env_field_ref(name: str, field_path: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": field_path}}}


# ------------------------------------------------------------------------------------------- quantities

_SUFFIXES: Mapping[str, Decimal] = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))((?:[eE][+-]?\d+)|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?$")


@functools.lru_cache(maxsize=4096)
def parse_quantity(text: str | int | float) -> Decimal:
    """A Kubernetes resource quantity as an exact decimal; raises ``ValueError`` on malformed input."""
    if isinstance(text, int | float):
        return Decimal(str(text))
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise ValueError(f"invalid quantity {text!r}")
    number, suffix = match.group(1), match.group(2) or ""
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        return _number(number + suffix, text)
    return _number(number, text) * _SUFFIXES[suffix]


def _number(s: str, original: object) -> Decimal:
    try:
        value = Decimal(s)
    except InvalidOperation:
        raise ValueError(f"invalid quantity {original!r}") from None
    if not value.is_finite():
        raise ValueError(f"invalid quantity {original!r}")
    return value


def quantity_ceil(value: Decimal) -> int:
    """Trainer's ``Quantity.Value()``: rounded up to an integer."""
    return math.ceil(value)


def merge_resources(base: Obj | None, override: Obj) -> Obj:
    """Strategic merge of ResourceRequirements: limits and requests per key (override wins), claims by name."""
    merged: Obj = dict(base) if base else {}
    for field in ("limits", "requests"):
        if field in override:
            combined = dict(merged.get(field) or {})
            combined.update(override[field] or {})
            merged[field] = combined
    if "claims" in override:
        claims = list(merged.get("claims") or [])
        _upsert(claims, override["claims"] or [], lambda a, b: a.get("name") == b.get("name"))
        merged["claims"] = claims
    return merged


def gpus_per_node(resources: Obj | None) -> int:
    """The first resource whose name contains "gpu": its request, or its limit when the request is 0."""
    if not resources:
        return 0
    requested = _first_gpu(resources.get("requests"))
    if requested == 0:
        limited = _first_gpu(resources.get("limits"))
        if limited > 0:
            return limited
    return requested


def _first_gpu(resource_list: Mapping[str, Any] | None) -> int:
    if not resource_list:
        return 0
    first = None
    for name in resource_list:
        if "gpu" in name.lower() and (first is None or name < first):
            first = name
    return 0 if first is None else quantity_ceil(parse_quantity(resource_list[first]))


def cpus_per_node(resources: Obj | None) -> int:
    """The CPU request, else the CPU limit, rounded up; 0 when neither is set."""
    if not resources:
        return 0
    request = (resources.get("requests") or {}).get("cpu")
    if request is not None and parse_quantity(request) != 0:
        return quantity_ceil(parse_quantity(request))
    limit = (resources.get("limits") or {}).get("cpu")
    if limit is not None:
        return quantity_ceil(parse_quantity(limit))
    return 0
