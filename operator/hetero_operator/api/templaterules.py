"""The admission rules of the worker pod template: one :class:`Rule` is a CEL rule of the CRD and its
Python twin (pure).

:mod:`hetero_operator.api.podtemplate` lists what the operator owns,
:mod:`hetero_operator.api.podsecurity` what Pod Security "restricted" refuses; both are built from
the helpers here, and ``scripts/gen-crd-podtemplate.py`` writes them into the CRD.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Path = tuple[str, ...]
"""Where a rule sits, relative to the template: keys, ``"*"`` for every item of a list."""
POD: Path = ("spec",)
CONTAINER: Path = ("spec", "containers", "*")
INIT: Path = ("spec", "initContainers", "*")


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """One admission rule on the template.

    Attributes:
        at: where it sits relative to the template (``("spec",)``, ``("spec", "containers",
            "*")``).
        field: the field it is about, relative to ``at`` (``"hostNetwork"``); the CEL rule's
            ``fieldPath`` and the Python path.
        cel: the CEL expression (``self`` is the object at ``at``).
        message: why, one sentence (:func:`cel_message` puts the field before it in the CRD).
        check: Python twin: ``check(obj)`` returns the offending sub-path below ``field``
            (``""`` for the field itself, ``"[2].name"`` for an item) or None when it passes.
    """

    at: Path
    field: str
    cel: str
    message: str
    check: Callable[[Mapping[str, Any]], str | None]


def _absent(field: str) -> Callable[[Mapping[str, Any]], str | None]:
    return lambda obj: "" if field in obj else None


def _forbid(at: Path, field: str, why: str) -> Rule:
    return Rule(at=at, field=field, cel=f"!has(self.{field})", message=why, check=_absent(field))


def _items(field: str, bad: Callable[[Mapping[str, Any]], str | None]) -> Callable[[Mapping[str, Any]], str | None]:
    """Twin of ``!has(self.F) || self.F.all(x, ok(x))``: the first bad item's sub-path."""
    def check(obj: Mapping[str, Any]) -> str | None:
        for i, item in enumerate(obj.get(field) or ()):
            found = bad(item if isinstance(item, Mapping) else {})
            if found is not None:
                return f"[{i}]{found}"
        return None
    return check


def _keys(field: str, bad: Callable[[str], bool]) -> Callable[[Mapping[str, Any]], str | None]:
    """Twin of ``!has(self.F) || self.F.all(k, !bad(k))`` over a map's keys."""
    def check(obj: Mapping[str, Any]) -> str | None:
        for key in obj.get(field) or {}:
            if bad(str(key)):
                return f"[{key}]"
        return None
    return check


def _cel_list(values: Sequence[str]) -> str:
    """``['a', 'b']``: a CEL list of strings."""
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


def cel_message(rule: Rule) -> str:
    """The rule's message as the CRD carries it: the field first, then why (the API server prints
    it after the path of the object the rule sits on: ``spec.worker.template.spec: Invalid value:
    "object": hostNetwork: refused: ranks talk ...``)."""
    return f"{rule.field}: refused: {rule.message}"


def cel_text(rule: Rule) -> str:
    """The rule as it goes into the CRD: guarded by ``has()`` when it reads a field."""
    if rule.cel.startswith("!has("):
        return rule.cel
    return f"!has(self.{rule.field}) || ({rule.cel})"


def _at(obj: Any, at: Path, prefix: str) -> Iterator[tuple[Mapping[str, Any], str]]:
    """Every object at ``at`` below ``obj`` with its path (lists expanded at ``"*"``)."""
    if not at:
        if isinstance(obj, Mapping):
            yield obj, prefix
        return
    head, rest = at[0], at[1:]
    if head == "*":
        for i, item in enumerate(obj if isinstance(obj, list) else ()):
            yield from _at(item, rest, f"{prefix}[{i}]")
    elif isinstance(obj, Mapping) and head in obj:
        yield from _at(obj[head], rest, f"{prefix}.{head}")
