"""The operator's view of the cluster: a Node informer and GPU-pod informer(s) (issue 32, item 9).

What the planner reads (:mod:`hetero_operator.controller.planner`) comes from two
:class:`~hetero_operator.controller.informer.Informer` caches, both filled by one LIST before
the operator handles any job (:meth:`ClusterCache.wait_synced`, awaited by the startup handler):

* Nodes, trimmed by :func:`~hetero_operator.cluster.nodeindex.trim_node`; a node whose trimmed
  content changed (added, changed, gone) kicks the jobs waiting for capacity and those with pods
  on it (:meth:`~hetero_operator.controller.reconcile.Reconciler.node_changed`);
* Pods (cluster-wide, or of each watched namespace), of which only bound, unfinished pods that
  request ``nvidia.com/*`` devices are kept (:func:`~hetero_operator.cluster.nodeindex.gpu_pod_entry`);
  every event of one of our rank pods kicks its job (what kopf's pod handler did).

About 1 KiB is kept per node and per GPU pod: whole objects (managedFields, images, status) are
never held past the page or event they came in.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from hetero_operator.api.labels import LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY
from hetero_operator.api.settings import OperatorConfig
from hetero_operator.cluster.nodeindex import build_indexed_inventory, gpu_pod_entry, trim_node
from hetero_operator.controller.informer import PAGE_SIZE, Informer, WatchLimits

log = logging.getLogger("heterotrain.operator")

SYNC_LOG_EVERY_S = 10.0
"""While the first listing is not done, say so this often (an API server that refuses the list)."""


def gpu_pod_value(body: Mapping[str, Any]) -> Any:
    """The kept value of a pod: its :class:`~hetero_operator.cluster.nodeindex.IndexedPod` when it
    holds GPUs on a node, else None."""
    entry = gpu_pod_entry(body)
    return next(iter(entry.values())) if entry else None


def our_pod_job(_type: str, body: Mapping[str, Any]) -> Hashable | None:
    """``(namespace, job)`` of one of our rank pods (labels ``managed-by`` and ``job-name``), else None."""
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    job = labels.get(LABEL_JOB)
    if not job or labels.get(LABEL_MANAGED_BY) != MANAGED_BY:
        return None
    return (meta.get("namespace"), job)


class ClusterCache:
    """The Node and GPU-pod informers of one operator.

    Args:
        core: a ``kubernetes.client.CoreV1Api`` (its list calls are the informers' LIST and WATCH).
        config: the operator settings (watched namespaces, watch timeouts).
        reconciler: returns the reconciler once it exists (None before: nothing is kicked).
        page_size: objects per LIST page.
    """

    def __init__(self, core: Any, config: OperatorConfig, *, reconciler: Callable[[], Any],
                 page_size: int = PAGE_SIZE) -> None:
        w = config.watch
        limits = WatchLimits(page_size=page_size, server_timeout_s=w.server_timeout_s,
                             client_timeout_s=w.client_timeout_s, connect_timeout_s=w.connect_timeout_s)
        self._reconciler = reconciler
        self.nodes = Informer(kind="nodes", list_fn=core.list_node, trim=trim_node,
                              on_change=self._node_changed, limits=limits)
        listers = ([functools.partial(core.list_namespaced_pod, ns) for ns in config.watch.namespaces]
                   or [core.list_pod_for_all_namespaces])
        self.pods = [Informer(kind="pods" if len(listers) == 1 else f"pods of {ns}", list_fn=fn,
                              trim=gpu_pod_value, notice=our_pod_job, on_notice=self._pod_event,
                              limits=limits)
                     for fn, ns in zip(listers, config.watch.namespaces or ("",), strict=True)]

    def _node_changed(self, name: str) -> None:
        rec = self._reconciler()
        if rec is not None:
            rec.node_changed(name)

    def _pod_event(self, key: Hashable) -> None:
        rec = self._reconciler()
        if rec is not None:
            namespace, job = key  # type: ignore[misc]
            rec.kick(namespace, job, delay_s=0.05)

    @property
    def informers(self) -> list[Informer]:
        return [self.nodes, *self.pods]

    def start(self) -> None:
        """Start every informer (call on the operator's loop)."""
        for informer in self.informers:
            informer.start()

    async def wait_synced(self) -> str:
        """Return once every informer holds its first listing; logs and returns a summary line
        (nodes listed, usable and excluded, GPU pods).  Waits as long as the listing fails,
        saying so every :data:`SYNC_LOG_EVERY_S`."""
        started = time.perf_counter()
        pending = {asyncio.ensure_future(i.wait_synced()) for i in self.informers}
        try:
            while pending:
                _, pending = await asyncio.wait(pending, timeout=SYNC_LOG_EVERY_S)
                if pending:
                    log.warning("still listing %s (%.0f s): no job is planned before every node is "
                                "known", ", ".join(i.kind for i in self.informers if not i.synced),
                                time.perf_counter() - started)
        finally:
            for task in pending:
                task.cancel()
        nodes, pods = self.node_values(), self.gpu_pod_values()
        inventory = build_indexed_inventory(nodes, pods)  # also the parse every node remembers
        line = (f"nodes synced: {len(nodes)} node(s) listed, {len(inventory.nodes)} usable, "
                f"{len(inventory.excluded)} excluded; {len(pods)} GPU pod(s); "
                f"{time.perf_counter() - started:.2f} s")
        log.info("%s", line)
        return line

    def node_values(self) -> list[Any]:
        """Every kept Node (:class:`~hetero_operator.cluster.nodeindex.IndexedNode`), a new list."""
        return self.nodes.values()

    def gpu_pod_values(self) -> list[Any]:
        """Every kept GPU pod (:class:`~hetero_operator.cluster.nodeindex.IndexedPod`), a new list."""
        if len(self.pods) == 1:
            return self.pods[0].values()
        return [v for informer in self.pods for v in informer.store.values()]

    def stop(self) -> None:
        """Stop every informer's thread."""
        for informer in self.informers:
            informer.stop()
