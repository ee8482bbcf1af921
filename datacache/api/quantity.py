"""Byte quantities: Kubernetes quantity strings in, Fluid-style sizes out.

``parse_quantity`` reads the sizes users write in resources (``quota: 10Gi``, ``blockSize: 4Mi``)
with Kubernetes' suffixes, so a value written for Fluid or for a Pod's resources means the same
here. ``format_bytes`` prints sizes the way Fluid's status columns do (``1.50GiB``).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

__all__ = ["parse_quantity", "format_bytes"]

# Binary (IEC) and decimal (SI) suffixes, as in Kubernetes' resource.Quantity. "k" is the SI
# spelling, "K" is accepted as well because users write it. A trailing "B" is tolerated after a
# binary suffix or alone ("64MiB", "512B") so that what format_bytes prints can be pasted back;
# "10GB" is refused: users mean 10Gi as often as 10G, so they must say which.
_MULTIPLIERS: dict[str, int] = {
    "": 1,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "Ei": 1024**6,
    "k": 1000,
    "K": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "P": 1000**5,
    "E": 1000**6,
}

_QUANTITY = re.compile(
    r"^(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:(?P<suffix>[KMGTPE]i)B?|(?P<si>[kKMGTPE])|(?P<exp>[eE][+-]?[0-9]+)|B)?$"
)

_LIMIT = Decimal(2**63)

ACCEPTED_FORMS = (
    "use a byte count such as 1073741824, or a number with a suffix: "
    "Ki, Mi, Gi, Ti, Pi (powers of 1024, e.g. 64Mi, 1.5Gi) "
    "or k, M, G, T, P (powers of 1000, e.g. 500M)"
)


def parse_quantity(value: str | int | float) -> int:
    """Return the number of bytes a quantity denotes.

    Accepts an ``int`` (bytes), a finite non-negative ``float`` (bytes, rounded up), or a string:
    a decimal number optionally followed by a binary suffix (``Ki Mi Gi Ti Pi Ei``, powers of
    1024), a decimal suffix (``k K M G T P E``, powers of 1000) or an exponent (``1e9``).
    A trailing ``B`` is tolerated after a binary suffix or alone (``64MiB``, ``512B``), not after a
    decimal one (``10GB`` is ambiguous). Fractional results are rounded up to
    whole bytes, as Kubernetes does.

    Raises ``ValueError`` (saying which forms are accepted) for anything else, including negative
    values, booleans and values of 2**63 bytes or more.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity: {ACCEPTED_FORMS}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"quantity {value} must not be negative")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"quantity {value!r} must be a finite, non-negative number of bytes")
        return math.ceil(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a quantity string or a number, got {type(value).__name__}")
    text = value.strip()
    match = _QUANTITY.match(text)
    if match is None:
        if text.startswith("-"):
            raise ValueError(f"quantity '{value}' must not be negative")
        ambiguous = re.match(r"^([0-9.]+)([kKMGTPE])B$", text)
        if ambiguous:
            number, letter = ambiguous.groups()
            raise ValueError(
                f"'{value}' is ambiguous: write '{number}{letter.upper()}i' (powers of 1024) "
                f"or '{number}{letter}' (powers of 1000)"
            )
        raise ValueError(f"'{value}' is not a quantity: {ACCEPTED_FORMS}")
    try:
        number = Decimal(match["number"])
        if match["exp"]:
            number = number.scaleb(int(match["exp"][1:]))
    except (InvalidOperation, ValueError):  # pragma: no cover - the regex admits valid decimals only
        raise ValueError(f"'{value}' is not a quantity: {ACCEPTED_FORMS}") from None
    number *= _MULTIPLIERS[match["suffix"] or match["si"] or ""]
    if number >= _LIMIT:
        raise ValueError(f"quantity '{value}' is too large (at most 8Ei)")
    return int(number.to_integral_value(rounding="ROUND_CEILING"))


_BINARY_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def format_bytes(n: int | float) -> str:
    """Format a byte count as Fluid's status columns do: ``0B``, ``512B``, ``64.00MiB``, ``1.50GiB``.

    Counts below 1 KiB are printed as whole bytes; larger ones with two decimals in the largest
    binary unit not exceeding the value. Negative counts keep their sign.
    """
    if n < 0:
        return "-" + format_bytes(-n)
    if n < 1024:
        return f"{int(n)}B"
    size = float(n)
    unit = "B"
    for unit in _BINARY_UNITS:
        size /= 1024.0
        if size < 1024.0:
            break
    return f"{size:.2f}{unit}"
