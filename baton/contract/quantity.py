"""Kubernetes resource quantities (`"40960"`, `"64Gi"`, `"1e9"`, `"500m"`) read exactly, and a
value quoted in an error message."""

from __future__ import annotations

import re
import reprlib
from decimal import Decimal, DecimalException, InvalidOperation

_QUANTITY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)
_LARGEST = Decimal(2**63)
_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def parse_quantity(text: object) -> Decimal:
    """A Kubernetes resource quantity (`"40960"`, `"64Gi"`, `"1e9"`, `"500m"`) as a number."""
    if not isinstance(text, str | int | float | Decimal) or isinstance(text, bool):
        raise ValueError(f"{shown(text)} is not a Kubernetes quantity")
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise ValueError(f"{shown(text)} is not a Kubernetes quantity")
    number, exponent, suffix = match.groups()
    try:
        value = Decimal(number)
    except InvalidOperation as err:  # pragma: no cover - the pattern admits only decimals
        raise ValueError(f"{text!r} is not a Kubernetes quantity") from err
    try:
        if exponent:
            value = value.scaleb(int(exponent[1:]))
        if suffix:
            value *= _SUFFIX[suffix]
    except DecimalException:  # an exponent past what Decimal holds (1e1000000, 1e-9999999)
        raise ValueError(f"{shown(text)} is out of range (its exponent is too large)") from None
    if abs(value) >= _LARGEST:  # past int64, and turning it into an int could take minutes
        raise ValueError(f"{shown(text)} is out of range (a quantity is below 2^63)")
    return value


def shown(value: object) -> str:
    """A value as an error message quotes it: its repr, cut short (no recursion, any size)."""
    return reprlib.repr(value)
