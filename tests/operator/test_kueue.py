"""Kueue admission per GPU type (issue 15, case 35), the pure part: the Workload we create (checked
against Kueue's own v1beta2 CRD, tests/fixtures/kueue), what an admission means for the plan and
the pods, eviction, and finishing.

Case 35's objects are mapped onto our API: its ResourceFlavors ``h100``/``t4`` (``v1beta1`` there,
the same fields in ``v1beta2``) pin ``nvidia.com/gpu.product`` and a GKE node pool; its job with
groups ``h100-80gb x2`` and ``t4 x2`` is our job with 4 ranks over a cluster of 2 H100 + 2 T4
(plus a T4 node outside the t4 pool, which the admission must not use).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from builders import CATALOG_118_124_128, make_node
from k8s import crdcheck, kueuecheck

from hetero_operator.api import types as model
from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.plan import plan_job
from hetero_operator.render import pods as rendering
from hetero_operator.render import workload as kueue
from hetero_operator.render.env import render_rank_envs

CASES = Path(__file__).resolve().parents[1] / "fixtures" / "cases"
H100 = "NVIDIA-H100-80GB-HBM3"
POOL = "cloud.google.com/gke-nodepool"
NOW = "2026-12-01T09:00:00Z"


def case35() -> list[dict[str, Any]]:
    (path,) = CASES.glob("35-*.yaml")
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def flavors() -> dict[str, dict[str, Any]]:
    """Case 35's ResourceFlavors, as v1beta2 objects."""
    out = {}
    for doc in case35():
        if doc.get("kind") == "ResourceFlavor":
            doc = {**doc, "apiVersion": kueue.API_VERSION}
            kueuecheck.validate(doc, "resourceflavors")
            out[doc["metadata"]["name"]] = doc
    return out


def nodes() -> list[dict[str, Any]]:
    return [
        make_node("h100-0", product=H100, count=2, memory_mib=81559, cc="9.0",
                  driver="550.127.05", runtime="12.4", labels={POOL: "h100-pool"}),
        make_node("t4-0", product="Tesla-T4", count=2, memory_mib=15360, cc="7.5",
                  driver="550.127.05", runtime="12.4", labels={POOL: "t4-pool"}),
        make_node("t4-spot", product="Tesla-T4", count=2, memory_mib=15360, cc="7.5",
                  driver="550.127.05", runtime="12.4", labels={POOL: "t4-spot"}),
    ]


def job_body(ranks: int = 4, priority_class: str = "") -> dict[str, Any]:
    policy: dict[str, Any] = {"backoffLimit": 3}
    if priority_class:
        policy["schedulingPolicy"] = {"priorityClass": priority_class}
    return {"apiVersion": "heterotrain.io/v1alpha1", "kind": "HeteroTrainingJob",
            "metadata": {"name": "job-q", "namespace": "team-x", "uid": "0b4f5a6e-1111-4c2e-9a7b-5d1e2f3a4b5c",
                         "labels": {kueue.QUEUE_LABEL: "team-q"}},
            "spec": {"worker": {"command": ["python", "-m", "train"],
                                "resources": {"requests": {"cpu": "4", "memory": "16Gi"}}},
                     "images": CATALOG_118_124_128,
                     "gpus": {"ranks": ranks, "allowedProducts": [H100, "Tesla-T4"]},
                     "training": {"globalBatchSize": 64}, "runPolicy": policy}}


def capacity_plan(body: dict[str, Any]) -> model.Plan:
    """The plan the Workload is shaped from: T4s of both pools count as capacity."""
    plan = plan_job(parse_job(body), kueue.capacity_inventory(build_inventory(nodes())))
    assert isinstance(plan, model.Plan), plan
    return plan


def workload(body: dict[str, Any] | None = None, priority: int | None = None) -> dict[str, Any]:
    body = body or job_body()
    return kueue.render_workload(body, parse_job(body), capacity_plan(body), priority=priority)


def admitted(wl: dict[str, Any], assignment: dict[str, str], *, cq: str = "gpu-cq") -> dict[str, Any]:
    """What Kueue writes when it admits: QuotaReserved + Admitted and status.admission."""
    wl = copy.deepcopy(wl)
    wl["status"] = {
        "conditions": [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
             "message": f"Quota reserved in ClusterQueue {cq}", "lastTransitionTime": NOW},
            {"type": "Admitted", "status": "True", "reason": "Admitted",
             "message": "The workload is admitted", "lastTransitionTime": NOW}],
        "admission": {"clusterQueue": cq, "podSetAssignments": [
            {"name": ps["name"], "count": ps["count"],
             "flavors": {"nvidia.com/gpu": assignment[ps["name"]], "cpu": "default-flavor"},
             "resourceUsage": {"nvidia.com/gpu": str(ps["count"])}}
            for ps in wl["spec"]["podSets"]]}}
    return wl


