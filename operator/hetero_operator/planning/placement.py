"""The pod template's placement terms in the plan (pure): a job whose template narrows the nodes
(``nodeSelector``, required node affinity) is planned only onto nodes those terms allow, and a node
tainted against the default worker pods is usable when the template's tolerations tolerate its
taints (a tainted GPU pool, spot nodes).

Without these the planner would place a rank on a node the scheduler then refuses (the pod stays
Pending until the pending timeout) or leave out a node the job may use.  Semantics are the
scheduler's: every ``nodeSelector`` label must match; the required ``nodeSelectorTerms`` are ORed,
the expressions of one term ANDed (In, NotIn, Exists, DoesNotExist, Gt, Lt; ``matchFields`` on
``metadata.name``); a toleration with operator Exists and no key tolerates every taint, an empty
effect every effect (https://kubernetes.io/docs/concepts/scheduling-eviction/).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from hetero_operator.api import types as model
from hetero_operator.api.types import ExcludedNode, Inventory
from hetero_operator.cluster.inventory import DEFAULT_TOLERATED_TAINT_KEYS, read_node

NODE_SELECTOR_MISMATCH = "NodeSelectorMismatch"
"""Exclusion reason: the node does not match the template's nodeSelector or node affinity."""
model.REASON_PHRASES.setdefault(NODE_SELECTOR_MISMATCH, "outside the template's nodeSelector/affinity")
_BLOCKING = ("NoSchedule", "NoExecute")


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


def node_matches(template: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """True when ``node`` satisfies the template's ``nodeSelector`` and required node affinity."""
    spec = template.get("spec") or {}
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    if any(labels.get(k) != str(v) for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True
    fields = {"metadata.name": meta.get("name")}
    return any(all(_expression(e, labels.get(e.get("key"))) for e in t.get("matchExpressions") or ())
               and all(_expression(e, fields.get(e.get("key"))) for e in t.get("matchFields") or ())
               for t in terms)


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' rule: one toleration matches the taint's key, value (Equal) and effect."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if op == "Exists" or str(t.get("value") or "") == str(taint.get("value") or ""):
            return True
    return False


def restrict_to_template(inventory: Inventory, nodes: Iterable[Mapping[str, Any]],
                         template: Mapping[str, Any],
                         used: Mapping[str, Mapping[str, int]] | None = None) -> Inventory:
    """The inventory as the template's placement terms see it.

    Args:
        inventory: the cluster's inventory (default tolerations).
        nodes: the Node objects it was built from.
        template: ``spec.worker.template`` (``{}``: the inventory unchanged).
        used: devices other pods use per node (re-reading a node the template's tolerations
            admit); None for none.

    Returns:
        Usable nodes that the template's nodeSelector/affinity allow, plus nodes excluded only
        for taints the template tolerates; the others excluded with
        :data:`NODE_SELECTOR_MISMATCH`.
    """
    spec = template.get("spec") or {}
    tolerations = list(spec.get("tolerations") or ())
    narrows = bool(spec.get("nodeSelector") or (spec.get("affinity") or {}).get("nodeAffinity"))
    if not narrows and not tolerations:
        return inventory
    by_name = {(n.get("metadata") or {}).get("name"): n for n in nodes}
    usable = list(inventory.nodes)
    excluded: list[ExcludedNode] = []
    for ex in inventory.excluded:
        node = by_name.get(ex.node)
        if ex.reason == model.TAINTED and node is not None and tolerations:
            taints = [t for t in (node.get("spec") or {}).get("taints") or ()
                      if t.get("effect") in _BLOCKING and t.get("key") not in DEFAULT_TOLERATED_TAINT_KEYS]
            if all(tolerates(tolerations, t) for t in taints):
                keys = tuple(sorted({*DEFAULT_TOLERATED_TAINT_KEYS, *(t.get("key") for t in taints)}))
                result = read_node(node, (used or {}).get(ex.node, {}), tolerated_taint_keys=keys)
                if not isinstance(result, ExcludedNode):
                    usable.append(result[0])
                    continue
                ex = result
        excluded.append(ex)
    kept = []
    for n in usable:
        node = by_name.get(n.name)
        if node is not None and not node_matches(template, node):
            excluded.append(ExcludedNode(
                node=n.name, reason=NODE_SELECTOR_MISMATCH, gpu_type=_gpu_type(n),
                message="node does not match spec.worker.template's nodeSelector or required "
                        "node affinity"))
        else:
            kept.append(n)
    return replace(inventory, nodes=tuple(sorted(kept, key=lambda n: n.name)),
                   excluded=tuple(sorted(excluded, key=lambda e: e.node)))


def _gpu_type(node: Any) -> str:
    devices = getattr(node, "devices", ()) or ()
    return getattr(devices[0], "gpu_type", "") if devices else ""
