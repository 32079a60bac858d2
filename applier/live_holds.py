"""Whether the live object already holds a plan, so that applying it would change nothing (``held_state``).

``applier.claim_round.decide`` asks it before any write the ledger does not already rule out. Pure: no I/O.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from contracts import labels

HeldState = Literal["held", "held-unlabelled", "differs"]


def held_state(planned: bytes, live_raw: bytes, *, manager: str) -> HeldState:
    """Whether applying ``planned`` as ``manager`` would leave the live object as it is.

    Asked before any write the ledger does not already rule out: a controller this pipeline takes over
    from (Trainer, which applies with the same field manager) built the target, the ledger lost its
    record, or a new plan of an existing JobSet repeats what the live object holds (a suspended JobSet
    is re-planned from the live one, server defaults included). ``held`` needs two
    things: every value the plan sets is the live value (lists item by item, in order), and every field
    ``manager`` already owns by Apply is still in the plan, since an apply would remove a field its
    manager stops sending. The only thing skipping the write leaves undone is co-owning fields that
    already hold the planned values. Anything this cannot tell (a list of another length, a list key
    it cannot find) is ``differs``: the write is then made, as it would have been without the check.

    ``held-unlabelled``: all that differs is this pipeline's label (an object Trainer made), which the
    label merge patch adds under a field manager of its own, so Trainer's next apply of the object as
    ``trainer`` after a rollback does not take it off again.
    """
    want = msgspec.json.decode(planned)
    have = msgspec.json.decode(live_raw)
    for entry in (have.get("metadata") or {}).get("managedFields") or []:
        if entry.get("manager") == manager and entry.get("operation") == "Apply" and not entry.get("subresource"):
            if not _owned_fields_in(entry.get("fieldsV1") or {}, want):
                return "differs"
            break
    want_meta = want.get("metadata") or {}
    ours = (want_meta.get("labels") or {}).pop(labels.MANAGED_BY_LABEL, None)
    if ours is not None and not want_meta["labels"]:
        del want_meta["labels"]
    if not _holds(want, have):
        return "differs"
    have_labels = (have.get("metadata") or {}).get("labels") or {}
    if ours is not None and have_labels.get(labels.MANAGED_BY_LABEL) != ours:
        return "held-unlabelled"
    return "held"


def _owned_fields_in(fields: dict[str, object], obj: object) -> bool:
    """Every field of a managedFields ``fieldsV1`` set is present in ``obj``."""
    for key, sub in fields.items():
        if key == ".":
            continue
        kind, _, rest = key.partition(":")
        child: object
        if kind == "f" and isinstance(obj, dict) and rest in obj:
            child = obj[rest]
        elif kind == "k" and isinstance(obj, list):
            item_key = msgspec.json.decode(rest)
            match = [i for i in obj if isinstance(i, dict) and _keyed_by(i, item_key)]
            if not match:
                return False
            child = match[0]
        elif kind == "v" and isinstance(obj, list):
            if msgspec.json.decode(rest) not in obj:
                return False
            continue
        else:
            return False
        if isinstance(sub, dict) and sub and not _owned_fields_in(sub, child):
            return False
    return True


def _keyed_by(item: dict[str, object], key: dict[str, object]) -> bool:
    return all(item.get(field, LIST_KEY_DEFAULTS.get(field)) == value for field, value in key.items())


LIST_KEY_DEFAULTS: dict[str, object] = {"protocol": "TCP"}
"""List-map key fields the API server fills in when an apply leaves them out.

A port list is keyed by containerPort and protocol, and protocol defaults to TCP (for built-in types and
in the pod templates of the CRDs this pipeline writes alike), so a manager that applied a port without a
protocol owns the item keyed ``{"containerPort": N, "protocol": "TCP"}``. A plan that leaves protocol out
names that same item again; one that owned a UDP port and now sends none does not.
"""


def _holds(want: object, have: object) -> bool:
    if isinstance(want, dict):
        return isinstance(have, dict) and all(v is None or (k in have and _holds(v, have[k])) for k, v in want.items())
    if isinstance(want, list):
        return isinstance(have, list) and len(want) == len(have) and all(map(_holds, want, have))
    return want == have
