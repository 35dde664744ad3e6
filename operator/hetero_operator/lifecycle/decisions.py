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
* a pod that will not start whatever the plan (an image pull error, an invalid image name, a
  missing Secret, scheduling gates left on, Multi-Attach: :mod:`hetero_operator.lifecycle.stuck`)
  keeps the job waiting with that reason and fails it after ``pending_timeout_s`` (issue 32, F5);
* pods Pending past ``pending_timeout_s`` otherwise are deleted and the job re-planned: counted
  in ``status.replans`` (not against ``backoffLimit``), each re-plan after an exponential delay,
  and past ``max_replans`` the job fails with ``ReplanLimitExceeded``;
* ``suspend`` deletes pods and keeps state; ``activeDeadlineSeconds`` fails the job;
  ``ttlSecondsAfterFinished`` deletes it; ``cleanPodPolicy`` picks the pods deleted at the end.

Restarts are counted once: a restart is decided only while the job is ``Created``/``Running``
and the reconciler records the new phase before it deletes any pod, so pods still there in
``Restarting``/``Pending`` are leftovers that are only deleted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from hetero_operator.api import conditions as c
from hetero_operator.api.settings import RestartSettings
from hetero_operator.api.spec import RunPolicy
from hetero_operator.cluster.nodehealth import NodeHealth
from hetero_operator.lifecycle import restart
from hetero_operator.lifecycle.elastic import ElasticJob, elastic_decision, without_removed
from hetero_operator.lifecycle.startup import STARTUP_ERROR, result_text
from hetero_operator.lifecycle.stuck import stuck_decision
from hetero_operator.lifecycle.disruptions import (STOPPED_AT_CHECKPOINT, NodeView, disrupted,
                                                   next_unstick_s, removal, stuck)
from hetero_operator.lifecycle.values import (CLEANUP, DELETE_JOB, FAIL, GROW, NOTHING,
                                              POLL_DELETING_S, REPLAN, RESTART, RUNNING, SHRINK,
                                              START, SUCCEED, SUSPEND, TERMINATED, WAIT, Decision, JobState, NodeLoss,
                                              PodState, pod_names)

__all__ = ["CLEANUP", "DELETE_JOB", "FAIL", "GROW", "NOTHING", "SHRINK", "ElasticJob", "POLL_DELETING_S", "REPLAN", "RESTART",
           "RUNNING", "START", "SUCCEED", "SUSPEND", "WAIT", "Decision", "JobState", "NodeLoss",
           "PodState", "RestartSettings", "RunPolicy", "STOPPED_AT_CHECKPOINT", "backoff_s", "decide"]
"""The lifecycle's entry point: :func:`decide` and the values it takes and returns (defined in
:mod:`~hetero_operator.lifecycle.values`, the cluster's part in
:mod:`~hetero_operator.lifecycle.disruptions`)."""


REPLAN_BACKOFF = "ReplanBackoff"
REPLAN_LIMIT_EXCEEDED = "ReplanLimitExceeded"


def backoff_s(restarts: int, timing: RestartSettings) -> float:
    """Delay before restart number ``restarts`` (1-based): :func:`restart.backoff_s` of ``timing``."""
    return restart.backoff_s(restarts, base_s=timing.backoff_base_s, max_s=timing.backoff_max_s)


