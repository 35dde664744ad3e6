"""Fit a Kubeflow replica's pod template to ``spec.worker.template`` (pure).

The template rules of :mod:`hetero_operator.api.podtemplate` (what the operator owns, what Pod
Security "restricted" refuses) are the one list: :func:`fit_template` asks
:func:`~hetero_operator.api.podtemplate.check_template` for the first refused field, takes it out
of the template and records it with the rule's own message, until the template passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from hetero_operator.api.errors import SpecError
from hetero_operator.api.podtemplate import TEMPLATE_PATH, check_template

MAX_REMOVALS = 200
"""Most fields taken out of one template (a bound on the loop; a template has far fewer)."""
_TOKEN = re.compile(r"\.([^.\[\]]+)|\[([^\]]*)\]")


def fit_template(template: dict[str, Any], *, source: Callable[[str], str],
                 removed: Callable[[str, str], None]) -> dict[str, Any]:
    """Take every refused field out of ``template`` (changed in place and returned).

    Args:
        template: a ``PodTemplateSpec`` dict, our ``spec.worker.template``.
        source: the input's path of a path relative to the template (``.spec.hostNetwork`` ->
            ``spec.pytorchReplicaSpecs.Worker.template.spec.hostNetwork``), given indices as
            they were before any removal.
        removed: called with (the input's path, why) for each field taken out.

    Raises:
        SpecError: the template still fails after :data:`MAX_REMOVALS` removals, or a refused
            path cannot be found in it.
    """
    origins: dict[int, list[int]] = {}
    for _ in range(MAX_REMOVALS):
        try:
            check_template(template)
        except SpecError as exc:
            if not exc.path.startswith(TEMPLATE_PATH):
                raise
            rel = _remove(template, exc.path[len(TEMPLATE_PATH):], origins)
            why = str(exc).partition(": ")[2]
            removed(source(rel), why.removeprefix("refused: "))
            continue
        return template
    raise SpecError(TEMPLATE_PATH, f"still refused after {MAX_REMOVALS} removals")


def _remove(template: dict[str, Any], rel: str, origins: dict[int, list[int]]) -> str:
    """Take the field at ``rel`` out (a list item when the refused field is one of its keys, so
    a ``hostPath`` volume goes as a whole); returns the path with original list indices."""
    tokens = [(m.group(1), m.group(2)) for m in _TOKEN.finditer(rel)]
    if not tokens:
        raise SpecError(TEMPLATE_PATH + rel, "cannot be taken out of the template")
    node: Any = template
    trail: list[tuple[Any, Any]] = []  # (container, key or index)
    shown = []
    for field, key in tokens:
        if field is not None:
            trail.append((node, field))
            shown.append(f".{field}")
            node = node[field] if isinstance(node, dict) and field in node else None
        elif isinstance(node, list):
            index = int(key)
            original = origins.setdefault(id(node), list(range(len(node))))[index]
            trail.append((node, index))
            shown.append(f"[{original}]")
            node = node[index]
        else:
            trail.append((node, key))
            shown.append(f"[{key}]")
            node = node.get(key) if isinstance(node, dict) else None
        if node is None and (field, key) != tokens[-1]:
            raise SpecError(TEMPLATE_PATH + rel, "cannot be found in the template")
    parent, last = trail[-1]
    if isinstance(last, str) and len(trail) > 1 and isinstance(trail[-2][1], int) \
            and trail[-3:-2] and trail[-3][1] not in ("containers",):
        parent, last = trail[-2]  # a refused field of a list item: the item goes
        shown.pop()
    if isinstance(last, int):
        del parent[last]
        origins[id(parent)].pop(last)
    else:
        parent.pop(last, None)
    return "".join(shown)
