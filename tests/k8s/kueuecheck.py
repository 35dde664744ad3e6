"""Validate Kueue objects against Kueue's own CRDs (tests/fixtures/kueue/, v0.19.2, v1beta2).

The structural schema is checked with jsonschema (via :mod:`crdcheck`'s conversion, defaults
applied first), and every ``x-kubernetes-validations`` CEL rule on a field the object sets is
evaluated by a Python twin in :data:`CEL_RULES`; a rule without a twin raises ``KeyError`` so a
rule we start to touch cannot go unchecked.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from . import crdcheck

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kueue"
VERSION = "v1beta2"
CEL_RULES: dict[str, Callable[[Any], bool]] = {
    "!has(self.priorityClassRef) || has(self.priority)":
        lambda s: "priorityClassRef" not in s or "priority" in s,
    "has(self.minCount) ? self.minCount <= self.count : true":
        lambda s: "minCount" not in s or s["minCount"] <= s["count"],
    "(self.group == 'scheduling.k8s.io') ? self.kind == 'PriorityClass' : true":
        lambda s: s["group"] != "scheduling.k8s.io" or s["kind"] == "PriorityClass",
    "(self.group == 'kueue.x-k8s.io') ? self.kind == 'WorkloadPriorityClass' : true":
        lambda s: s["group"] != "kueue.x-k8s.io" or s["kind"] == "WorkloadPriorityClass",
    # Workload: an admission with a quota reservation has one assignment per pod set
    ("has(self.status) && has(self.status.conditions) && self.status.conditions.exists(c, c.type == "
     "'QuotaReserved' && c.status == 'True') && has(self.status.admission) ? size(self.spec.podSets) "
     "== size(self.status.admission.podSetAssignments) : true"):
        lambda s: not (any(c["type"] == "QuotaReserved" and c["status"] == "True"
                           for c in (s.get("status") or {}).get("conditions") or ())
                       and (s.get("status") or {}).get("admission"))
        or len(s["spec"]["podSets"]) == len(s["status"]["admission"]["podSetAssignments"]),
    ("!has(self.clusterName) || (!has(self.nominatedClusterNames) || "
     "(has(self.nominatedClusterNames) && size(self.nominatedClusterNames) == 0))"):
        lambda s: "clusterName" not in s or not s.get("nominatedClusterNames"),
    # ResourceFlavor
    "self.all(x, !has(x.key) ? x.operator == 'Exists' : true)":
        lambda s: all("key" in x or x.get("operator") == "Exists" for x in s),
    "self.all(x, has(x.tolerationSeconds) ? x.effect == 'NoExecute' : true)":
        lambda s: all("tolerationSeconds" not in x or x.get("effect") == "NoExecute" for x in s),
    "self.all(x, !has(x.operator) || x.operator in ['Equal', 'Exists'])":
        lambda s: all(x.get("operator", "Equal") in ("Equal", "Exists") for x in s),
    "self.all(x, has(x.operator) && x.operator == 'Exists' ? !has(x.value) : true)":
        lambda s: all(x.get("operator") != "Exists" or "value" not in x for x in s),
    "self.all(x, !has(x.effect) || x.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute'])":
        lambda s: all(x.get("effect", "NoSchedule") in ("NoSchedule", "PreferNoSchedule", "NoExecute")
                      for x in s),
    "!has(self.topologyName) || self.nodeLabels.size() >= 1":
        lambda s: "topologyName" not in s or len(s.get("nodeLabels") or {}) >= 1,
    # ClusterQueue
    ("!has(self.cohortName) && has(self.resourceGroups) ? self.resourceGroups.all(rg, "
     "rg.flavors.all(f, f.resources.all(r, !has(r.borrowingLimit)))) : true"):
        lambda s: "cohortName" in s or "resourceGroups" not in s or all(
            "borrowingLimit" not in r for rg in s["resourceGroups"] for f in rg["flavors"]
            for r in f["resources"]),
    "!has(self.preference) || (self.whenCanBorrow == 'TryNextFlavor' && self.whenCanPreempt == 'TryNextFlavor')":
        lambda s: "preference" not in s or (s.get("whenCanBorrow") == "TryNextFlavor"
                                            and s.get("whenCanPreempt") == "TryNextFlavor"),
    ("!(self.reclaimWithinCohort == 'Never' && has(self.borrowWithinCohort) &&  "
     "self.borrowWithinCohort.policy != 'Never')"):
        lambda s: not (s.get("reclaimWithinCohort") == "Never" and "borrowWithinCohort" in s
                       and s["borrowWithinCohort"].get("policy") != "Never"),
    "self.flavors.all(x, size(x.resources) == size(self.coveredResources))":
        lambda s: all(len(f["resources"]) == len(s["coveredResources"]) for f in s["flavors"]),
}
"""CEL rule text -> Python twin ``(self) -> bool``. Transition rules (they read ``oldSelf``) pass
on create, as in Kubernetes, and are skipped: these tests check objects, not updates."""


def load(plural: str) -> dict[str, Any]:
    """Kueue's CRD of ``plural`` (``workloads``, ``resourceflavors``, ``clusterqueues``, ...)."""
    return copy.deepcopy(_load(plural))


@functools.cache
def _load(plural: str) -> dict[str, Any]:
    return yaml.load((FIXTURES / f"kueue.x-k8s.io_{plural}.yaml").read_text(), Loader=yaml.CSafeLoader)


@functools.cache
def _validator(plural: str) -> jsonschema.Draft7Validator:
    schema = crdcheck.openapi_schema(_load(plural), VERSION)
    return jsonschema.Draft7Validator(crdcheck.to_json_schema(schema))


def validate(obj: Mapping[str, Any], plural: str) -> dict[str, Any]:
    """Default and validate ``obj`` like the API server with Kueue's CRD; returns the defaulted
    object.

    Raises:
        crdcheck.Invalid: a schema or CEL violation (message names the field).
        KeyError: a CEL rule on a set field has no Python twin.
    """
    crd = _load(plural)
    schema = crdcheck.openapi_schema(crd, VERSION)
    assert obj["apiVersion"] == f"kueue.x-k8s.io/{VERSION}", obj["apiVersion"]
    assert obj["kind"] == crd["spec"]["names"]["kind"], obj["kind"]
    defaulted = crdcheck.apply_defaults(schema, obj)
    errors = sorted(_validator(plural).iter_errors(defaulted),
                    key=lambda e: list(e.absolute_path))
    if errors:
        path = ".".join(str(p) for p in errors[0].absolute_path) or "<root>"
        raise crdcheck.Invalid(f"{obj['kind']} {obj['metadata'].get('name')!r} is invalid: "
                               f"{path}: {errors[0].message}")
    for path, rule, value in _cel_sites(schema, defaulted, ""):
        if "oldSelf" in rule:
            continue
        if rule not in CEL_RULES:
            raise KeyError(f"no Python twin for CEL rule {rule!r} at {path}")
        if not CEL_RULES[rule](value):
            raise crdcheck.Invalid(f"{obj['kind']} {obj['metadata'].get('name')!r} is invalid: "
                                   f"{path}: fails {rule}")
    return defaulted


def _cel_sites(schema: Mapping[str, Any], value: Any, path: str):
    for rule in schema.get("x-kubernetes-validations") or ():
        yield path, rule["rule"], value
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                yield from _cel_sites(sub, value[key], f"{path}.{key}" if path else key)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from _cel_sites(schema["items"], item, f"{path}[{i}]")
