"""What to do next with a job, given its status, its pods and the nodes (pure decisions).

:func:`decide` is the whole lifecycle: the reconciler observes, calls it, and carries out the
returned :class:`Decision` (write status first, then delete pods, plan and create pods, delete
the job).  Rules (issue 4, Kubeflow's run policy; shared/cases/21; issue 10):

* a failed rank pod restarts the *whole* gang (collectives need every rank), counted in
  ``status.restarts`` against ``backoffLimit``, after an exponential delay; past the limit the
  job fails with ``BackoffLimitExceeded`` (the one restart policy, shared with ``heterotrain
  run``: :mod:`hetero_operator.lifecycle.restart`);
* failures that are not the job's fault restart the gang without counting against
  ``backoffLimit`` (``status.infrastructureRestarts``): a lost node, a node shutdown, an
  eviction or preemption (the pod's ``DisruptionTarget`` condition or ``status.reason``), a pod
  deleted by someone else, and any failure while a pod of the gang sits on an unhealthy node
  (its peers' collectives time out because of it);
* a node NotReady/Unknown or tainted unreachable counts as lost ``nodeLossGraceSeconds`` after
  it stopped being healthy (at once when the Node object is gone or tainted out-of-service):
  the job's pods there are force-deleted (grace 0: no kubelet will ever confirm) and the gang
  re-planned onto the remaining capacity;
* terminating pods never block a job without limit: on a lost node they are force-deleted at
  once, elsewhere when ``nodeLossGraceSeconds`` passed after their ``deletionTimestamp``;
* pods Pending past ``pending_timeout_s`` are deleted and the job re-planned, not counted;
* ``suspend`` deletes pods and keeps state; ``activeDeadlineSeconds`` fails the job;
  ``ttlSecondsAfterFinished`` deletes it; ``cleanPodPolicy`` picks the pods deleted at the end.

Restarts are counted once: a restart is decided only while the job is ``Created``/``Running``
and the reconciler records the new phase before it deletes any pod, so pods still there in
``Restarting``/``Pending`` are leftovers that are only deleted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hetero_operator.api import conditions as c
from hetero_operator.api.spec import RunPolicy
from hetero_operator.cluster.nodehealth import NodeHealth
from hetero_operator.lifecycle import restart
from heterotrain_common import defaults

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

TERMINATED = ("Succeeded", "Failed")
POLL_DELETING_S = 1.0

SHUTDOWN_REASONS = frozenset({"Shutdown", "NodeShutdown", "Terminated"})
"""``status.reason`` the kubelet's graceful node shutdown manager writes on the pods it stops."""
EVICTION_REASONS = frozenset({"Evicted", "DeletionByTaintManager", "EvictionByEvictionAPI",
                              "TerminationByKubelet"})
