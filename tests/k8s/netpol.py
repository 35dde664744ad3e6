"""A NetworkPolicy evaluator with Kubernetes' semantics, for tests (shared/cases/46).

A connection from pod A to pod B on (port, protocol) is allowed when

* A's egress allows it: A is selected by no policy of its namespace with ``Egress`` in
  ``policyTypes``, or some such policy has an egress rule whose ``to`` peers match B and whose
  ``ports`` match (no ``ports``: every port; no ``to``: every peer); and
* B's ingress allows it: the same with ``Ingress``, ``from`` peers matching A.

A peer is ``podSelector`` (pods of the policy's namespace), ``namespaceSelector`` (every pod of
the matching namespaces), both (matching pods of matching namespaces), or ``ipBlock`` (external
addresses: never a pod here).  Ports: a number with optional ``endPort`` (inclusive) or a named
container port, protocol TCP by default.  ``policyTypes`` left out means Ingress, plus Egress when
the policy has egress rules (the API server's default).
https://kubernetes.io/docs/concepts/services-networking/network-policies/
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetero_operator.cluster.netpol import policy_types, selector_matches


@dataclass(frozen=True)
class Pod:
    """A pod: namespace, labels, its named container ports."""

    namespace: str
    labels: Mapping[str, str]
    name: str = ""
    ports: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Flow:
    src: Pod
    dst: Pod
    port: int
    protocol: str = "TCP"


class Cluster:
    """Namespaces (name -> labels) and NetworkPolicy objects."""

    def __init__(self, namespaces: Mapping[str, Mapping[str, str]],
                 policies: Sequence[Mapping[str, Any]] = ()) -> None:
        self.namespaces = {n: {"kubernetes.io/metadata.name": n, **dict(labels)}
                           for n, labels in namespaces.items()}
        self.policies = list(policies)

    def _selecting(self, pod: Pod, kind: str) -> list[Mapping[str, Any]]:
        return [p for p in self.policies
                if p["metadata"].get("namespace") == pod.namespace and kind in policy_types(p)
                and selector_matches((p.get("spec") or {}).get("podSelector") or {}, pod.labels)]

    def _peer(self, peer: Mapping[str, Any], policy_ns: str, pod: Pod) -> bool:
        if "ipBlock" in peer:
            return False
        ns_sel, pod_sel = peer.get("namespaceSelector"), peer.get("podSelector")
        if ns_sel is not None:
            if not selector_matches(ns_sel, self.namespaces.get(pod.namespace, {})):
                return False
        elif pod.namespace != policy_ns:
            return False
        return pod_sel is None or selector_matches(pod_sel, pod.labels)

    @staticmethod
    def _port(ports: Sequence[Mapping[str, Any]] | None, flow: Flow) -> bool:
        if not ports:
            return True
        for p in ports:
            if p.get("protocol", "TCP") != flow.protocol:
                continue
            number = p.get("port")
            if number is None:
                return True
            if isinstance(number, str):
                number = flow.dst.ports.get(number)
                if number is None:
                    continue
            if number <= flow.port <= int(p.get("endPort", number)):
                return True
        return False

    def _side(self, flow: Flow, kind: str) -> bool:
        pod, other = (flow.src, flow.dst) if kind == "Egress" else (flow.dst, flow.src)
        selecting = self._selecting(pod, kind)
        if not selecting:
            return True  # not isolated in this direction
        rules_key, peers_key = ("egress", "to") if kind == "Egress" else ("ingress", "from")
        for policy in selecting:
            ns = policy["metadata"]["namespace"]
            for rule in (policy.get("spec") or {}).get(rules_key) or ():
                peers = rule.get(peers_key)
                if (not peers or any(self._peer(p, ns, other) for p in peers)) and self._port(
                        rule.get("ports"), flow):
                    return True
        return False

    def allowed(self, flow: Flow) -> bool:
        """Both the source's egress and the destination's ingress allow the flow."""
        return self._side(flow, "Egress") and self._side(flow, "Ingress")

    def blocked(self, flows: Sequence[Flow]) -> list[Flow]:
        return [f for f in flows if not self.allowed(f)]
