"""Generate ``contracts/kube.py`` from the installed kubernetes client's model metadata.

Every model class in ``kubernetes.client.models`` carries ``openapi_types`` (python attribute ->
type string) and ``attribute_map`` (python attribute -> JSON name).  Starting from ``ROOTS`` this
script takes the transitive closure of referenced models and writes one msgspec Struct per model.
Every field is optional and defaults to ``msgspec.UNSET`` so that encoding emits only what was set.

Usage::

    python tools/gen_kube_types.py            # rewrite contracts/kube.py
    python tools/gen_kube_types.py --check    # exit 1 if contracts/kube.py is stale
    python tools/gen_kube_types.py -o PATH    # write somewhere else
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import kubernetes.client.models as k8s_models

LINE_LENGTH = 110
INDENT = "    "

DEFAULT_OUTPUT = Path(__file__).resolve().parent.parent / "contracts" / "kube.py"

ROOTS: tuple[str, ...] = (
    "V1ObjectMeta",
    "V1OwnerReference",
    "V1PodTemplateSpec",
    "V1JobTemplateSpec",
    "V1Condition",
    "V1ResourceRequirements",
    "V1PersistentVolumeClaim",
    "V1LabelSelector",
    "V1ConfigMap",
    "V1Secret",
)

# resource.Quantity fields, keyed by (client model, JSON name).  The client types them as plain
# ``str`` (or ``Dict[str, str]``), but a CRD stores whatever the client sent: ``nvidia.com/gpu: 2``
# comes back as an integer.  The list holds the Quantity / ResourceList properties of core/v1 as of
# Kubernetes 1.36; an entry whose model is in the closure but lacks the field fails the generation.
QUANTITY_FIELDS: frozenset[tuple[str, str]] = frozenset(
    {
        ("V1ContainerStatus", "allocatedResources"),
        ("V1EmptyDirVolumeSource", "sizeLimit"),
        ("V1LimitRangeItem", "default"),
        ("V1LimitRangeItem", "defaultRequest"),
        ("V1LimitRangeItem", "max"),
        ("V1LimitRangeItem", "maxLimitRequestRatio"),
        ("V1LimitRangeItem", "min"),
        ("V1NodeStatus", "allocatable"),
        ("V1NodeStatus", "capacity"),
        ("V1PersistentVolumeClaimStatus", "allocatedResources"),
        ("V1PersistentVolumeClaimStatus", "capacity"),
        ("V1PersistentVolumeSpec", "capacity"),
        ("V1PodSpec", "overhead"),
        ("V1PodStatus", "allocatedResources"),
        ("V1ResourceFieldSelector", "divisor"),
        ("V1ResourceQuotaSpec", "hard"),
        ("V1ResourceQuotaStatus", "hard"),
        ("V1ResourceQuotaStatus", "used"),
        ("V1ResourceRequirements", "limits"),
        ("V1ResourceRequirements", "requests"),
        ("V1VolumeResourceRequirements", "limits"),
        ("V1VolumeResourceRequirements", "requests"),
    }
)

# IntOrString fields, used only with client versions whose models carry no typed annotations
# (the pydantic-based clients annotate them as ``StrictInt | StrictStr``).
INT_OR_STRING_FIELDS: frozenset[tuple[str, str]] = frozenset(
    {
        ("V1HTTPGetAction", "port"),
        ("V1TCPSocketAction", "port"),
        ("V1ServicePort", "targetPort"),
    }
)

PRIMITIVES: dict[str, str] = {
    "str": "str",
    "int": "int",
    "bool": "bool",
    "float": "float",
    "datetime": "str",
    "date": "str",
    "bytes": "bytes",
    "bytearray": "bytes",
}

_LIST_RE = re.compile(r"^(?:list|List)\[(?P<item>.+)\]$")
_DICT_RE = re.compile(r"^(?:dict\(str, ?(?P<old>.+)\)|Dict\[str, ?(?P<new>.+)\])$")
_PREFIX_RE = re.compile(r"^(?:[A-Z][a-z]+)?V\d+(?:(?:alpha|beta)\d+)?(?=[A-Z])")

# Names that generated annotations refer to; a struct field must not shadow them.
_ANNOTATION_NAMES = frozenset(
    {"Any", "IntOrString", "Quantity", "bool", "bytes", "dict", "float", "int", "list", "msgspec", "str"}
)


class GenerationError(RuntimeError):
    """The client's metadata cannot be mapped without a human decision."""


@dataclass(frozen=True)
class Field:
    py_name: str
    json_name: str
    annotation: str


@dataclass(frozen=True)
class Model:
    client_name: str
    class_name: str
    fields: tuple[Field, ...]