PREEMPTION_REASONS = frozenset({"PreemptionByScheduler", "PreemptionByKubeScheduler", "Preempting"})
DELETED = "Deleted"
"""Disruption of a pod deleted while the job ran (not by this operator)."""
STOPPED_AT_CHECKPOINT = "StoppedAtCheckpoint"
"""A pod whose ranks exited 75 (``heterotrain_common.envnames.PREEMPTED_EXIT_CODE``): they stopped at
a step every rank agreed on after a SIGTERM to one of them and wrote a checkpoint.  Counts as the
cluster's doing when the cause shows (another pod of the gang disrupted, deleted or gone)."""


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
        attempt: the ``heterotrain.io/attempt`` label.
        gpu_type: the ``heterotrain.io/gpu-type`` annotation.
        ranks: ranks the pod runs (the ``heterotrain.io/ranks`` annotation).
        failure: ``"OOMKilled exit 137"`` style summary of a failed container, ``""`` otherwise.
        disruption: why the cluster stopped the pod, when it did: the ``DisruptionTarget``
            condition's reason (``PreemptionByScheduler``, ``DeletionByTaintManager``,
            ``EvictionByEvictionAPI``, ``TerminationByKubelet``, ``DeletionByPodGC``) or a
            ``status.reason`` of :data:`SHUTDOWN_REASONS`/``Evicted``; ``""`` otherwise.
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
    """

    phase: str = ""
    restarts: int = 0
    infrastructure_restarts: int = 0
    attempt: int = 0
    start_s: float | None = None
    completion_s: float | None = None
    restart_not_before_s: float | None = None
    planned_pods: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Timing:
    """Operator timeouts in seconds (from :class:`hetero_operator.api.settings.OperatorConfig`)."""

    pending_timeout_s: float = defaults.PENDING_TIMEOUT_S
    backoff_base_s: float = defaults.BACKOFF_BASE_S
    backoff_max_s: float = defaults.BACKOFF_MAX_S


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


def backoff_s(restarts: int, timing: Timing) -> float:
    """Delay before restart number ``restarts`` (1-based): :func:`restart.backoff_s` of ``timing``."""
    return restart.backoff_s(restarts, base_s=timing.backoff_base_s, max_s=timing.backoff_max_s)


class _Nodes:
    """Node health lookups for one decision."""

    def __init__(self, nodes: Mapping[str, NodeHealth] | None, grace_s: float, now_s: float) -> None:
        self.nodes, self.grace_s, self.now_s = nodes, grace_s, now_s

    def health(self, node: str) -> NodeHealth | None:
        """``None`` when unknown (no node name, no node list) or gone."""
        if self.nodes is None or not node:
            return None
        return self.nodes.get(node)

    def gone(self, node: str) -> bool:
        return self.nodes is not None and bool(node) and node not in self.nodes

    def lost_at_s(self, node: str) -> float | None:
        if self.gone(node):
            return self.now_s
        h = self.health(node)
        return None if h is None else h.lost_at_s(self.grace_s)

    def lost(self, node: str) -> bool:
        at = self.lost_at_s(node)
        return at is not None and self.now_s >= at

    def unhealthy(self, node: str) -> bool:
        h = self.health(node)
        return self.gone(node) or (h is not None and not h.healthy)

    def loss(self, node: str, pods: Sequence[PodState]) -> NodeLoss:
        names = _names([p for p in pods if p.node == node])
        h = self.health(node)
        if h is None or h.unhealthy_since_s is None:
            return NodeLoss(node=node, why=DELETED, since_s=self.now_s, lost_s=self.now_s, pods=names)
        return NodeLoss(node=node, why=h.why, since_s=h.unhealthy_since_s,
                        lost_s=h.lost_at_s(self.grace_s) or self.now_s, pods=names)


def decide(job: JobState, policy: RunPolicy, pods: Sequence[PodState], *,
           nodes: Mapping[str, NodeHealth] | None, now_s: float, timing: Timing = Timing(),
           checkpointing: bool = True) -> Decision:
    """Decide the next step of one job.

    Args:
        job: persisted state.
        policy: ``spec.runPolicy``.
        pods: the job's pods (all attempts, terminating ones included).
        nodes: health of every node that exists, by name (see
            :func:`hetero_operator.cluster.nodehealth.node_health`); ``None`` when unknown (skips the
            node checks).
        now_s: current time, epoch seconds.
        timing: operator timeouts.
        checkpointing: the job sets ``spec.training.checkpoint.path`` (a restart resumes from the
            last checkpoint; without, from step 0: :mod:`hetero_operator.lifecycle.restart`).

    Returns:
        The :class:`Decision`.
    """
    health = _Nodes(nodes, float(policy.node_loss_grace_seconds), now_s)
    stuck = _stuck(pods, health)
    if job.phase in c.FINISHED_PHASES:
        return _finished(job, policy, pods, now_s, stuck)
    live = [p for p in pods if not p.deleting]
    if policy.suspend:
        delete, force = _removal(live, health)
        return Decision(action=SUSPEND, phase=c.SUSPENDED, reason="Suspended",
                        message="The job is suspended (spec.runPolicy.suspend); its pods are deleted and its state kept.",
                        delete_pods=delete, force_delete_pods=tuple(sorted({*force, *stuck})))
    deadline = policy.active_deadline_seconds
    if deadline is not None and job.start_s is not None and now_s >= job.start_s + deadline:
        delete, force = _removal([p for p in live if p.name in _to_clean(policy, live)], health)
        return Decision(action=FAIL, phase=c.FAILED, reason="DeadlineExceeded",
                        message=f"The job ran longer than activeDeadlineSeconds={deadline}.",
                        delete_pods=delete, force_delete_pods=tuple(sorted({*force, *stuck})))
    if job.phase in (c.CREATED, c.RUNNING):
        current = [p for p in pods if p.attempt == job.attempt]
        disrupted = _disrupted(job, policy, current, health, now_s)
        if disrupted is not None:
            return disrupted
    if len(live) < len(pods):
        return Decision(action=WAIT, phase=job.phase or c.PENDING, reason="PodsTerminating",
                        message="Waiting for the previous pods to terminate.",
                        force_delete_pods=stuck, requeue_s=_next_unstick_s(pods, health))
    leftovers = live if job.phase in (c.RESTARTING, c.PENDING) else [p for p in live if p.attempt != job.attempt]
    if leftovers:
        delete, force = _removal(leftovers, health)
        return Decision(action=WAIT, phase=job.phase or c.PENDING, reason="StalePods",
                        message=f"Deleting {len(leftovers)} pod(s) of an earlier attempt.",
                        delete_pods=delete, force_delete_pods=force, requeue_s=POLL_DELETING_S)
    if not live:
        return _no_pods(job, now_s)
    return _with_pods(job, policy, live, now_s=now_s, timing=timing, checkpointing=checkpointing)


def _disrupted(job: JobState, policy: RunPolicy, current: Sequence[PodState], health: _Nodes,
               now_s: float) -> Decision | None:
    """The cluster's part: a lost node, a disrupted pod, a failure next to an unhealthy node."""
    lost_nodes = sorted({p.node for p in current if p.phase != "Succeeded" and health.lost(p.node)})
    if lost_nodes:
        loss = health.loss(lost_nodes[0], current)
        force = _names([p for p in current if p.node in lost_nodes])
        others = _names([p for p in current if p.node not in lost_nodes and not p.deleting])
        if loss.why == DELETED:
            what = f"Node {loss.node} was deleted"
        else:
            what = (f"Node {loss.node} is lost: {loss.why} since {c.now_iso(loss.since_s)}, "
                    f"nodeLossGraceSeconds={policy.node_loss_grace_seconds} passed at "
                    f"{c.now_iso(loss.lost_s)}")
        what += f"; force-deleted pod(s) {', '.join(force)}"
        return _infra_restart(job, policy, "NodeLost", what, delete=others, force=force,
                              node_loss=loss)
    stopped = [p for p in current if p.disruption == STOPPED_AT_CHECKPOINT and not p.deleting]
    failed = [p for p in current if p.phase == "Failed" and p not in stopped]
    disrupted = [p for p in current if (p.disruption or p.deleting) and p not in stopped]
    gone = set(job.planned_pods) - {p.name for p in current}
    if stopped and (disrupted or gone):  # the peers of a preempted pod: the cluster's doing
        disrupted += stopped
    else:
        failed += stopped
    # A pod that already succeeded is done with its node, whatever happens to the node now.
    unhealthy = [p for p in current if p.phase != "Succeeded" and health.unhealthy(p.node)]
    if disrupted or (failed and unhealthy):
        if disrupted:  # the cause first, the peers that stopped for it after
            first = min(disrupted, key=lambda p: (p in stopped, p.first_rank))
            cause = DELETED if first.deleting and first.disruption == STOPPED_AT_CHECKPOINT else first.disruption
            reason, words = _disruption_kind(cause or DELETED)
            what = f"{first.name} on {first.node or 'no node'} {words}"
        else:
            first = min(unhealthy, key=lambda p: p.first_rank)
            h = health.health(first.node)
            reason = "NodeNotReady"
            why = h.why if h is not None else DELETED
            what = (f"{min(failed, key=lambda p: p.first_rank).name} failed while node "
                    f"{first.node} of {first.name} is not healthy ({why})")
        delete, force = _removal([p for p in current if not p.deleting], health)
        return _infra_restart(job, policy, reason, what, delete=delete,
                              force=tuple(sorted({*force, *_stuck(current, health)})))
    if unhealthy and not failed:
        first = min(unhealthy, key=lambda p: p.first_rank)
        h = health.health(first.node)
        at = health.lost_at_s(first.node)
        assert h is not None and at is not None  # unhealthy, not gone (gone is lost)
        return Decision(action=WAIT, phase=job.phase, reason="NodeNotReady",
                        message=(f"Node {first.node} of pod {first.name} is not healthy ({h.why}) since "
                                 f"{c.now_iso(h.unhealthy_since_s or now_s)}; its pods count as lost at "
                                 f"{c.now_iso(at)} (nodeLossGraceSeconds="
                                 f"{policy.node_loss_grace_seconds})."),
                        requeue_s=max(at - now_s, 0.0) + 0.05)
    return None


