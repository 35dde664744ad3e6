"""Read and write the job's ``status`` (pure).

Every key written here is declared in the CRD's status schema (shared/cases/24: a structural
schema silently prunes undeclared status fields); ``STATUS_KEYS`` lists them for that test.
``status.progress`` is written by :mod:`hetero_operator.controller.progress` (rank 0's metrics).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hetero_operator.api import conditions as c
from hetero_operator.api import limits
from hetero_operator.api.labels import (ANNOTATION_GPU_TYPE, ANNOTATION_RANKS, LABEL_ATTEMPT,
                                        LABEL_RANK, LABEL_ROLE, ROLE_KEEPER)
from hetero_operator.api.memoryplan import MemoryPlan
from hetero_operator.api.pipelineplan import PipelinePlan
from hetero_operator.api.spec import JobSpec
from hetero_operator.api.types import ExcludedNode, Plan
from hetero_operator.lifecycle.disruptions import SHUTDOWN_REASONS, STOPPED_AT_CHECKPOINT
from hetero_operator.lifecycle.restart import BACKOFF_LIMIT_EXCEEDED
from hetero_operator.lifecycle import elastic, startup
from hetero_operator.lifecycle.stuck import stuck_of
from hetero_operator.lifecycle.values import FAIL, REPLAN, Decision, JobState, NodeLoss, PodState
from hetero_operator.planning.marginal import VALUE_STATUS_KEYS, value_status
from hetero_operator.render.pods import pod_units
from heterotrain_common.envnames import PREEMPTED_EXIT_CODE

STATUS_KEYS = frozenset({
    "phase", "message", "observedGeneration", "conditions", "restarts", "replans", "attempt",
    "infrastructureRestarts", "lastDisruption", "lastNodeLoss",
    "ranksWanted", "ranksRunning", "ranksSummary", "gpuTypes", "startTime", "lastStartTime",
    "completionTime", "restartNotBefore", "lastFailure", "plan", "progress",
    "createRefusals", "createRetryTime", "result", "elastic",
})
PLAN_KEYS = frozenset({"worldSize", "masterAddr", "masterPort", "expectedSpeedupOverEqual",
                       "groups", "excluded", "excludedCount", "excludedReasons", "pods",
                       "memory", "pipeline", "layout"}) | VALUE_STATUS_KEYS
MEMORY_KEYS = frozenset({"requested", "mode", "stateBytes", "reasons", "gpuTypes"})
MEMORY_TYPE_KEYS = frozenset({"gpuType", "ranks", "usableBytes", "stateSharePercent", "stateBytes",
                              "microBatches", "activationCheckpointing", "peakBytes"})
GROUP_KEYS = frozenset({"index", "pod", "node", "gpuType", "architecture", "resourceName", "image",
                        "precision", "firstRank", "ranks", "localBatches"})
PROGRESS_KEYS = frozenset({"step", "samplesPerSecond", "loss", "efficiency", "predictionRatio",
                           "updateTime", "totalSteps", "eta"})


STALE_PROGRESS_KEYS: dict[str, tuple[str, ...]] = {
    c.SUCCEEDED: ("eta",), c.FAILED: ("eta",),
    c.SUSPENDED: ("eta", "samplesPerSecond"), c.RESTARTING: ("eta", "samplesPerSecond"),
    c.PENDING: ("eta", "samplesPerSecond"),
}
"""``status.progress`` keys dropped in a phase where no rank steps (a queued, evicted or
restarting job showed its last rate, a finished one its last eta; issue 33): the step, total and
loss stay."""


def job_state(status: Mapping[str, Any]) -> JobState:
    """The persisted lifecycle state from ``status`` (missing keys take their defaults)."""
    plan = status.get("plan") or {}
    return JobState(
        phase=str(status.get("phase") or ""), restarts=int(status.get("restarts") or 0),
        infrastructure_restarts=int(status.get("infrastructureRestarts") or 0),
        attempt=int(status.get("attempt") or 0), start_s=c.parse_iso(status.get("startTime")),
        completion_s=c.parse_iso(status.get("completionTime")),
        restart_not_before_s=c.parse_iso(status.get("restartNotBefore")),
        planned_pods=tuple(plan.get("pods") or ()), replans=int(status.get("replans") or 0),
    )


def pod_state(pod: Mapping[str, Any], planned_node: str = "",
              events: Iterable[Mapping[str, Any]] = ()) -> PodState:
    """Summarise a ``v1/Pod`` dict for :func:`hetero_operator.lifecycle.decisions.decide`
    (``events``: Events about the pod, for :func:`hetero_operator.lifecycle.stuck.stuck_of`)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    st = pod.get("status") or {}
    annotations = meta.get("annotations") or {}
    stuck, stuck_message = stuck_of(pod, events)
    done = startup.worker_terminated(st)
    keeper = labels.get(LABEL_ROLE) == ROLE_KEEPER  # no rank: never "rank 0", no rank counted
    return PodState(
        name=meta.get("name", ""), first_rank=-1 if keeper else int(labels.get(LABEL_RANK, "0")),
        phase=st.get("phase") or "Pending",
        node=(pod.get("spec") or {}).get("nodeName") or pinned_node(pod) or planned_node,
        deleting=bool(meta.get("deletionTimestamp")),
        deletion_s=c.parse_iso(meta.get("deletionTimestamp")),
        created_s=c.parse_iso(meta.get("creationTimestamp")),
        attempt=int(labels.get(LABEL_ATTEMPT, "0")),
        gpu_type=annotations.get(ANNOTATION_GPU_TYPE, ""),
        ranks=0 if keeper else ranks_of(annotations.get(ANNOTATION_RANKS, "")),
        failure=_failure(st),
        disruption=disruption(st),
        stuck=stuck, stuck_message=stuck_message,
        log_tail=startup.log_tail(done), startup_error=startup.startup_error(done),
        result=startup.result(done), unschedulable=startup.unschedulable(st),
    )


