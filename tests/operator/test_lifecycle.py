"""Every lifecycle decision, through the pure :func:`hetero_operator.lifecycle.decisions.decide`."""

from __future__ import annotations

import pytest

from hetero_operator.api.spec import RunPolicy
from hetero_operator.cluster.nodehealth import NodeHealth
from hetero_operator.lifecycle import decisions as lc

NOW = 1_800_000_000.0
TIMING = lc.RestartSettings(pending_timeout_s=300, backoff_base_s=10, backoff_max_s=300)
PODS3 = ("job-g0", "job-g1", "job-g2")
NODES = {n: NodeHealth(name=n) for n in ("node-a", "node-b", "node-c")}


def _pods(*phases: str, attempt: int = 1, created: float = NOW - 10, **over: object) -> list[lc.PodState]:
    return [lc.PodState(name=f"job-g{i}", first_rank=[0, 1, 2][i], phase=ph, node=f"node-{'abc'[i]}",
                        attempt=attempt, created_s=created, gpu_type=["A100", "V100", "Tesla-T4"][i],
                        **over) for i, ph in enumerate(phases)]


def _job(**kw: object) -> lc.JobState:
    base = dict(phase="Running", attempt=1, start_s=NOW - 100, planned_pods=PODS3)
    base.update(kw)
    return lc.JobState(**base)


def decide(job: lc.JobState, pods: list[lc.PodState], policy: RunPolicy = RunPolicy(), nodes=NODES,
           now: float = NOW) -> lc.Decision:
    return lc.decide(job, policy, pods, nodes=nodes, now_s=now, timing=TIMING)


def test_a_new_job_without_pods_starts() -> None:
    d = decide(lc.JobState(), [])
    assert (d.action, d.phase) == (lc.START, "Created")


def test_all_pods_running_is_running() -> None:
    d = decide(_job(), _pods("Running", "Running", "Running"))
    assert (d.action, d.phase, d.reason, d.delete_pods) == (lc.RUNNING, "Running", "JobRunning", ())


def test_some_pods_pending_waits_until_the_pending_timeout() -> None:
    d = decide(_job(phase="Created"), _pods("Running", "Pending", "Running", created=NOW - 100))
    assert (d.action, d.phase, d.reason) == (lc.WAIT, "Created", "PodsPending")
    assert d.requeue_s == pytest.approx(200.5)


def test_pod_pending_past_the_timeout_replans_without_counting_a_restart() -> None:
    d = decide(_job(phase="Created"), _pods("Running", "Pending", "Running", created=NOW - 301))
    assert (d.action, d.phase, d.reason) == (lc.REPLAN, "Pending", "PendingTimeout")
    assert d.delete_pods == PODS3 and not d.count_restart


def test_a_node_that_disappeared_after_its_pod_succeeded_does_not_disturb_the_others() -> None:
    """The pod on node-c finished before node-c was deleted: the job keeps running (this raised an
    AssertionError in every reconcile of the job before)."""
    nodes = {n: h for n, h in NODES.items() if n != "node-c"}
    d = decide(_job(), _pods("Running", "Running", "Succeeded"), nodes=nodes)
    assert (d.action, d.phase, d.reason) == (lc.RUNNING, "Running", "JobRunning")


def test_a_node_that_disappeared_replans() -> None:
    nodes = {n: h for n, h in NODES.items() if n != "node-c"}
    d = decide(_job(), _pods("Running", "Running", "Running"), nodes=nodes)
    assert (d.action, d.phase, d.reason) == (lc.RESTART, "Restarting", "NodeLost")
    assert d.message.startswith("Node node-c was deleted; force-deleted pod(s) job-g2. Restarting all ranks")
    assert (d.delete_pods, d.force_delete_pods) == (("job-g0", "job-g1"), ("job-g2",))
    assert d.count_infrastructure_restart and not d.count_restart
    assert d.node_loss == lc.NodeLoss(node="node-c", why="Deleted", since_s=NOW, lost_s=NOW, pods=("job-g2",))


