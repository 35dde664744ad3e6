"""An elastic job's lifecycle on the cluster (``spec.elastic``, issue 31; pure).

Without ``spec.elastic`` a lost rank pod restarts the whole gang
(:mod:`hetero_operator.lifecycle.decisions`). With it, :func:`elastic_decision` is asked first, while
the job is ``Created``/``Running``:

* **shrink**: a rank pod is lost (it failed, its node counts as lost after
  ``nodeLossGraceSeconds``, it was disrupted or deleted by someone else) and the ranks of the other
  pods still number at least ``spec.elastic.minRanks``: only the lost pod is deleted (grace 0 on a
  lost node), the survivors keep running and re-form without it (the job's membership keeper
  announces the new generation: ``hetero_worker.membership.keeper``), nothing is counted in
  ``status.restarts`` or ``status.infrastructureRestarts``. Below ``minRanks`` this module says
  nothing and the gang restart of a job without ``spec.elastic`` happens;
* **grow**: a pod removed by a shrink is created again (same name, with
  ``HTJ_ELASTIC_JOIN_GENERATION=next``: its ranks join the running job at a step boundary with a
  peer's state) on its node once that is healthy again, or, while it is not, on another healthy
  node with as many free whole GPUs of its GPU type (a spot node replaced by a new one), while the job would have at most ``spec.elastic.maxRanks``
  ranks, at most ``spec.runPolicy.backoffLimit`` times per attempt (a pod that fails each time it
  starts would otherwise loop, as in ``heterotrain run``);
* **success**: when rank 0's pod was lost, the job has succeeded once every remaining rank pod has.

Each change is one :class:`ElasticStatus` (``status.elastic``: the operator's membership
generation, the ranks per GPU type, why) and an Event. The pods a shrink removed are kept in it
(:attr:`ElasticStatus.lost`), so :func:`without_removed` can hide their old instances (failed,
terminating) from the gang rules, which would otherwise restart the gang for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hetero_operator.api import conditions as c
from hetero_operator.api.elasticspec import ElasticSpec
from hetero_operator.api.spec import RunPolicy
from hetero_operator.lifecycle.disruptions import DELETED, STOPPED_AT_CHECKPOINT, NodeView
from hetero_operator.lifecycle.values import (GROW, POLL_DELETING_S, SHRINK, SUCCEED, Decision,
                                              JobState, PodState, pod_names)

SHRINK_REASON = "ElasticShrink"
GROW_REASON = "ElasticGrow"
SUCCEED_REASON = "JobSucceeded"
ELASTIC_KEYS = frozenset({"attempt", "generation", "ranks", "gpuTypes", "reason", "message",
                          "lastTransitionTime", "lostPods", "regrows"})
"""The keys of ``status.elastic`` (declared in the CRD's status schema)."""
LOST_POD_KEYS = frozenset({"pod", "node", "gpuType", "ranks", "why"})


@dataclass(frozen=True, kw_only=True, slots=True)
class LostPod:
    """A rank pod a shrink removed from the job (``status.elastic.lostPods[]``).

    Attributes:
        pod: its name (created again under the same name when it grows back).
        node: the node it was planned on.
        gpu_type: its GPU product.
        ranks: the ranks it ran.
        why: how it was lost, in words.
    """

    pod: str
    node: str
    gpu_type: str
    ranks: int
    why: str

    def to_status(self) -> dict[str, Any]:
        """``status.elastic.lostPods[]``."""
        return {"pod": self.pod, "node": self.node, "gpuType": self.gpu_type, "ranks": self.ranks,
                "why": self.why}


@dataclass(frozen=True, kw_only=True, slots=True)
class ElasticStatus:
    """``status.elastic`` of the current attempt.

    Attributes:
        generation: membership changes the operator made in this attempt (0 at the start; +1 per
            shrink or growth).
        ranks: ranks of the job's pods that are not lost.
        gpu_types: those ranks per GPU product, in plan order.
        reason: ``ElasticShrink`` / ``ElasticGrow`` of the last change (``""`` before one).
        message: the last change in words.
        changed_s: when it happened, epoch seconds (None before one).
        lost: the pods removed by a shrink and not grown back.
        regrows: pods created again in this attempt (at most ``spec.runPolicy.backoffLimit``).
        attempt: the attempt (``status.attempt``) this section is of.
    """

    attempt: int = 0
    generation: int = 0
    ranks: int = 0
    gpu_types: tuple[tuple[str, int], ...] = ()
    reason: str = ""
    message: str = ""
    changed_s: float | None = None
    lost: tuple[LostPod, ...] = field(default=())
    regrows: int = 0

    @property
    def removed(self) -> frozenset[str]:
        """Names of the pods the job goes on without."""
        return frozenset(p.pod for p in self.lost)

    def to_status(self) -> dict[str, Any]:
        """``status.elastic``."""
        out: dict[str, Any] = {
            "attempt": self.attempt, "generation": self.generation, "ranks": self.ranks,
            "gpuTypes": [{"gpuType": t, "ranks": n} for t, n in self.gpu_types],
            "lostPods": [p.to_status() for p in self.lost], "regrows": self.regrows}
        if self.reason:
            out.update(reason=self.reason, message=self.message)
        if self.changed_s is not None:
            out["lastTransitionTime"] = c.now_iso(self.changed_s)
        return out

    @classmethod
    def from_status(cls, status: Mapping[str, Any], attempt: int) -> ElasticStatus:
        """Parse ``status.elastic`` (a fresh one when absent or of an earlier attempt: ``attempt``
        is ``status.attempt`` and the section is reset at each start)."""
        raw = status.get("elastic") or {}
        if int(raw.get("attempt") or 0) != attempt:
            return cls(attempt=attempt)
        return cls(attempt=attempt, generation=int(raw.get("generation") or 0), ranks=int(raw.get("ranks") or 0),
                   gpu_types=tuple((str(g["gpuType"]), int(g["ranks"]))
                                   for g in raw.get("gpuTypes") or ()),
                   reason=str(raw.get("reason") or ""), message=str(raw.get("message") or ""),
                   changed_s=c.parse_iso(raw.get("lastTransitionTime")),
                   lost=tuple(LostPod(pod=str(p["pod"]), node=str(p.get("node") or ""),
                                      gpu_type=str(p.get("gpuType") or ""),
                                      ranks=int(p.get("ranks") or 1), why=str(p.get("why") or ""))
                              for p in raw.get("lostPods") or ()),
                   regrows=int(raw.get("regrows") or 0))


@dataclass(frozen=True, kw_only=True, slots=True)
class ElasticJob:
    """What :func:`hetero_operator.lifecycle.decisions.decide` needs of an elastic job.

    Attributes:
        spec: ``spec.elastic``.
        state: ``status.elastic`` of the current attempt.
        keeper: the name of its membership keeper pod.
        spares: free whole GPUs per GFD product and node (where a lost pod whose node is still
            not healthy may come back; read only while the job has lost pods).
    """

    spec: ElasticSpec
    state: ElasticStatus
    keeper: str
    spares: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @property
    def nodes(self) -> frozenset[str]:
        """The nodes of the pods the job goes on without (their health decides a growth)."""
        return frozenset(p.node for p in self.state.lost if p.node)


def without_removed(pods: Sequence[PodState], state: ElasticStatus) -> list[PodState]:
    """``pods`` less the pods a shrink removed (failed, terminating, or still shown Running on a
    lost node: the gang rules must not see them). A pod grown back is no longer in
    :attr:`ElasticStatus.lost`, so its new instance stays."""
    return [p for p in pods if p.name not in state.removed]


def elastic_decision(job: JobState, policy: RunPolicy, ej: ElasticJob, pods: Sequence[PodState],
                     health: NodeView, now_s: float) -> Decision | None:
    """A shrink, a growth, the success of a job whose rank 0 was lost, or None (the gang rules go
    on; see the module's docstring).

    Args:
        job / policy: the job's state (its attempt, planned pods) and run policy.
        ej: ``spec.elastic``, ``status.elastic`` and the keeper pod's name (never a rank pod).
        pods: every pod of the job (all attempts).
        health: the nodes' health.
        now_s: the clock, epoch seconds.
    """
    elastic, state = ej.spec, ej.state
    current = [p for p in pods if p.attempt == job.attempt and p.name != ej.keeper]
    gone = state.removed
    ranked = [p for p in current if p.name not in gone]
    lost = [p for p in ranked if _lost(p, health)]
    alive = [p for p in ranked if p not in lost]
    alive_ranks = sum(p.ranks for p in alive)
    if lost:
        if alive_ranks < elastic.min_ranks:
            return None  # the gang restart, as without spec.elastic
        return _shrink(job, elastic, state, lost, alive, health, now_s)
    if alive and all(p.phase == "Succeeded" for p in alive) and gone:
        return Decision(action=SUCCEED, phase=c.SUCCEEDED, reason=SUCCEED_REASON,
                        message=f"Every remaining rank completed successfully ({alive_ranks} of "
                                f"{alive_ranks + sum(p.ranks for p in state.lost)} ranks; "
                                f"{', '.join(sorted(gone))} lost).")
    present = {p.name for p in pods}
    room = elastic.max_ranks - alive_ranks
    free = {t: dict(by_node) for t, by_node in ej.spares.items()}
    joining: list[tuple[LostPod, str]] = []
    for lp in state.lost:
        if lp.pod in present or lp.ranks > room or state.regrows + len(joining) >= policy.backoff_limit:
            continue
        node = lp.node if _healthy(health, lp.node) else _spare(free, lp, health)
        if node:
            joining.append((lp, node))
            room -= lp.ranks
    if joining and job.phase in (c.CREATED, c.RUNNING):
        return _grow(elastic, state, joining, alive, alive_ranks, now_s)
    return None


def _spare(free: dict[str, dict[str, int]], lp: LostPod, health: NodeView) -> str:
    """A node other than ``lp``'s with ``lp.ranks`` free GPUs of its type (the first by name; the
    spares list usable nodes only, and one the job's health view knows as unhealthy is passed
    over), taken from ``free``; ``""`` when none."""
    by_node = free.get(lp.gpu_type) or {}
    node = next((n for n in sorted(by_node) if n != lp.node and by_node[n] >= lp.ranks
                 and _not_known_unhealthy(health, n)), "")
    if node:
        by_node[node] -= lp.ranks
    return node


def _lost(p: PodState, health: NodeView) -> bool:
    """A rank pod that is out of the job: failed (not at start-up: that fails the job), on a lost
    node, disrupted or deleted by someone else."""
    if p.phase == "Succeeded":
        return False
    if p.phase == "Failed":
        return not p.startup_error
    return health.lost(p.node) or p.deleting or p.disruption not in ("", STOPPED_AT_CHECKPOINT)


def _not_known_unhealthy(health: NodeView, node: str) -> bool:
    """The spares come from usable nodes only; the health view knows just the job's nodes."""
    h = health.health(node)
    return h is None or h.healthy


def _healthy(health: NodeView, node: str) -> bool:
    h = health.health(node)
    return h is not None and h.healthy


def _why(p: PodState, health: NodeView) -> str:
    if health.lost(p.node):
        h = health.health(p.node)
        return f"node {p.node} lost ({h.why if h is not None else DELETED})"
    if p.phase == "Failed":
        return f"failed ({p.failure or 'exit status unknown'})"
    if p.disruption:
        return f"disrupted ({p.disruption})"
    return "deleted while the job ran"


def _by_type(pods: Sequence[PodState]) -> tuple[tuple[str, int], ...]:
    counts: dict[str, int] = {}
    for p in sorted(pods, key=lambda p: p.first_rank):
        counts[p.gpu_type or "unknown"] = counts.get(p.gpu_type or "unknown", 0) + p.ranks
    return tuple(counts.items())


def _shrink(job: JobState, elastic: ElasticSpec, state: ElasticStatus, lost: Sequence[PodState],
            alive: Sequence[PodState], health: NodeView, now_s: float) -> Decision:
    new_lost = tuple(LostPod(pod=p.name, node=p.node, gpu_type=p.gpu_type, ranks=p.ranks,
                             why=_why(p, health)) for p in sorted(lost, key=lambda p: p.first_rank))
    alive_ranks = sum(p.ranks for p in alive)
    before = alive_ranks + sum(p.ranks for p in lost)
    what = "; ".join(f"pod {lp.pod} ({lp.ranks} {lp.gpu_type or 'unknown GPU'} rank"
                     f"{'s' if lp.ranks > 1 else ''}) {lp.why}" for lp in new_lost)
    message = (f"{what}: the job goes on with {alive_ranks} of {before} ranks "
               f"(spec.elastic.minRanks {elastic.min_ranks}); the survivors re-form without "
               "it and continue from the step they are at: no restart, no checkpoint read.")
    force = pod_names([p for p in lost if health.lost(p.node)])
    graceful = tuple(n for n in pod_names([p for p in lost if not p.deleting]) if n not in force)
    new = replace(state, generation=state.generation + 1, ranks=alive_ranks,
                  gpu_types=_by_type(alive), reason=SHRINK_REASON, message=message,
                  changed_s=now_s, lost=(*state.lost, *new_lost))
    return Decision(action=SHRINK, phase=c.RUNNING, reason=SHRINK_REASON, message=message,
                    delete_pods=graceful, force_delete_pods=force, elastic=new.to_status(),
                    requeue_s=POLL_DELETING_S)


def _grow(elastic: ElasticSpec, state: ElasticStatus, placed: Sequence[tuple[LostPod, str]],
          alive: Sequence[PodState], alive_ranks: int, now_s: float) -> Decision:
    joining = [lp for lp, _ in placed]
    moved = {lp.pod: node for lp, node in placed if node != lp.node}
    added = sum(lp.ranks for lp in joining)
    where = "; ".join(f"{lp.pod} on {node}" + (f" ({lp.node} is not healthy; {node} has free "
                                                f"{lp.gpu_type or 'GPU'}s)" if node != lp.node
                                                else f" ({node} healthy again)")
                      for lp, node in placed)
    message = (f"Pod{'s' if len(joining) > 1 else ''} {where}: "
               f"{added} {joining[0].gpu_type or 'unknown GPU'} rank{'s' if added > 1 else ''} "
               f"created again to join the running job at a step boundary ({alive_ranks} -> "
               f"{alive_ranks + added} ranks, spec.elastic.maxRanks {elastic.max_ranks}); its "
               "ranks take a peer's state, no checkpoint is read.")
    names = {lp.pod for lp in joining}
    types = dict(_by_type(alive))
    for lp in joining:
        types[lp.gpu_type or "unknown"] = types.get(lp.gpu_type or "unknown", 0) + lp.ranks
    new = replace(state, generation=state.generation + 1, ranks=alive_ranks + added,
                  gpu_types=tuple(types.items()), reason=GROW_REASON, message=message,
                  changed_s=now_s, lost=tuple(lp for lp in state.lost if lp.pod not in names),
                  regrows=state.regrows + len(joining))
    return Decision(action=GROW, phase=c.RUNNING, reason=GROW_REASON, message=message,
                    create_pods=tuple(sorted(names)), create_on=moved, elastic=new.to_status())


def started(ranks: int, gpu_types: Sequence[tuple[str, int]], attempt: int) -> dict[str, Any]:
    """``status.elastic`` of a new attempt: generation 0 with every planned rank."""
    counts: dict[str, int] = {}
    for gpu_type, n in gpu_types:
        counts[gpu_type] = counts.get(gpu_type, 0) + n
    return ElasticStatus(attempt=attempt, ranks=ranks, gpu_types=tuple(counts.items())).to_status()


__all__ = ["ELASTIC_KEYS", "ElasticJob", "GROW_REASON", "LOST_POD_KEYS", "SHRINK_REASON", "ElasticStatus", "LostPod", "elastic_decision", "started",
           "without_removed"]
