"""Nodes as the operator's node index holds them, each remembering its own parse.

The operator keeps every Node in its Node informer (``hetero_operator.controller.informer``; the
value is :func:`hetero_operator.cluster.nodeindex.trim_node`'s :class:`IndexedNode`).  The informer
replaces a value only when the node's trimmed content changes, so a parse stored *on the value* is valid for exactly
as long as the value lives: a start re-reads only the nodes that changed since the last start (and
the nodes whose GPU pods changed), instead of all of them; GPU pods in the pod index likewise
remember their device requests (:class:`IndexedPod`).  At 10,000 nodes that turns about
270 ms of label parsing per start into a few milliseconds of look-ups (``bench/bench_plan.py``).

Pure: no kopf, no kubernetes (tests/operator/test_layering.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hetero_operator.api.labels import LABEL_MANAGED_BY, MANAGED_BY
from hetero_operator.api.types import ExcludedNode, Inventory, InventoryWarning, NodeInventory
from hetero_operator.cluster.inventory import (DEFAULT_TOLERATED_TAINT_KEYS, node_labels, read_node,
                                               tolerates, used_resources)

_Parsed = ExcludedNode | tuple[NodeInventory, list[InventoryWarning]]


class IndexedNode(dict):  # type: ignore[type-arg]
    """A trimmed Node (a plain dict to every reader) plus the memo of its last parse.

    The memo is keyed by what the parse depends on besides the node itself: the GPU devices used
    on it by other pods, the tolerated taint keys, and which of its taints the job's tolerations
    tolerate (none for an untainted node, so jobs with different tolerations share its parse).
    Equality is the dict's, so the informer keeps an unchanged node's value (and its memo) when
    the node is re-listed or only its heartbeat changed.
    """

    __slots__ = ("_memo", "name", "labels")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._memo: tuple[tuple[Any, ...], _Parsed] | None = None
        self.name: str = _name(self)
        self.labels: Mapping[str, str] = node_labels(self)
        """The node's labels as strings (read once, when the value is made)."""

    def parsed(self, used: Mapping[str, int], tolerated_taint_keys: tuple[str, ...],
               tolerations: Sequence[Mapping[str, Any]] = ()) -> _Parsed:
        """:func:`hetero_operator.cluster.inventory.read_node` of this node, memoised.

        Args:
            used: ``{resource: devices}`` requested on this node by pods other than the job's.
            tolerated_taint_keys: taint keys that do not exclude the node.
            tolerations: the job's pod tolerations.

        Returns:
            The node's inventory and warnings, or why it is excluded (shared, do not mutate).
        """
        taints = (self.get("spec") or {}).get("taints") or ()
        waived = tuple(i for i, t in enumerate(taints) if tolerates(tolerations, t)) if tolerations else ()
        key = (tuple(sorted(used.items())) if used else (), tolerated_taint_keys, waived)
        memo = self._memo
        if memo is None or memo[0] != key:
            memo = self._memo = (key, read_node(self, used, tolerated_taint_keys=tolerated_taint_keys,
                                                tolerations=tolerations))
        return memo[1]