def decide(job: JobState, policy: RunPolicy, pods: Sequence[PodState], *,
           nodes: Mapping[str, NodeHealth] | None, now_s: float, timing: RestartSettings = RestartSettings(),
           checkpointing: bool = True, restart_from: str = "",
           elastic: ElasticJob | None = None) -> Decision:
    """Decide the next step of one job.

    Args:
        job: persisted state.
        policy: ``spec.runPolicy``.
        pods: the job's pods (all attempts, terminating ones included).
        nodes: health of every node that exists, by name (see
            :func:`hetero_operator.cluster.nodehealth.node_health`); ``None`` when unknown (skips the
            node checks).
        now_s: current time, epoch seconds.
        timing: the operator's restart settings (``HTJ_PENDING_TIMEOUT_S``, ``HTJ_BACKOFF_*``).
        checkpointing: the job sets ``spec.training.checkpoint.path`` (a restart resumes from the
            last checkpoint; without, from step 0: :mod:`hetero_operator.lifecycle.restart`).
        restart_from: where a restart continues, for its message
            (:func:`hetero_operator.lifecycle.ckptplace.restart_source`); ``""``: from ``checkpointing``.
        elastic: a job with ``spec.elastic``: a lost pod shrinks it instead of restarting the
            gang while ``minRanks`` ranks are left, and a removed pod grows back
            (:mod:`hetero_operator.lifecycle.elastic`); None: not elastic.

    Returns:
        The :class:`Decision`.
    """
    health = NodeView(nodes, float(policy.node_loss_grace_seconds), now_s)
    overdue = stuck(pods, health)
    if job.phase in c.FINISHED_PHASES:
        return _finished(job, policy, pods, now_s, overdue)
    live = [p for p in pods if not p.deleting]
    if policy.suspend:
        delete, force = removal(live, health)
        return Decision(action=SUSPEND, phase=c.SUSPENDED, reason="Suspended",
                        message="The job is suspended (spec.runPolicy.suspend); its pods are deleted and its state kept.",
                        delete_pods=delete, force_delete_pods=tuple(sorted({*force, *overdue})))
    deadline = policy.active_deadline_seconds
    if deadline is not None and job.start_s is not None and now_s >= job.start_s + deadline:
        delete, force = removal([p for p in live if p.name in _to_clean(policy, live)], health)
        return Decision(action=FAIL, phase=c.FAILED, reason="DeadlineExceeded",
                        message=f"The job ran longer than activeDeadlineSeconds={deadline}.",
                        delete_pods=delete, force_delete_pods=tuple(sorted({*force, *overdue})))
    if job.phase in (c.CREATED, c.RUNNING) and elastic is not None:
        changed = elastic_decision(job, policy, elastic, pods, health, now_s)
        if changed is not None:
            return changed
    if elastic is not None and elastic.state.lost:  # the gang rules never see the removed pods
        pods = without_removed(pods, elastic.state)
        live = [p for p in pods if not p.deleting]
        job = replace(job, planned_pods=tuple(n for n in job.planned_pods
                                              if n not in elastic.state.removed))
    if job.phase in (c.CREATED, c.RUNNING):
        current = [p for p in pods if p.attempt == job.attempt]
        cluster_did = disrupted(job, policy, current, health, now_s, restart_from=restart_from)
        if cluster_did is not None:
            return cluster_did
    if len(live) < len(pods):
        return Decision(action=WAIT, phase=job.phase or c.PENDING, reason="PodsTerminating",
                        message="Waiting for the previous pods to terminate.",
                        force_delete_pods=overdue, requeue_s=next_unstick_s(pods, health))
    leftovers = live if job.phase in (c.RESTARTING, c.PENDING) else [p for p in live if p.attempt != job.attempt]
    if leftovers:
        delete, force = removal(leftovers, health)
        return Decision(action=WAIT, phase=job.phase or c.PENDING, reason="StalePods",
                        message=f"Deleting {len(leftovers)} pod(s) of an earlier attempt.",
                        delete_pods=delete, force_delete_pods=force, requeue_s=POLL_DELETING_S)
    if not live:
        return _no_pods(job, now_s)
    d = _with_pods(job, policy, live, now_s=now_s, timing=timing, checkpointing=checkpointing,
                   restart_from=restart_from)
    if elastic is not None and job.phase == c.RUNNING and d.phase == c.CREATED:
        return replace(d, phase=c.RUNNING)  # a pod growing back: the others train meanwhile
    return d


def _no_pods(job: JobState, now_s: float) -> Decision:
    if job.restart_not_before_s is not None and now_s < job.restart_not_before_s:
        wait = job.restart_not_before_s - now_s
        if job.phase == c.PENDING:  # after a re-plan
            return Decision(action=WAIT, phase=c.PENDING, reason=REPLAN_BACKOFF,
                            message=f"Re-plan {job.replans} starts in {wait:.0f} s (exponential backoff).",
                            requeue_s=wait)
        return Decision(action=WAIT, phase=c.RESTARTING, reason="BackoffDelay",
                        message=f"Restart {job.restarts} starts in {wait:.0f} s (exponential backoff).",
                        requeue_s=wait)
    return Decision(action=START, phase=c.CREATED, reason="Planning", message="Planning the job.")