def test_a_missing_pod_after_a_crash_mid_creation_replans_everything() -> None:
    d = decide(_job(phase="Created"), _pods("Running", "Pending"))
    assert (d.action, d.reason, d.delete_pods) == (lc.REPLAN, "IncompletePodSet", ("job-g0", "job-g1"))


def test_failed_rank_restarts_the_whole_gang_with_exponential_backoff() -> None:
    """shared/cases/21: restart #1 after 10 s, #2 after 20 s; counted against backoffLimit."""
    pods = _pods("Running", "Running", "Failed", failure="OOMKilled exit 137")
    d1 = decide(_job(restarts=0), pods, RunPolicy(backoff_limit=2))
    assert (d1.action, d1.phase, d1.reason) == (lc.RESTART, "Restarting", "RankFailed")
    assert d1.delete_pods == PODS3 and d1.count_restart
    assert d1.restart_not_before_s == NOW + 10
    assert d1.message.startswith("job-g2 (Tesla-T4) failed: OOMKilled exit 137; restarting all ranks")
    d2 = decide(_job(restarts=1), pods, RunPolicy(backoff_limit=2))
    assert d2.restart_not_before_s == NOW + 20


def test_backoff_is_capped() -> None:
    assert [lc.backoff_s(n, TIMING) for n in (1, 2, 3, 6, 7)] == [10, 20, 40, 300, 300]


def test_failure_past_backoff_limit_fails_and_cleans_all_pods() -> None:
    """shared/cases/21: third failure with backoffLimit 2 -> Failed, BackoffLimitExceeded."""
    pods = _pods("Running", "Running", "Failed", failure="OOMKilled exit 137")
    d = decide(_job(restarts=2), pods, RunPolicy(backoff_limit=2, clean_pod_policy="All"))
    assert (d.action, d.phase, d.reason) == (lc.FAIL, "Failed", "BackoffLimitExceeded")
    assert d.delete_pods == PODS3
    assert d.message == ("job-g2 (Tesla-T4) failed: OOMKilled exit 137; 2 restart(s) reached "
                         "backoffLimit 2.")


def test_clean_pod_policy_running_keeps_terminated_pods_and_none_keeps_all() -> None:
    pods = _pods("Running", "Running", "Failed")
    running = decide(_job(restarts=3), pods, RunPolicy(backoff_limit=3, clean_pod_policy="Running"))
    assert running.delete_pods == ("job-g0", "job-g1")
    keep = decide(_job(restarts=3), pods, RunPolicy(backoff_limit=3, clean_pod_policy="None"))
    assert keep.delete_pods == ()


def test_waiting_for_backoff_then_starting() -> None:
    job = _job(phase="Restarting", restarts=1, restart_not_before_s=NOW + 7, attempt=1)
    d = decide(job, [])
    assert (d.action, d.phase, d.reason, d.requeue_s) == (lc.WAIT, "Restarting", "BackoffDelay", 7)
    assert decide(job, [], now=NOW + 7).action == lc.START


def test_terminating_pods_are_waited_for() -> None:
    d = decide(_job(phase="Restarting"), _pods("Running", "Running", "Failed", deleting=True,
                                               deletion_s=NOW + 30))
    assert (d.action, d.reason, d.delete_pods, d.force_delete_pods) == (lc.WAIT, "PodsTerminating", (), ())
    assert d.requeue_s == lc.POLL_DELETING_S


def test_pods_of_an_earlier_attempt_are_deleted_first() -> None:
    d = decide(_job(attempt=2), _pods("Running", "Running", "Running", attempt=1))
    assert (d.action, d.reason, d.delete_pods) == (lc.WAIT, "StalePods", PODS3)


def test_rank0_success_succeeds_and_cleans_running_pods() -> None:
    d = decide(_job(), _pods("Succeeded", "Running", "Succeeded"))
    assert (d.action, d.phase, d.reason) == (lc.SUCCEED, "Succeeded", "JobSucceeded")
    assert d.delete_pods == ("job-g1",)


