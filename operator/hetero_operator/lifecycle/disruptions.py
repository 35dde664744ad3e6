"""The cluster's part in a job's lifecycle (pure): lost nodes, disrupted pods, pods no kubelet will
finish, and the infrastructure restarts they cause (not counted against ``backoffLimit``).

:func:`disrupted` is asked by :func:`hetero_operator.lifecycle.decisions.decide` while the job is
``Created``/``Running``; :class:`NodeView` answers its node health questions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hetero_operator.api import conditions as c
from hetero_operator.api.spec import RunPolicy
from hetero_operator.cluster.nodehealth import NodeHealth
from hetero_operator.lifecycle.values import (POLL_DELETING_S, RESTART, WAIT, Decision, JobState,
                                              NodeLoss, PodState, pod_names)

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


class NodeView:
    """Node health lookups for one decision: ``nodes`` by name (``None`` when unknown), the
    ``nodeLossGraceSeconds`` and the clock, epoch seconds."""

    def __init__(self, nodes: Mapping[str, NodeHealth] | None, grace_s: float, now_s: float) -> None:
        self.nodes, self.grace_s, self.now_s = nodes, grace_s, now_s

    def health(self, node: str) -> NodeHealth | None:
        """``None`` when unknown (no node name, no node list) or gone."""
        if self.nodes is None or not node:
            return None
        return self.nodes.get(node)

    def gone(self, node: str) -> bool:
        """The node list is known and ``node`` is not in it (its Node object was deleted)."""
        return self.nodes is not None and bool(node) and node not in self.nodes

    def lost_at_s(self, node: str) -> float | None:
        """When ``node`` counts (or counted) as lost, epoch seconds: now when gone, else
        ``nodeLossGraceSeconds`` after it stopped being healthy; None while healthy or unknown."""
        if self.gone(node):
            return self.now_s
        h = self.health(node)
        return None if h is None else h.lost_at_s(self.grace_s)

    def lost(self, node: str) -> bool:
        """``node`` counts as lost now."""
        at = self.lost_at_s(node)
        return at is not None and self.now_s >= at

    def unhealthy(self, node: str) -> bool:
        """``node`` is gone or not healthy (lost or still within its grace)."""
        h = self.health(node)
        return self.gone(node) or (h is not None and not h.healthy)

    def loss(self, node: str, pods: Sequence[PodState]) -> NodeLoss:
        """The :class:`NodeLoss` of ``node`` with the pods of ``pods`` on it."""
        names = pod_names([p for p in pods if p.node == node])
        h = self.health(node)
        if h is None or h.unhealthy_since_s is None:
            return NodeLoss(node=node, why=DELETED, since_s=self.now_s, lost_s=self.now_s, pods=names)
        return NodeLoss(node=node, why=h.why, since_s=h.unhealthy_since_s,
                        lost_s=h.lost_at_s(self.grace_s) or self.now_s, pods=names)


def disrupted(job: JobState, policy: RunPolicy, current: Sequence[PodState], health: NodeView,
              now_s: float, *, restart_from: str = "") -> Decision | None:
    """The cluster's part: a lost node, a disrupted pod, a failure next to an unhealthy node.

    Args:
        job / policy: the job's state and run policy.
        current: the pods of the current attempt.
        health: the nodes' health.
        now_s: the clock, epoch seconds.
        restart_from: where a restart continues, for its message (``""``: not said).

    Returns:
        An infrastructure restart, a wait for a node that is not healthy yet, or None when the
        cluster did nothing to the job.
    """
    lost_nodes = sorted({p.node for p in current if p.phase != "Succeeded" and health.lost(p.node)})
    if lost_nodes:
        loss = health.loss(lost_nodes[0], current)
        force = pod_names([p for p in current if p.node in lost_nodes])
        others = pod_names([p for p in current if p.node not in lost_nodes and not p.deleting])
        if loss.why == DELETED:
            what = f"Node {loss.node} was deleted"
        else:
            what = (f"Node {loss.node} is lost: {loss.why} since {c.now_iso(loss.since_s)}, "
                    f"nodeLossGraceSeconds={policy.node_loss_grace_seconds} passed at "
                    f"{c.now_iso(loss.lost_s)}")
        what += f"; force-deleted pod(s) {', '.join(force)}"
        return _infra_restart(job, policy, "NodeLost", what, delete=others, force=force,
                              node_loss=loss, restart_from=restart_from)
    stopped = [p for p in current if p.disruption == STOPPED_AT_CHECKPOINT and not p.deleting]
    failed = [p for p in current if p.phase == "Failed" and p not in stopped]
    by_cluster = [p for p in current if (p.disruption or p.deleting) and p not in stopped]
    gone = set(job.planned_pods) - {p.name for p in current}
    if stopped and (by_cluster or gone):  # the peers of a preempted pod: the cluster's doing
        by_cluster += stopped
    else:
        failed += stopped
    # A pod that already succeeded is done with its node, whatever happens to the node now.
    unhealthy = [p for p in current if p.phase != "Succeeded" and health.unhealthy(p.node)]
    if by_cluster or (failed and unhealthy):
        if by_cluster:  # the cause first, the peers that stopped for it after
            first = min(by_cluster, key=lambda p: (p in stopped, p.first_rank))
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
        delete, force = removal([p for p in current if not p.deleting], health)
        return _infra_restart(job, policy, reason, what, delete=delete,
                              force=tuple(sorted({*force, *stuck(current, health)})),
                              restart_from=restart_from)
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
                   node_loss: NodeLoss | None = None, restart_from: str = "") -> Decision:
    n = job.infrastructure_restarts + 1
    source = f", continuing from {restart_from}" if restart_from else ""
    delete = tuple(p for p in delete if p not in force)
    return Decision(action=RESTART, phase=c.RESTARTING, reason=reason,
                    message=(f"{what}. Restarting all ranks on the remaining capacity "
                             f"(infrastructure restart {n}; not counted against backoffLimit "
                             f"{policy.backoff_limit}, {job.restarts} restart(s) used){source}."),
                    delete_pods=delete, force_delete_pods=force, count_infrastructure_restart=True,
                    node_loss=node_loss, disruption=what, requeue_s=POLL_DELETING_S)


def stuck(pods: Sequence[PodState], health: NodeView) -> tuple[str, ...]:
    """Terminating pods no kubelet will finish: on a lost node, or overdue by the grace period."""
    return pod_names([p for p in pods if p.deleting and (
        health.lost(p.node) or (p.deletion_s is not None
                                and health.now_s >= p.deletion_s + health.grace_s))])


def next_unstick_s(pods: Sequence[PodState], health: NodeView) -> float:
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


def removal(pods: Sequence[PodState], health: NodeView) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(graceful, force) deletions: pods on a lost node go with grace 0."""
    force = [p for p in pods if health.lost(p.node)]
    return pod_names([p for p in pods if p not in force]), pod_names(force)
