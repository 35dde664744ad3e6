"""Conditions: Kubernetes conventions (transition times), Kubeflow types, phase mapping."""

from __future__ import annotations

import pytest

from hetero_operator.api import conditions as c

T0, T1 = 1_800_000_000.0, 1_800_000_060.0


def _by_type(conds: list[dict]) -> dict[str, dict]:
    return {x["type"]: x for x in conds}


def test_new_condition_gets_both_times_and_generation() -> None:
    conds = c.set_condition([], type_=c.CREATED, status=c.TRUE, reason="PodsCreated",
                            message="Created 3 pods.", now_s=T0, generation=2)
    assert conds == [{"type": "Created", "status": "True", "reason": "PodsCreated",
                      "message": "Created 3 pods.", "lastTransitionTime": "2027-01-15T08:00:00Z",
                      "lastUpdateTime": "2027-01-15T08:00:00Z", "observedGeneration": 2}]


def test_transition_time_moves_only_when_status_changes() -> None:
    conds = c.set_condition([], type_=c.RUNNING, status=c.TRUE, reason="A", message="a", now_s=T0)
    same = c.set_condition(conds, type_=c.RUNNING, status=c.TRUE, reason="B", message="b", now_s=T1)
    assert same[0]["lastTransitionTime"] == "2027-01-15T08:00:00Z"
    assert same[0]["lastUpdateTime"] == "2027-01-15T08:01:00Z"
    flipped = c.set_condition(same, type_=c.RUNNING, status=c.FALSE, reason="B", message="b", now_s=T1)
    assert flipped[0]["lastTransitionTime"] == "2027-01-15T08:01:00Z"


def test_unchanged_condition_keeps_update_time() -> None:
    conds = c.set_condition([], type_=c.RUNNING, status=c.TRUE, reason="A", message="a", now_s=T0)
    again = c.set_condition(conds, type_=c.RUNNING, status=c.TRUE, reason="A", message="a", now_s=T1)
    assert again == conds


@pytest.mark.parametrize("kwargs,error", [
    (dict(type_="Ready", status=c.TRUE), "condition type must be one of"),
    (dict(type_=c.RUNNING, status="yes"), "condition status must be True, False or Unknown"),
], ids=["unknown type", "unknown status"])
def test_bad_type_or_status_is_refused(kwargs: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        c.set_condition([], reason="R", message="m", now_s=T0, **kwargs)


def test_lifecycle_of_conditions_from_pending_to_succeeded() -> None:
    conds = c.apply_phase([], phase=c.PENDING, reason="InsufficientGPUs", message="Tesla-T4: need 2, free 1", now_s=T0)
    assert _by_type(conds) == {"Created": conds[0]}
    assert conds[0]["status"] == "False" and conds[0]["reason"] == "InsufficientGPUs"
    conds = c.apply_phase(conds, phase=c.CREATED, reason="PodsCreated", message="m", now_s=T0)
    conds = c.apply_phase(conds, phase=c.RUNNING, reason="JobRunning", message="m", now_s=T0)
    conds = c.apply_phase(conds, phase=c.RESTARTING, reason="RankFailed", message="m", now_s=T1)
    got = _by_type(conds)
    assert (got["Created"]["status"], got["Running"]["status"], got["Restarting"]["status"]) == ("True", "False", "True")
    conds = c.apply_phase(conds, phase=c.RUNNING, reason="JobRunning", message="m", now_s=T1)
    assert _by_type(conds)["Restarting"]["status"] == "False"
    conds = c.apply_phase(conds, phase=c.SUCCEEDED, reason="JobSucceeded", message="done", now_s=T1)
    got = _by_type(conds)
    assert {t: got[t]["status"] for t in got} == {"Created": "True", "Running": "False",
                                                  "Restarting": "False", "Succeeded": "True"}


def test_pending_after_a_restart_keeps_created_true() -> None:
    conds = c.apply_phase([], phase=c.CREATED, reason="PodsCreated", message="m", now_s=T0)
    conds = c.apply_phase(conds, phase=c.PENDING, reason="NodeLost", message="m", now_s=T1)
    assert _by_type(conds)["Created"]["status"] == "True"


def test_suspended_clears_running_and_failed_is_terminal() -> None:
    conds = c.apply_phase([], phase=c.RUNNING, reason="JobRunning", message="m", now_s=T0)
    conds = c.apply_phase(conds, phase=c.SUSPENDED, reason="Suspended", message="m", now_s=T0)
    assert {x["type"]: x["status"] for x in conds} == {"Created": "True", "Running": "False", "Suspended": "True"}
    conds = c.apply_phase(conds, phase=c.FAILED, reason="BackoffLimitExceeded", message="m", now_s=T1)
    assert {x["type"]: x["status"] for x in conds}["Failed"] == "True"
    assert {x["type"]: x["status"] for x in conds}["Suspended"] == "False"


def test_iso_round_trip() -> None:
    assert c.parse_iso(c.now_iso(T0)) == T0
    assert c.parse_iso("") is None


def test_a_waiting_job_condition_carries_the_latest_shortfall() -> None:
    """Issue 10: the Created=False condition of a Pending job always says the current shortfall."""
    conds = c.apply_phase([], phase=c.PENDING, reason="InsufficientGPUs",
                          message="Unschedulable: Tesla-T4: need 2, free 1", now_s=T0)
    conds = c.apply_phase(conds, phase=c.PENDING, reason="InsufficientGPUs",
                          message="Unschedulable: Tesla-T4: need 2, free 0", now_s=T1)
    assert _by_type(conds)["Created"] == {
        "type": "Created", "status": "False", "reason": "InsufficientGPUs",
        "message": "Unschedulable: Tesla-T4: need 2, free 0",
        "lastTransitionTime": "2027-01-15T08:00:00Z", "lastUpdateTime": "2027-01-15T08:01:00Z"}


def test_a_node_not_ready_wait_keeps_running_true_with_the_reason() -> None:
    conds = c.apply_phase([], phase=c.RUNNING, reason="JobRunning", message="m", now_s=T0)
    conds = c.apply_phase(conds, phase=c.RUNNING, reason="NodeNotReady", message="node-c", now_s=T1)
    running = _by_type(conds)["Running"]
    assert (running["status"], running["reason"], running["lastTransitionTime"]) == (
        "True", "NodeNotReady", "2027-01-15T08:00:00Z")
    conds = c.apply_phase(conds, phase=c.RESTARTING, reason="NodeLost", message="lost", now_s=T1)
    assert {t: x["status"] for t, x in _by_type(conds).items()} == {
        "Created": "True", "Running": "False", "Restarting": "True"}