def test_suspend_deletes_pods_and_keeps_state() -> None:
    d = decide(_job(restarts=1), _pods("Running", "Running", "Running"), RunPolicy(suspend=True))
    assert (d.action, d.phase, d.delete_pods, d.count_restart) == (lc.SUSPEND, "Suspended", PODS3, False)
    assert decide(_job(phase="Suspended"), [], RunPolicy(suspend=False)).action == lc.START


def test_active_deadline_fails_the_job() -> None:
    d = decide(_job(start_s=NOW - 61), _pods("Running", "Running", "Running"),
               RunPolicy(active_deadline_seconds=60))
    assert (d.action, d.phase, d.reason, d.delete_pods) == (lc.FAIL, "Failed", "DeadlineExceeded", PODS3)


def test_finished_job_is_deleted_after_its_ttl() -> None:
    policy = RunPolicy(ttl_seconds_after_finished=30)
    early = decide(_job(phase="Succeeded", completion_s=NOW - 10), [], policy)
    assert (early.action, early.requeue_s) == (lc.NOTHING, 20)
    late = decide(_job(phase="Succeeded", completion_s=NOW - 30), [], policy)
    assert (late.action, late.reason) == (lc.DELETE_JOB, "TTLExpired")


def test_finished_job_without_ttl_stays_and_cleans_leftovers() -> None:
    d = decide(_job(phase="Failed", completion_s=NOW), _pods("Running", "Failed", "Failed"),
               RunPolicy(clean_pod_policy="Running"))
    assert (d.action, d.delete_pods, d.phase) == (lc.CLEANUP, ("job-g0",), "Failed")
    done = decide(_job(phase="Failed", completion_s=NOW), [], RunPolicy())
    assert (done.action, done.requeue_s) == (lc.NOTHING, None)


# --- node loss and disruptions (issue 10) --------------------------------------------------

def _not_ready(name: str, since: float, *, out_of_service: bool = False) -> NodeHealth:
    return NodeHealth(name=name, unhealthy_since_s=since, out_of_service=out_of_service,
                      why="Ready=Unknown (NodeStatusUnknown), taint node.kubernetes.io/unreachable")


def _nodes_with(health: NodeHealth) -> dict[str, NodeHealth]:
    return {**NODES, health.name: health}


def test_node_not_ready_within_the_grace_period_waits_until_it_counts_as_lost() -> None:
    d = decide(_job(), _pods("Running", "Running", "Running"), nodes=_nodes_with(_not_ready("node-c", NOW - 100)))
    assert (d.action, d.phase, d.reason) == (lc.WAIT, "Running", "NodeNotReady")
    assert (d.delete_pods, d.force_delete_pods, d.count_restart, d.count_infrastructure_restart) == ((), (), False, False)
    assert d.requeue_s == pytest.approx(200.05)
    assert d.message == ("Node node-c of pod job-g2 is not healthy (Ready=Unknown (NodeStatusUnknown), taint "
                         "node.kubernetes.io/unreachable) since 2027-01-15T07:58:20Z; its pods count as lost at "
                         "2027-01-15T08:03:20Z (nodeLossGraceSeconds=300).")


def test_node_not_ready_past_the_grace_period_force_deletes_its_pods_and_restarts_uncounted() -> None:
    """Pods on a silent node keep reporting Running; after the grace they are force-deleted."""
    d = decide(_job(restarts=1), _pods("Running", "Running", "Running"), RunPolicy(backoff_limit=1),
               nodes=_nodes_with(_not_ready("node-c", NOW - 300)))
    assert (d.action, d.phase, d.reason) == (lc.RESTART, "Restarting", "NodeLost")
    assert (d.delete_pods, d.force_delete_pods) == (("job-g0", "job-g1"), ("job-g2",))
    assert (d.count_restart, d.count_infrastructure_restart, d.restart_not_before_s) == (False, True, None)
    assert d.node_loss == lc.NodeLoss(node="node-c", why=_not_ready("node-c", 0).why, since_s=NOW - 300,
                                      lost_s=NOW, pods=("job-g2",))
    assert d.message == (
        "Node node-c is lost: Ready=Unknown (NodeStatusUnknown), taint node.kubernetes.io/unreachable since "
        "2027-01-15T07:55:00Z, nodeLossGraceSeconds=300 passed at 2027-01-15T08:00:00Z; force-deleted pod(s) "
        "job-g2. Restarting all ranks on the remaining capacity (infrastructure restart 1; not counted "
        "against backoffLimit 1, 1 restart(s) used).")