def test_one_pod_set_per_gpu_type_with_its_product_selector_and_counts() -> None:
    wl = workload()
    assert wl["metadata"]["name"] == kueue.workload_name("job-q", job_body()["metadata"]["uid"])
    assert wl["metadata"]["ownerReferences"] == [
        {"apiVersion": "heterotrain.io/v1alpha1", "kind": "HeteroTrainingJob", "name": "job-q",
         "uid": "0b4f5a6e-1111-4c2e-9a7b-5d1e2f3a4b5c", "controller": True, "blockOwnerDeletion": True}]
    assert wl["spec"]["queueName"] == "team-q"
    assert [(ps["name"], ps["count"], ps["template"]["spec"]["nodeSelector"],
             ps["template"]["spec"]["containers"][0]["resources"]["requests"])
            for ps in wl["spec"]["podSets"]] == [
        ("nvidia-h100-80gb-hbm3", 2, {"nvidia.com/gpu.product": H100},
         {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}),
        ("tesla-t4", 2, {"nvidia.com/gpu.product": "Tesla-T4"},
         {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"})]


def test_workload_validates_against_kueues_crd() -> None:
    kueuecheck.validate(workload(), "workloads")
    with_priority = workload(job_body(priority_class="training"), priority=1000)
    kueuecheck.validate(with_priority, "workloads")
    assert with_priority["spec"]["priorityClassRef"] == {
        "group": "scheduling.k8s.io", "kind": "PriorityClass", "name": "training"}
    assert with_priority["spec"]["priority"] == 1000
    assert {ps["template"]["spec"]["priorityClassName"] for ps in with_priority["spec"]["podSets"]} == {
        "training"}


def test_the_crd_check_catches_what_kueue_would_refuse() -> None:
    """Negative controls: Kueue's schema and CEL rules reject a bad pod-set name and a priority
    class without its value."""
    bad = workload()
    bad["spec"]["podSets"][0]["name"] = "NVIDIA-H100-80GB-HBM3"
    with pytest.raises(crdcheck.Invalid, match="spec.podSets.0.name"):
        kueuecheck.validate(bad, "workloads")
    no_value = workload(job_body(priority_class="training"), priority=1000)
    del no_value["spec"]["priority"]
    with pytest.raises(crdcheck.Invalid, match="priorityClassRef"):
        kueuecheck.validate(no_value, "workloads")


@pytest.mark.parametrize(("gpu_type", "name"), [
    ("Tesla-T4", "tesla-t4"), ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "nvidia-a100-sxm4-40gb-mig-1g-5gb"),
    ("X" * 80, "x" * 56 + "-" + "3c5b7e")])
def test_pod_set_names_are_dns_labels(gpu_type: str, name: str) -> None:
    got = kueue.pod_set_name(gpu_type)
    assert len(got) <= 63 and got[:57] == name[:57]


def test_pending_workload_means_no_pods() -> None:
    adm = kueue.read_admission(workload())
    assert (adm.state, adm.reason) == (kueue.PENDING, "WaitingForAdmission")
    assert adm.message.startswith("Queued in LocalQueue team-q: Workload heterotrainingjob-job-q-")


def placed(wl: dict[str, Any]) -> dict[str, kueue.FlavorPlacement]:
    adm = kueue.read_admission(wl)
    assert adm.state == kueue.RUN, adm
    return kueue.placements(adm, wl, flavors())


def test_admission_with_two_flavors_plans_within_it_and_pins_pods_to_the_flavors_nodes() -> None:
    """Case 35: h100 pods get h100-pool, t4 pods t4-pool; the t4-spot node is not used."""
    body = job_body()
    wl = admitted(workload(body), {"nvidia-h100-80gb-hbm3": "h100", "tesla-t4": "t4"})
    allowed = placed(wl)
    assert {t: (p.flavor, dict(p.node_labels), p.count) for t, p in allowed.items()} == {
        H100: ("h100", {"nvidia.com/gpu.product": H100, POOL: "h100-pool"}, 2),
        "Tesla-T4": ("t4", {"nvidia.com/gpu.product": "Tesla-T4", POOL: "t4-pool"}, 2)}
    inv = kueue.restrict_inventory(build_inventory(nodes()), allowed)
    assert [(d.node, d.gpu_type, d.free) for d in inv.devices()] == [
        ("h100-0", H100, 2), ("t4-0", "Tesla-T4", 2)]
    spec = parse_job(body)
    plan = plan_job(spec, inv)
    assert isinstance(plan, model.Plan), plan
    envs = render_rank_envs(plan, spec, master_addr="x", master_port=29500, simulated=False)
    pods = rendering.render_pods(spec, plan, envs, launcher=("heterotrain", "launch", "--"),
                                 inputs=kueue.add_placements(rendering.PodInputs(), plan, allowed))
    assert [(p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
             ["nodeSelectorTerms"][0]["matchFields"][0]["values"], p["spec"]["nodeSelector"]) for p in pods] == [
        (["h100-0"], {"nvidia.com/gpu.product": H100, POOL: "h100-pool"}),
        (["t4-0"], {"nvidia.com/gpu.product": "Tesla-T4", POOL: "t4-pool"})]
    for pod in pods:
        kubernetes_validate.validate(json.loads(json.dumps(pod)), "1.34.0", strict=True)


def test_flavor_tolerations_are_added_to_the_pods() -> None:
    fl = flavors()
    fl["t4"]["spec"]["tolerations"] = [{"key": "cloud.google.com/gke-spot", "operator": "Equal",
                                        "value": "true", "effect": "NoSchedule"}]
    kueuecheck.validate(fl["t4"], "resourceflavors")
    wl = admitted(workload(), {"nvidia-h100-80gb-hbm3": "h100", "tesla-t4": "t4"})
    allowed = kueue.placements(kueue.read_admission(wl), wl, fl)
    body = job_body()
    spec = parse_job(body)
    plan = plan_job(spec, kueue.restrict_inventory(build_inventory(nodes()), allowed))
    envs = render_rank_envs(plan, spec, master_addr="x", master_port=29500, simulated=False)
    pods = rendering.render_pods(spec, plan, envs, launcher=("l",),
                                 inputs=kueue.add_placements(rendering.PodInputs(), plan, allowed))
    assert [t["key"] for t in pods[1]["spec"]["tolerations"]] == ["nvidia.com/gpu", "cloud.google.com/gke-spot"]
    assert [t["key"] for t in pods[0]["spec"]["tolerations"]] == ["nvidia.com/gpu"]


def test_admitted_count_caps_the_plan() -> None:
    """Kueue admitted only 1 T4 (say, partial admission): the plan never uses more."""
    wl = admitted(workload(), {"nvidia-h100-80gb-hbm3": "h100", "tesla-t4": "t4"})
    wl["status"]["admission"]["podSetAssignments"][1]["count"] = 1
    inv = kueue.restrict_inventory(build_inventory(nodes()), placed(wl))
    assert [(d.node, d.gpu_type, d.free) for d in inv.devices()] == [
        ("h100-0", H100, 2), ("t4-0", "Tesla-T4", 1)]


def test_flavor_that_contradicts_the_gpu_type_is_a_mismatch() -> None:
    """Case 35: a t4 pod set admitted to the h100 flavor gets FlavorMismatch, not H100 nodes."""
    wl = admitted(workload(), {"nvidia-h100-80gb-hbm3": "h100", "tesla-t4": "h100"})
    with pytest.raises(kueue.FlavorMismatch) as err:
        placed(wl)
    assert str(err.value) == (
        "pod set tesla-t4 needs nvidia.com/gpu.product=Tesla-T4 but Kueue admitted it to "
        "ResourceFlavor h100 whose nodeLabels say nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3; "
        "give each GPU type its own ResourceFlavor whose nodeLabels name that nvidia.com/gpu.product")


def test_eviction_stops_and_clears_the_admission_like_jobframework() -> None:
    wl = admitted(workload(), {"nvidia-h100-80gb-hbm3": "h100", "tesla-t4": "t4"})
    wl["status"]["conditions"].append({
        "type": "Evicted", "status": "True", "reason": "Preempted",
        "message": "Preempted to accommodate a workload (UID: 1) due to prioritization in the ClusterQueue",
        "lastTransitionTime": NOW})
    adm = kueue.read_admission(wl)
    assert (adm.state, adm.reason) == (kueue.EVICT, "EvictedPreempted")
    patch = kueue.cleared_admission_status(wl, "2026-12-01T09:05:00Z")
    assert patch["admission"] is None
    conds = {c["type"]: (c["status"], c["reason"]) for c in patch["conditions"]}
    assert conds == {"QuotaReserved": ("False", "Pending"), "Admitted": ("False", "NoReservation"),
                     "Evicted": ("True", "Preempted"), "Requeued": ("True", "Preempted")}
    after = copy.deepcopy(wl)
    after["status"].update(patch)
    after["status"].pop("admission")
    kueuecheck.validate(after, "workloads")
    assert kueue.read_admission(after).state == kueue.EVICT  # until Kueue clears Evicted


def test_finished_marks_the_workload_once() -> None:
    wl = admitted(workload(), {"nvidia-h100-80gb-hbm3": "h100", "tesla-t4": "t4"})
    patch = kueue.finished_status(wl, succeeded=True, message="Job succeeded", now_iso=NOW)
    assert patch is not None
    assert patch["conditions"][-1] == {"type": "Finished", "status": "True", "reason": "Succeeded",
                                       "message": "Job succeeded", "lastTransitionTime": NOW}
    wl["status"].update(patch)
    kueuecheck.validate(wl, "workloads")
    assert kueue.finished_status(wl, succeeded=True, message="again", now_iso=NOW) is None


def test_unqueued_jobs_are_not_gated() -> None:
    body = job_body()
    assert kueue.queue_name(body) == "team-q"
    del body["metadata"]["labels"]
    assert kueue.queue_name(body) == ""
