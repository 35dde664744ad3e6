"""Kueue's contract for an external framework against REAL Kueue (v0.17.0's manager on the real
API server, waitForPodsReady 20 s in this cluster; issue 21, shared cases 41, 42, 49).  The same
with the test playing Kueue: tests/operator/test_kueue_contract_e2e.py.

* case 41: a job that runs longer than waitForPodsReady's 20 s is not evicted: the operator's
  ``PodsReady=True`` (``Started``) reached Kueue, merged beside Kueue's own conditions;
* case 42: an AdmissionCheck whose controller the test plays: Kueue reserves quota and waits for
  the check (no pods); the check Ready with ``podSetUpdates`` makes Kueue admit, and the pods
  carry the update's annotations, nodeSelector and toleration (the real scheduler binds them);
* case 49: the operator speaking ``v1beta1`` (what it does on a Kueue that serves only v1beta1) is
  admitted by real Kueue, which serves both: the v1beta1 Workload is valid to Kueue's own CRD,
  webhooks and conversion, and the job runs;
* a user's suspend releases the quota (Kueue evicts the deactivated Workload, its ClusterQueue
  shows no admitted Workload) and a resume gets it admitted and running again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from realcluster import GROUP, PLURAL, VERSION, RealCluster
from test_kueue_real import A100, KUEUE, T4, apply, job_cond, kobj, local_queue, queued, wl_cond, workload

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
READY_S = 20
"""waitForPodsReady's timeout in this cluster (hetero_operator.devcluster.kueue.start)."""
QUEUED = {"key": "cloud.google.com/gke-queued", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
PROV = {"autoscaling.x-k8s.io/consume-provisioning-request": "prov-t4-abc12",
        "autoscaling.x-k8s.io/provisioning-class-name": "queued-provisioning.gke.io"}


def waiting(flag: Path) -> str:
    return (f"import os, time\nwhile not os.path.exists({str(flag)!r}):\n"
            "    time.sleep(0.2)  # sync-ok: runs until the test lets it finish\n")


def cluster_queue(name: str, checks: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
        {"name": "ct-a100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 1}]},
        {"name": "ct-t4", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 2}]}]}]}
    if checks:
        spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": c} for c in checks]}
    return kobj("ClusterQueue", name, spec)


def cq(cl: RealCluster, name: str) -> dict[str, Any]:
    return cl.custom.get_cluster_custom_object(*KUEUE, "clusterqueues", name)


def cq_active(cl: RealCluster, name: str) -> bool:
    return any(c["type"] == "Active" and c["status"] == "True"
               for c in (cq(cl, name).get("status") or {}).get("conditions", []))


