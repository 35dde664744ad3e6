"""Typed readers of manifest fields: each raises :class:`~hetero_operator.api.errors.SpecError`
naming the field path (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hetero_operator.api.errors import SpecError
from hetero_operator.api.quantities import QuantityError, parse_quantity


def mapping(obj: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> Mapping[str, Any]:
    value = obj.get(key)
    if value is None:
        if required:
            raise SpecError(path, "is required")
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(path, f"must be a mapping, got {type(value).__name__}")
    return value


def string(obj: Mapping[str, Any], key: str, path: str) -> str:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    if not isinstance(value, str) or not value:
        raise SpecError(path, "is required and must be a non-empty string")
    return value


def optional_string(obj: Mapping[str, Any], key: str, path: str) -> str:
    """A string, ``""`` when absent or null."""
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SpecError(path, f"must be a string, got {type(value).__name__} {value!r}")
    return value


DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def claim_name(obj: Mapping[str, Any], key: str, path: str) -> str:
    """A PersistentVolumeClaim's name (a DNS-1123 subdomain), ``""`` when absent."""
    value = optional_string(obj, key, path)
    if value and (len(value) > 253 or not DNS_1123_SUBDOMAIN.match(value)):
        raise SpecError(path, f"{value!r} is no PersistentVolumeClaim name (lower-case letters, "
                        "digits, '-' and '.', at most 253): give the claim's name as kubectl get pvc "
                        "shows it")
    return value


def string_list(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> tuple[str, ...]:
    value = obj.get(key)
    if value is None:
        if required:
            raise SpecError(path, "is required (a list of strings)")
        return ()
    if not isinstance(value, list) or not all(isinstance(v, (str, int)) for v in value):
        raise SpecError(path, "must be a list of strings")
    return tuple(str(v) for v in value)


def integer(obj: Mapping[str, Any], key: str, path: str, default: int | None, lo: int, hi: int) -> int:
    value = obj.get(key, default)
    if value is None:
        raise SpecError(path, f"is required (an integer in {lo}..{hi})")
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(path, f"must be an integer in {lo}..{hi}, got {value!r}")
    if not lo <= value <= hi:
        raise SpecError(path, f"must be in {lo}..{hi}, got {value}")
    return value


def optional_integer(obj: Mapping[str, Any], key: str, path: str) -> int | None:
    if obj.get(key) is None:
        return None
    return integer(obj, key, path, None, 0, 10**9)


def boolean(obj: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = obj.get(key, default)
    if not isinstance(value, bool):
        raise SpecError(path, f"must be true or false, got {value!r}")
    return value


def enum(obj: Mapping[str, Any], key: str, path: str, choices: tuple[str, ...],
          default: str | None = None) -> str:
    value = obj.get(key, default if default is not None else choices[0])
    if value not in choices:
        raise SpecError(path, f"must be one of {', '.join(choices)}; got {value!r}")
    return str(value)


def quantity(obj: Mapping[str, Any], key: str, path: str, *, binary: bool = True,
              hi: int = 2**50) -> int:
    """An integer or Kubernetes quantity string (``"1.3G"``, ``"48Mi"``), exactly; 0 when absent."""

    value = obj.get(key)
    if value is None:
        return 0
    try:
        number = parse_quantity(value, binary=binary)
    except QuantityError as exc:
        raise SpecError(path, str(exc)) from None
    if number > hi:
        raise SpecError(path, f"must be at most {hi}, got {number}")
    return number
