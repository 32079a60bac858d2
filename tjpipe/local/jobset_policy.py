"""JobSet v0.12.0's update rule as a ValidatingAdmissionPolicy, for tests only.

Why this exists: JobSet enforces its update rule in a validating webhook (``ValidateUpdate`` in
``pkg/webhooks/jobset_webhook.go``). Our local apiserver runs no JobSet controller, so it has no webhook,
and without one a test could not show upstream Trainer bug #3008 (a resumed TrainJob's JobSet is
rejected) or show that the planner's fix (``planner.immutability.restrict_to_mutable``) gets accepted.
This module writes the same rule as a ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1), which
the kube-apiserver runs itself. Only tests install it. ``tjpipe up`` does not: on a real cluster,
JobSet's own webhook enforces the rule.

The rule, as the webhook applies it to an UPDATE of a JobSet:

- ``spec.replicatedJobs`` is immutable. The one exception: while the old or the new JobSet has
  ``spec.suspend: true``, each pod template's ``metadata.labels``, ``metadata.annotations``,
  ``spec.nodeSelector``, ``spec.tolerations`` and ``spec.schedulingGates`` may change (Kueue needs them).
- ``spec.managedBy`` is immutable.

(The ElasticJobSet feature gate, off by default, would also let an Indexed Job's parallelism and
completions change. We do not model it.)

Why it is generated from the CRD schema: the webhook resets the five mutable fields to their old values
and then compares the whole list. CEL cannot remove fields from an object, so the policy does the
reverse. It walks the CRD's openAPIV3Schema down the path to the mutable fields and compares every
property it meets on the way, one clause per property. A property with no mutable field below it is
compared whole, in one clause. The five mutable fields are compared only when neither JobSet is
suspended. Generating the clauses from the schema means a JobSet release that adds a property is
covered without anyone editing this file. If the mutable fields move, generation raises an error
rather than allowing too much.

How the CEL is shaped. Everything below was checked against kube-apiserver 1.36:

- Presence. ``p.old.?a.?b == p.new.?a.?b`` compares two optionals. Both absent counts as equal, and one
  absent counts as a change. It says what ``has(a.p) == has(b.p) && (!has(a.p) || a.p == b.p)`` says, but
  at any depth. It also treats an absent parent as an empty one, which is right here: in Go the structs
  on the walked path (``template``, ``spec``, ``metadata``) are values, not pointers. Every chain starts
  at the replicated job. Selecting ``.?x`` from an optional that was first stored in a map or a list
  gives ``none`` at runtime, and that would make every such clause pass. So no intermediate object is
  held in a variable.
- Property names are used as they are, ``namespace`` included. At runtime a policy sees plain
  unstructured maps, not schema-typed objects. So the ``__namespace__`` escaping of CRD validation
  rules would look for a key that never exists, and the clause would always pass. (We saw a change
  to the pod template's ``metadata.namespace`` get through that way.) kube-apiserver 1.36 accepts
  ``.?namespace`` both when it compiles the policy and when it type-checks it.
- Lists and maps are compared through ``.orValue([])`` and ``.orValue({})``, because Go's semantic
  equality treats a nil slice or map as equal to an empty one.
- Old and new replicated jobs are paired by position. The webhook looks jobs up by name, but it then
  compares the whole lists in order, so the names, the count and the order must match.
  ``sameJobNames`` checks that first, and ``jobPairs`` is built (and indexed) only after it passes.
- The clauses are grouped into one variable per object on the walked path (``jobSpecChanges``,
  ``podSpecChanges``, ...). Each variable yields the paths that differ, so a denial names them, much
  as ``restrict_to_mutable`` reports what it dropped.
- Cost. Unlike CRD validation rules, a policy gets no static cost estimate: neither the apiserver's
  create-time validation nor the type checker computes one. At runtime each expression may spend
  1,000,000 units and a binding 10,000,000. Each replicated job is one pass over a fixed list of
  clauses, and equality costs about the size of the smaller operand. A 550 kB JobSet with 40 replicated
  jobs evaluates well within budget.
- Types. When the policy is created, the apiserver compiles it against dynamic types. The check
  against the schema's types runs in kube-controller-manager, which our local stack does not start,
  and that check writes its result to ``status.typeChecking``. We ran the same checker offline
  (``validating.TypeChecker`` from k8s.io/apiserver v0.36.3) against this CRD: the validations gave no
  warnings. That checker sees ``variables.*`` as dynamic, so we also checked each ``*Changes``
  expression with ``variables.jobPairs`` written out in full. Those gave no warnings either, while a
  misspelt property in them is reported.

What it cannot express exactly, and what it covers:

- Below a property that is compared whole, Go's semantic equality is more lenient than CEL's in three
  ways. It treats a nil list or map as equal to an empty one at any depth (a container's ``env: []``
  against no ``env``). It treats an absent non-pointer scalar or struct as equal to its zero value
  (``""``, ``0``, ``false``, ``{}``). And it compares quantities by value (``1`` equals ``"1000m"``).
  The policy compares values as they are stored, so in these cases it is stricter than the webhook.
  On the walked path itself, nil-or-empty lists and maps and absent parent structs are handled, as
  described above. Only objects that no planner produces run into these cases.
- It matches ``UPDATE`` of the main resource, as the webhook does, so the status subresource is never
  checked. ``matchPolicy: Equivalent`` converts a request in another served version to the storage
  version before the policy evaluates it.

List order is not on this list. At runtime the apiserver hands the policy plain unstructured objects,
so every list, including ``map`` and ``set`` lists, compares in order, exactly as Go's DeepEqual does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

POLICY_NAME = "tjpipe-jobset-update-rule"
JOBSET_GROUP = "jobset.x-k8s.io"
JOBSET_PLURAL = "jobsets"

# Relative to one replicated job, as in the webhook's munging of ``Template.Spec.Template``.
_POD_TEMPLATE = ("template", "spec", "template")
MUTABLE_WHILE_SUSPENDED: tuple[tuple[str, ...], ...] = (
    (*_POD_TEMPLATE, "metadata", "labels"),
    (*_POD_TEMPLATE, "metadata", "annotations"),
    (*_POD_TEMPLATE, "spec", "nodeSelector"),
    (*_POD_TEMPLATE, "spec", "tolerations"),
    (*_POD_TEMPLATE, "spec", "schedulingGates"),
)

MESSAGE_JOB_NAMES = (
    "spec.replicatedJobs: Invalid value: field is immutable: the replicated jobs' names, number and order cannot change"
)
MESSAGE_MANAGED_BY = "spec.managedBy: Invalid value: field is immutable"
MESSAGE_REPLICATED_JOBS = "spec.replicatedJobs: Invalid value: field is immutable"

Obj = dict[str, Any]

# A property name CEL can select with ``.?name``. Names are used as they are, not escaped: see the module
# docstring.
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def jobset_update_policy(crd: Mapping[str, Any], *, namespace: str | None = None) -> list[Obj]:
    """The ValidatingAdmissionPolicy and its binding that enforce JobSet's update rule.

    ``crd`` is JobSet's CustomResourceDefinition (from ``tjpipe.local.crds.crd_manifests()``). The policy
    matches its storage version; updates sent in another version are converted to that version first
    (``matchPolicy: Equivalent``). When ``namespace`` is given, the binding only covers that namespace,
    so a test can install the policy without affecting other namespaces.
    """
    version = _storage_version(crd)
    item_schema = _replicated_job_schema(version["schema"]["openAPIV3Schema"])
    binding_spec: Obj = {"policyName": POLICY_NAME, "validationActions": ["Deny"]}
    if namespace is not None:
        binding_spec["matchResources"] = {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
        }
    policy: Obj = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "matchPolicy": "Equivalent",
                "resourceRules": [
                    {
                        "apiGroups": [crd["spec"]["group"]],
                        "apiVersions": [version["name"]],
                        "operations": ["UPDATE"],
                        "resources": [crd["spec"]["names"]["plural"]],
                    }
                ],
            },
            "variables": _variables(_levels(item_schema, MUTABLE_WHILE_SUSPENDED)),
            "validations": [
                {
                    "expression": "variables.sameJobNames",
                    "message": MESSAGE_JOB_NAMES,
                    "reason": "Invalid",
                },
                {
                    "expression": "size(variables.changedPaths) == 0",
                    "messageExpression": (
                        f"'{MESSAGE_REPLICATED_JOBS}' + (variables.suspended"
                        " ? ' (while suspended only the pod template\\'s labels, annotations, nodeSelector,"
                        " tolerations and schedulingGates may change)'"
                        " : ' (the JobSet is not suspended)') + ': changed ' + variables.changedPaths.join(', ')"
                    ),
                    "message": MESSAGE_REPLICATED_JOBS,
                    "reason": "Invalid",
                },
                {
                    "expression": "oldObject.?spec.?managedBy == object.?spec.?managedBy",
                    "message": MESSAGE_MANAGED_BY,
                    "reason": "Invalid",
                },
            ],
        },
    }
    binding: Obj = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME},
        "spec": binding_spec,
    }
    return [policy, binding]


@dataclass(frozen=True)
class _Level:
    """One object on the way from a replicated job to the mutable fields, and one clause per property of it.

    A clause yields an empty string when the property is unchanged (or may change), else the property's name.
    """

    path: tuple[str, ...]
    name: str
    clauses: tuple[str, ...]


# Variable names for the objects the walk passes through; any other path gets a name made from its keys.
_LEVEL_NAMES = {
    (): "job",
    ("template",): "jobTemplate",
    ("template", "spec"): "jobSpec",
    _POD_TEMPLATE: "podTemplate",
    (*_POD_TEMPLATE, "metadata"): "podMetadata",
    (*_POD_TEMPLATE, "spec"): "podSpec",
}


def _levels(item_schema: Mapping[str, Any], mutable: Sequence[tuple[str, ...]]) -> list[_Level]:
    for path in mutable:
        _schema_at(item_schema, path)  # raises if JobSet moved a mutable field: never allow too much silently
    levels: list[_Level] = []
    _walk(item_schema, (), mutable, levels)
    return levels


def _walk(
    schema: Mapping[str, Any], path: tuple[str, ...], mutable: Sequence[tuple[str, ...]], out: list[_Level]
) -> None:
    """Add a level for the object at ``path``, then one for each child object that holds a mutable field."""
    properties: Mapping[str, Any] = schema.get("properties") or {}
    if not properties:
        raise ValueError(f"{'.'.join(path) or 'replicatedJobs[]'}: no properties in the schema to compare")
    clauses: list[str] = []
    below: list[str] = []
    for key in sorted(properties):
        child_path = (*path, key)
        if child_path in mutable:
            clauses.append(f"(variables.suspended || {_equal(properties[key], child_path)}) ? '' : '{key}'")
        elif any(m[: len(child_path)] == child_path for m in mutable):
            below.append(key)
        else:
            clauses.append(f"({_equal(properties[key], child_path)}) ? '' : '{key}'")
    name = _LEVEL_NAMES.get(path) or "at" + "".join(key[:1].upper() + key[1:] for key in path)
    out.append(_Level(path=path, name=name, clauses=tuple(clauses)))
    for key in below:
        _walk(properties[key], (*path, key), mutable, out)


def _equal(schema: Mapping[str, Any], path: tuple[str, ...]) -> str:
    """CEL that is true when ``p.old`` and ``p.new`` agree at ``path`` (Go: a nil list or map equals an empty one)."""
    selector = "".join(_select(key) for key in path)
    old, new = f"p.old{selector}", f"p.new{selector}"
    kind = schema.get("type")
    if kind == "array":
        old, new = f"{old}.orValue([])", f"{new}.orValue([])"
    elif kind == "object" and "additionalProperties" in schema and not schema.get("properties"):
        old, new = f"{old}.orValue({{}})", f"{new}.orValue({{}})"
    return f"{old} == {new}"


def _variables(levels: Sequence[_Level]) -> list[Obj]:
    variables: list[Obj] = [
        {
            "name": "suspended",
            "expression": "oldObject.?spec.?suspend.orValue(false) || object.?spec.?suspend.orValue(false)",
        },
        {"name": "oldJobs", "expression": "oldObject.?spec.?replicatedJobs.orValue([])"},
        {"name": "newJobs", "expression": "object.?spec.?replicatedJobs.orValue([])"},
        {
            "name": "sameJobNames",
            "expression": (
                "size(variables.oldJobs) == size(variables.newJobs)"
                " && variables.newJobs.all(i, job, job.name == variables.oldJobs[i].name)"
            ),
        },
        {
            # One {'old': ..., 'new': ...} per replicated job, paired by position once the names match.
            "name": "jobPairs",
            "expression": (
                "variables.sameJobNames"
                " ? lists.range(size(variables.newJobs))"
                ".map(i, {'old': variables.oldJobs[i], 'new': variables.newJobs[i]})"
                " : []"
            ),
        },
    ]
    changes: list[str] = []
    for level in levels:
        if not level.clauses:
            continue
        # <level>Changes: where the level's properties differ (and may not), as paths under spec.replicatedJobs.
        prefix = "".join(f"{key}." for key in level.path)
        clauses = ",\n  ".join(level.clauses)
        variables.append(
            {
                "name": f"{level.name}Changes",
                "expression": (
                    f"variables.jobPairs.transformList(i, p, [\n  {clauses}\n]"
                    f".filter(path, path != '').map(path, 'spec.replicatedJobs[' + string(i) + '].{prefix}' + path))"
                    ".flatten()"
                ),
            }
        )
        changes.append(f"variables.{level.name}Changes")
    variables.append({"name": "changedPaths", "expression": " + ".join(changes) or "[]"})
    return variables


def _select(name: str) -> str:
    if not _IDENTIFIER.match(name):
        raise ValueError(f"property {name!r} cannot be selected in CEL")
    return f".?{name}"


def _storage_version(crd: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = crd.get("spec") or {}
    if spec.get("group") != JOBSET_GROUP or (spec.get("names") or {}).get("plural") != JOBSET_PLURAL:
        raise ValueError(f"not the JobSet CRD: {(crd.get('metadata') or {}).get('name')}")
    versions = [v for v in spec.get("versions") or [] if v.get("storage")]
    if len(versions) != 1:
        raise ValueError("the JobSet CRD must have exactly one storage version")
    version: Mapping[str, Any] = versions[0]
    return version


def _replicated_job_schema(root: Mapping[str, Any]) -> Mapping[str, Any]:
    replicated_jobs = _schema_at(root, ("spec", "replicatedJobs"))
    if replicated_jobs.get("type") != "array" or "items" not in replicated_jobs:
        raise ValueError("spec.replicatedJobs is not a list in the JobSet CRD")
    items: Mapping[str, Any] = replicated_jobs["items"]
    return items


def _schema_at(schema: Mapping[str, Any], path: Sequence[str]) -> Mapping[str, Any]:
    node = schema
    for depth, key in enumerate(path):
        properties = node.get("properties") or {}
        if key not in properties:
            raise ValueError(f"the JobSet CRD has no {'.'.join(path[: depth + 1])}")
        node = properties[key]
    return node
