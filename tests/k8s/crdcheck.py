"""Validate objects against a CRD's structural schema the way the API server does (offline).

The structural ``openAPIV3Schema`` is turned into JSON Schema (``x-kubernetes-*`` keys dropped,
``int-or-string`` kept as ``anyOf``) and checked with ``jsonschema``; defaults are applied like
the API server's defaulting; the ``x-kubernetes-validations`` CEL rules we ship are evaluated by
Python twins in :data:`CEL_RULES` (a rule without a twin is an error, so a new rule cannot be
shipped untested).
"""

from __future__ import annotations

import copy
import functools
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "heterotrainingjobs.heterotrain.io.yaml"
sys.path.insert(0, str(CRD_PATH.parents[1] / "operator"))
from hetero_operator.api import podtemplate  # noqa: E402

CEL_RULES: dict[str, Callable[[Any, Any], bool]] = {
    "size(self.metadata.name) <= 50": lambda s, old: len(s["metadata"]["name"]) <= 50,
    "!has(self.minRanks) || self.minRanks <= self.ranks":
        lambda s, old: "minRanks" not in s or s["minRanks"] <= s["ranks"],
    "!has(self.minRanks) || !has(self.maxRanks) || self.minRanks <= self.maxRanks":
        lambda s, old: "minRanks" not in s or "maxRanks" not in s or s["minRanks"] <= s["maxRanks"],
    "self == oldSelf": lambda s, old: old is None or s == old,
    "!has(self.persistentVolumeClaim) || self.persistentVolumeClaim == '' || (has(self.path) && self.path != '')":
        lambda s, old: not s.get("persistentVolumeClaim") or bool(s.get("path")),
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')":
        lambda s, old: re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", s["metadata"]["name"]) is not None,
    **{podtemplate.cel_text(r): (lambda rule: lambda s, old: rule.check(s) is None)(r)
       for r in podtemplate.RULES},
    ("self.all(p, p.matches('^(linux|windows)/(386|amd64|arm|arm64|loong64|mips64le|ppc64le|riscv64|"
     "s390x)(/[a-z0-9]{1,8})?$'))"):  # spec.images[].platforms (the parser's twin: test_case53)
        lambda s, old: all(re.search(r"^(linux|windows)/(386|amd64|arm|arm64|loong64|mips64le|ppc64le|"
                                     r"riscv64|s390x)(/[a-z0-9]{1,8})?$", p) for p in s),
}
"""CEL rule text -> Python twin ``(self, oldSelf_or_None) -> bool``.  Transition rules
(``oldSelf``) pass on create, as in Kubernetes."""


class Invalid(ValueError):
    """The object violates the schema; ``str()`` is a kubectl-style message naming the field."""


def load_crd(path: Path = CRD_PATH) -> dict[str, Any]:
    """The CRD manifest (a copy: callers may change it)."""
    return copy.deepcopy(_load(path))


@functools.cache
def _load(path: Path) -> dict[str, Any]:
    # libyaml: the pure-Python loader takes seconds for the embedded PodTemplateSpec schema
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def openapi_schema(crd: Mapping[str, Any], version: str = "v1alpha1") -> dict[str, Any]:
    """The ``openAPIV3Schema`` of ``version``."""
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(version)


def to_json_schema(node: Any) -> Any:
    """Structural schema -> JSON Schema (drops ``x-kubernetes-*``, ``nullable`` and ``format``)."""
    if isinstance(node, list):
        return [to_json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "format", "default"):
            continue
        if key in ("properties",):
            out[key] = {k: to_json_schema(v) for k, v in value.items()}
        else:
            out[key] = to_json_schema(value)
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
    return out


def apply_defaults(schema: Mapping[str, Any], obj: Any) -> Any:
    """A copy of ``obj`` with schema defaults filled in (objects that exist only)."""
    obj = copy.deepcopy(obj)
    _defaults(schema, obj)
    return obj


def _defaults(schema: Mapping[str, Any], obj: Any) -> None:
    if isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in obj and "default" in sub:
                obj[key] = copy.deepcopy(sub["default"])
            if key in obj:
                _defaults(sub, obj[key])
    elif isinstance(obj, list) and "items" in schema:
        for item in obj:
            _defaults(schema["items"], item)


def prune(schema: Mapping[str, Any], obj: Any) -> Any:
    """Drop fields the structural schema does not declare (the API server's pruning)."""
    if isinstance(obj, dict) and "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        return {k: prune(schema["properties"][k], v) for k, v in obj.items() if k in schema["properties"]}
    if isinstance(obj, list) and "items" in schema:
        return [prune(schema["items"], v) for v in obj]
    return obj


_VALIDATORS: dict[int, tuple[Mapping[str, Any], Any]] = {}


def _validator(schema: Mapping[str, Any]) -> Any:
    """The JSON Schema validator of ``schema``, built once (the embedded PodTemplateSpec schema
    takes a while to convert); the schema is kept so its ``id`` is never reused."""
    found = _VALIDATORS.get(id(schema))
    if found is None or found[0] is not schema:
        found = _VALIDATORS[id(schema)] = (schema, jsonschema.Draft7Validator(to_json_schema(schema)))
    return found[1]


def validate(obj: Mapping[str, Any], old: Mapping[str, Any] | None = None,
             crd: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Default, then validate like the API server; returns the defaulted object.

    Raises:
        Invalid: schema or CEL violation, message ``HeteroTrainingJob.heterotrain.io "x" is
            invalid: spec.gpus.ranks: ...``.
    """
    schema = openapi_schema(crd or _load(CRD_PATH))  # read only: the cached one
    defaulted = apply_defaults(schema, obj)
    name = (obj.get("metadata") or {}).get("name", "")
    errors = sorted(_validator(schema).iter_errors(defaulted), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        path = ".".join(str(p) for p in e.absolute_path) or "<root>"
        raise Invalid(f'HeteroTrainingJob.heterotrain.io "{name}" is invalid: {path}: {e.message}')
    old_defaulted = apply_defaults(schema, old) if old is not None else None
    for path, rule, message, value, old_value in _cel_sites(schema, defaulted, old_defaulted, ""):
        check = CEL_RULES.get(rule)
        if check is None:
            raise KeyError(f"no Python twin for CEL rule {rule!r} at {path}")
        if not check(value, old_value):
            raise Invalid(f'HeteroTrainingJob.heterotrain.io "{name}" is invalid: {path or "<root>"}: '
                          f"Invalid value: {message}")
    return defaulted


def _cel_sites(schema: Mapping[str, Any], value: Any, old: Any, path: str):
    for rule in schema.get("x-kubernetes-validations") or ():
        yield path, rule["rule"], rule.get("message", rule["rule"]), value, old
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                sub_old = old.get(key) if isinstance(old, dict) else None
                yield from _cel_sites(sub, value[key], sub_old, f"{path}.{key}" if path else key)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):  # list items: no transition rules (oldSelf) there
            yield from _cel_sites(schema["items"], item, None, f"{path}[{i}]")


def cel_rules(schema: Mapping[str, Any]) -> list[str]:
    """Every CEL rule text in the schema."""
    found = [r["rule"] for r in schema.get("x-kubernetes-validations") or ()]
    for sub in (schema.get("properties") or {}).values():
        found += cel_rules(sub)
    if "items" in schema:
        found += cel_rules(schema["items"])
    return found
