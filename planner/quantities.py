"""Kubernetes resource quantities rendered the way ``resource.Quantity.String()`` renders them.

Trainer's components pass through Go's typed quantities, so every quantity it writes is canonical: a
runtime's ``nvidia.com/gpu: 2`` becomes ``"2"``, ``1000m`` becomes ``"1"``. The planner keeps quantities as
exact decimals and renders them here, in the number format (decimal SI, binary SI or decimal exponent)
Kubernetes' parser gives the original text, so the components compare equal to Trainer's byte for byte.
"""

from __future__ import annotations

import decimal
import functools
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Literal

from planner.merge import parse_quantity

QuantityFormat = Literal["DecimalSI", "BinarySI", "DecimalExponent"]

_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES: Mapping[int, str] = {
    -9: "n",
    -6: "u",
    -3: "m",
    0: "",
    3: "k",
    6: "M",
    9: "G",
    12: "T",
    15: "P",
    18: "E",
}
NANO = Decimal("1e-9")
EXACT = decimal.Context(prec=200, rounding=decimal.ROUND_HALF_EVEN, traps=[decimal.InvalidOperation])


def quantity_format(text: str | int | float) -> QuantityFormat:
    """The format Kubernetes' parser gives a quantity, from its suffix."""
    if not isinstance(text, str):
        return "DecimalSI"
    body = text.strip().lstrip("+-")
    suffix = body.lstrip("0123456789.")
    if suffix in _BINARY_SUFFIXES[1:]:
        return "BinarySI"
    if len(suffix) > 1 and suffix[0] in "eE":
        return "DecimalExponent"
    return "DecimalSI"


def format_quantity(value: Decimal, fmt: QuantityFormat) -> str:
    """``resource.Quantity.String()`` of ``value`` held in format ``fmt``.

    Values finer than a nano unit are rounded up to it, as Kubernetes does when it parses them. Where Go
    would run out of suffixes (beyond ``E`` or ``Ei``) the mantissa grows instead, so the value is kept.
    """
    with decimal.localcontext(EXACT):
        if value == 0:
            return "0"
        value = value.quantize(NANO, rounding=decimal.ROUND_UP)
        if fmt == "BinarySI" and (-1024 < value < 1024 or value != value.to_integral_value()):
            # Small or fractional values are shown in decimal SI rather than rounded.
            fmt = "DecimalSI"
        if fmt == "BinarySI":
            mantissa, power = int(value), 0
            while mantissa % 1024 == 0 and power < len(_BINARY_SUFFIXES) - 1:
                mantissa //= 1024
                power += 1
            return f"{mantissa}{_BINARY_SUFFIXES[power]}"
        sign, digits, exponent = value.as_tuple()
        mantissa = int("".join(map(str, digits)))
        exp = int(exponent)
        while mantissa % 10 == 0:
            mantissa //= 10
            exp += 1
        while exp % 3 != 0:
            mantissa *= 10
            exp -= 1
        number = f"{'-' if sign else ''}{mantissa}"
        if fmt == "DecimalExponent":
            return number if exp == 0 else f"{number}e{exp}"
        if exp > 18:
            number = f"{'-' if sign else ''}{mantissa * 10 ** (exp - 18)}"
            exp = 18
        return f"{number}{_DECIMAL_SUFFIXES[exp]}"


@functools.lru_cache(maxsize=4096)
def canonical_quantity(text: str | int | float) -> str:
    """One quantity as Trainer would write it after Go's typed round trip."""
    return format_quantity(parse_quantity(text), quantity_format(text))


def canonical_resources(resources: Any) -> Any:
    """``limits``, ``requests`` (and any other quantity map) of a ResourceRequirements, made canonical."""
    if not isinstance(resources, dict):
        return resources
    out = dict(resources)
    for field in ("limits", "requests"):
        values = out.get(field)
        if isinstance(values, dict):
            canonical = {}
            for name, value in values.items():
                text = _CANONICAL.get(value)
                if text is None:
                    text = canonical_quantity(value)
                    if len(_CANONICAL) >= _CANONICAL_SIZE:
                        _CANONICAL.clear()
                    _CANONICAL[value] = text
                canonical[name] = text
            out[field] = canonical
    return out


_CANONICAL: dict[str | int | float, str] = {}
"""``canonical_quantity`` as a plain dict: every plan renders the same few quantities, and a dict lookup
costs half the call through ``lru_cache``. Keyed like it (``2`` and ``2.0`` are one key)."""
_CANONICAL_SIZE = 4096