def class_name_for(client_name: str) -> str:
    """``V1PodSpec`` -> ``PodSpec``; ``CoreV1ResourceClaim`` -> ``ResourceClaim``."""
    stripped = _PREFIX_RE.sub("", client_name, count=1)
    if not stripped or not stripped[0].isupper():
        raise GenerationError(f"cannot derive a class name from client model {client_name!r}")
    return stripped


def python_name_for(attr: str) -> str:
    name = attr.lstrip("_")
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        name += "_"
    if not name.isidentifier():
        raise GenerationError(f"cannot derive a python name from client attribute {attr!r}")
    return name


def _model_class(client_name: str) -> Any:
    cls = getattr(k8s_models, client_name, None)
    if cls is None or not hasattr(cls, "openapi_types") or not hasattr(cls, "attribute_map"):
        raise GenerationError(f"kubernetes.client.models has no model {client_name!r}")
    return cls


def _referenced_models(type_str: str) -> list[str]:
    type_str = type_str.strip()
    if m := _LIST_RE.match(type_str):
        return _referenced_models(m["item"])
    if m := _DICT_RE.match(type_str):
        return _referenced_models(m["old"] or m["new"])
    if type_str in PRIMITIVES or type_str == "object":
        return []
    return [type_str]


def _leaf_types(annotation: Any) -> set[Any]:
    """Flatten Optional / Union / Annotated down to the set of concrete leaf types."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _leaf_types(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        leaves: set[Any] = set()
        for arg in typing.get_args(annotation):
            if arg is not type(None):
                leaves |= _leaf_types(arg)
        return leaves
    return {annotation}


def _is_int_or_string(cls: Any, client_name: str, json_name: str) -> bool:
    model_fields = getattr(cls, "model_fields", None)
    if not isinstance(model_fields, dict):
        return (client_name, json_name) in INT_OR_STRING_FIELDS
    for py_name, info in model_fields.items():
        alias = getattr(info, "serialization_alias", None)
        if alias == json_name or (alias is None and py_name == json_name):
            return _leaf_types(info.annotation) == {int, str}
    raise GenerationError(f"{client_name}.{json_name}: no typed field to decide what 'object' means")


def _render(type_str: str, *, client_name: str, json_name: str, cls: Any, quantity: bool) -> str:
    type_str = type_str.strip()
    if m := _LIST_RE.match(type_str):
        inner = _render(m["item"], client_name=client_name, json_name=json_name, cls=cls, quantity=quantity)
        return f"list[{inner}]"
    if m := _DICT_RE.match(type_str):
        value = m["old"] or m["new"]
        inner = _render(value, client_name=client_name, json_name=json_name, cls=cls, quantity=quantity)
        return f"dict[str, {inner}]"
    if quantity:
        if type_str != "str":
            raise GenerationError(f"{client_name}.{json_name}: Quantity typed {type_str!r}, expected str")
        return "Quantity"
    if type_str in PRIMITIVES:
        return PRIMITIVES[type_str]
    if type_str == "object":
        return "IntOrString" if _is_int_or_string(cls, client_name, json_name) else "Any"
    return class_name_for(type_str)


def collect_models(roots: tuple[str, ...] = ROOTS) -> list[Model]:
    """Transitive closure of ``roots``, sorted by class name."""
    seen: dict[str, Any] = {}
    pending = list(roots)
    while pending:
        client_name = pending.pop()
        if client_name in seen:
            continue
        cls = _model_class(client_name)
        seen[client_name] = cls
        for type_str in cls.openapi_types.values():
            pending.extend(_referenced_models(type_str))

    for client_name, json_name in sorted(QUANTITY_FIELDS | INT_OR_STRING_FIELDS):
        if client_name in seen and json_name not in seen[client_name].attribute_map.values():
            raise GenerationError(f"override table names {client_name}.{json_name}, which the client lacks")

    by_class: dict[str, str] = {}
    for client_name in seen:
        class_name = class_name_for(client_name)
        if class_name in by_class:
            raise GenerationError(
                f"class name collision: {by_class[class_name]} and {client_name} both map to {class_name}"
            )
        if class_name in _ANNOTATION_NAMES or class_name == "KubeStruct":
            raise GenerationError(f"class name {class_name} (from {client_name}) is a reserved name")
        by_class[class_name] = client_name

    reserved = _ANNOTATION_NAMES | set(by_class)
    models: list[Model] = []
    for class_name in sorted(by_class):
        client_name = by_class[class_name]
        cls = seen[client_name]
        fields: list[Field] = []
        py_names: set[str] = set()
        for attr, type_str in cls.openapi_types.items():
            json_name = cls.attribute_map[attr]
            py_name = python_name_for(attr)
            if py_name in py_names:
                raise GenerationError(f"{client_name}: two attributes map to python name {py_name!r}")
            if py_name in reserved:
                raise GenerationError(f"{client_name}.{attr}: python name {py_name!r} shadows a type name")
            py_names.add(py_name)
            annotation = _render(
                type_str,
                client_name=client_name,
                json_name=json_name,
                cls=cls,
                quantity=(client_name, json_name) in QUANTITY_FIELDS,
            )
            fields.append(Field(py_name=py_name, json_name=json_name, annotation=annotation))
        models.append(Model(client_name=client_name, class_name=class_name, fields=tuple(fields)))
    return models


def _fits(line: str) -> bool:
    return len(line) <= LINE_LENGTH


def render_field(field: Field) -> list[str]:
    """One struct field, laid out the way ``ruff format`` lays out a long annotated assignment."""
    lhs = f"{field.py_name}: {field.annotation} | msgspec.UnsetType"
    if field.py_name == field.json_name:
        rhs_args = ""
        rhs = "msgspec.UNSET"
    else:
        rhs_args = f'default=msgspec.UNSET, name="{field.json_name}"'
        rhs = f"msgspec.field({rhs_args})"
    one_line = f"{INDENT}{lhs} = {rhs}"
    if _fits(one_line):
        return [one_line]
    if rhs_args and _fits(f"{INDENT}{lhs} = msgspec.field(") and _fits(f"{INDENT * 2}{rhs_args}"):
        return [f"{INDENT}{lhs} = msgspec.field(", f"{INDENT * 2}{rhs_args}", f"{INDENT})"]
    if _fits(f"{INDENT}{lhs} = (") and _fits(f"{INDENT * 2}{rhs}"):
        return [f"{INDENT}{lhs} = (", f"{INDENT * 2}{rhs}", f"{INDENT})"]
    head = f"{INDENT}{field.py_name}: ("
    body = f"{INDENT * 2}{field.annotation} | msgspec.UnsetType"
    tail = f"{INDENT}) = {rhs}"
    if _fits(head) and _fits(body) and _fits(tail):
        return [head, body, tail]
    raise GenerationError(f"cannot lay out field {field.py_name} within {LINE_LENGTH} columns")


# contracts/kube.py starts with this text, by construction.
HEADER = '''\
# Generated by tools/gen_kube_types.py from the kubernetes client's model metadata
# (kubernetes python client {version}). DO NOT EDIT: re-run the generator instead.
"""Kubernetes object types as msgspec Structs in which "not set" is ``msgspec.UNSET``.

