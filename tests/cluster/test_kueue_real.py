"""The operator with REAL Kueue (v0.17.0's manager, its CRDs and webhooks) on the real API server:
Kueue itself admits the job's Workload on one ResourceFlavor per GPU type, preempts it for a
higher-priority one, and evicts a Workload whose pods never get ready (waitForPodsReady,
``realcluster.WAIT_FOR_PODS_READY_S``).  The stand-in test (tests/operator/test_kueue_e2e.py)
plays Kueue."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from realcluster import GROUP, PLURAL, REPO, VERSION, WAIT_FOR_PODS_READY_S, RealCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
KUEUE = ("kueue.x-k8s.io", "v1beta2")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
A100, T4 = "NVIDIA-A100-SXM4-40GB", "Tesla-T4"


def kobj(kind: str, name: str, spec: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "/".join(KUEUE), "kind": kind, "metadata": meta, "spec": spec}


def apply(cl: RealCluster, *objs: dict[str, Any]) -> None:
    cl.kubectl("apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objs)}))


@pytest.fixture(scope="module")
def queues(kueue: RealCluster) -> RealCluster:
    """Flavors a100 and t4 (one per GPU type), a ClusterQueue with 1 A100 + 2 T4 that preempts
    lower priorities, and one whose flavor matches no node (pods never get ready)."""
    cl = kueue
    apply(cl,
          kobj("ResourceFlavor", "a100", {"nodeLabels": {"nvidia.com/gpu.product": A100}}),
          kobj("ResourceFlavor", "t4", {"nodeLabels": {"nvidia.com/gpu.product": T4}}),
          kobj("ResourceFlavor", "ghost", {"nodeLabels": {"nvidia.com/gpu.product": T4,
                                                          "example.com/pool": "nowhere"}}),
          kobj("ClusterQueue", "gpu-cq", {
              "namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
              "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                  {"name": "a100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 1}]},
                  {"name": "t4", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 2}]}]}]}),
          kobj("ClusterQueue", "ghost-cq", {
              "namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                  {"name": "ghost", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 2}]}]}]}))
    for name, value in (("low", 100), ("high", 1000)):
        cl.kubectl("apply", "-f", "-", input_text=json.dumps({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": f"htj-{name}"},
            "value": value, "preemptionPolicy": "Never"}))
    cl.wait_for(lambda: _cq_active(cl, "gpu-cq") and _cq_active(cl, "ghost-cq"), 60, "ClusterQueues Active")
    return cl


def _cq_active(cl: RealCluster, name: str) -> bool:
    cq = cl.custom.get_cluster_custom_object(*KUEUE, "clusterqueues", name)
    return any(c["type"] == "Active" and c["status"] == "True" for c in (cq.get("status") or {}).get("conditions", []))


def local_queue(cl: RealCluster, ns: str, name: str, cq: str) -> None:
    apply(cl, kobj("LocalQueue", name, {"clusterQueue": cq}, namespace=ns))


def queued(name: str, queue: str, code: str, priority: str | None = None) -> dict[str, Any]:
    """A 3-rank job (A100 + 2x T4) in ``queue`` running ``python -c code``."""
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"] = {"name": name, "labels": {QUEUE_LABEL: queue}}
    body["spec"]["worker"].update(command=["python", "-c", code], args=[], env=[])
    body["spec"]["gpus"] = {"ranks": 3, "minRanks": 3, "allowedProducts": [A100, T4]}
    body["spec"]["training"].pop("checkpoint")
    if priority:
        body["spec"]["runPolicy"]["schedulingPolicy"] = {"priorityClass": priority}
    return body


def workload(cl: RealCluster, ns: str) -> dict[str, Any] | None:
    items = cl.custom.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"]
    return items[0] if len(items) == 1 else None


def wl_cond(wl: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return next((c for c in ((wl or {}).get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def job_cond(cl: RealCluster, name: str, ns: str, type_: str) -> dict[str, Any]:
    job = cl.job(name, ns) or {}
    return next((c for c in (job.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def test_kueue_admits_the_workload_on_one_flavor_per_gpu_type_and_the_job_succeeds(queues: RealCluster) -> None:
    cl = queues
    cl.idle()
    ns = cl.namespace("kq-admit")
    local_queue(cl, ns, "team-q", "gpu-cq")
    cl.apply(queued("admitted", "team-q", "pass"), ns)
    wl = cl.wait_for(lambda: wl_cond(workload(cl, ns), "Admitted").get("status") == "True" and workload(cl, ns),
                     60, "Kueue to admit the Workload")
    flavors = {a["name"]: a["flavors"]["nvidia.com/gpu"] for a in wl["status"]["admission"]["podSetAssignments"]}
    assert flavors == {"nvidia-a100-sxm4-40gb": "a100", "tesla-t4": "t4"}
    assert wl["status"]["admission"]["clusterQueue"] == "gpu-cq"
    job = cl.finished("admitted", ns, 90)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    assert [(g["pod"], g["node"]) for g in job["status"]["plan"]["groups"]] == [
        ("admitted-g0", "node-a100"), ("admitted-g1", "node-t4")]
    assert cl.core.read_namespaced_pod("admitted-g0", ns).spec.node_name == "node-a100"  # the real scheduler
    cl.wait_for(lambda: wl_cond(workload(cl, ns), "Finished").get("status") == "True", 30, "Workload Finished")


def test_kueue_preempts_the_low_priority_job_for_a_high_priority_one(queues: RealCluster, tmp_path: Path) -> None:
    cl = queues
    cl.idle()
    ns = cl.namespace("kq-preempt")
    local_queue(cl, ns, "team-q", "gpu-cq")
    flag = tmp_path / "go"
    low_code = (f"import os, sys, time\nwhile not os.path.exists({str(flag)!r}):\n"
                "    time.sleep(0.2)  # sync-ok: runs until the test lets it finish\n")
    cl.apply(queued("low", "team-q", low_code, priority="htj-low"), ns)
    cl.wait_for(lambda: cl.phase("low", ns) == "Running", 60, "low Running")
    cl.apply(queued("high", "team-q", "pass", priority="htj-high"), ns)
    # Kueue (not the test) evicts the low-priority Workload; the operator stops its pods
    low_wl = lambda: next(w for w in cl.custom.list_namespaced_custom_object(*KUEUE, ns, "workloads")["items"]  # noqa: E731
                          if w["metadata"]["labels"].get("heterotrain.io/job-name") == "low")
    evicted = cl.wait_for(lambda: wl_cond(low_wl(), "Evicted").get("status") == "True" and wl_cond(low_wl(), "Evicted"),
                          60, "the low-priority Workload Evicted")
    assert evicted["reason"] == "Preempted", evicted
    cl.wait_for(lambda: job_cond(cl, "low", ns, "Suspended").get("status") == "True", 60, "low Suspended")
    high = cl.finished("high", ns, 90)
    assert high["status"]["phase"] == "Succeeded", high["status"]
    flag.write_text("1")
    low = cl.finished("low", ns, 120)  # re-admitted once high's quota is free
    assert low["status"]["phase"] == "Succeeded", low["status"]
    assert low["status"]["attempt"] >= 2


def test_kueue_wait_for_pods_ready_evicts_a_workload_whose_pods_never_start(queues: RealCluster) -> None:
    cl = queues
    cl.idle()
    ns = cl.namespace("kq-ready")
    local_queue(cl, ns, "ghost-q", "ghost-cq")
    body = queued("stuck", "ghost-q", "pass")
    body["spec"]["gpus"] = {"ranks": 2, "minRanks": 2, "allowedProducts": [T4]}
    cl.apply(body, ns)
    cl.wait_for(lambda: wl_cond(workload(cl, ns), "Admitted").get("status") == "True", 60, "admitted on ghost")
    # the flavor's node label matches no node: no pod of the job ever gets ready
    evicted = cl.wait_for(lambda: wl_cond(workload(cl, ns), "Evicted").get("status") == "True"
                          and wl_cond(workload(cl, ns), "Evicted"), WAIT_FOR_PODS_READY_S + 60,
                          "Kueue's PodsReadyTimeout eviction")
    assert evicted["reason"] == "PodsReadyTimeout", (evicted, (cl.job("stuck", ns) or {}).get("status"))
    cl.wait_for(lambda: cl.pods(ns) == [], 60, "no pod left")
    cl.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "stuck")


def test_kueue_never_admits_a_gpu_type_to_a_flavor_whose_node_labels_contradict_it(queues: RealCluster) -> None:
    """The stand-in test admitted the T4 pod set to the A100 flavor (the operator then refuses with
    FlavorMismatch); real Kueue checks the pod set's nodeSelector against the flavor's nodeLabels
    and leaves the Workload pending: no pods, the job waits for admission."""
    cl = queues
    cl.idle()
    apply(cl, kobj("ClusterQueue", "a100-only-cq", {
        "namespaceSelector": {}, "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
            {"name": "a100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}]}]}))
    cl.wait_for(lambda: _cq_active(cl, "a100-only-cq"), 60, "ClusterQueue Active")
    ns = cl.namespace("kq-mismatch")
    local_queue(cl, ns, "a100-q", "a100-only-cq")
    cl.apply(queued("mismatch", "a100-q", "pass"), ns)
    pending = cl.wait_for(lambda: wl_cond(workload(cl, ns), "QuotaReserved").get("reason") == "Pending"
                          and wl_cond(workload(cl, ns), "QuotaReserved"), 60, "Kueue's verdict")
    assert pending["status"] == "False" and "tesla-t4" in pending["message"], pending
    assert "didn't match" in pending["message"] or "doesn't match" in pending["message"], pending
    assert cl.pods(ns) == []
    assert job_cond(cl, "mismatch", ns, "Suspended").get("reason") == "WaitingForAdmission"
    cl.custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "mismatch")