def _disruption_kind(reason: str) -> tuple[str, str]:
    """(event reason, words) for a pod's disruption reason."""
    if reason in SHUTDOWN_REASONS:
        return "NodeShutdown", f"was stopped by its node's shutdown ({reason})"
    if reason in PREEMPTION_REASONS:
        return "PodPreempted", f"was preempted ({reason})"
    if reason in EVICTION_REASONS:
        return "PodEvicted", f"was evicted ({reason})"
    if reason == DELETED:
        return "PodDeleted", "was deleted while the job ran"
    if reason == STOPPED_AT_CHECKPOINT:
        return "PodPreempted", ("stopped at an agreed step with a checkpoint after SIGTERM (exit 75), "
                                "its peer pods gone")
    return "PodDisrupted", f"was disrupted ({reason})"


def _infra_restart(job: JobState, policy: RunPolicy, reason: str, what: str, *,
                   delete: tuple[str, ...], force: tuple[str, ...],
                   node_loss: NodeLoss | None = None) -> Decision:
    n = job.infrastructure_restarts + 1
    delete = tuple(p for p in delete if p not in force)
    return Decision(action=RESTART, phase=c.RESTARTING, reason=reason,
                    message=(f"{what}. Restarting all ranks on the remaining capacity "
                             f"(infrastructure restart {n}; not counted against backoffLimit "
                             f"{policy.backoff_limit}, {job.restarts} restart(s) used)."),
                    delete_pods=delete, force_delete_pods=force, count_infrastructure_restart=True,
                    node_loss=node_loss, disruption=what, requeue_s=POLL_DELETING_S)