class IndexedPod(dict):  # type: ignore[type-arg]
    """A trimmed GPU pod (a plain dict to every reader) plus the memo of its device requests."""

    __slots__ = ("_used",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._used: dict[str, dict[str, int]] | None = None

    def used(self) -> dict[str, dict[str, int]]:
        """``used_resources([self])``: ``{node: {resource: devices}}``, memoised (do not mutate)."""
        if self._used is None:
            self._used = used_resources([self])
        return self._used


def indexed_used_resources(pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """:func:`hetero_operator.cluster.inventory.used_resources`, reusing each :class:`IndexedPod`'s memo."""
    out: dict[str, dict[str, int]] = {}
    plain = []
    for pod in pods:
        if not isinstance(pod, IndexedPod):
            plain.append(pod)
            continue
        for node, requests in pod.used().items():
            mine = out.get(node)
            if mine is None:
                out[node] = dict(requests)
            else:
                for resource, n in requests.items():
                    mine[resource] = mine.get(resource, 0) + n
    for node, requests in used_resources(plain).items():
        mine = out.setdefault(node, {})
        for resource, n in requests.items():
            mine[resource] = mine.get(resource, 0) + n
    return out


def build_indexed_inventory(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]] = (), *,
                            tolerated_taint_keys: tuple[str, ...] = DEFAULT_TOLERATED_TAINT_KEYS,
                            tolerations: Sequence[Mapping[str, Any]] = ()) -> Inventory:
    """:func:`hetero_operator.cluster.inventory.build_inventory`, reusing the index values' memos.

    :class:`IndexedNode` and :class:`IndexedPod` values reuse their parses; any other mapping is
    parsed as usual.  When every value is the very one of the last call (nothing changed in the
    index since the last start), the last inventory is returned as it is; when only some node
    values were replaced or the GPU pods changed, only the replaced nodes and the nodes whose
    used devices changed are looked at again (in the operator every start leaves out its own
    pods and adds other starts' held ones, so the pods differ from start to start).  The result
    is equal to ``build_inventory(nodes, pods, ...)``.

    Args:
        nodes: Node objects (the index's :class:`IndexedNode` values, or plain dicts).
        pods: bound pods whose ``nvidia.com/*`` requests count as used (not the job's own).
        tolerated_taint_keys: taint keys that do not exclude a node.
        tolerations: the job's pod tolerations (a taint they tolerate does not exclude a node).
    """
    nodes, pods = list(nodes), list(pods)
    last = _last[0]
    used: dict[str, dict[str, int]] | None = None
    tolerated = (tolerated_taint_keys, _toleration_key(tolerations))
    if last is not None and last.tolerated == tolerated:
        if _same(last.pods, pods):
            if _same(last.nodes, nodes):
                return last.inventory  # the very same index values as the last start
            incremental = _update(last, nodes, pods, tolerations, last.used)
            if incremental is not None:
                return incremental
        elif all(isinstance(p, IndexedPod) for p in pods):
            used = indexed_used_resources(pods)
            incremental = _update(last, nodes, pods, tolerations, used)
            if incremental is not None:
                return incremental
    used = indexed_used_resources(pods) if used is None else used
    none: dict[str, int] = {}
    results: list[_Parsed] = []
    for node in nodes:
        node_used = used.get(_name(node), none)
        if isinstance(node, IndexedNode):
            results.append(node.parsed(node_used, tolerated_taint_keys, tolerations))
        else:
            results.append(read_node(node, node_used, tolerated_taint_keys=tolerated_taint_keys,
                                     tolerations=tolerations))
    order = sorted(range(len(nodes)), key=lambda i: _name(nodes[i]))
    inventory = _assemble(nodes, results, order)
    if all(isinstance(n, IndexedNode) for n in nodes) and all(isinstance(p, IndexedPod) for p in pods):
        position = {_name(n): i for i, n in enumerate(nodes)}
        _last[0] = _Last(nodes, pods, tolerated, used, results, order, inventory, position)
    return inventory


def _toleration_key(tolerations: Sequence[Mapping[str, Any]]) -> tuple[tuple[tuple[str, str], ...], ...]:
    """A hashable form of pod tolerations (what the last inventory was read with)."""
    return tuple(tuple(sorted((str(k), str(v)) for k, v in t.items())) for t in tolerations)


class _Last:
    """The last inventory built from index values only, with what it was built from.  Index values
    are never changed in place (the informer stores a new value for a changed object), so a value that is
    the same object as last time has the same parse; holding the values also keeps their ids from
    being reused.  About 0.4 KiB per node is kept."""

    __slots__ = ("nodes", "pods", "tolerated", "used", "results", "order", "inventory", "position")

    def __init__(self, nodes: list[Any], pods: list[Any], tolerated: tuple[Any, ...],
                 used: dict[str, dict[str, int]], results: list[_Parsed], order: list[int],
                 inventory: Inventory, position: dict[str, int]) -> None:
        self.nodes, self.pods, self.tolerated, self.used = nodes, pods, tolerated, used
        self.results, self.order, self.inventory = results, order, inventory
        self.position = position  # node name -> its position in ``nodes``


_last: list[_Last | None] = [None]


def _update(last: _Last, nodes: list[Any], pods: list[Any], tolerations: Sequence[Mapping[str, Any]],
            used: dict[str, dict[str, int]]) -> Inventory | None:
    """The inventory when only some node values were replaced in place (same names in the same
    positions) and/or the pods' ``used`` devices changed on some nodes: re-read those nodes,
    keep the rest and the sort order; None otherwise."""
    if len(nodes) != len(last.nodes):
        return None
    changed = {i for i, (old, new) in enumerate(zip(last.nodes, nodes)) if old is not new}
    if not all(isinstance(nodes[i], IndexedNode) and _name(nodes[i]) == _name(last.nodes[i])
               for i in changed):
        return None
    none: dict[str, int] = {}
    if used is not last.used:  # only nodes with GPU pods now or last time can differ
        for name in used.keys() | last.used.keys():
            if (used.get(name) or none) != (last.used.get(name) or none):
                i = last.position.get(name)
                if i is not None:  # a pod on a node the index does not hold counts nowhere
                    changed.add(i)
    results = list(last.results)
    for i in changed:
        results[i] = nodes[i].parsed(used.get(_name(nodes[i]), none), last.tolerated[0], tolerations)
    inventory = _assemble(nodes, results, last.order)
    _last[0] = _Last(nodes, pods, last.tolerated, used, results, last.order, inventory, last.position)
    return inventory


