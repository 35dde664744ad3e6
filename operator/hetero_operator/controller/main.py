"""kopf registrations only (``kopf run -m hetero_operator.controller.main`` or ``heterotrain operator``).

No timers, daemons or mandatory delete handlers: none of them may put a finalizer on the job
(shared/cases/23); children go by owner references.  All work happens in
:class:`hetero_operator.controller.reconcile.Reconciler`, kicked by these watch-event handlers.
"""

from __future__ import annotations

from typing import Any

import kopf

from hetero_operator.api.labels import LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY
from hetero_operator.api.spec import API_GROUP, PLURAL, VERSION
from hetero_operator.cluster import nodeindex
from hetero_operator.controller import runner


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    await runner.on_startup(settings, memo)


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    return runner.login()


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await runner.on_cleanup(memo)


@kopf.index("nodes")
def nodes_idx(name: str, body: kopf.Body, **_: Any) -> dict[str, Any]:
    return {name: nodeindex.trim_node(body)}


@kopf.index("pods")
def gpu_pods_idx(body: kopf.Body, **_: Any) -> dict[str, Any]:
    return nodeindex.gpu_pod_entry(body) or {}  # {} drops the pod (None would keep a stale entry)


@kopf.on.event(API_GROUP, VERSION, PLURAL)
async def job_event(type: str | None, name: str, namespace: str, memo: kopf.Memo,
                    nodes_idx: kopf.Index[str, Any], gpu_pods_idx: kopf.Index[str, Any],
                    **_: Any) -> None:
    reconciler = runner.reconciler(memo, nodes_idx, gpu_pods_idx)
    if type == "DELETED":
        reconciler.forget(namespace, name)
    else:
        reconciler.kick(namespace, name)


@kopf.on.event("pods", labels={LABEL_MANAGED_BY: MANAGED_BY, LABEL_JOB: kopf.PRESENT})
async def pod_event(labels: kopf.Labels, namespace: str, memo: kopf.Memo,
                    nodes_idx: kopf.Index[str, Any], gpu_pods_idx: kopf.Index[str, Any],
                    **_: Any) -> None:
    runner.reconciler(memo, nodes_idx, gpu_pods_idx).kick(namespace, labels[LABEL_JOB], delay_s=0.05)


@kopf.on.event("kueue.x-k8s.io", "workloads", labels={LABEL_JOB: kopf.PRESENT})  # preferred version
async def workload_event(labels: kopf.Labels, namespace: str, memo: kopf.Memo,
                         nodes_idx: kopf.Index[str, Any], gpu_pods_idx: kopf.Index[str, Any],
                         **_: Any) -> None:
    """Kueue admitted, evicted or changed a queued job's Workload: look at the job now."""
    runner.reconciler(memo, nodes_idx, gpu_pods_idx).kick(namespace, labels[LABEL_JOB], delay_s=0.05)


@kopf.on.event("nodes")
async def node_event(name: str, memo: kopf.Memo, nodes_idx: kopf.Index[str, Any],
                     gpu_pods_idx: kopf.Index[str, Any], **_: Any) -> None:
    runner.reconciler(memo, nodes_idx, gpu_pods_idx).node_changed(name)
