"""End to end with Kueue's Workload driven as Kueue would drive it (issue 15, case 35): the operator
(kopf, in process) against the fake API server with the local kubelet; the test plays Kueue's
scheduler: it admits the Workload with flavors (writing ``QuotaReserved``/``Admitted`` and
``status.admission`` the way Kueue's scheduler does), evicts it (``Evicted``, reason
``Preempted``) and admits it again.

Cluster: examples/clusters/mixed.yaml (A100, V100, 2x T4), each node in a GKE-style node pool.
ResourceFlavors: ``a100`` (A100 product + ``a100-pool``) and ``t4`` (T4 product + ``t4-pool`` and
a spot toleration), as case 35's per-product flavors.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from k8s import kueuecheck  # noqa: E402
from k8s.harness import Cluster, load_nodes  # noqa: E402

from builders import e2e_config  # noqa: E402
from hetero_operator.render import workload as kueue  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PODS = ("", "v1", "pods")
FLAVORS = kueue.RESOURCE_FLAVORS
WORKLOADS = kueue.WORKLOADS
POOL = "cloud.google.com/gke-nodepool"
SPOT = {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
CONFIG = e2e_config()
TIMEOUT_S = 150
NOW = "2026-12-01T09:00:00Z"
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(300)]


def pooled_nodes() -> list[dict[str, Any]]:
    nodes = copy.deepcopy(load_nodes())
    for node in nodes:
        pool = node["metadata"]["name"].removeprefix("node-") + "-pool"
        node["metadata"]["labels"][POOL] = pool
    return nodes


def flavor(name: str, product: str, pool: str, tolerations: list[dict[str, str]] | None = None
           ) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeLabels": {"nvidia.com/gpu.product": product, POOL: pool}}
    if tolerations:
        spec["tolerations"] = tolerations
    obj = {"apiVersion": kueue.API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": name},
           "spec": spec}
    kueuecheck.validate(obj, "resourceflavors")
    return obj


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    async with Cluster(tmp_path_factory.mktemp("kueue")) as cl:
        await cl.add_nodes(pooled_nodes())
        for f in (flavor("a100", "NVIDIA-A100-SXM4-40GB", "a100-pool"),
                  flavor("t4", "Tesla-T4", "t4-pool", [SPOT])):
            await cl.api.create(FLAVORS, None, f)
        await cl.start_operator(CONFIG)
        yield cl


def queued_digits(name: str, tmp: Path, args: list[str]) -> dict[str, Any]:
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"]["name"] = name
    body["metadata"]["labels"] = {kueue.QUEUE_LABEL: "team-q"}
    body["spec"]["worker"]["args"] = args
    body["spec"]["worker"]["env"] = [{"name": "HTJ_SIM_DELAY_PER_SAMPLE_S", "value": "0"}]
    body["spec"]["gpus"] = {"ranks": 3, "minRanks": 3,
                            "allowedProducts": ["NVIDIA-A100-SXM4-40GB", "Tesla-T4"]}
    body["spec"]["training"]["checkpoint"] = {"path": str(tmp / name / "ckpt"), "intervalSteps": 5}
    return body


def workload(cluster: Cluster, ns: str) -> dict[str, Any] | None:
    found = cluster.api.objects(WORKLOADS, ns)
    return found[0] if len(found) == 1 else None


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions", []) if c["type"] == type_), {})


async def admit(cluster: Cluster, wl: dict[str, Any], assignment: dict[str, str]) -> None:
    """Kueue's scheduler admitting the Workload (no admission checks: Admitted at once)."""
    conditions = [c for c in (wl.get("status") or {}).get("conditions", [])
                  if c["type"] not in ("QuotaReserved", "Admitted", "Evicted")]
    conditions += [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved",
         "message": "Quota reserved in ClusterQueue gpu-cq", "lastTransitionTime": NOW},
        {"type": "Admitted", "status": "True", "reason": "Admitted",
         "message": "The workload is admitted", "lastTransitionTime": NOW},
        {"type": "Evicted", "status": "False", "reason": "QuotaReserved",
         "message": "Previously: Preempted", "lastTransitionTime": NOW}]
    status = {"conditions": conditions, "admission": {"clusterQueue": "gpu-cq", "podSetAssignments": [
        {"name": ps["name"], "count": ps["count"], "flavors": {"nvidia.com/gpu": assignment[ps["name"]]},
         "resourceUsage": {"nvidia.com/gpu": str(ps["count"])}} for ps in wl["spec"]["podSets"]]}}
    checked = copy.deepcopy(wl)
    checked["status"] = status
    kueuecheck.validate(checked, "workloads")
    await cluster.api.patch(WORKLOADS, wl["metadata"]["namespace"], wl["metadata"]["name"],
                            {"status": status}, subresource="status")


async def evict(cluster: Cluster, wl: dict[str, Any]) -> None:
    """Kueue preempting the Workload: ``Evicted=True`` (reason ``Preempted``)."""
    conditions = [c for c in wl["status"]["conditions"] if c["type"] != "Evicted"]
    conditions.append({"type": "Evicted", "status": "True", "reason": "Preempted",
                       "message": "Preempted to accommodate a higher priority Workload",
                       "lastTransitionTime": NOW})
    await cluster.api.patch(WORKLOADS, wl["metadata"]["namespace"], wl["metadata"]["name"],
                            {"status": {"conditions": conditions}}, subresource="status")


