"""GPU prices per device-hour: from a YAML/JSON file or the ``HTJ_GPU_PRICES`` setting (pure)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml


class PriceError(ValueError):
    """A prices file or setting does not parse (the message names it)."""


def parse_prices(data: Any, source: str) -> dict[str, float]:
    """A mapping ``name -> price per device-hour`` (numbers >= 0).

    Raises:
        PriceError: not a mapping of names to non-negative numbers.
    """
    if not isinstance(data, Mapping):
        raise PriceError(f"{source}: expected a mapping of GPU type to price per hour")
    out = {}
    for name, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
                or math.isinf(value):
            raise PriceError(f"{source}: {name}: price must be a number >= 0, got {value!r}")
        out[str(name)] = float(value)
    return out


def load_prices(path: Path) -> dict[str, float]:
    """Prices from a YAML or JSON file.

    Raises:
        PriceError: unreadable or malformed.
    """
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise PriceError(f"{path}: cannot read ({exc})") from None
    except yaml.YAMLError:
        raise PriceError(f"{path}: not valid YAML or JSON") from None
    return parse_prices(data, str(path))


def parse_prices_setting(raw: str, name: str = "HTJ_GPU_PRICES") -> dict[str, float]:
    """``"Tesla-T4=0.35,NVIDIA-A100-SXM4-40GB=2.9"`` -> prices.

    Raises:
        PriceError: an entry without ``=`` or with a bad number.
    """
    out: dict[str, Any] = {}
    for entry in filter(None, (e.strip() for e in raw.split(","))):
        key, sep, value = entry.rpartition("=")
        if not sep or not key:
            raise PriceError(f"{name}: entry {entry!r} must be type=price")
        try:
            out[key.strip()] = float(value)
        except ValueError:
            raise PriceError(f"{name}: {key}: price must be a number, got {value!r}") from None
    return parse_prices(out, name)
