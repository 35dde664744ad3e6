"""Attributes of the :class:`~hetero_worker.trainer.Trainer` that one of its parts owns."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any


def part_attr(path: str, doc: str, *, convert: Callable[[Any], Any] | None = None) -> property:
    """A property that reads a part's state: ``"sync.groups"`` reads ``self.sync.groups``
    (``doc``: its docstring); read-only, or settable through ``convert`` (e.g. ``int``) if given."""
    owner_path, _, name = path.rpartition(".")
    setter = None
    if convert is not None:
        def setter(self: Any, value: Any) -> None:
            setattr(operator.attrgetter(owner_path)(self), name, convert(value))
    return property(operator.attrgetter(path), setter, doc=doc)