@pytest.fixture(scope="module")
def queues(kueue: RealCluster) -> RealCluster:
    """Flavors ct-a100 and ct-t4, ClusterQueue ct-cq (1 A100 + 2 T4) and ct-checked-cq (the same,
    behind the AdmissionCheck ct-prov whose controller the tests play)."""
    cl = kueue
    apply(cl, kobj("ResourceFlavor", "ct-a100", {"nodeLabels": {"nvidia.com/gpu.product": A100}}),
          kobj("ResourceFlavor", "ct-t4", {"nodeLabels": {"nvidia.com/gpu.product": T4}}),
          kobj("AdmissionCheck", "ct-prov", {"controllerName": "example.com/provisioning"}),
          cluster_queue("ct-cq"), cluster_queue("ct-checked-cq", ["ct-prov"]))
    # the check's controller says it is active (Kueue keeps a ClusterQueue with an inactive check inactive)
    ac = cl.custom.get_cluster_custom_object(*KUEUE, "admissionchecks", "ct-prov")
    ac["status"] = {"conditions": [{"type": "Active", "status": "True", "reason": "Active",
                                    "message": "the test plays the controller",
                                    "lastTransitionTime": _now()}]}
    cl.custom.patch_cluster_custom_object_status(*KUEUE, "admissionchecks", "ct-prov", {"status": ac["status"]})
    cl.kubectl("apply", "-f", "-", input_text=json.dumps({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "ct-low"},
        "value": 100, "preemptionPolicy": "Never"}))
    cl.wait_for(lambda: cq_active(cl, "ct-cq") and cq_active(cl, "ct-checked-cq"), 60, "ClusterQueues Active")
    return cl


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def test_case41_a_job_running_past_the_pods_ready_timeout_is_not_evicted(queues: RealCluster, tmp_path: Path) -> None:
    cl = queues
    cl.idle()
    ns = cl.namespace("kc-ready")
    local_queue(cl, ns, "team-q", "ct-cq")
    flag = tmp_path / "go"
    cl.apply(queued("ready", "team-q", waiting(flag)), ns)
    cl.wait_for(lambda: wl_cond(workload(cl, ns), "Admitted").get("status") == "True", 60, "admitted")
    admitted_s = time.monotonic()
    cl.wait_for(lambda: wl_cond(workload(cl, ns), "PodsReady").get("status") == "True", READY_S,
                "PodsReady=True within waitForPodsReady's timeout")
    ready = wl_cond(workload(cl, ns), "PodsReady")
    assert (ready["reason"], ready["message"]) == ("Started", "All pods reached readiness and the workload is running")
    # the timeout passes with the job running and the Workload admitted (an eviction fails at once)
    cl.wait_for(lambda: _not_evicted(cl, ns) and time.monotonic() - admitted_s > READY_S + 5, READY_S + 30,
                "waitForPodsReady's timeout to pass without an eviction")
    wl = workload(cl, ns)
    assert {c["type"] for c in wl["status"]["conditions"]} >= {"QuotaReserved", "Admitted", "PodsReady"}
    assert cl.phase("ready", ns) == "Running"
    flag.write_text("1")
    job = cl.finished("ready", ns, 90)
    assert job["status"]["phase"] == "Succeeded" and job["status"]["attempt"] == 1, job["status"]


def _not_evicted(cl: RealCluster, ns: str) -> bool:
    evicted = wl_cond(workload(cl, ns), "Evicted")
    assert evicted.get("status") != "True", f"Kueue evicted the running job: {evicted}"
    return True


def test_case42_real_kueue_waits_for_the_check_and_its_pod_set_updates_reach_the_pods(
        queues: RealCluster, tmp_path: Path) -> None:
    cl = queues
    cl.idle()
    ns = cl.namespace("kc-prov")
    local_queue(cl, ns, "team-q", "ct-checked-cq")
    cl.kubectl("label", "node", "node-t4", "cloud.google.com/gke-queued=true", "--overwrite")
    try:
        flag = tmp_path / "go"
        cl.apply(queued("prov", "team-q", waiting(flag)), ns)
        # Kueue may write the reserved quota and the check's state in two updates: wait for both
        wl = cl.wait_for(lambda: (w := workload(cl, ns)) and wl_cond(w, "QuotaReserved").get(
            "status") == "True" and (w.get("status") or {}).get("admissionChecks") and w, 60,
                         "quota reserved and the admission check's state")
        checks = wl["status"]["admissionChecks"]
        assert [(c["name"], c["state"]) for c in checks] == [("ct-prov", "Pending")]
        assert wl_cond(wl, "Admitted").get("status") != "True"
        cl.wait_for(lambda: "waiting for admission check ct-prov" in job_cond(cl, "prov", ns, "Suspended")
                    .get("message", ""), 30, "the job naming the pending check")
        assert cl.pods(ns) == []
        # the check's controller: Ready, with updates for the T4 pod set
        checks[0].update(state="Ready", message="Provisioned", lastTransitionTime=_now(), podSetUpdates=[{
            "name": "tesla-t4", "annotations": PROV, "nodeSelector": {"cloud.google.com/gke-queued": "true"},
            "tolerations": [QUEUED]}])
        cl.custom.patch_namespaced_custom_object_status(*KUEUE, ns, "workloads", wl["metadata"]["name"],
                                                        {"status": {"admissionChecks": checks}})
        cl.wait_for(lambda: wl_cond(workload(cl, ns), "Admitted").get("status") == "True", 60,
                    "Kueue admitting once the check is Ready")
        cl.wait_for(lambda: len(cl.pods(ns, "prov")) == 2 and all(
            p["spec"].get("nodeName") for p in cl.pods(ns, "prov")), 60, "the pods, bound by the real scheduler")
        t4 = next(p for p in cl.pods(ns, "prov") if p["metadata"]["name"] == "prov-g1")
        assert t4["spec"]["nodeName"] == "node-t4"  # the one node carrying the provisioned label
        assert {k: t4["metadata"]["annotations"].get(k) for k in PROV} == PROV
        assert t4["spec"]["nodeSelector"]["cloud.google.com/gke-queued"] == "true"
        assert QUEUED in t4["spec"]["tolerations"]
        flag.write_text("1")
        job = cl.finished("prov", ns, 90)
        assert job["status"]["phase"] == "Succeeded", job["status"]
    finally:
        cl.kubectl("label", "node", "node-t4", "cloud.google.com/gke-queued-", check=False)