def _stuck(pods: Sequence[PodState], health: _Nodes) -> tuple[str, ...]:
    """Terminating pods no kubelet will finish: on a lost node, or overdue by the grace period."""
    return _names([p for p in pods if p.deleting and (
        health.lost(p.node) or (p.deletion_s is not None
                                and health.now_s >= p.deletion_s + health.grace_s))])


def _next_unstick_s(pods: Sequence[PodState], health: _Nodes) -> float:
    """Seconds until the next terminating pod would be force-deleted (at most the poll)."""
    times = [POLL_DELETING_S]
    for p in pods:
        if not p.deleting:
            continue
        at = health.lost_at_s(p.node)
        if at is not None:
            times.append(at - health.now_s)
        if p.deletion_s is not None:
            times.append(p.deletion_s + health.grace_s - health.now_s)
    return max(min(times), 0.05)


def _removal(pods: Sequence[PodState], health: _Nodes) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(graceful, force) deletions: pods on a lost node go with grace 0."""
    force = [p for p in pods if health.lost(p.node)]
    return _names([p for p in pods if p not in force]), _names(force)


def _no_pods(job: JobState, now_s: float) -> Decision:
    if job.restart_not_before_s is not None and now_s < job.restart_not_before_s:
        wait = job.restart_not_before_s - now_s
        return Decision(action=WAIT, phase=c.RESTARTING, reason="BackoffDelay",
                        message=f"Restart {job.restarts} starts in {wait:.0f} s (exponential backoff).",
                        requeue_s=wait)
    return Decision(action=START, phase=c.CREATED, reason="Planning", message="Planning the job.")


def _with_pods(job: JobState, policy: RunPolicy, pods: Sequence[PodState], *,
               now_s: float, timing: Timing, checkpointing: bool = True) -> Decision:
    failed = [p for p in pods if p.phase == "Failed"]
    if failed:
        return _on_failure(job, policy, pods, failed, now_s, timing, checkpointing)
    rank0 = next((p for p in pods if p.first_rank == 0), None)
    if rank0 is not None and rank0.phase == "Succeeded":
        return Decision(action=SUCCEED, phase=c.SUCCEEDED, reason="JobSucceeded",
                        message="Rank 0 completed successfully.",
                        delete_pods=_to_clean(policy, pods))
    missing = sorted(set(job.planned_pods) - {p.name for p in pods})
    if missing:
        return _replan("IncompletePodSet", f"Pod(s) {', '.join(missing)} are missing; re-planning "
                       "the whole job (collectives need every rank).", pods)
    stuck = [p for p in pods if p.phase == "Pending" and p.created_s is not None
             and now_s - p.created_s > timing.pending_timeout_s]
    if stuck:
        return _replan("PendingTimeout", f"Pod {stuck[0].name} was Pending longer than "
                       f"{timing.pending_timeout_s:.0f} s; re-planning.", pods)
    if all(p.phase in ("Running", "Succeeded") for p in pods):
        return Decision(action=RUNNING, phase=c.RUNNING, reason="JobRunning",
                        message=f"All {len(pods)} pod(s) are running.")
    pending = [p for p in pods if p.phase not in ("Running", "Succeeded")]
    oldest = min((p.created_s for p in pending if p.created_s is not None), default=now_s)
    return Decision(action=WAIT, phase=c.CREATED, reason="PodsPending",
                    message=f"{len(pending)} of {len(pods)} pod(s) are not running yet.",
                    requeue_s=max(oldest + timing.pending_timeout_s - now_s, 0.0) + 0.5)


def _on_failure(job: JobState, policy: RunPolicy, pods: Sequence[PodState],
                failed: Sequence[PodState], now_s: float, timing: Timing,
                checkpointing: bool) -> Decision:
    first = min(failed, key=lambda p: p.first_rank)
    what = f"{first.name} ({first.gpu_type or 'unknown GPU'}) failed" + (
        f": {first.failure}" if first.failure else "")
    verdict = restart.after_failure(restarts=job.restarts, backoff_limit=policy.backoff_limit,
                                    checkpointing=checkpointing, base_s=timing.backoff_base_s,
                                    max_s=timing.backoff_max_s)
    if not verdict.restart:
        return Decision(action=FAIL, phase=c.FAILED, reason=verdict.reason,
                        message=f"{what}; {verdict.message}.", delete_pods=_to_clean(policy, pods))
    return Decision(action=RESTART, phase=c.RESTARTING, reason=verdict.reason,
                    message=f"{what}; {verdict.message}.",
                    delete_pods=_names(pods), count_restart=True,
                    restart_not_before_s=now_s + verdict.delay_s, requeue_s=POLL_DELETING_S)


def _replan(reason: str, message: str, pods: Sequence[PodState]) -> Decision:
    return Decision(action=REPLAN, phase=c.PENDING, reason=reason, message=message,
                    delete_pods=_names(pods), requeue_s=POLL_DELETING_S)


def _finished(job: JobState, policy: RunPolicy, pods: Sequence[PodState], now_s: float,
              stuck: tuple[str, ...]) -> Decision:
    ttl = policy.ttl_seconds_after_finished
    if ttl is not None and job.completion_s is not None and now_s >= job.completion_s + ttl:
        return Decision(action=DELETE_JOB, phase=job.phase, reason="TTLExpired",
                        message=f"ttlSecondsAfterFinished={ttl} passed; deleting the job.")
    requeue = None if ttl is None or job.completion_s is None else job.completion_s + ttl - now_s
    live = [p for p in pods if not p.deleting]
    doomed = _to_clean(policy, live)
    if doomed or stuck:
        return Decision(action=CLEANUP, phase=job.phase, reason="CleanPodPolicy",
                        message=f"Deleting {len(doomed) + len(stuck)} pod(s) (cleanPodPolicy "
                                f"{policy.clean_pod_policy}).",
                        delete_pods=doomed, force_delete_pods=stuck, requeue_s=requeue)
    if len(live) < len(pods):  # terminating, not stuck yet: look again when they would be
        return Decision(action=NOTHING, phase=job.phase, reason="", message="",
                        requeue_s=min(requeue if requeue is not None else float("inf"),
                                      max(POLL_DELETING_S, 5.0)))
    return Decision(action=NOTHING, phase=job.phase, reason="", message="", requeue_s=requeue)


def _to_clean(policy: RunPolicy, pods: Sequence[PodState]) -> tuple[str, ...]:
    """Pods to delete when the job ends: All, Running (those not terminated), or None."""
    if policy.clean_pod_policy == "All":
        return _names(pods)
    if policy.clean_pod_policy == "Running":
        return _names([p for p in pods if p.phase not in TERMINATED])
    return ()


def _names(pods: Sequence[PodState]) -> tuple[str, ...]:
    return tuple(sorted(p.name for p in pods))
