"""The pod template's placement terms in the plan (pure): a job whose template narrows the nodes
(``nodeSelector``, required node affinity) is planned only onto nodes those terms allow.

Without this the planner would place a rank on a node the scheduler then refuses (the pod stays
Pending until the pending timeout).  Semantics are the scheduler's: every ``nodeSelector`` label
must match; the required ``nodeSelectorTerms`` are ORed, the expressions of one term ANDed (In,
NotIn, Exists, DoesNotExist, Gt, Lt; ``matchFields`` on ``metadata.name``)
(https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/).

The template's tolerations act earlier, where the nodes are read: the inventory is built with
them (:func:`pod_tolerations`, :func:`hetero_operator.cluster.inventory.build_inventory`), so a
node tainted against the default worker pods is usable when they tolerate its taints (a tainted
GPU pool, spot nodes).  This filter reads only the inventory (its nodes and their labels).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from hetero_operator.api import types as model
from hetero_operator.api.types import ExcludedNode, Inventory

NODE_SELECTOR_MISMATCH = "NodeSelectorMismatch"
"""Exclusion reason: the node does not match the template's nodeSelector or node affinity."""
model.REASON_PHRASES.setdefault(NODE_SELECTOR_MISMATCH, "outside the template's nodeSelector/affinity")


def _expression(expr: Mapping[str, Any], value: str | None) -> bool:
    op, values = expr.get("operator"), [str(v) for v in expr.get("values") or ()]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            a, b = int(value), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def pod_tolerations(template: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    """The tolerations the template gives the job's pods (read the inventory with them)."""
    return tuple((template.get("spec") or {}).get("tolerations") or ())


def node_matches(template: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    """True when node ``name`` with ``labels`` satisfies the template's ``nodeSelector`` and
    required node affinity."""
    spec = template.get("spec") or {}
    if any(labels.get(k) != str(v) for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True
    fields = {"metadata.name": name}
    return any(all(_expression(e, labels.get(e.get("key"))) for e in t.get("matchExpressions") or ())
               and all(_expression(e, fields.get(e.get("key"))) for e in t.get("matchFields") or ())
               for t in terms)


def restrict_to_template(inventory: Inventory, template: Mapping[str, Any]) -> Inventory:
    """The inventory as the template's nodeSelector and required node affinity see it.

    Args:
        inventory: the cluster's inventory, read with the template's tolerations
            (:func:`pod_tolerations`); its labels are matched.
        template: ``spec.worker.template`` (``{}``: the inventory unchanged).

    Returns:
        The usable nodes the terms allow; the others excluded with :data:`NODE_SELECTOR_MISMATCH`.
    """
    spec = template.get("spec") or {}
    if not (spec.get("nodeSelector") or (spec.get("affinity") or {}).get("nodeAffinity")):
        return inventory
    kept, excluded = [], list(inventory.excluded)
    for n in inventory.nodes:
        if node_matches(template, n.name, inventory.labels.get(n.name, {})):
            kept.append(n)
        else:
            excluded.append(ExcludedNode(
                node=n.name, reason=NODE_SELECTOR_MISMATCH, gpu_type=_gpu_type(n),
                message="node does not match spec.worker.template's nodeSelector or required "
                        "node affinity"))
    return replace(inventory, nodes=tuple(kept), excluded=tuple(sorted(excluded, key=lambda e: e.node)))


def _gpu_type(node: Any) -> str:
    devices = getattr(node, "devices", ()) or ()
    return getattr(devices[0], "gpu_type", "") if devices else ""