def test_case49_a_v1beta1_workload_from_the_operator_is_admitted_by_real_kueue(queues: RealCluster) -> None:
    cl = queues
    cl.idle()
    ns = cl.namespace("kc-v1beta1")
    local_queue(cl, ns, "team-q", "ct-cq")
    gate = cl.memo.state["reconciler"].kueue
    gate.version = "v1beta1"  # what discovery chooses on a Kueue that serves only v1beta1
    try:
        cl.apply(queued("old", "team-q", "pass", priority="ct-low"), ns)
        wl = cl.wait_for(lambda: (cl.custom.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", ns,
                                                                          "workloads")["items"] or [None])[0],
                         60, "a Workload")
        assert (wl["spec"]["priorityClassName"], wl["spec"]["priorityClassSource"]) == (
            "ct-low", "scheduling.k8s.io/priorityclass")
        job = cl.finished("old", ns, 90)
        assert job["status"]["phase"] == "Succeeded", job["status"]
        cl.wait_for(lambda: wl_cond(workload(cl, ns), "Finished").get("status") == "True", 30,
                    "Workload Finished")
        stored = workload(cl, ns)  # read back through v1beta2: converted by Kueue's webhook
        assert stored["spec"]["priorityClassRef"]["name"] == "ct-low"
    finally:
        gate.version = None


def test_a_users_suspend_releases_the_quota_and_a_resume_runs_the_job_again(queues: RealCluster, tmp_path: Path) -> None:
    cl = queues
    cl.idle()
    ns = cl.namespace("kc-suspend")
    local_queue(cl, ns, "team-q", "ct-cq")
    flag = tmp_path / "go"
    cl.apply(queued("pausing", "team-q", waiting(flag)), ns)
    cl.wait_for(lambda: cl.phase("pausing", ns) == "Running", 90, "Running")
    cl.wait_for(lambda: (cq(cl, "ct-cq").get("status") or {}).get("admittedWorkloads") == 1, 30, "quota used")
    cl.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "pausing",
                                             {"spec": {"runPolicy": {"suspend": True}}})
    evicted = cl.wait_for(lambda: wl_cond(workload(cl, ns), "Evicted").get("status") == "True"
                          and wl_cond(workload(cl, ns), "Evicted"), 60, "Kueue evicting the deactivated Workload")
    assert evicted["reason"] == "Deactivated", evicted
    cl.wait_for(lambda: cl.pods(ns, "pausing") == [], 60, "the pods stopped")
    cl.wait_for(lambda: (cq(cl, "ct-cq").get("status") or {}).get("admittedWorkloads", 0) == 0
                and (cq(cl, "ct-cq").get("status") or {}).get("reservingWorkloads", 0) == 0, 60,
                "the ClusterQueue's quota released")
    assert job_cond(cl, "pausing", ns, "Suspended").get("status") == "True"
    cl.custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "pausing",
                                             {"spec": {"runPolicy": {"suspend": False}}})
    cl.wait_for(lambda: cl.phase("pausing", ns) == "Running", 90, "admitted and Running again")
    flag.write_text("1")
    job = cl.finished("pausing", ns, 90)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    assert json.dumps(workload(cl, ns)["spec"].get("active")) == "true"
