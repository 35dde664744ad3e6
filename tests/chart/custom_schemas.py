"""Minimal JSON schemas for the rendered custom resources that kubernetes-validate cannot check.

kubernetes-validate ships schemas of the built-in Kubernetes kinds only. The chart also renders
Prometheus Operator objects (ServiceMonitor, PodMonitor, PrometheusRule; field names from
monitoring.coreos.com/v1 as documented at https://prometheus-operator.dev/docs/api-reference/api/)
and kopf's peering objects (kopf.dev/v1, https://kopf.readthedocs.io/en/stable/peering/). These
schemas cover the fields the chart uses, reject unknown fields where the real CRD does
(``additionalProperties: False``), and check value shapes (durations, label names, actions).
"""

from __future__ import annotations

from typing import Any

import jsonschema

DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
LABEL_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
METADATA = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", "maxLength": 253},
    "namespace": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
    "labels": LABEL_MAP, "annotations": LABEL_MAP}}
LABEL_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": LABEL_MAP,
    "matchExpressions": {"type": "array", "items": {
        "type": "object", "required": ["key", "operator"], "additionalProperties": False,
        "properties": {"key": {"type": "string"},
                       "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                       "values": {"type": "array", "items": {"type": "string"}}}}}}}
NAMESPACE_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}}
PROM_LABEL_NAME = {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}
RELABEL = {"type": "object", "additionalProperties": False, "properties": {
    "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod",
                        "labelmap", "LabelMap", "labeldrop", "LabelDrop", "labelkeep",
                        "LabelKeep", "lowercase", "Lowercase", "uppercase", "Uppercase",
                        "keepequal", "KeepEqual", "dropequal", "DropEqual"]},
    "sourceLabels": {"type": "array", "items": PROM_LABEL_NAME},
    "separator": {"type": "string"}, "targetLabel": PROM_LABEL_NAME,
    "regex": {"type": "string"}, "modulus": {"type": "integer"},
    "replacement": {"type": "string"}}}
ENDPOINT_COMMON = {
    "path": {"type": "string", "pattern": "^/"}, "scheme": {"enum": ["http", "https"]},
    "interval": DURATION, "scrapeTimeout": DURATION, "honorLabels": {"type": "boolean"},
    "honorTimestamps": {"type": "boolean"},
    "relabelings": {"type": "array", "items": RELABEL},
    "metricRelabelings": {"type": "array", "items": RELABEL}}


def _kind(api_version: str, kind: str, spec: dict[str, Any] | None) -> dict[str, Any]:
    props: dict[str, Any] = {"apiVersion": {"const": api_version}, "kind": {"const": kind},
                             "metadata": METADATA}
    required = ["apiVersion", "kind", "metadata"]
    if spec is not None:
        props["spec"] = spec
        required.append("spec")
    return {"type": "object", "required": required, "properties": props,
            "additionalProperties": spec is None}


SERVICE_MONITOR = _kind("monitoring.coreos.com/v1", "ServiceMonitor", {
    "type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
    "properties": {
        "jobLabel": {"type": "string"}, "selector": LABEL_SELECTOR,
        "namespaceSelector": NAMESPACE_SELECTOR,
        "endpoints": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False,
            "properties": {"port": {"type": "string"}, **ENDPOINT_COMMON}}}}})

POD_MONITOR = _kind("monitoring.coreos.com/v1", "PodMonitor", {
    "type": "object", "required": ["selector", "podMetricsEndpoints"], "additionalProperties": False,
    "properties": {
        "jobLabel": {"type": "string"},
        "podTargetLabels": {"type": "array", "items": {"type": "string"}},
        "selector": LABEL_SELECTOR, "namespaceSelector": NAMESPACE_SELECTOR,
        "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False,
            "properties": {"port": {"type": "string"}, "portNumber": {"type": "integer"},
                           **ENDPOINT_COMMON}}}}})

RULE = {"type": "object", "required": ["expr"], "additionalProperties": False,
        "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
        "properties": {
            "alert": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*$"},
            "record": {"type": "string", "pattern": r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"},
            "expr": {"type": "string", "minLength": 1}, "for": DURATION,
            "keep_firing_for": DURATION, "labels": LABEL_MAP, "annotations": LABEL_MAP}}
PROMETHEUS_RULE = _kind("monitoring.coreos.com/v1", "PrometheusRule", {
    "type": "object", "required": ["groups"], "additionalProperties": False,
    "properties": {"groups": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["name", "rules"], "additionalProperties": False,
        "properties": {"name": {"type": "string", "minLength": 1}, "interval": DURATION,
                       "rules": {"type": "array", "minItems": 1, "items": RULE}}}}}})

CLUSTER_KOPF_PEERING = _kind("kopf.dev/v1", "ClusterKopfPeering", None)
KOPF_PEERING = _kind("kopf.dev/v1", "KopfPeering", None)

SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PodMonitor"): POD_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
    ("kopf.dev/v1", "ClusterKopfPeering"): CLUSTER_KOPF_PEERING,
    ("kopf.dev/v1", "KopfPeering"): KOPF_PEERING,
}


def custom_schema(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The schema for ``doc``'s apiVersion/kind, None for a built-in kind."""
    return SCHEMAS.get((doc.get("apiVersion", ""), doc.get("kind", "")))


def validate_custom(doc: dict[str, Any]) -> None:
    """Validate a custom resource against its minimal schema.

    Raises:
        KeyError: no schema is known for its apiVersion/kind.
        jsonschema.ValidationError: the object does not match.
    """
    schema = SCHEMAS[(doc["apiVersion"], doc["kind"])]
    jsonschema.validate(doc, schema, cls=jsonschema.Draft7Validator)
    if doc.get("metadata", {}).get("namespace") is None and doc["kind"] in (
            "ServiceMonitor", "PodMonitor", "PrometheusRule", "KopfPeering"):
        raise jsonschema.ValidationError(f"{doc['kind']} {doc['metadata']['name']} is namespaced "
                                         "but has no metadata.namespace")