def test_a_job_may_lower_the_grace_period_and_out_of_service_needs_none() -> None:
    pods = _pods("Running", "Running", "Running")
    short = RunPolicy(node_loss_grace_seconds=20)
    assert decide(_job(), pods, short, nodes=_nodes_with(_not_ready("node-c", NOW - 19))).reason == "NodeNotReady"
    assert decide(_job(), pods, short, nodes=_nodes_with(_not_ready("node-c", NOW - 20))).reason == "NodeLost"
    down = _not_ready("node-c", NOW - 1, out_of_service=True)
    assert decide(_job(), pods, nodes=_nodes_with(down)).reason == "NodeLost"


def test_terminating_pods_on_a_lost_node_are_force_deleted_and_never_block() -> None:
    """The kubelet of node-c is gone: its pod stays Terminating for ever unless we force it."""
    pods = [*_pods("Running", "Running"), lc.PodState(name="job-g2", first_rank=2, phase="Running", node="node-c",
                                                      attempt=1, deleting=True, deletion_s=NOW - 5)]
    within = decide(_job(phase="Restarting"), pods, nodes=_nodes_with(_not_ready("node-c", NOW - 250)))
    assert (within.action, within.reason, within.force_delete_pods) == (lc.WAIT, "PodsTerminating", ())
    assert within.requeue_s == lc.POLL_DELETING_S
    lost = decide(_job(phase="Restarting"), pods, nodes=_nodes_with(_not_ready("node-c", NOW - 300)))
    assert (lost.action, lost.reason, lost.force_delete_pods) == (lc.WAIT, "PodsTerminating", ("job-g2",))


def test_a_terminating_pod_whose_kubelet_never_confirms_is_forced_after_the_grace() -> None:
    pod = lc.PodState(name="job-g2", first_rank=2, phase="Running", node="node-c", attempt=1,
                      deleting=True, deletion_s=NOW - 299)
    early = decide(_job(phase="Restarting"), [pod], RunPolicy())
    assert early.force_delete_pods == () and early.requeue_s == pytest.approx(1.0)
    assert decide(_job(phase="Restarting"), [pod], RunPolicy(), now=NOW + 1).force_delete_pods == ("job-g2",)


def test_an_evicted_pod_stuck_terminating_restarts_the_gang_without_counting() -> None:
    pods = _pods("Running", "Running")
    pods.append(lc.PodState(name="job-g2", first_rank=2, phase="Running", node="node-c", attempt=1,
                            deleting=True, deletion_s=NOW + 25, disruption="DeletionByTaintManager"))
    d = decide(_job(restarts=0), pods, RunPolicy(backoff_limit=0),
               nodes=_nodes_with(_not_ready("node-c", NOW - 60)))
    assert (d.action, d.phase, d.reason) == (lc.RESTART, "Restarting", "PodEvicted")
    assert (d.delete_pods, d.force_delete_pods) == (("job-g0", "job-g1"), ())
    assert (d.count_restart, d.count_infrastructure_restart) == (False, True)
    assert d.disruption == "job-g2 on node-c was evicted (DeletionByTaintManager)"
    # the restart is recorded before any deletion: the next look only waits (and forces at the loss)
    after = decide(_job(phase="Restarting", infrastructure_restarts=1), [pods[2]], RunPolicy(backoff_limit=0),
                   nodes=_nodes_with(_not_ready("node-c", NOW - 300)))
    assert (after.action, after.force_delete_pods, after.count_infrastructure_restart) == (
        lc.WAIT, ("job-g2",), False)


@pytest.mark.parametrize("reason,event", [("Terminated", "NodeShutdown"), ("Shutdown", "NodeShutdown"),
                                          ("PreemptionByScheduler", "PodPreempted"), ("Evicted", "PodEvicted"),
                                          ("DeletionByPodGC", "PodDisrupted")])
