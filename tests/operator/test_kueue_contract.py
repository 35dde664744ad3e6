"""Kueue's contract for an external job framework, to the letter (issue 21): PodsReady exactly as
Kueue v0.17's own job reconciler writes it (case 41), admission checks and their podSetUpdates
(case 42), a v1beta1-only Kueue served through v1beta1 (case 49), a user's suspend releasing the
quota, and Workload conditions merged with optimistic concurrency instead of replaced.

The adapter runs over the in-memory CustomObjectsApi of tests/operator/test_kueue_gate.py; the
operator end to end is tests/operator/test_kueue_contract_e2e.py (the fake API server) and
tests/cluster/test_kueue_contract_real.py (real Kueue).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from test_kueue_gate import NOW, Api, Custom, capacity_plan, custom, job_body, the_workload  # noqa: F401 (fixture)

from hetero_operator.api.spec import parse_job
from hetero_operator.controller.objects import KueueGate
from hetero_operator.lifecycle import decisions as lc
from hetero_operator.lifecycle.decisions import PodState
from hetero_operator.render import kueuestatus as ks

LATER = "2026-12-01T09:01:00Z"


def wl_with(conditions: list[dict[str, Any]], **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "w", "resourceVersion": "7"},
            "status": {"conditions": copy.deepcopy(conditions), **status}}


def cond(type_: str, status: str, reason: str, message: str = "m") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": NOW}


# --- PodsReady (case 41) ---------------------------------------------------------------------------

@pytest.mark.parametrize(("current", "admitted", "running", "want"), [
    (None, False, False, ("False", "WaitForStart")),
    (None, True, False, ("False", "WaitForStart")),
    (None, True, True, ("True", "Started")),
    (("True", "Started"), True, False, ("False", "WaitForRecovery")),
    (("False", "WaitForRecovery"), True, False, ("False", "WaitForRecovery")),
    (("False", "WaitForRecovery"), True, True, ("True", "Recovered")),
    (("True", "Recovered"), True, True, ("True", "Recovered")),
    (("True", "Started"), False, False, ("False", "WaitForStart")),
], ids=["queued: waiting to start", "admitted, ranks starting: waiting to start",
        "every rank runs: started", "a rank failed after the start: waiting for recovery",
        "still restarting: waiting for recovery", "running again: recovered",
        "recovered stays recovered", "evicted and queued again: waiting to start (a new start)"])
def test_pods_ready_follows_kueues_own_job_reconciler(current, admitted, running, want) -> None:
    """Kueue v0.17's reasons (``Started``/``Recovered``; the case file quotes the older
    ``PodsReady`` reason, which Kueue itself renamed)."""
    wl = wl_with([cond("PodsReady", *current)] if current else [])
    got = ks.pods_ready(wl, admitted=admitted, all_running=running)
    assert (got["status"], got["reason"]) == want


def states(*phases: str) -> list[PodState]:
    return [PodState(name=f"p{i}", first_rank=i, phase=ph, ranks=1) for i, ph in enumerate(phases)]


def test_every_rank_running_means_every_planned_rank() -> None:
    assert ks.all_ranks_running(states("Running", "Running", "Running"), 3)
    assert not ks.all_ranks_running(states("Running", "Pending", "Running"), 3)
    assert not ks.all_ranks_running(states("Running", "Running"), 3)
    assert not ks.all_ranks_running([], 0)
    # the ranks that finish first at the end of a job: still ready (not WaitForRecovery)
    assert ks.all_ranks_running(states("Succeeded", "Running", "Succeeded"), 3)
    assert not ks.all_ranks_running(states("Succeeded", "Failed", "Running"), 3)
    deleting = states("Running", "Running", "Running")
    deleting[0] = PodState(name="p0", first_rank=0, phase="Running", ranks=1, deleting=True)
    assert not ks.all_ranks_running(deleting, 3)


# --- merged conditions --------------------------------------------------------------------------

def test_a_condition_change_keeps_every_other_condition_and_its_transition_time() -> None:
    wl = wl_with([cond("QuotaReserved", "True", "QuotaReserved"), cond("PodsReady", "False", "WaitForStart")])
    merged = ks.merged_conditions(wl, [ks.pods_ready(wl, admitted=True, all_running=True)], LATER)
    assert [c["type"] for c in merged] == ["QuotaReserved", "PodsReady"]
    assert merged[0] == cond("QuotaReserved", "True", "QuotaReserved")
    assert (merged[1]["status"], merged[1]["reason"], merged[1]["lastTransitionTime"]) == ("True", "Started", LATER)
    assert ks.merged_conditions(wl_with(merged), [ks.pods_ready(wl_with(merged), admitted=True,
                                                                all_running=True)], LATER) is None
    assert ks.status_patch(wl, {"conditions": merged})["metadata"] == {"resourceVersion": "7"}


async def test_a_condition_kueue_writes_between_read_and_patch_survives(custom: Custom) -> None:
    """The patch carries the resourceVersion it was computed from: Kueue's write in between makes
    it a 409, and the gate reads again and merges again."""
    body = job_body()
    body["status"] = {"plan": {"worldSize": 3}}
    gate = KueueGate(Api(custom))
    await gate.check(body, parse_job(body), capacity_plan)
    admit(the_workload(custom))
    opened = await gate.check(body, parse_job(body), capacity_plan)
    # Kueue writes a condition after the gate read the Workload
    wl = the_workload(custom)
    wl["status"]["conditions"].append(cond("Requeued", "False", "Admitted"))
    custom._bump(wl)
    decision = lc.Decision(action=lc.WAIT, phase="Running", reason="Running", message="")
    await gate.after(opened, body, decision, states("Running", "Running", "Running"), NOW)
    conditions = {c["type"]: c for c in the_workload(custom)["status"]["conditions"]}
    assert conditions["Requeued"]["reason"] == "Admitted"  # Kueue's write kept
    assert (conditions["PodsReady"]["status"], conditions["PodsReady"]["reason"]) == ("True", "Started")


def admit(wl: dict[str, Any], *, checks: list[dict[str, Any]] | None = None,
          admitted: bool = True) -> None:
    wl["status"] = {"conditions": [
        cond("QuotaReserved", "True", "QuotaReserved"),
        cond("Admitted", "True" if admitted else "False", "Admitted" if admitted else "UnsatisfiedChecks")],
        "admission": {"clusterQueue": "gpu-cq", "podSetAssignments": [
            {"name": "nvidia-a100-sxm4-40gb", "count": 1, "flavors": {"nvidia.com/gpu": "a100"}},
            {"name": "tesla-t4", "count": 2, "flavors": {"nvidia.com/gpu": "t4"}}]}}
    if checks is not None:
        wl["status"]["admissionChecks"] = checks


# --- admission checks and podSetUpdates (case 42) -------------------------------------------------

PROV = {"autoscaling.x-k8s.io/consume-provisioning-request": "prov-t4-abc12",
        "autoscaling.x-k8s.io/provisioning-class-name": "queued-provisioning.gke.io"}
QUEUED = {"key": "cloud.google.com/gke-queued", "operator": "Equal", "value": "true", "effect": "NoSchedule"}


def ready_check(update: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": "dws-prov", "state": "Ready", "message": "Provisioned",
            "lastTransitionTime": NOW, "podSetUpdates": [update or {
                "name": "tesla-t4", "annotations": PROV,
                "nodeSelector": {"cloud.google.com/gke-queued": "true"}, "tolerations": [QUEUED]}]}


async def test_a_pending_admission_check_holds_the_pods_and_says_which(custom: Custom) -> None:
    body = job_body()
    gate = KueueGate(Api(custom))
    await gate.check(body, parse_job(body), capacity_plan)
    admit(the_workload(custom), admitted=False, checks=[
        {"name": "dws-prov", "state": "Pending", "message": "Provisioning in progress",
         "lastTransitionTime": NOW}])
    held = await gate.check(body, parse_job(body), capacity_plan)
    assert not held.admitted and held.reason == "WaitingForAdmission"
    assert "quota reserved, waiting for admission check dws-prov (Pending: Provisioning in progress)" in held.message


async def test_ready_checks_pod_set_updates_reach_the_placement(custom: Custom) -> None:
    body = job_body()
    gate = KueueGate(Api(custom))
    await gate.check(body, parse_job(body), capacity_plan)
    admit(the_workload(custom), checks=[ready_check()])
    opened = await gate.check(body, parse_job(body), capacity_plan)
    assert opened.admitted
    t4 = opened.allowed["Tesla-T4"]
    assert t4.node_labels == {"nvidia.com/gpu.product": "Tesla-T4", "cloud.google.com/gke-queued": "true"}
    assert QUEUED in t4.tolerations and t4.annotations == PROV
    a100 = opened.allowed["NVIDIA-A100-SXM4-40GB"]  # no update for its pod set
    assert a100.annotations == {} and a100.node_labels == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}


@pytest.mark.parametrize(("update", "fragment"), [
    ({"name": "tesla-t4", "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}},
     "must select nvidia.com/gpu.product=Tesla-T4"),
    ({"name": "tesla-t4", "labels": {"heterotrain.io/rank": "9"}}, "a label the operator sets"),
], ids=["an update naming another GPU product is refused like a flavor mismatch",
        "an update that would change the operator's own pod labels is refused"])
async def test_a_contradicting_update_is_refused_not_dropped(custom: Custom, update, fragment) -> None:
    body = job_body()
    gate = KueueGate(Api(custom))
    await gate.check(body, parse_job(body), capacity_plan)
    admit(the_workload(custom), checks=[ready_check(update)])
    refused = await gate.check(body, parse_job(body), capacity_plan)
    assert not refused.admitted and refused.reason == "AdmissionCheckConflict"
    assert fragment in refused.message


def test_two_checks_disagreeing_on_a_key_conflict() -> None:
    a = ready_check({"name": "tesla-t4", "annotations": {"k": "1"}})
    b = {**ready_check({"name": "tesla-t4", "annotations": {"k": "2"}}), "name": "other"}
    with pytest.raises(ks.PodSetUpdateConflict, match="sets annotations k=2"):
        ks.pod_set_updates({"status": {"admissionChecks": [a, b]}})


# --- versions (case 49) ---------------------------------------------------------------------------

async def test_a_v1beta1_only_kueue_gets_a_v1beta1_workload(custom: Custom) -> None:
    cu = custom
    cu.kueue_versions = ("v1beta1",)
    body = job_body()
    gate = await KueueGate(Api(cu)).check(body, parse_job(body), capacity_plan)
    assert (gate.admitted, gate.reason, gate.version) == (False, "WaitingForAdmission", "v1beta1")
    wl = the_workload(cu)
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    spec = wl["spec"]
    assert (spec["priorityClassName"], spec["priorityClassSource"], spec["priority"]) == (
        "training", "scheduling.k8s.io/priorityclass", 1000)
    assert "priorityClassRef" not in spec


async def test_both_versions_served_prefers_v1beta2(custom: Custom) -> None:
    body = job_body()
    gate = await KueueGate(Api(custom)).check(body, parse_job(body), capacity_plan)
    assert gate.version == "v1beta2" and the_workload(custom)["apiVersion"] == "kueue.x-k8s.io/v1beta2"


# --- suspend ---------------------------------------------------------------------------------------

async def test_a_users_suspend_deactivates_the_workload_and_a_resume_activates_it(custom: Custom) -> None:
    body = job_body()
    gate = KueueGate(Api(custom))
    await gate.check(body, parse_job(body), capacity_plan)
    assert the_workload(custom)["spec"]["active"] is True
    admit(the_workload(custom))
    body["spec"]["runPolicy"]["suspend"] = True
    suspended = await gate.check(body, parse_job(body), capacity_plan)
    wl = the_workload(custom)
    assert wl["spec"]["active"] is False and wl["metadata"]["annotations"][ks.DEACTIVATED_BY] == ks.USER_SUSPEND
    assert suspended.user_suspended
    # the lifecycle's own reason for a user's suspend stays (not Kueue's)
    mine = lc.Decision(action=lc.SUSPEND, phase="Suspended", reason="Suspended", message="by the user")
    assert suspended.explain(mine) is mine
    body["spec"]["runPolicy"]["suspend"] = False
    await gate.check(body, parse_job(body), capacity_plan)
    wl = the_workload(custom)
    assert wl["spec"]["active"] is True and ks.DEACTIVATED_BY not in wl["metadata"].get("annotations", {})


def test_a_workload_kueue_deactivated_itself_stays_inactive() -> None:
    """e.g. ``requeuingStrategy.backoffLimitCount`` reached: not the operator's to undo."""
    wl = {"metadata": {}, "spec": {"active": False}}
    assert ks.active_patch(wl, suspended=False) is None
    assert ks.active_patch({"metadata": {}, "spec": {}}, suspended=False) is None
