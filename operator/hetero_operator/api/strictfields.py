"""Strict manifests: refuse fields the CRD does not know, naming the nearest known one (pure).

The known fields come from the CRD's own ``openAPIV3Schema`` (``crds/heterotrainingjobs.heterotrain.io.yaml``),
so a field added to the CRD is known here without a second list. ``kubectl apply`` refuses unknown
fields the same way (server-side strict field validation, the default since Kubernetes 1.27:
https://kubernetes.io/docs/reference/using-api/api-concepts/#field-validation); ``heterotrain run``
and ``plan`` read the manifest themselves, and the operator checks what an API server let through.

Where the schema says ``x-kubernetes-preserve-unknown-fields: true`` (e.g. a ``spec.worker.env``
entry's ``valueFrom``) or ``additionalProperties`` (resource maps), any key is allowed, as the API
server allows it.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CRD_FILE = "heterotrainingjobs.heterotrain.io.yaml"
CRD_PATHS = (
    Path(__file__).resolve().parents[1] / "crd.yaml",  # placed by Dockerfile.operator
    Path(__file__).resolve().parents[3] / "crds" / CRD_FILE,  # a checkout of the repository
)
"""Where the CRD is looked for, first found wins."""


@dataclass(frozen=True, kw_only=True, slots=True)
class UnknownField:
    """A key of the manifest the schema does not define.

    Attributes:
        path: dotted path with list indices, e.g. ``"spec.gpus.minRank"``.
        suggestion: the nearest known sibling name, ``""`` when none is close.
        known: the known sibling names, sorted.
    """

    path: str
    suggestion: str
    known: tuple[str, ...]

    def message(self) -> str:
        """``"unknown field; did you mean minRanks?"`` (or the known names when none is close)."""
        if self.suggestion:
            return f"unknown field; did you mean {self.suggestion}?"
        return f"unknown field; known fields here: {', '.join(self.known)}"


@functools.cache
def crd_schema() -> Mapping[str, Any] | None:
    """The ``openAPIV3Schema`` of the CRD's first version, None when no CRD file is found.

    Raises:
        ValueError: the file exists but holds no ``openAPIV3Schema``.
    """
    import yaml

    path = next((p for p in CRD_PATHS if p.is_file()), None)
    if path is None:
        return None
    # libyaml's loader: the CRD embeds Kubernetes' PodTemplateSpec schema (about 0.5 MB), which
    # the pure-Python loader takes seconds to read
    crd = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    try:
        return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"{path}: no spec.versions[0].schema.openAPIV3Schema") from None


def unknown_fields(body: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> list[UnknownField]:
    """Every key of ``body`` that ``schema`` does not define, in document order.

    Args:
        body: the manifest (``apiVersion``, ``kind``, ``metadata``, ``spec``, maybe ``status``).
        schema: an ``openAPIV3Schema``; defaults to :func:`crd_schema` (no check when None).

    Returns:
        The unknown fields; ``metadata`` (an open ``type: object``) is never checked.
    """
    schema = crd_schema() if schema is None else schema
    if schema is None:
        return []
    return list(_walk(body, schema, ""))


def _walk(value: Any, schema: Mapping[str, Any], path: str) -> Iterator[UnknownField]:
    if isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, Mapping):
            for i, item in enumerate(value):
                yield from _walk(item, items, f"{path}[{i}]")
        return
    if not isinstance(value, Mapping):
        return
    properties = schema.get("properties")
    extra = schema.get("additionalProperties")
    open_object = (schema.get("x-kubernetes-preserve-unknown-fields") is True or extra is True
                   or (properties is None and extra is None))
    for key, child in value.items():
        child_path = f"{path}.{key}" if path else str(key)
        if isinstance(properties, Mapping) and key in properties:
            yield from _walk(child, properties[key], child_path)
        elif isinstance(extra, Mapping):
            yield from _walk(child, extra, child_path)
        elif not open_object:
            known = tuple(sorted(properties or ()))
            yield UnknownField(path=child_path, suggestion=nearest(str(key), known), known=known)


def nearest(name: str, known: tuple[str, ...]) -> str:
    """The known name closest to ``name`` (same letters ignoring case first), ``""`` if none is close.

    Uses :func:`difflib.get_close_matches` with its default cutoff 0.6.
    """
    same_case = [k for k in known if k.lower() == name.lower()]
    if same_case:
        return same_case[0]
    lowered = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1)
    return lowered[close[0]] if close else ""
