"""The operator's elastic lifecycle (issue 31), through the pure
:func:`hetero_operator.lifecycle.decisions.decide`: a lost rank pod shrinks the job (only it is
deleted, nothing counted as a restart), below ``minRanks`` the gang restarts as without
``spec.elastic``, a removed pod whose node is healthy again is created again, at most
``backoffLimit`` times, and a job whose rank 0 was lost succeeds when every remaining rank has."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hetero_operator.api.elasticspec import ElasticSpec
from hetero_operator.api.spec import RunPolicy
from hetero_operator.cluster.nodehealth import NodeHealth
from hetero_operator.lifecycle import decisions as lc
from hetero_operator.lifecycle import status as st
from hetero_operator.lifecycle.elastic import (ELASTIC_KEYS, GROW_REASON, SHRINK_REASON, ElasticStatus, LostPod,
                                               started)

NOW = 1_800_000_000.0
TIMING = lc.RestartSettings(pending_timeout_s=300, backoff_base_s=10, backoff_max_s=300)
KEEPER = "job-membership"
PLANNED = ("job-g0", "job-g1", "job-g2")
NODES = {n: NodeHealth(name=n) for n in ("node-a", "node-b", "node-t4")}
LOST_T4 = {**NODES, "node-t4": NodeHealth(name="node-t4", unhealthy_since_s=NOW - 60,
                                           why="Ready=Unknown (NodeStatusUnknown)")}
POLICY = RunPolicy(node_loss_grace_seconds=10, backoff_limit=2)


def _pods(*phases: str, **over: Any) -> list[lc.PodState]:
    """A100 (rank 0), V100 (rank 1), 2x T4 in one pod (ranks 2-3), and the keeper, all Running
    unless ``phases`` says otherwise."""
    shape = [("job-g0", 0, "node-a", "A100", 1), ("job-g1", 1, "node-b", "V100", 1),
             ("job-g2", 2, "node-t4", "Tesla-T4", 2)]
    pods = [lc.PodState(name=n, first_rank=r, phase=ph, node=node, attempt=1, created_s=NOW - 100,
                        gpu_type=t, ranks=k, **over.get(n, {}))
            for (n, r, node, t, k), ph in zip(shape, phases, strict=True)]
    return [*pods, lc.PodState(name=KEEPER, first_rank=-1, phase="Running", node="node-a",
                               attempt=1, created_s=NOW - 100, ranks=0)]


def _decide(pods: list[lc.PodState], *, nodes: dict[str, NodeHealth] = NODES, min_ranks: int = 2,
            max_ranks: int = 4, state: ElasticStatus | None = None,
            policy: RunPolicy = POLICY, spares: dict[str, dict[str, int]] | None = None) -> lc.Decision:
    job = lc.JobState(phase="Running", attempt=1, start_s=NOW - 200, planned_pods=PLANNED)
    ej = lc.ElasticJob(spec=ElasticSpec(min_ranks=min_ranks, max_ranks=max_ranks),
                       state=state or ElasticStatus(attempt=1, ranks=4), keeper=KEEPER,
                       spares=spares or {})
    return lc.decide(job, policy, pods, nodes=nodes, now_s=NOW, timing=TIMING, elastic=ej)


def _state(d: lc.Decision) -> ElasticStatus:
    assert d.elastic is not None
    return ElasticStatus.from_status({"elastic": d.elastic}, 1)


def test_a_lost_node_shrinks_the_job_deleting_only_its_pod_and_counting_no_restart() -> None:
    d = _decide(_pods("Running", "Running", "Running"), nodes=LOST_T4)
    assert (d.action, d.phase, d.reason) == (lc.SHRINK, "Running", SHRINK_REASON)
    assert (d.delete_pods, d.force_delete_pods) == ((), ("job-g2",))  # no kubelet will confirm
    assert not d.count_restart and not d.count_infrastructure_restart
    assert d.message.startswith("pod job-g2 (2 Tesla-T4 ranks) node node-t4 lost "
                                "(Ready=Unknown (NodeStatusUnknown)): the job goes on with 2 of 4 ranks")
    assert d.elastic == {"attempt": 1, "generation": 1, "ranks": 2,
                         "gpuTypes": [{"gpuType": "A100", "ranks": 1}, {"gpuType": "V100", "ranks": 1}],
                         "lostPods": [{"pod": "job-g2", "node": "node-t4", "gpuType": "Tesla-T4",
                                       "ranks": 2, "why": "node node-t4 lost (Ready=Unknown "
                                                          "(NodeStatusUnknown))"}],
                         "regrows": 0, "reason": SHRINK_REASON, "message": d.message,
                         "lastTransitionTime": "2027-01-15T08:00:00Z"}


def test_a_failed_rank_pod_is_deleted_gracefully_and_the_others_go_on() -> None:
    d = _decide(_pods("Running", "Failed", "Running",
                      **{"job-g1": {"failure": "Error exit 137"}}), min_ranks=3)
    assert (d.action, d.delete_pods, d.force_delete_pods) == (lc.SHRINK, ("job-g1",), ())
    assert _state(d).ranks == 3 and "failed (Error exit 137)" in d.message


def test_below_min_ranks_the_gang_restarts_as_without_elastic() -> None:
    d = _decide(_pods("Running", "Running", "Running"), nodes=LOST_T4, min_ranks=3)
    assert (d.action, d.reason, d.count_infrastructure_restart) == (lc.RESTART, "NodeLost", True)
    assert d.force_delete_pods == ("job-g2",)
    assert set(d.delete_pods) == {"job-g0", "job-g1", KEEPER}


def test_a_start_up_error_fails_the_job_rather_than_shrinking_it() -> None:
    d = _decide(_pods("Running", "Failed", "Running",
                      **{"job-g1": {"startup_error": "No module named 'train'"}}))
    assert (d.action, d.reason) == (lc.FAIL, "StartupError")


def test_the_keeper_failing_restarts_the_gang() -> None:
    pods = _pods("Running", "Running", "Running")
    pods[-1] = replace(pods[-1], phase="Failed", failure="Error exit 1")
    d = _decide(pods)
    assert (d.action, d.count_restart) == (lc.RESTART, True)


def test_after_a_shrink_the_removed_pod_is_invisible_to_the_gang_rules() -> None:
    """The lost pod still shows Running on its dead node until the force-delete lands, and is
    missing from the plan afterwards: neither restarts the gang."""
    state = _state(_decide(_pods("Running", "Running", "Running"), nodes=LOST_T4))
    still_there = _decide(_pods("Running", "Running", "Running"), nodes=LOST_T4, state=state)
    assert (still_there.action, still_there.reason) == (lc.RUNNING, "JobRunning")
    gone = _decide(_pods("Running", "Running", "Running")[:2] + _pods("Running", "Running", "Running")[3:],
                   nodes=LOST_T4, state=state)
    assert (gone.action, gone.reason) == (lc.RUNNING, "JobRunning")


def test_the_removed_pod_is_created_again_when_its_node_is_healthy() -> None:
    state = _state(_decide(_pods("Running", "Running", "Running"), nodes=LOST_T4))
    pods = [p for p in _pods("Running", "Running", "Running") if p.name != "job-g2"]
    assert _decide(pods, nodes=LOST_T4, state=state).action == lc.RUNNING  # still down: wait
    d = _decide(pods, nodes=NODES, state=state)
    assert (d.action, d.reason, d.create_pods) == (lc.GROW, GROW_REASON, ("job-g2",))
    assert d.message.startswith("Pod job-g2 on node-t4 (node-t4 healthy again): 2 Tesla-T4 ranks "
                                "created again to join the running job at a step boundary (2 -> 4 ranks")
    assert d.create_on == {}
    grown = _state(d)
    assert (grown.generation, grown.ranks, grown.lost, grown.regrows) == (2, 4, (), 1)
    assert grown.gpu_types == (("A100", 1), ("V100", 1), ("Tesla-T4", 2))


def test_growing_stops_at_max_ranks_and_at_the_backoff_limit() -> None:
    lost = ElasticStatus(attempt=1, ranks=2, generation=1, lost=(
        LostPod(pod="job-g2", node="node-t4", gpu_type="Tesla-T4", ranks=2, why="failed"),))
    pods = [p for p in _pods("Running", "Running", "Running") if p.name != "job-g2"]
    assert _decide(pods, state=lost, max_ranks=3).action == lc.RUNNING  # 2 + 2 > 3
    assert _decide(pods, state=replace(lost, regrows=2)).action == lc.RUNNING  # backoffLimit 2 used
    assert _decide(pods, state=replace(lost, regrows=1)).action == lc.GROW


def test_a_job_whose_rank_0_was_lost_succeeds_when_every_remaining_rank_has() -> None:
    state = _state(_decide(_pods("Failed", "Running", "Running"), min_ranks=2))
    pods = [p for p in _pods("Running", "Succeeded", "Succeeded") if p.name != "job-g0"]
    d = _decide(pods, state=replace(state, regrows=POLICY.backoff_limit))
    assert (d.action, d.phase) == (lc.SUCCEED, "Succeeded")
    assert d.message == "Every remaining rank completed successfully (3 of 4 ranks; job-g0 lost)."


def test_status_elastic_starts_at_generation_0_and_resets_with_each_attempt() -> None:
    first = started(4, [("A100", 1), ("V100", 1), ("Tesla-T4", 1), ("Tesla-T4", 1)], 1)
    assert first == {"attempt": 1, "generation": 0, "ranks": 4, "lostPods": [], "regrows": 0,
                     "gpuTypes": [{"gpuType": "A100", "ranks": 1}, {"gpuType": "V100", "ranks": 1},
                                  {"gpuType": "Tesla-T4", "ranks": 2}]}
    assert ElasticStatus.from_status({"elastic": {**first, "generation": 3}}, 2) == ElasticStatus(attempt=2)
    assert "elastic" in st.STATUS_KEYS and set(first) < ELASTIC_KEYS  # declared in the CRD (test_crd)


def test_while_a_pod_grows_back_the_job_stays_running() -> None:
    state = ElasticStatus(attempt=1, ranks=4, generation=2, regrows=1)
    d = _decide(_pods("Running", "Running", "Pending"), state=state)
    assert (d.action, d.phase, d.reason) == (lc.WAIT, "Running", "PodsPending")


def test_while_its_node_is_down_a_removed_pod_comes_back_on_another_node_of_its_gpu_type() -> None:
    """A spot T4 node reclaimed, another T4 node free: the pod comes back there; a node with too
    few free T4s, or one that is not healthy, is passed over."""
    state = _state(_decide(_pods("Running", "Running", "Running"), nodes=LOST_T4))
    pods = [p for p in _pods("Running", "Running", "Running") if p.name != "job-g2"]
    nodes = {**LOST_T4,  # the health view knows only the job's nodes (node-t4-c is not one)
             "node-t4-sick": NodeHealth(name="node-t4-sick", unhealthy_since_s=NOW - 5, why="Ready=False")}
    spares = {"Tesla-T4": {"node-t4-b": 1, "node-t4-c": 2, "node-t4-sick": 2}, "Tesla-V100": {"node-v": 4}}
    d = _decide(pods, nodes=nodes, state=state, spares=spares)
    assert (d.action, d.create_pods, d.create_on) == (lc.GROW, ("job-g2",), {"job-g2": "node-t4-c"})
    assert d.message.startswith("Pod job-g2 on node-t4-c (node-t4 is not healthy; node-t4-c has free "
                                "Tesla-T4s): 2 Tesla-T4 ranks created again")
    assert _decide(pods, nodes=nodes, state=state, spares={"Tesla-T4": {"node-t4-b": 1}}).action == lc.RUNNING
