"""What to do next with a job, given its status, its pods and the nodes (pure decisions).

:func:`decide` is the whole lifecycle: the reconciler observes, calls it, and carries out the
returned :class:`Decision` (delete pods, plan and create pods, write status, delete the job).
Rules (issue 4, Kubeflow's run policy; shared/cases/21):

* a failed rank pod restarts the *whole* gang (collectives need every rank), counted in
  ``status.restarts`` against ``backoffLimit``, after an exponential delay; past the limit the
  job fails with ``BackoffLimitExceeded``;
* pods Pending past ``pending_timeout_s`` or on a node that disappeared are deleted and the job
  re-planned, not counted as restarts;
* ``suspend`` deletes pods and keeps state; ``activeDeadlineSeconds`` fails the job;
  ``ttlSecondsAfterFinished`` deletes it; ``cleanPodPolicy`` picks the pods deleted at the end.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from hetero_operator import conditions as c
from hetero_operator.spec import RunPolicy

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


@dataclass(frozen=True, kw_only=True, slots=True)
class PodState:
    """What matters of one rank pod.

    Attributes:
        name: pod name.
        first_rank: global rank of its local rank 0.
        phase: ``Pending``, ``Running``, ``Succeeded``, ``Failed`` or ``Unknown``.
        node: node name (``spec.nodeName`` or the planned node); ``""`` when unknown.
        deleting: ``metadata.deletionTimestamp`` is set.
        created_s: creation time, epoch seconds; ``None`` when unknown.
        attempt: the ``heterotrain.io/attempt`` label.
        gpu_type: the ``heterotrain.io/gpu-type`` annotation.
        failure: ``"OOMKilled exit 137"`` style summary of a failed container, ``""`` otherwise.
    """

    name: str
    first_rank: int
    phase: str
    node: str = ""
    deleting: bool = False
    created_s: float | None = None
    attempt: int = 0
    gpu_type: str = ""
    failure: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class JobState:
    """The job's persisted progress (all from ``status``, so it survives operator restarts).

    Attributes:
        phase: ``status.phase`` (``""`` before the first reconcile).
        restarts: whole-job restarts so far.
        attempt: generation of the current pods.
        start_s: first pod creation, epoch seconds.
        completion_s: when it succeeded or failed.
        restart_not_before_s: earliest next start after a failure.
        planned_pods: pod names of the current plan (empty when no plan).
    """

    phase: str = ""
    restarts: int = 0
    attempt: int = 0
    start_s: float | None = None
    completion_s: float | None = None
    restart_not_before_s: float | None = None
    planned_pods: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Timing:
    """Operator timeouts in seconds (from :class:`hetero_operator.config.OperatorConfig`)."""

    pending_timeout_s: float = 300.0
    backoff_base_s: float = 10.0
    backoff_max_s: float = 300.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Decision:
    """The next step.

    Attributes:
        action: one of the module's action constants.
        phase: the phase to record (unchanged phase for ``Cleanup``/``Nothing``).
        reason: CamelCase reason for the condition and the event.
        message: one sentence.
        delete_pods: pod names to delete now.
        requeue_s: look again after this many seconds; ``None`` = on the next event or resync.
        count_restart: add one to ``status.restarts``.
        restart_not_before_s: new ``status.restartNotBefore``, epoch seconds.
    """

    action: str
    phase: str
    reason: str
    message: str
    delete_pods: tuple[str, ...] = ()
    requeue_s: float | None = None
    count_restart: bool = False
    restart_not_before_s: float | None = None


def backoff_s(restarts: int, timing: Timing) -> float:
    """Delay before restart number ``restarts`` (1-based): ``base * 2**(restarts-1)``, capped."""
    return min(timing.backoff_base_s * 2 ** max(restarts - 1, 0), timing.backoff_max_s)


def decide(job: JobState, policy: RunPolicy, pods: Sequence[PodState], *,
           nodes: Collection[str] | None, now_s: float, timing: Timing = Timing()) -> Decision:
    """Decide the next step of one job.

    Args:
        job: persisted state.
        policy: ``spec.runPolicy``.
        pods: the job's pods (all attempts).
        nodes: names of the nodes that exist; ``None`` when unknown (skips the node check).
        now_s: current time, epoch seconds.
        timing: operator timeouts.

    Returns:
        The :class:`Decision`.
    """
    if job.phase in c.FINISHED_PHASES:
        return _finished(job, policy, pods, now_s)
    live = [p for p in pods if not p.deleting]
    if policy.suspend:
        return Decision(action=SUSPEND, phase=c.SUSPENDED, reason="Suspended",
                        message="The job is suspended (spec.runPolicy.suspend); its pods are deleted and its state kept.",
                        delete_pods=_names(live))
    deadline = policy.active_deadline_seconds
    if deadline is not None and job.start_s is not None and now_s >= job.start_s + deadline:
        return Decision(action=FAIL, phase=c.FAILED, reason="DeadlineExceeded",
                        message=f"The job ran longer than activeDeadlineSeconds={deadline}.",
                        delete_pods=_to_clean(policy, live))
    if len(live) < len(pods):
        return Decision(action=WAIT, phase=job.phase or c.PENDING, reason="PodsTerminating",
                        message="Waiting for the previous pods to terminate.",
                        requeue_s=POLL_DELETING_S)
    stale = [p for p in live if p.attempt != job.attempt]
    if stale:
        return Decision(action=WAIT, phase=job.phase or c.PENDING, reason="StalePods",
                        message=f"Deleting {len(stale)} pod(s) of an earlier attempt.",
                        delete_pods=_names(stale), requeue_s=POLL_DELETING_S)
    if not live:
        return _no_pods(job, now_s)
    return _with_pods(job, policy, live, nodes=nodes, now_s=now_s, timing=timing)


def _no_pods(job: JobState, now_s: float) -> Decision:
    if job.restart_not_before_s is not None and now_s < job.restart_not_before_s:
        wait = job.restart_not_before_s - now_s
        return Decision(action=WAIT, phase=c.RESTARTING, reason="BackoffDelay",
                        message=f"Restart {job.restarts} starts in {wait:.0f} s (exponential backoff).",
                        requeue_s=wait)
    return Decision(action=START, phase=c.CREATED, reason="Planning", message="Planning the job.")


def _with_pods(job: JobState, policy: RunPolicy, pods: Sequence[PodState], *,
               nodes: Collection[str] | None, now_s: float, timing: Timing) -> Decision:
    failed = [p for p in pods if p.phase == "Failed"]
    if failed:
        return _on_failure(job, policy, pods, failed, now_s, timing)
    rank0 = next((p for p in pods if p.first_rank == 0), None)
    if rank0 is not None and rank0.phase == "Succeeded":
        return Decision(action=SUCCEED, phase=c.SUCCEEDED, reason="JobSucceeded",
                        message="Rank 0 completed successfully.",
                        delete_pods=_to_clean(policy, pods))
    missing = sorted(set(job.planned_pods) - {p.name for p in pods})
    if missing:
        return _replan("IncompletePodSet", f"Pod(s) {', '.join(missing)} are missing; re-planning "
                       "the whole job (collectives need every rank).", pods)
    if nodes is not None:
        lost = [p for p in pods if p.node and p.node not in nodes and p.phase not in TERMINATED]
        if lost:
            return _replan("NodeLost", f"Node {lost[0].node} of pod {lost[0].name} disappeared; "
                           "re-planning onto the remaining capacity.", pods)
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
                failed: Sequence[PodState], now_s: float, timing: Timing) -> Decision:
    first = min(failed, key=lambda p: p.first_rank)
    what = f"{first.name} ({first.gpu_type or 'unknown GPU'}) failed" + (
        f": {first.failure}" if first.failure else "")
    if job.restarts >= policy.backoff_limit:
        return Decision(action=FAIL, phase=c.FAILED, reason="BackoffLimitExceeded",
                        message=f"{what}; {job.restarts} restart(s) reached backoffLimit "
                                f"{policy.backoff_limit}.",
                        delete_pods=_to_clean(policy, pods))
    n = job.restarts + 1
    delay = backoff_s(n, timing)
    return Decision(action=RESTART, phase=c.RESTARTING, reason="RankFailed",
                    message=f"{what}; restarting all ranks from the last checkpoint "
                            f"(restart {n} of {policy.backoff_limit}) in {delay:.0f} s.",
                    delete_pods=_names(pods), count_restart=True,
                    restart_not_before_s=now_s + delay, requeue_s=POLL_DELETING_S)


def _replan(reason: str, message: str, pods: Sequence[PodState]) -> Decision:
    return Decision(action=REPLAN, phase=c.PENDING, reason=reason, message=message,
                    delete_pods=_names(pods), requeue_s=POLL_DELETING_S)


def _finished(job: JobState, policy: RunPolicy, pods: Sequence[PodState], now_s: float) -> Decision:
    ttl = policy.ttl_seconds_after_finished
    if ttl is not None and job.completion_s is not None and now_s >= job.completion_s + ttl:
        return Decision(action=DELETE_JOB, phase=job.phase, reason="TTLExpired",
                        message=f"ttlSecondsAfterFinished={ttl} passed; deleting the job.")
    requeue = None if ttl is None or job.completion_s is None else job.completion_s + ttl - now_s
    live = [p for p in pods if not p.deleting]
    doomed = _to_clean(policy, live)
    if doomed:
        return Decision(action=CLEANUP, phase=job.phase, reason="CleanPodPolicy",
                        message=f"Deleting {len(doomed)} pod(s) (cleanPodPolicy {policy.clean_pod_policy}).",
                        delete_pods=doomed, requeue_s=requeue)
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