Every field of every struct is optional and defaults to ``msgspec.UNSET``; encoding emits only the
fields that were set, so a struct doubles as a server-side apply configuration that claims exactly
the fields it holds.  JSON names are the Kubernetes ones.  Unknown fields are ignored on decode.
Timestamps stay RFC 3339 strings; ``bytes`` fields (Secret ``data``, ConfigMap ``binaryData``) are
base64 strings on the wire, which msgspec encodes and decodes.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import msgspec

KUBERNETES_CLIENT_VERSION = "{version}"

IntOrString: TypeAlias = int | str
"""``intstr.IntOrString``: a port number or a port name, a count or a percentage."""

Quantity: TypeAlias = int | str
"""``resource.Quantity``: the API server returns strings, but CRD objects keep integers as sent."""


class KubeStruct(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """Base of every Kubernetes wire struct; every field defaults to ``msgspec.UNSET``."""
'''


def generate(roots: tuple[str, ...] = ROOTS) -> str:
    models = collect_models(roots)
    out: list[str] = [HEADER.format(version=kubernetes.__version__).rstrip("\n")]
    for model in models:
        out.append("")
        out.append("")
        out.append(f"class {model.class_name}(KubeStruct, frozen=True, kw_only=True):")
        out.append(f'{INDENT}"""Client model ``{model.client_name}``."""')
        if model.fields:
            out.append("")
        for field in model.fields:
            out.extend(render_field(field))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-o", "--output", type=Path, default=DEFAULT_OUTPUT, help="file to write")
    parser.add_argument("--check", action="store_true", help="exit 1 if the output file is not up to date")
    args = parser.parse_args(argv)
    try:
        text = generate()
    except GenerationError as exc:
        print(f"gen_kube_types: {exc}", file=sys.stderr)
        return 2
    output: Path = args.output
    if args.check:
        current = output.read_text(encoding="utf-8") if output.exists() else None
        if current != text:
            print(f"{output} is out of date; run tools/gen_kube_types.py", file=sys.stderr)
            return 1
        return 0
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"wrote {output} ({text.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