def pinned_node(pod: Mapping[str, Any]) -> str:
    """The node a pod not yet bound is pinned to (its required node affinity's ``metadata.name``
    field, as :func:`hetero_operator.render.pods.node_affinity` writes it); ``""`` when none (an
    elastic pod coming back on another node than ``status.plan`` says)."""
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    terms = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or ()
    pins = [str(f["values"][0]) for term in terms[:1] for f in term.get("matchFields") or ()
            if f.get("key") == "metadata.name" and f.get("operator") == "In"
            and len(f.get("values") or ()) == 1]
    return pins[-1] if pins else ""  # ours comes after a template's own fields


def ranks_of(text: str) -> int:
    """Number of ranks in an :data:`~hetero_operator.api.labels.ANNOTATION_RANKS` annotation
    (``"3"`` -> 1, ``"2-5"`` -> 4).

    The annotation, not the pod name, says how many ranks a pod runs (one place; MIG pods run
    one rank each, a whole-GPU group pod runs the group).  Missing or malformed -> 1.
    """
    first, _, last = text.partition("-")
    try:
        return int(last) - int(first) + 1 if last else 1
    except ValueError:
        return 1


def disruption(st: Mapping[str, Any]) -> str:
    """Why the cluster stopped the pod (:attr:`PodState.disruption`), ``""`` when it did not.

    ``status.reason`` of a node shutdown (``Shutdown``, ``NodeShutdown``, ``Terminated``) or a
    kubelet eviction (``Evicted``) wins; otherwise the reason of a ``DisruptionTarget``
    condition with status True (Kubernetes 1.26+, https://kubernetes.io/docs/concepts/workloads/pods/disruptions/#pod-disruption-conditions).
    """
    reason = str(st.get("reason") or "")
    if reason in SHUTDOWN_REASONS or reason == "Evicted":
        return reason
    for cond in st.get("conditions") or ():
        if cond.get("type") == "DisruptionTarget" and str(cond.get("status")) == "True":
            return str(cond.get("reason") or "DisruptionTarget")
    for cs in st.get("containerStatuses") or ():  # the ranks stopped at an agreed step (SIGTERM)
        done = (cs.get("state") or {}).get("terminated") or {}
        if cs.get("name") == "worker" and done.get("exitCode") == PREEMPTED_EXIT_CODE:
            return STOPPED_AT_CHECKPOINT
    return ""