def test_a_pod_failed_by_the_cluster_does_not_count_against_backoff_limit_zero(reason: str, event: str) -> None:
    pods = _pods("Running", "Running", "Failed", failure="Error exit 143")
    pods[2] = lc.PodState(**{**{f: getattr(pods[2], f) for f in lc.PodState.__slots__}, "disruption": reason})
    d = decide(_job(), pods, RunPolicy(backoff_limit=0))
    assert (d.action, d.reason, d.count_restart, d.count_infrastructure_restart) == (lc.RESTART, event, False, True)
    assert d.delete_pods == PODS3 and d.restart_not_before_s is None


def test_a_peer_failing_while_a_node_is_not_ready_is_the_clusters_fault() -> None:
    """Rank 0's collective times out because node-c went silent: not a bug in the job."""
    pods = _pods("Failed", "Running", "Running", failure="Error exit 1")
    d = decide(_job(), pods, RunPolicy(backoff_limit=0), nodes=_nodes_with(_not_ready("node-c", NOW - 10)))
    assert (d.action, d.reason, d.count_restart, d.count_infrastructure_restart) == (
        lc.RESTART, "NodeNotReady", False, True)
    assert d.message.startswith("job-g0 failed while node node-c of job-g2 is not healthy (Ready=Unknown")


def test_a_pod_deleted_by_someone_else_restarts_uncounted() -> None:
    pods = _pods("Running", "Running", "Running")
    pods[1] = lc.PodState(name="job-g1", first_rank=1, phase="Running", node="node-b", attempt=1,
                          deleting=True, deletion_s=NOW + 30)
    d = decide(_job(), pods, RunPolicy(backoff_limit=0))
    assert (d.action, d.reason, d.delete_pods, d.count_infrastructure_restart) == (
        lc.RESTART, "PodDeleted", ("job-g0", "job-g2"), True)


def test_leftover_pods_of_a_recorded_restart_are_only_deleted() -> None:
    pods = _pods("Running", "Running", "Failed")
    d = decide(_job(phase="Restarting", restarts=1), pods, RunPolicy(backoff_limit=1))
    assert (d.action, d.reason, d.delete_pods, d.count_restart) == (lc.WAIT, "StalePods", PODS3, False)


def test_node_health_is_read_from_conditions_and_taints() -> None:
    from hetero_operator.cluster.nodehealth import node_health
    node = {"metadata": {"name": "n"}, "spec": {"taints": [
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": "2027-01-15T08:00:05Z"},
        {"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                                   "lastTransitionTime": "2027-01-15T08:00:00Z"}]}}
    h = node_health(node, NOW + 60)
    assert (h.healthy, h.unhealthy_since_s, h.out_of_service) == (False, NOW, False)
    assert h.why == "Ready=Unknown (NodeStatusUnknown), taint node.kubernetes.io/unreachable"
    assert h.lost_at_s(300) == NOW + 300
    ready = {"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert node_health(ready, NOW).healthy and node_health(ready, NOW).lost_at_s(300) is None
    down = {"metadata": {"name": "n"}, "spec": {"taints": [
        {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}]}}
    assert node_health(down, NOW).lost_at_s(300) == NOW  # no timeAdded: now; out-of-service: no grace


@pytest.mark.parametrize(("policy", "deleted"), [("Running", ("job-g2",)), ("None", ())],
                         ids=["Running deletes the peer still starting", "None keeps it"])
def test_rank_0_success_cleans_a_peer_still_pending_by_clean_pod_policy(policy, deleted) -> None:
    """The cause of the node-loss e2e flake (issue 22, point 13): the restarted g2 can still be
    Pending when rank 0 succeeds; the default policy deletes it, so that test keeps its pods."""
    d = decide(_job(), _pods("Succeeded", "Succeeded", "Pending"), RunPolicy(clean_pod_policy=policy))
    assert (d.action, d.reason, d.delete_pods) == (lc.SUCCEED, "JobSucceeded", deleted)
