"""kopf registrations only (``kopf run -m hetero_operator.controller.main`` or ``heterotrain operator``).

No timers, daemons or mandatory delete handlers: none of them may put a finalizer on the job
(shared/cases/23); children go by owner references.  All work happens in
:class:`hetero_operator.controller.reconcile.Reconciler`, kicked by these watch-event handlers and
by the operator's own Node and Pod informers (:mod:`hetero_operator.controller.informer`, started
by :func:`hetero_operator.controller.runner.on_startup`): kopf watches no Node and no Pod, so no
per-object kopf worker paces how fast the operator learns the cluster (issue 32, item 9).
"""

from __future__ import annotations

from typing import Any

import kopf

from hetero_operator.api.labels import LABEL_JOB
from hetero_operator.api.spec import API_GROUP, PLURAL, VERSION
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


@kopf.on.event(API_GROUP, VERSION, PLURAL)
async def job_event(type: str | None, name: str, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    reconciler = runner.reconciler(memo)
    if type == "DELETED":
        reconciler.forget(namespace, name)
    else:
        reconciler.kick(namespace, name)


@kopf.on.event("kueue.x-k8s.io", "workloads", labels={LABEL_JOB: kopf.PRESENT})  # preferred version
async def workload_event(labels: kopf.Labels, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    """Kueue admitted, evicted or changed a queued job's Workload: look at the job now."""
    runner.reconciler(memo).kick(namespace, labels[LABEL_JOB], delay_s=0.05)
