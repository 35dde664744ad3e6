"""Is a node still there for the job's pods? Read from the Node object (pure).

A node whose kubelet stops answering keeps its pods' last status (``Running``) for ever, and a
pod deleted there stays ``Terminating`` for ever (no kubelet confirms).  Kubernetes' node
lifecycle controller marks such a node: ``Ready`` turns ``Unknown`` (kubelet silent) or ``False``
(kubelet reports a problem), and it adds the ``node.kubernetes.io/unreachable`` or
``node.kubernetes.io/not-ready`` taints with ``timeAdded``.  The pods on it are evicted after
their ``tolerationSeconds`` (300 s by default, ``DefaultTolerationSeconds`` admission plugin).
Sources: https://kubernetes.io/docs/concepts/architecture/nodes/#condition,
https://kubernetes.io/docs/reference/labels-annotations-taints/ (unreachable, not-ready,
out-of-service), https://kubernetes.io/docs/concepts/cluster-administration/node-shutdown/.

:func:`node_health` turns a Node dict into :class:`NodeHealth`; the lifecycle treats a node as
lost ``nodeLossGraceSeconds`` after it stopped being healthy, or at once when the Node object is
gone or an administrator put the ``node.kubernetes.io/out-of-service`` taint on it (the
non-graceful node shutdown contract: the node is known to be down).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hetero_operator.api import conditions as c

UNREACHABLE = "node.kubernetes.io/unreachable"
NOT_READY = "node.kubernetes.io/not-ready"
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
CLOUD_SHUTDOWN = "node.cloudprovider.kubernetes.io/shutdown"
UNHEALTHY_TAINTS = (UNREACHABLE, NOT_READY, CLOUD_SHUTDOWN, OUT_OF_SERVICE)
"""Taint keys that mark a node whose pods cannot run (any effect)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeHealth:
    """Health of one node as the job sees it.

    Attributes:
        name: node name.
        unhealthy_since_s: when it stopped being healthy, epoch seconds (the earliest of the
            ``Ready`` condition's ``lastTransitionTime`` and the unhealthy taints' ``timeAdded``);
            ``None`` while healthy.
        why: what is wrong, e.g. ``"Ready=Unknown (NodeStatusUnknown)"`` or
            ``"taint node.kubernetes.io/unreachable"``; ``""`` while healthy.
        out_of_service: the ``node.kubernetes.io/out-of-service`` taint is set (an
            administrator declared the node down: lost without waiting).
    """

    name: str
    unhealthy_since_s: float | None = None
    why: str = ""
    out_of_service: bool = False

    @property
    def healthy(self) -> bool:
        """True when nothing marks the node unhealthy."""
        return self.unhealthy_since_s is None

    def lost_at_s(self, grace_s: float) -> float | None:
        """When the node counts as lost (epoch seconds), ``None`` while healthy.

        Args:
            grace_s: ``spec.runPolicy.nodeLossGraceSeconds``.
        """
        if self.unhealthy_since_s is None:
            return None
        return self.unhealthy_since_s + (0.0 if self.out_of_service else grace_s)


def node_health(node: Mapping[str, Any], now_s: float) -> NodeHealth:
    """Read a ``v1/Node`` dict (or the operator's trimmed copy of one).

    Args:
        node: the Node object.
        now_s: current time, epoch seconds; used as the start of the unhealthy period when the
            object carries no time for it (a real API server always sets
            ``lastTransitionTime``; ``timeAdded`` is set on NoExecute taints).

    Returns:
        The :class:`NodeHealth`.
    """
    name = str((node.get("metadata") or {}).get("name") or "")
    since: list[float] = []
    why: list[str] = []
    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready" and str(cond.get("status")) != "True":
            why.append(f"Ready={cond.get('status')}" + (f" ({cond['reason']})" if cond.get("reason") else ""))
            since.append(_time(cond.get("lastTransitionTime"), now_s))
    out_of_service = False
    for taint in (node.get("spec") or {}).get("taints") or ():
        key = taint.get("key")
        if key in UNHEALTHY_TAINTS:
            if f"taint {key}" not in why:  # NoSchedule and NoExecute come in pairs
                why.append(f"taint {key}")
            since.append(_time(taint.get("timeAdded"), now_s))
            out_of_service = out_of_service or key == OUT_OF_SERVICE
    if not since:
        return NodeHealth(name=name)
    return NodeHealth(name=name, unhealthy_since_s=min(since), why=", ".join(why),
                      out_of_service=out_of_service)


def _time(text: Any, now_s: float) -> float:
    try:
        value = c.parse_iso(str(text)) if text else None
    except ValueError:
        value = None
    return now_s if value is None else min(value, now_s)
