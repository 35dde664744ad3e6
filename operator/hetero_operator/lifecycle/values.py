"""The lifecycle's values: what it observes of a job (:class:`JobState`, :class:`PodState`), what
it decides (:class:`Decision` and the action names) (pure).  It decides with the operator's
:class:`~hetero_operator.api.settings.RestartSettings`.  :mod:`hetero_operator.lifecycle.status` reads them from and writes them to the job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


# Actions
START = "Start"            # plan and create the pods
WAIT = "Wait"              # nothing to change now; status may change
RUNNING = "Running"        # all pods running; refresh status
RESTART = "Restart"        # delete all pods, count a restart, start after a backoff
REPLAN = "Replan"          # delete all pods, start again without counting a restart
FAIL = "Fail"
SUCCEED = "Succeed"
SUSPEND = "Suspend"
CLEANUP = "Cleanup"        # finished job: delete pods per cleanPodPolicy
DELETE_JOB = "DeleteJob"   # ttlSecondsAfterFinished passed
NOTHING = "Nothing"
SHRINK = "Shrink"          # elastic: delete the lost pods only, the survivors go on
GROW = "Grow"              # elastic: create removed pods again, they join the running job

TERMINATED = ("Succeeded", "Failed")
POLL_DELETING_S = 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class PodState:
    """What matters of one rank pod.

    Attributes:
        name: pod name.
        first_rank: global rank of its local rank 0.
        phase: ``Pending``, ``Running``, ``Succeeded``, ``Failed`` or ``Unknown``.
        node: node name (``spec.nodeName`` or the planned node); ``""`` when unknown.
        deleting: ``metadata.deletionTimestamp`` is set.
        deletion_s: ``metadata.deletionTimestamp``, epoch seconds: the time by which the kubelet
            should have removed the pod (the API server sets it to the request time plus the
            grace period); ``None`` when not deleting.
        created_s: creation time, epoch seconds; ``None`` when unknown.
        attempt: the :data:`~hetero_operator.api.labels.LABEL_ATTEMPT` label.
        gpu_type: the :data:`~hetero_operator.api.labels.ANNOTATION_GPU_TYPE` annotation.
        ranks: ranks the pod runs (the :data:`~hetero_operator.api.labels.ANNOTATION_RANKS` annotation).
        failure: ``"OOMKilled exit 137"`` style summary of a failed container, ``""`` otherwise.
        disruption: why the cluster stopped the pod, when it did: the ``DisruptionTarget``
            condition's reason (``PreemptionByScheduler``, ``DeletionByTaintManager``,
            ``EvictionByEvictionAPI``, ``TerminationByKubelet``, ``DeletionByPodGC``) or a
            ``status.reason`` of :data:`~hetero_operator.lifecycle.disruptions.SHUTDOWN_REASONS`/``Evicted``; ``""`` otherwise.
        stuck: why the pod will not start whatever the plan, one of
            :data:`hetero_operator.lifecycle.stuck.JOB_REASONS` (``ImagePullFailed``, ...); ``""``
            when it is not stuck.
        stuck_message: what the pod shows (``container worker is ImagePullBackOff: ...``).
        log_tail: a failed worker container's last log lines (its termination message under
            ``FallbackToLogsOnError``), ``""`` otherwise.
        startup_error: why its failure is deterministic (the script or module is not there, an
            import fails: :func:`hetero_operator.lifecycle.startup.startup_error`), ``""`` when a
            restart may help.
        result: the job's result a succeeded rank 0 left in its termination message (final
            ``step``, ``totalSteps``, ``loss``, the script's ``metrics``), None otherwise.
        unschedulable: the scheduler's message for a pod it cannot place (``FailedScheduling``),
            ``""`` otherwise.
    """

    name: str
    first_rank: int
    phase: str
    node: str = ""
    deleting: bool = False
    deletion_s: float | None = None
    created_s: float | None = None
    attempt: int = 0
    gpu_type: str = ""
    ranks: int = 1
    failure: str = ""
    disruption: str = ""
    stuck: str = ""
    stuck_message: str = ""
    log_tail: str = ""
    startup_error: str = ""
    result: Mapping[str, Any] | None = field(default=None, hash=False)
    unschedulable: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobState:
    """The job's persisted progress (all from ``status``, so it survives operator restarts).

    Attributes:
        phase: ``status.phase`` (``""`` before the first reconcile).
        restarts: whole-job restarts caused by the job's own failures so far.
        infrastructure_restarts: whole-job restarts caused by the cluster so far.
        attempt: generation of the current pods (1 for the first start).
        start_s: first pod creation, epoch seconds.
        completion_s: when it succeeded or failed.
        restart_not_before_s: earliest next start after a failure.
        planned_pods: pod names of the current plan (empty when no plan).
        replans: re-plans so far (``status.replans``; capped by ``HTJ_MAX_REPLANS``).
    """

    phase: str = ""
    restarts: int = 0
    infrastructure_restarts: int = 0
    attempt: int = 0
    start_s: float | None = None
    completion_s: float | None = None
    restart_not_before_s: float | None = None
    planned_pods: tuple[str, ...] = ()
    replans: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeLoss:
    """A node the job lost.

    Attributes:
        node: node name.
        why: ``"Ready=Unknown (NodeStatusUnknown), taint node.kubernetes.io/unreachable"`` or
            ``"Deleted"`` (the Node object is gone).
        since_s: when it stopped being healthy, epoch seconds.
        lost_s: when it counted as lost, epoch seconds.
        pods: the job's pods on it.
    """

    node: str
    why: str
    since_s: float
    lost_s: float
    pods: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    """The next step.

    Attributes:
        action: one of the module's action constants.
        phase: the phase to record (unchanged phase for ``Cleanup``/``Nothing``).
        reason: CamelCase reason for the condition and the event.
        message: one sentence.
        delete_pods: pod names to delete now (graceful).
        force_delete_pods: pod names to delete now with grace period 0 (their kubelet is gone
            or silent).
        requeue_s: look again after this many seconds; ``None`` = on the next event or resync.
        count_restart: add one to ``status.restarts`` (counts against ``backoffLimit``).
        count_infrastructure_restart: add one to ``status.infrastructureRestarts``.
        restart_not_before_s: new ``status.restartNotBefore``, epoch seconds.
        node_loss: the node lost, for ``status.lastNodeLoss``.
        disruption: what the cluster did, for ``status.lastDisruption``.
        create_pods: pod names to create again (:data:`GROW`: removed by an elastic shrink,
            their node healthy again, or another node of their GPU type free).
        create_on: of those, the ones that come back on another node than planned: pod -> node.
        elastic: the new ``status.elastic`` (:mod:`hetero_operator.lifecycle.elastic`); None:
            unchanged.
    """

    action: str
    phase: str
    reason: str
    message: str
    delete_pods: tuple[str, ...] = ()
    force_delete_pods: tuple[str, ...] = ()
    requeue_s: float | None = None
    count_restart: bool = False
    count_infrastructure_restart: bool = False
    restart_not_before_s: float | None = None
    node_loss: NodeLoss | None = None
    disruption: str = ""
    create_pods: tuple[str, ...] = ()
    create_on: Mapping[str, str] = field(default_factory=dict, hash=False)
    elastic: Mapping[str, Any] | None = field(default=None, hash=False)


def pod_names(pods: Sequence[PodState]) -> tuple[str, ...]:
    """The pods' names, sorted."""
    return tuple(sorted(p.name for p in pods))
