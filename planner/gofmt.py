"""Go's ``fmt`` verbs for the values Trainer's messages quote, so validation messages match Trainer's.

Several plugins (torch, Volcano) format names into their error messages the way Trainer's Go code does;
the formatting lives here so that no plugin imports another for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import msgspec


def go_quote(text: str) -> str:
    """Go's ``%q`` for the names that appear in messages (close enough outside control characters)."""
    return json.dumps(text, ensure_ascii=False)


def go_string_list(items: Iterable[str]) -> str:
    """Go's ``%v`` of a ``[]string``: ``[a b c]``."""
    return "[" + " ".join(items) + "]"


def go_value(value: Any) -> str:
    """How apimachinery's ``field.Invalid`` prints a bad value: numbers and booleans with ``%v``, strings
    with ``%q``, anything else as Go's ``json.Marshal`` would (which escapes ``<``, ``>`` and ``&``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return go_quote(value)
    text = msgspec.json.encode(value).decode()
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