def _assemble(nodes: list[Any], results: list[_Parsed], order: list[int]) -> Inventory:
    """The :class:`Inventory` of per-node results, in ``order`` (positions sorted by node name)."""
    usable: list[NodeInventory] = []
    excluded: list[ExcludedNode] = []
    warnings: list[InventoryWarning] = []
    labels: dict[str, Mapping[str, str]] = {}
    for i in order:
        node = nodes[i]
        labels[_name(node)] = node.labels if isinstance(node, IndexedNode) else node_labels(node)
        result = results[i]
        if isinstance(result, ExcludedNode):
            excluded.append(result)
        else:
            usable.append(result[0])
            if result[1]:
                warnings.extend(result[1])
    return Inventory(nodes=tuple(usable), excluded=tuple(excluded), warnings=tuple(warnings),
                     labels=labels)


def _same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


def _name(node: Mapping[str, Any]) -> str:
    """The node's name, as :func:`hetero_operator.cluster.inventory.build_inventory` sorts by it."""
    if isinstance(node, IndexedNode):
        try:
            return node.name
        except AttributeError:  # while IndexedNode.__init__ runs
            pass
    return str((node.get("metadata") or {}).get("name") or "<unnamed>")


GPU_RESOURCE_PREFIX = "nvidia.com/"


def trim_node(body: Mapping[str, Any]) -> IndexedNode:
    """What the planner reads of a Node: name, labels, taints, unschedulable, capacity, conditions.

    An :class:`~hetero_operator.cluster.nodeindex.IndexedNode`: the index value also keeps the node's
    parse, so a start re-reads only nodes that changed (issue 11).  Conditions lose
    ``lastHeartbeatTime`` (nothing reads it): a kubelet's heartbeat then leaves the value equal,
    the informer keeps the old one, and its parse survives.
    """
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status", {})
    trimmed = {k: status[k] for k in ("capacity", "allocatable") if k in status}
    if "conditions" in status:
        trimmed["conditions"] = [{k: v for k, v in c.items() if k != "lastHeartbeatTime"}
                                 for c in status["conditions"] or ()]
    return IndexedNode({
        "metadata": {"name": meta.get("name"), "labels": dict(meta.get("labels") or {}),
                     "annotations": dict(meta.get("annotations") or {})},
        "spec": {k: spec[k] for k in ("unschedulable", "taints") if k in spec},
        "status": trimmed,
    })


def gpu_pod_entry(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``{node: trimmed pod}`` for a bound, unfinished pod requesting NVIDIA resources; else None.

    Our own pods count from their creation: before the scheduler binds one, its node is the one
    its required node affinity pins it to.  Otherwise jobs started in the same seconds all plan
    onto the same free GPUs (seen in bench/bench_operator.py: 500 jobs, all on two nodes).
    """
    spec, status = body.get("spec", {}), body.get("status", {})
    node = spec.get("nodeName") or _pinned_node(body)
    if not node or status.get("phase") in ("Succeeded", "Failed"):
        return None
    if (body.get("metadata") or {}).get("deletionTimestamp") and status.get("phase") != "Running":
        return None
    containers = [{"name": ct.get("name"), "resources": ct.get("resources") or {}}
                  for ct in spec.get("containers") or ()]
    wants_gpu = any(k.startswith(GPU_RESOURCE_PREFIX)  # requests/limits; DRA's `claims` is a list
                    for ct in containers for part in ct["resources"].values()
                    if isinstance(part, Mapping) for k in part)
    if not wants_gpu:
        return None
    meta = body.get("metadata") or {}
    return {node: IndexedPod({"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                                           "labels": dict(meta.get("labels") or {})},
                              "spec": {"nodeName": node, "containers": containers},
                              "status": {"phase": status.get("phase")}})}


def _pinned_node(body: Mapping[str, Any]) -> str | None:
    """The one node a not-yet-bound pod of ours is pinned to (``rendering``'s required node
    affinity ``metadata.name In [node]``); None for anything else."""
    labels = (body.get("metadata") or {}).get("labels") or {}
    if labels.get(LABEL_MANAGED_BY) != MANAGED_BY:
        return None
    try:
        terms = body["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    except (KeyError, TypeError):
        return None
    names = [v for t in terms or () for f in t.get("matchFields") or ()
             if f.get("key") == "metadata.name" and f.get("operator") == "In" for v in f.get("values") or ()]
    return names[0] if len(terms or ()) == 1 and len(names) == 1 else None