def job_condition(cluster: Cluster, name: str, ns: str, type_: str) -> dict[str, Any]:
    job = cluster.job(name, ns) or {}
    return next((c for c in job.get("status", {}).get("conditions", []) if c["type"] == type_), {})


async def test_queued_job_runs_only_when_admitted_on_its_flavors_nodes_and_resumes_after_eviction(
        cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("q")
    ns, name = "team-x", "queued"
    await cluster.apply(queued_digits(name, tmp, ["--max-steps", "400", "--checkpoint-every", "5"]), ns)

    # 1. a Workload with one pod set per GPU type, and no pods while it waits
    wl = await cluster.wait_for(lambda: workload(cluster, ns), 30, "the Workload")
    kueuecheck.validate(wl, "workloads")
    assert [(ps["name"], ps["count"], ps["template"]["spec"]["nodeSelector"]) for ps in wl["spec"]["podSets"]] == [
        ("nvidia-a100-sxm4-40gb", 1, {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}),
        ("tesla-t4", 2, {"nvidia.com/gpu.product": "Tesla-T4"})]
    assert wl["spec"]["queueName"] == "team-q"
    assert wl["metadata"]["ownerReferences"][0]["uid"] == cluster.job(name, ns)["metadata"]["uid"]
    await cluster.wait_for(lambda: job_condition(cluster, name, ns, "Suspended").get("reason")
                           == "WaitingForAdmission", 30, "Suspended/WaitingForAdmission")
    assert cluster.pods(ns) == []
    assert cluster.phase(name, ns) == "Suspended"

    # 2. admitted with flavors a100 and t4: each GPU type's pods on its flavor's nodes
    await admit(cluster, wl, {"nvidia-a100-sxm4-40gb": "a100", "tesla-t4": "t4"})
    await cluster.wait_for(lambda: len(cluster.pods(ns)) == 2
                           and all(p["spec"].get("nodeName") for p in cluster.pods(ns)),
                           30, "pods after admission, bound by the kubelet")
    pods = {p["metadata"]["name"]: p for p in cluster.pods(ns)}
    assert {n: (p["spec"]["nodeSelector"], [t["key"] for t in p["spec"]["tolerations"]])
            for n, p in pods.items()} == {
        f"{name}-g0": ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", POOL: "a100-pool"},
                       ["nvidia.com/gpu"]),
        f"{name}-g1": ({"nvidia.com/gpu.product": "Tesla-T4", POOL: "t4-pool"},
                       ["nvidia.com/gpu", "cloud.google.com/gke-spot"])}
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in pooled_nodes()}
    for pod in pods.values():  # the kubelet bound it: its node carries every selected label
        labels = nodes[pod["spec"]["nodeName"]]
        assert all(labels.get(k) == v for k, v in pod["spec"]["nodeSelector"].items())

    # 3. evicted (preempted) mid-training: pods go, the job suspends, the admission is cleared
    ckpt = tmp / name / "ckpt"
    await cluster.wait_for(lambda: cluster.phase(name, ns) == "Running" and ckpt.exists()
                           and any(ckpt.iterdir()), TIMEOUT_S, "a checkpoint")
    await evict(cluster, workload(cluster, ns))
    await cluster.wait_for(lambda: cluster.pods(ns) == [], 60, "pods deleted after eviction")
    await cluster.wait_for(lambda: "admission" not in (workload(cluster, ns).get("status") or {}),
                           30, "the admission cleared")
    wl = workload(cluster, ns)
    assert (condition(wl, "QuotaReserved")["status"], condition(wl, "Requeued")["status"]) == ("False", "True")
    suspended = job_condition(cluster, name, ns, "Suspended")
    assert (cluster.phase(name, ns), suspended["status"], suspended["reason"]) == (
        "Suspended", "True", "EvictedPreempted")

    # 4. admitted again: the job starts from its checkpoint and finishes; Kueue gets Finished
    await admit(cluster, wl, {"nvidia-a100-sxm4-40gb": "a100", "tesla-t4": "t4"})
    await cluster.wait_for(lambda: cluster.phase(name, ns) in ("Succeeded", "Failed"), TIMEOUT_S, "finish")
    job = cluster.job(name, ns)
    assert job["status"]["phase"] == "Succeeded"
    assert job["status"]["attempt"] == 2 and job["status"].get("restarts", 0) == 0
    assert cluster.kubelet is not None
    assert "resumed at step" in cluster.kubelet.log(ns, f"{name}-g0")
    await cluster.wait_for(lambda: condition(workload(cluster, ns), "Finished").get("status") == "True",
                           30, "Workload Finished")
    assert condition(workload(cluster, ns), "Finished")["reason"] == "Succeeded"


async def test_flavor_that_contradicts_the_gpu_type_creates_no_pods(cluster: Cluster,
                                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    """Case 35: the T4 pod set admitted to the A100 flavor -> FlavorMismatch, no pods."""
    await cluster.idle()
    ns, name = "team-y", "mismatch"
    await cluster.apply(queued_digits(name, tmp_path_factory.mktemp("m"), ["--max-steps", "2"]), ns)
    wl = await cluster.wait_for(lambda: workload(cluster, ns), 30, "the Workload")
    await admit(cluster, wl, {"nvidia-a100-sxm4-40gb": "a100", "tesla-t4": "a100"})
    await cluster.wait_for(lambda: job_condition(cluster, name, ns, "Suspended").get("reason")
                           == "FlavorMismatch", 30, "FlavorMismatch")
    assert cluster.pods(ns) == []
    assert "admitted it to ResourceFlavor a100" in job_condition(cluster, name, ns, "Suspended")["message"]