def _failure(st: Mapping[str, Any]) -> str:
    for cs in st.get("containerStatuses") or ():
        term = (cs.get("state") or {}).get("terminated")
        if term and term.get("exitCode", 0) != 0:
            return f"{term.get('reason') or 'Error'} exit {term.get('exitCode')}"
    return st.get("reason") or ""


def plan_status(job_name: str, plan: Plan, *, master_addr: str, master_port: int) -> dict[str, Any]:
    """``status.plan``: where each rank went (one entry per group) and the excluded nodes."""
    units = pod_units(job_name, plan)
    first_pod = {}
    for u in units:
        first_pod.setdefault(u.group.index, u.name)
    return {
        "worldSize": plan.world_size, "masterAddr": master_addr, "masterPort": master_port,
        "expectedSpeedupOverEqual": f"{plan.expected_speedup_over_equal:.2f}",
        "pods": [u.name for u in units],
        "groups": [{
            "index": g.index, "pod": first_pod[g.index], "node": g.node, "gpuType": g.gpu_type,
            "architecture": g.architecture, "resourceName": g.resource_name, "image": g.image,
            "precision": g.precision, "firstRank": g.ranks[0], "ranks": len(g.ranks),
            "localBatches": list(g.local_batches)} for g in plan.groups],
        **excluded_status(plan.excluded),
        **value_status(plan.value),
        **({"memory": memory_status(plan.memory)} if plan.memory is not None else {}),
        **({"pipeline": pipeline_status(plan.pipeline)} if plan.pipeline is not None else {}),
        **({"layout": {"chosen": plan.layout.chosen, "reasons": list(plan.layout.reasons)}}
           if plan.layout is not None else {}),
    }


def pipeline_status(pipeline: PipelinePlan) -> dict[str, Any]:
    """``status.plan.pipeline``: the stages per GPU type in pipeline order (its ranks, its blocks,
    a rank's planned memory), the micro-batches, the schedule and the bubble."""
    return {
        "microBatches": pipeline.micro_batches, "schedule": pipeline.schedule,
        "bubbleFraction": f"{pipeline.bubble_fraction:.4f}",
        "stages": [{"stage": s.index, "gpuType": s.gpu_type, "ranks": list(s.ranks),
                    "firstBlock": s.first_block, "blocks": s.blocks,
                    "memoryBytes": s.memory_bytes} for s in pipeline.stages],
    }


