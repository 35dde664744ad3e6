"""Read and write the job's ``status`` (pure).

Every key written here is declared in the CRD's status schema (shared/cases/24: a structural
schema silently prunes undeclared status fields); ``STATUS_KEYS`` lists them for that test.
Progress comes from rank 0's Prometheus endpoint (worker metric names in docs/internal-api.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from hetero_operator import conditions as c
from hetero_operator.lifecycle import JobState, PodState
from hetero_operator.model import Plan
from hetero_operator.rendering import (ANNOTATION_GPU_TYPE, LABEL_ATTEMPT, LABEL_RANK, pod_units)

STATUS_KEYS = frozenset({
    "phase", "message", "observedGeneration", "conditions", "restarts", "replans", "attempt",
    "ranksWanted", "ranksRunning", "ranksSummary", "gpuTypes", "startTime", "lastStartTime",
    "completionTime", "restartNotBefore", "lastFailure", "plan", "progress",
})
PLAN_KEYS = frozenset({"worldSize", "masterAddr", "masterPort", "expectedSpeedupOverEqual",
                       "groups", "excluded", "pods"})
GROUP_KEYS = frozenset({"index", "pod", "node", "gpuType", "architecture", "resourceName", "image",
                        "precision", "firstRank", "ranks", "localBatches"})
PROGRESS_KEYS = frozenset({"step", "samplesPerSecond", "loss", "updateTime"})


def job_state(status: Mapping[str, Any]) -> JobState:
    """The persisted lifecycle state from ``status`` (missing keys take their defaults)."""
    plan = status.get("plan") or {}
    return JobState(
        phase=str(status.get("phase") or ""), restarts=int(status.get("restarts") or 0),
        attempt=int(status.get("attempt") or 0), start_s=c.parse_iso(status.get("startTime")),
        completion_s=c.parse_iso(status.get("completionTime")),
        restart_not_before_s=c.parse_iso(status.get("restartNotBefore")),
        planned_pods=tuple(plan.get("pods") or ()),
    )


def pod_state(pod: Mapping[str, Any], planned_node: str = "") -> PodState:
    """Summarise a ``v1/Pod`` dict for :func:`hetero_operator.lifecycle.decide`."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    st = pod.get("status") or {}
    return PodState(
        name=meta.get("name", ""), first_rank=int(labels.get(LABEL_RANK, "0")),
        phase=st.get("phase") or "Pending",
        node=(pod.get("spec") or {}).get("nodeName") or planned_node,
        deleting=bool(meta.get("deletionTimestamp")),
        created_s=c.parse_iso(meta.get("creationTimestamp")),
        attempt=int(labels.get(LABEL_ATTEMPT, "0")),
        gpu_type=(meta.get("annotations") or {}).get(ANNOTATION_GPU_TYPE, ""),
        failure=_failure(st),
    )


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
        "excluded": [{"node": e.node, "reason": e.reason, "message": e.message}
                     for e in plan.excluded],
    }


def gpu_types_text(groups: Iterable[Mapping[str, Any]]) -> str:
    """``"NVIDIA-A100-SXM4-40GB:1,Tesla-T4:2"``: ranks per GPU type in first-seen order."""
    counts: dict[str, int] = {}
    for g in groups:
        counts[g["gpuType"]] = counts.get(g["gpuType"], 0) + int(g["ranks"])
    return ",".join(f"{k}:{v}" for k, v in counts.items())


@dataclass(frozen=True, kw_only=True, slots=True)
class Progress:
    """Rank 0's training progress.

    Attributes:
        step: optimizer steps completed (``htj_steps_total``).
        samples_per_s: global throughput, samples/s: rank 0's last-step throughput
            (``htj_throughput_samples_per_second``) scaled by global / local batch (ranks step
            together, so every rank's step time is the global step time).
        loss: last loss (``htj_loss``), ``None`` when absent.
    """

    step: int
    samples_per_s: float
    loss: float | None = None


def parse_progress(metrics_text: str, global_batch: int) -> Progress | None:
    """Read rank 0's ``/metrics`` text; ``None`` when it has no ``htj_steps_total`` yet."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in ("htj_steps_total", "htj_throughput_samples_per_second",
                               "htj_local_batch_size", "htj_loss"):
                values[sample.name] = sample.value
    if "htj_steps_total" not in values:
        return None
    local = values.get("htj_local_batch_size") or 0
    rate = values.get("htj_throughput_samples_per_second", 0.0)
    scale = global_batch / local if local > 0 else 1.0
    return Progress(step=int(values["htj_steps_total"]), samples_per_s=rate * scale,
                    loss=values.get("htj_loss"))


def progress_status(progress: Progress, now_s: float) -> dict[str, Any]:
    """``status.progress`` (decimals as strings: no floats in the API object)."""
    out: dict[str, Any] = {"step": progress.step, "samplesPerSecond": f"{progress.samples_per_s:.1f}",
                           "updateTime": c.now_iso(now_s)}
    if progress.loss is not None:
        out["loss"] = f"{progress.loss:.4f}"
    return out