def _with_pods(job: JobState, policy: RunPolicy, pods: Sequence[PodState], *,
               now_s: float, timing: RestartSettings, checkpointing: bool = True,
               restart_from: str = "") -> Decision:
    failed = [p for p in pods if p.phase == "Failed"]
    if failed:
        return _on_failure(job, policy, pods, failed, now_s, timing, checkpointing, restart_from)
    rank0 = next((p for p in pods if p.first_rank == 0), None)
    if rank0 is not None and rank0.phase == "Succeeded":
        return Decision(action=SUCCEED, phase=c.SUCCEEDED, reason="JobSucceeded",
                        message=f"Rank 0 completed successfully{result_text(rank0.result)}.",
                        delete_pods=_to_clean(policy, pods))
    missing = sorted(set(job.planned_pods) - {p.name for p in pods})
    if missing:
        return _replan(job, policy, "IncompletePodSet", f"Pod(s) {', '.join(missing)} are missing; "
                       "re-planning the whole job (collectives need every rank)", pods, now_s, timing)
    will_not_start = stuck_decision(pods, now_s=now_s, pending_timeout_s=timing.pending_timeout_s,
                                    clean=_to_clean(policy, pods))
    if will_not_start is not None:
        return will_not_start
    stuck = [p for p in pods if p.phase == "Pending" and p.created_s is not None
             and now_s - p.created_s > timing.pending_timeout_s]
    if stuck:
        return _replan(job, policy, "PendingTimeout", f"Pod {stuck[0].name} was Pending longer than "
                       f"{timing.pending_timeout_s:.0f} s", pods, now_s, timing)
    if all(p.phase in ("Running", "Succeeded") for p in pods):
        return Decision(action=RUNNING, phase=c.RUNNING, reason="JobRunning",
                        message=f"All {len(pods)} pod(s) are running.")
    pending = [p for p in pods if p.phase not in ("Running", "Succeeded")]
    oldest = min((p.created_s for p in pending if p.created_s is not None), default=now_s)
    unplaced = next((p for p in pending if p.unschedulable), None)  # FailedScheduling's word
    why = (f" The scheduler cannot place {unplaced.name}: {unplaced.unschedulable}"
           f"{'' if unplaced.unschedulable.endswith('.') else '.'}" if unplaced else "")
    return Decision(action=WAIT, phase=c.CREATED, reason="PodsPending",
                    message=f"{len(pending)} of {len(pods)} pod(s) are not running yet.{why}",
                    requeue_s=max(oldest + timing.pending_timeout_s - now_s, 0.0) + 0.5)


def _on_failure(job: JobState, policy: RunPolicy, pods: Sequence[PodState],
                failed: Sequence[PodState], now_s: float, timing: RestartSettings,
                checkpointing: bool, restart_from: str = "") -> Decision:
    first = min(failed, key=lambda p: p.first_rank)
    fatal = next((p for p in sorted(failed, key=lambda p: p.first_rank) if p.startup_error), None)
    if fatal is not None:  # the same command in the same image fails again: keep the restarts
        return Decision(
            action=FAIL, phase=c.FAILED, reason=STARTUP_ERROR,
            message=(f"{fatal.name} ({fatal.gpu_type or 'unknown GPU'}) failed at start-up: "
                     f"{fatal.startup_error}; a restart would run the same command in the same "
                     "image, so the job fails without using its restarts "
                     f"(spec.runPolicy.backoffLimit {policy.backoff_limit}): fix "
                     "spec.worker.command/args or the image, then re-create the job."
                     + (f" Last log lines: {fatal.log_tail}" if fatal.log_tail else "")),
            delete_pods=_to_clean(policy, pods))
    what = f"{first.name} ({first.gpu_type or 'unknown GPU'}) failed" + (
        f": {first.failure}" if first.failure else "")
    tail = f" Last log lines of {first.name}: {first.log_tail}" if first.log_tail else ""
    verdict = restart.after_failure(restarts=job.restarts, backoff_limit=policy.backoff_limit,
                                    checkpointing=checkpointing, base_s=timing.backoff_base_s,
                                    max_s=timing.backoff_max_s, source=restart_from)
    if not verdict.restart:
        return Decision(action=FAIL, phase=c.FAILED, reason=verdict.reason,
                        message=f"{what}; {verdict.message}.{tail}", delete_pods=_to_clean(policy, pods))
    return Decision(action=RESTART, phase=c.RESTARTING, reason=verdict.reason,
                    message=f"{what}; {verdict.message}.{tail}",
                    delete_pods=pod_names(pods), count_restart=True,
                    restart_not_before_s=now_s + verdict.delay_s, requeue_s=POLL_DELETING_S)


def _replan(job: JobState, policy: RunPolicy, reason: str, what: str, pods: Sequence[PodState],
            now_s: float, timing: RestartSettings) -> Decision:
    """Re-plan number ``job.replans + 1`` after its backoff, or fail past ``max_replans``."""
    if job.replans >= timing.max_replans:
        return Decision(action=FAIL, phase=c.FAILED, reason=REPLAN_LIMIT_EXCEEDED,
                        message=(f"{what}; {job.replans} re-plan(s) reached HTJ_MAX_REPLANS="
                                 f"{timing.max_replans}, so the job fails: the cluster keeps placing "
                                 "something else on its nodes, or its pods cannot start there (the "
                                 "pods' Events say why); free capacity or lower spec.gpus.minRanks, "
                                 "then re-create the job."),
                        delete_pods=_to_clean(policy, pods))
    n = job.replans + 1
    delay = backoff_s(n, timing)
    return Decision(action=REPLAN, phase=c.PENDING, reason=reason,
                    message=(f"{what}; re-plan {n} of at most {timing.max_replans} (HTJ_MAX_REPLANS) "
                             f"in {delay:.0f} s."),
                    delete_pods=pod_names(pods), restart_not_before_s=now_s + delay,
                    requeue_s=POLL_DELETING_S)


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
        return pod_names(pods)
    if policy.clean_pod_policy == "Running":
        return pod_names([p for p in pods if p.phase not in TERMINATED])
    return ()
