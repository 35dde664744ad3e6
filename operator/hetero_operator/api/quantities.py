"""Kubernetes quantities (``900k``, ``16Gi``) as whole numbers, and byte figures for people (pure)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

GIB = 2**30
MIB = 2**20
_QUANTITY_RE = re.compile(r"^(?P<num>[0-9]+(\.[0-9]*)?|\.[0-9]+)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


class QuantityError(ValueError):
    """A value is not a whole-number Kubernetes quantity (the message says what is accepted)."""


def parse_quantity(value: object, *, binary: bool = True) -> int:
    """A whole number from an integer or a Kubernetes quantity string, exactly.

    Kubernetes' quantity notation (``k8s.io/apimachinery/pkg/api/resource``): decimal suffixes
    ``k M G T P E`` (powers of 1000) and binary ``Ki Mi Gi Ti Pi Ei`` (powers of 1024), e.g.
    ``"1.3G"`` = 1 300 000 000, ``"48Mi"`` = 50 331 648.  Parsed with :class:`decimal.Decimal`, so
    ``"1.3G"`` is exact (no float).

    Args:
        value: an ``int`` (not bool) or a string.
        binary: accept binary suffixes (byte sizes); False for counts such as parameters.

    Returns:
        The integer (>= 0).

    Raises:
        QuantityError: negative, not a quantity, a suffix not accepted here, or not a whole number.
    """
    if isinstance(value, bool):
        raise QuantityError(f"must be an integer or a quantity string, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise QuantityError(f"must be >= 0, got {value}")
        return value
    if not isinstance(value, str):
        raise QuantityError(f"must be an integer or a quantity string such as \"1.3G\", got {value!r}")
    m = _QUANTITY_RE.match(value.strip())
    if not m:
        raise QuantityError(f"must be a whole number or a quantity such as \"1.3G\" or \"48Mi\", got {value!r}")
    suffix = m.group("suffix") or ""
    if suffix.endswith("i") and not binary:
        raise QuantityError(f"is a count: use a decimal suffix (k, M, G, T), not {suffix!r}, got {value!r}")
    try:
        exact = Decimal(m.group("num")) * _SUFFIX[suffix]
    except InvalidOperation:  # pragma: no cover - the regex admits only digits
        raise QuantityError(f"is not a number: {value!r}") from None
    if exact != exact.to_integral_value():
        raise QuantityError(f"must be a whole number, {value!r} is {exact}")
    return int(exact)


_ANY_QUANTITY_RE = re.compile(r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)"
                              r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")


def check_quantity(value: object) -> None:
    """Any non-negative Kubernetes quantity (``500m``, ``0.5``, ``1e3``, ``16Gi``): what a
    container's requests and limits take.

    Raises:
        QuantityError: not a quantity, or negative.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise QuantityError(f"must be a quantity such as \"500m\", \"2\" or \"16Gi\", got {value!r}")
    if isinstance(value, (int, float)):
        if not 0 <= value < float("inf"):
            raise QuantityError(f"must be a finite number >= 0, got {value!r}")
        return
    if not _ANY_QUANTITY_RE.match(value.strip()):
        raise QuantityError(f"must be a quantity such as \"500m\", \"2\" or \"16Gi\", got {value!r}")


_SCALE_RE = re.compile(r"^\+?(?P<num>[0-9]+(\.[0-9]*)?|\.[0-9]+)(?P<suffix>[A-Za-z]*|[eE][+-]?[0-9]+)$")


def scale_quantity(value: object, factor: int) -> int | str:
    """``value`` (a quantity :func:`check_quantity` accepts) times a whole ``factor``, exactly, in
    the same unit: ``("4", 2)`` -> ``"8"``, ``("8Gi", 2)`` -> ``"16Gi"``, ``("500m", 3)`` ->
    ``"1500m"``, ``("1.5", 2)`` -> ``"3"``; an integer stays an integer.

    Raises:
        QuantityError: not a quantity (as :func:`check_quantity`).
    """
    check_quantity(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value * factor
    m = _SCALE_RE.match(str(value).strip())
    if not m:  # pragma: no cover - check_quantity admitted it
        raise QuantityError(f"must be a quantity such as \"500m\", \"2\" or \"16Gi\", got {value!r}")
    scaled = (Decimal(m.group("num")) * factor).normalize()
    return f"{scaled:f}{m.group('suffix')}"


def gib(n_bytes: float) -> str:
    """Bytes in the largest binary unit that keeps the figure >= 1, one decimal: ``"18.4 GiB"``,
    ``"7.2 MiB"``, ``"879.0 KiB"``."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 1024)):
        if abs(n_bytes) >= size:
            return f"{n_bytes / size:.1f} {unit}"
    return f"{n_bytes:.0f} B"
