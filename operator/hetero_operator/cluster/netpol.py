"""Kubernetes NetworkPolicy semantics the operator needs (pure): label selectors, and whether a
namespace's policies isolate a pod's egress.

A pod is isolated for egress when any NetworkPolicy of its namespace selects it and has
``Egress`` in its ``policyTypes`` (written, or implied by egress rules when ``policyTypes`` is
left out); it may then open only connections some such policy's egress rules allow.  Policies add
up: nothing denies what another allows (https://kubernetes.io/docs/concepts/services-networking/network-policies/).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A ``metav1.LabelSelector`` (``matchLabels``, ``matchExpressions`` with In, NotIn, Exists,
    DoesNotExist) against labels; the empty selector matches everything, None nothing."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or ():
        key, op = expr.get("key"), expr.get("operator")
        values = set(expr.get("values") or ())
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False  # an invalid selector selects nothing
    return True


def policy_types(policy: Mapping[str, Any]) -> tuple[str, ...]:
    """``spec.policyTypes``, or the API server's default when it is left out: Ingress, plus
    Egress when the policy has egress rules."""
    spec = policy.get("spec") or {}
    given = spec.get("policyTypes")
    if given:
        return tuple(given)
    return ("Ingress", "Egress") if spec.get("egress") else ("Ingress",)


def egress_isolated(policies: Iterable[Mapping[str, Any]], pod_labels: Mapping[str, str], *,
                    ignore: str = "") -> list[str]:
    """Names of the policies (of the pod's namespace) that isolate the pod for egress.

    Args:
        policies: NetworkPolicy objects of the namespace.
        pod_labels: the pod's labels.
        ignore: a policy name to leave out (the job's own).
    """
    return sorted(p["metadata"]["name"] for p in policies
                  if p["metadata"]["name"] != ignore and "Egress" in policy_types(p)
                  and selector_matches((p.get("spec") or {}).get("podSelector") or {}, pod_labels))
