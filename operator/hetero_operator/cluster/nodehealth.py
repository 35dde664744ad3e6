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

A mark without a time (a ``Ready`` condition without ``lastTransitionTime``, a taint without
``timeAdded``) dates from the first time the operator saw it (:class:`FirstSeen`, kept by the
reconciler): "now" at every look would restart the grace period for ever, so the node would never
count as lost, and every look would report a new "since".
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


class FirstSeen:
    """When the operator first saw each time-less unhealthy mark of a node, epoch seconds.

    Keyed by (node, mark), e.g. ``("node-t4", "Ready=Unknown")``; a node's entries are dropped
    when it is seen healthy, and :meth:`keep_nodes` drops those of nodes that are gone, so the
    map holds only the currently unhealthy nodes' marks.
    """

    def __init__(self) -> None:
        self._seen: dict[tuple[str, str], float] = {}

    def time(self, node: str, mark: str, now_s: float) -> float:
        """The first time ``mark`` was seen on ``node`` (``now_s`` the first time it is asked)."""
        return self._seen.setdefault((node, mark), now_s)

    def forget(self, node: str, *, keep: frozenset[str] = frozenset()) -> None:
        """Drop ``node``'s marks except ``keep`` (the ones it still carries)."""
        for key in [k for k in self._seen if k[0] == node and k[1] not in keep]:
            del self._seen[key]

    def keep_nodes(self, names: set[str]) -> None:
        """Drop the marks of every node not in ``names`` (deleted Node objects)."""
        for key in [k for k in self._seen if k[0] not in names]:
            del self._seen[key]

    def __len__(self) -> int:
        """Marks remembered."""
        return len(self._seen)


def node_health(node: Mapping[str, Any], now_s: float,
                first_seen: FirstSeen | None = None) -> NodeHealth:
    """Read a ``v1/Node`` dict (or the operator's trimmed copy of one).

    Args:
        node: the Node object.
        now_s: current time, epoch seconds.
        first_seen: where a mark without a time (no ``lastTransitionTime``, no ``timeAdded``)
            is dated from its first sighting; None dates it ``now_s`` (one-off reads only: the
            grace period would restart at every look).

    Returns:
        The :class:`NodeHealth`.
    """
    name = str((node.get("metadata") or {}).get("name") or "")
    since: list[float] = []
    why: list[str] = []
    timeless: set[str] = set()

    def dated(text: Any, mark: str) -> float:
        value = _time(text, now_s)
        if value is not None:
            return value
        timeless.add(mark)
        return now_s if first_seen is None else first_seen.time(name, mark, now_s)

    for cond in (node.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready" and str(cond.get("status")) != "True":
            mark = f"Ready={cond.get('status')}"
            why.append(mark + (f" ({cond['reason']})" if cond.get("reason") else ""))
            since.append(dated(cond.get("lastTransitionTime"), mark))
    out_of_service = False
    for taint in (node.get("spec") or {}).get("taints") or ():
        key = taint.get("key")
        if key in UNHEALTHY_TAINTS:
            if f"taint {key}" not in why:  # NoSchedule and NoExecute come in pairs
                why.append(f"taint {key}")
            since.append(dated(taint.get("timeAdded"), f"taint {key}"))
            out_of_service = out_of_service or key == OUT_OF_SERVICE
    if first_seen is not None:
        first_seen.forget(name, keep=frozenset(timeless))
    if not since:
        return NodeHealth(name=name)
    return NodeHealth(name=name, unhealthy_since_s=min(since), why=", ".join(why),
                      out_of_service=out_of_service)


def _time(text: Any, now_s: float) -> float | None:
    """An ISO time as epoch seconds (never after ``now_s``); None when missing or unreadable."""
    try:
        value = c.parse_iso(str(text)) if text else None
    except ValueError:
        value = None
    return None if value is None else min(value, now_s)
