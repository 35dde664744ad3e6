"""Every lifecycle decision, through the pure :func:`hetero_operator.lifecycle.decide`."""

from __future__ import annotations

import pytest

from hetero_operator import lifecycle as lc
from hetero_operator.spec import RunPolicy

NOW = 1_800_000_000.0
TIMING = lc.Timing(pending_timeout_s=300, backoff_base_s=10, backoff_max_s=300)
PODS3 = ("job-g0", "job-g1", "job-g2")
NODES = {"node-a", "node-b", "node-c"}


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


def test_a_node_that_disappeared_replans() -> None:
    d = decide(_job(), _pods("Running", "Running", "Running"), nodes={"node-a", "node-b"})
    assert (d.action, d.reason) == (lc.REPLAN, "NodeLost")
    assert "node-c" in d.message and d.delete_pods == PODS3


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
    d = decide(_job(phase="Restarting"), _pods("Running", "Running", "Failed", deleting=True))
    assert (d.action, d.reason, d.delete_pods) == (lc.WAIT, "PodsTerminating", ())


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