def excluded_status(excluded: Sequence[ExcludedNode]) -> dict[str, Any]:
    """``status.plan.excluded`` (at most :data:`limits.EXCLUDED_MAX` nodes), ``excludedCount`` (all
    of them) and ``excludedReasons`` (a count per reason).

    At 2,000 nodes a plan can exclude more nodes than the CRD's ``maxItems`` allows, and the API
    server then refuses the whole status write; so the list keeps the first nodes of every reason
    in turn (each reason shown, none crowding out the others), in the plan's order.
    """
    by_reason: dict[str, list[int]] = {}
    for i, e in enumerate(excluded):
        by_reason.setdefault(e.reason, []).append(i)
    keep: set[int] = set()
    queues = [by_reason[r] for r in sorted(by_reason)]
    depth = 0
    while len(keep) < min(len(excluded), limits.EXCLUDED_MAX):
        for q in queues:
            if depth < len(q) and len(keep) < limits.EXCLUDED_MAX:
                keep.add(q[depth])
        depth += 1
    counts = sorted(by_reason.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return {
        "excluded": [{"node": e.node, "reason": e.reason, "message": e.message}
                     for i, e in enumerate(excluded) if i in keep],
        "excludedCount": len(excluded),
        "excludedReasons": [{"reason": r, "count": len(ix)}
                            for r, ix in counts[:limits.EXCLUDED_REASONS_MAX]],
    }


def memory_status(memory: MemoryPlan) -> dict[str, Any]:
    """``status.plan.memory``: the sharding mode chosen and why, and per GPU type what a rank of it
    holds (the largest figure among its ranks: most state, most micro-batches, highest peak).

    Per GPU type rather than per rank, so the status stays small at 1,024 ranks; ``heterotrain
    plan`` prints the per-rank table.
    """
    by_type: dict[str, list[Any]] = {}
    for r in memory.ranks:
        by_type.setdefault(r.gpu_type, []).append(r)
    return {
        "requested": memory.requested, "mode": memory.mode, "stateBytes": memory.state_bytes,
        "reasons": list(memory.reasons),
        "gpuTypes": [{
            "gpuType": t, "ranks": len(rs), "usableBytes": min(r.usable_bytes for r in rs),
            "stateSharePercent": f"{max(r.state_share_ppm for r in rs) / 1e4:.2f}",
            "stateBytes": max(r.state_bytes for r in rs),
            "microBatches": max(r.micro_batches for r in rs),
            "activationCheckpointing": any(r.activation_checkpointing for r in rs),
            "peakBytes": max(r.peak_bytes for r in rs)} for t, rs in by_type.items()],
    }


def node_loss_status(loss: NodeLoss) -> dict[str, Any]:
    """``status.lastNodeLoss``: which node, why, since when, when it counted as lost, its pods."""
    return {"node": loss.node, "reason": loss.why, "notReadySince": c.now_iso(loss.since_s),
            "lostTime": c.now_iso(loss.lost_s), "pods": list(loss.pods)}


def ranks_running(states: Iterable[PodState]) -> int:
    """Ranks whose pods are Running and not terminating."""
    return sum(p.ranks for p in states if p.phase == "Running" and not p.deleting)


def gpu_types_text(groups: Iterable[Mapping[str, Any]]) -> str:
    """``"NVIDIA-A100-SXM4-40GB:1,Tesla-T4:2"``: ranks per GPU type in first-seen order."""
    counts: dict[str, int] = {}
    for g in groups:
        counts[g["gpuType"]] = counts.get(g["gpuType"], 0) + int(g["ranks"])
    return ",".join(f"{k}:{v}" for k, v in counts.items())


def decided_status(status: Mapping[str, Any], d: Decision, states: Iterable[PodState], *,
                   generation: Any, now_s: float, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The job's new ``status`` once decision ``d`` is taken: phase, ``observedGeneration``, the
    message and its condition, the restart counters, the last failure, disruption and node loss,
    when a restart may start, the completion time and the running ranks.

    Args:
        status: the current status.
        d: the lifecycle's decision.
        states: the job's pods.
        generation: ``metadata.generation`` of the job.
        now_s: the clock, epoch seconds.
        extra: more keys to set first (e.g. the plan of a start).
    """
    new = dict(status, phase=d.phase, observedGeneration=generation, **(extra or {}))
    if d.message:
        new["message"] = d.message
        new["conditions"] = c.apply_phase(status.get("conditions") or [], phase=d.phase,
                                          reason=d.reason, message=d.message, now_s=now_s,
                                          generation=generation)
    if d.count_restart:
        new["restarts"] = int(status.get("restarts") or 0) + 1
        new["lastFailure"] = d.message.split(";")[0]
    if d.count_infrastructure_restart:
        new["infrastructureRestarts"] = int(status.get("infrastructureRestarts") or 0) + 1
    if d.disruption:
        new["lastDisruption"] = d.disruption
    if d.node_loss is not None:
        new["lastNodeLoss"] = node_loss_status(d.node_loss)
    if d.restart_not_before_s is not None:
        new["restartNotBefore"] = c.now_iso(d.restart_not_before_s)
    if d.elastic is not None:
        new["elastic"] = dict(d.elastic)
    if d.action == REPLAN:
        new["replans"] = int(status.get("replans") or 0) + 1
    if d.action == FAIL and d.reason == BACKOFF_LIMIT_EXCEEDED:
        new["lastFailure"] = d.message.split(";")[0]
    if d.phase in c.FINISHED_PHASES and not status.get("completionTime"):
        new["completionTime"] = c.now_iso(now_s)
    if d.phase == c.SUCCEEDED:  # the result and the final progress, from rank 0's message
        new.update(final_status(status, states, now_s))
    stale = STALE_PROGRESS_KEYS.get(d.phase, ())
    if new.get("progress") and any(k in new["progress"] for k in stale):  # no rank steps now
        new["progress"] = {k: v for k, v in new["progress"].items() if k not in stale}
    plan = status.get("plan") or {}
    wanted = int(plan.get("worldSize") or status.get("ranksWanted") or 0)
    running = ranks_running(states)
    new.update(ranksRunning=running, ranksSummary=f"{running}/{wanted}")
    if wanted:
        new["ranksWanted"] = wanted
    return new


def final_status(status: Mapping[str, Any], states: Iterable[PodState], now_s: float) -> dict[str, Any]:
    """``status.result`` and the final ``status.progress`` of a succeeded job, from the result
    rank 0 left in its termination message (:mod:`hetero_operator.lifecycle.startup`): the last
    step, total steps and loss replace the mid-run reading and the ``eta`` goes; ``{}`` when rank
    0 left none (a script that reports nothing: the last reading stays)."""
    rank0 = next((p for p in states if p.first_rank == 0 and p.result), None)
    result = startup.result_status(rank0.result if rank0 is not None else None)
    if not result:
        return {}
    progress = {k: v for k, v in (status.get("progress") or {}).items() if k != "eta"}
    progress.update({k: result[k] for k in ("step", "totalSteps", "loss") if k in result},
                    updateTime=c.now_iso(now_s))
    if "step" not in progress:
        return {"result": result}
    return {"result": result, "progress": progress}


def planned_nodes(status: Mapping[str, Any]) -> dict[str, str]:
    """``{pod: node}`` of the first pod of every group of ``status.plan`` (a pod not bound yet is
    pinned there); ``{}`` without a plan."""
    return {g["pod"]: g["node"] for g in (status.get("plan") or {}).get("groups") or ()}


def profile_note(spec: JobSpec) -> str:
    """Where the ranks write profiler traces (annotation
    :data:`~hetero_operator.api.labels.ANNOTATION_PROFILE_STEPS`), for the Created condition's
    message; ``""`` when not profiling."""
    if spec.profile_steps is None:
        return ""
    first, last = spec.profile_steps
    where = (f"{spec.training.checkpoint_path}/profiles/" if spec.training.checkpoint_path
             else "./profiles/ in each container (lost with the pod: set spec.training.checkpoint)")
    volume = (f" on PersistentVolumeClaim {spec.training.checkpoint_pvc}"
              if spec.training.checkpoint_path and spec.training.checkpoint_pvc else "")
    return (f" Profiling steps {first}-{last}: every rank writes "
            f"{where}rank-<r>-steps-{first}-{last}.trace.json{volume}.")


def placed_message(spec: JobSpec, plan: Plan, plan_status: Mapping[str, Any]) -> str:
    """The Created condition's message of a start: ranks, nodes, GPU types, the expected speedup
    (``plan_status`` is :func:`plan_status` of ``plan``) and where profiles go."""
    return (f"Placed {plan.world_size} ranks on {len(plan.nodes)} node(s) "
            f"({gpu_types_text(plan_status['groups'])}); expected speedup over an equal split "
            f"{plan_status['expectedSpeedupOverEqual']}x.") + profile_note(spec)


@dataclass(frozen=True, kw_only=True, slots=True)
class Refusals:
    """The API server's refusals of the job's current start (``status.createRefusals``).

    Attributes:
        count: refused starts in a row (0: none).
        retry_s: when the next start may be tried, epoch seconds; None without a refusal
            (``status.createRetryTime``; only while the job is ``Pending``).
        message: the status message, which carries the server's word.
    """

    count: int = 0
    retry_s: float | None = None
    message: str = ""


def refusals(status: Mapping[str, Any]) -> Refusals:
    """:class:`Refusals` from ``status``."""
    count = int(status.get("createRefusals") or 0)
    retry = (c.parse_iso(status.get("createRetryTime"))
             if count and status.get("phase") == c.PENDING else None)
    return Refusals(count=count, retry_s=retry, message=str(status.get("message") or ""))


@dataclass(frozen=True, kw_only=True, slots=True)
class StartStatus:
    """The status of a start: ``before`` is written before any pod is created; ``created`` once
    every pod was admitted (it differs only after refusals: the job stays ``Pending`` with the
    server's word until a start worked)."""

    before: dict[str, Any]
    created: dict[str, Any]


def started_status(status: Mapping[str, Any], spec: JobSpec, plan: Plan, plan_status: Mapping[str, Any],
                   *, attempt: int, generation: Any, now_s: float) -> StartStatus:
    """The job's ``status`` once its pods of ``attempt`` are planned: the plan, the attempt, the
    ranks wanted, the GPU types, the start times and the Created condition.

    Args:
        status: the current status.
        spec: the job.
        plan: its plan; ``plan_status`` is :func:`plan_status` of it.
        attempt: the attempt the pods belong to (1 for the first start).
        generation: ``metadata.generation`` of the job.
        now_s: the clock, epoch seconds.
    """
    message = placed_message(spec, plan, plan_status)
    new = dict(status, plan=dict(plan_status), attempt=attempt, ranksWanted=plan.world_size,
               ranksRunning=0, ranksSummary=f"0/{plan.world_size}",
               gpuTypes=gpu_types_text(plan_status["groups"]), lastStartTime=c.now_iso(now_s),
               phase=c.CREATED, message=message, observedGeneration=generation)
    new.setdefault("startTime", c.now_iso(now_s))
    new.pop("restartNotBefore", None)
    new.pop("elastic", None)
    if spec.elastic is not None:  # generation 0 of this attempt: every planned rank
        new["elastic"] = elastic.started(plan.world_size, [
            (g["gpuType"], int(g["ranks"])) for g in plan_status["groups"]], attempt)
    new["conditions"] = c.apply_phase(status.get("conditions") or [], phase=c.CREATED,
                                      reason="PodsCreated", message=message, now_s=now_s,
                                      generation=generation)
    created = {k: v for k, v in new.items() if k not in ("createRefusals", "createRetryTime")}
    if refusals(status).count:  # a retry after a refusal stays Pending with the server's word
        new.update({k: status[k] for k in ("phase", "message", "conditions") if k in status})
    return StartStatus(before=new, created=created)


def refused_status(started: Mapping[str, Any], *, reason: str, message: str, refusals_count: int,
                   retry_s: float, conditions: Iterable[Mapping[str, Any]], generation: Any,
                   now_s: float) -> dict[str, Any]:
    """The job's ``status`` after the API server refused pods of the start whose status is
    ``started``: ``Pending`` with ``message``, the refusals counted, the time of the next try.

    Args:
        started: :attr:`StartStatus.before` of the refused start.
        reason: the condition's reason (``PodsRefused``).
        message: the server's word and the backoff.
        refusals_count: refused starts in a row, this one included.
        retry_s: when the next start may be tried, epoch seconds.
        conditions: the conditions before the start.
        generation / now_s: as :func:`started_status`.
    """
    new = dict(started, phase=c.PENDING, message=message, createRefusals=refusals_count,
               createRetryTime=c.now_iso(retry_s), ranksRunning=0)
    new["conditions"] = c.apply_phase(conditions, phase=c.PENDING, reason=reason, message=message,
                                      now_s=now_s, generation=generation)
    return new


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns status ``old`` into ``new``; empty when equal.

    A merge patch keeps what it does not name, so every key ``old`` has and ``new`` lacks is sent
    as ``None``: at the top level and one level down, in nested mappings such as
    ``status.progress`` (a finished job kept its ``progress.eta`` before this).
    """
    def value(before: Any, after: Any) -> Any:
        if isinstance(before, Mapping) and isinstance(after, Mapping):
            return {**{k: None for k in before if k not in after}, **after}
        return after

    changed = {k: value(old.get(k), v) for k, v in new.items() if old.get(k) != v}
    return {**changed, **{k: None for k in old if k not in new}}
