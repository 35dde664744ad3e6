"""Kueue's contract end to end on the fake API server with the local kubelet (issue 21; the test
plays Kueue, as tests/operator/test_kueue_e2e.py does; the same against real Kueue:
tests/cluster/test_kueue_contract_real.py).

* case 41: the test plays Kueue's ``waitForPodsReady`` (timeout 20 s): ``PodsReady`` must be True
  within 20 s of admission, or the job would be evicted with ``PodsReadyTimeout``; a rank failure
  (gang restart) turns it back to ``WaitForRecovery`` and then ``Recovered``;
* case 42: quota reserved with an admission check Pending creates no pods; the check Ready with
  ``podSetUpdates`` puts their annotations, nodeSelector and toleration on the pod set's pods;
* case 49: a cluster whose Kueue serves only ``v1beta1`` gets a ``v1beta1`` Workload (control: a
  ``v1beta2`` cluster gets a ``v1beta2`` one); both wait with ``WaitingForAdmission``, no pods;
* a user's suspend deactivates the admitted Workload (the test plays Kueue's eviction
  ``Deactivated``), the pods go and the admission is cleared (the quota is free); a resume
  activates it, and the admitted job runs again.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_kueue_e2e import (CONFIG, FLAVORS, NOW, admit, condition, flavor, job_condition,  # noqa: E402
                            pooled_nodes)

from k8s.harness import Cluster  # noqa: E402

from hetero_operator.render import kueuestatus as ks  # noqa: E402
from hetero_operator.render import workload as kueue  # noqa: E402

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(300)]
READY_TIMEOUT_S = 20
"""Case 41's waitForPodsReady timeout (Kueue's default is 5 min)."""
QUEUED = {"key": "cloud.google.com/gke-queued", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
PROV = {"autoscaling.x-k8s.io/consume-provisioning-request": "prov-t4-abc12",
        "autoscaling.x-k8s.io/provisioning-class-name": "queued-provisioning.gke.io"}


def provisioned_nodes() -> list[dict[str, Any]]:
    """The mixed cluster in node pools; the T4 node is the one a ProvisioningRequest brought up."""
    nodes = pooled_nodes()
    for node in nodes:
        if node["metadata"]["name"] == "node-t4":
            node["metadata"]["labels"]["cloud.google.com/gke-queued"] = "true"
    return nodes


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    async with Cluster(tmp_path_factory.mktemp("kueue-contract")) as cl:
        await cl.add_nodes(provisioned_nodes())
        for f in (flavor("a100", "NVIDIA-A100-SXM4-40GB", "a100-pool"), flavor("t4", "Tesla-T4", "t4-pool")):
            await cl.api.create(FLAVORS, None, f)
        await cl.start_operator(CONFIG)
        yield cl


def waiting_job(name: str, tmp: Path) -> dict[str, Any]:
    """3 ranks (A100 + 2x T4) that run until ``<tmp>/go`` exists; rank 1 of the first attempt
    fails as soon as ``<tmp>/fail`` exists (a gang restart)."""
    code = (f"import os, sys, time\n"
            f"while not os.path.exists({str(tmp / 'go')!r}):\n"
            f"    if (os.path.exists({str(tmp / 'fail')!r}) and os.environ['RANK'] == '1'\n"
            f"            and os.environ.get('HTJ_RESTART_GENERATION') == '0'):\n"
            f"        sys.exit(3)\n"
            f"    time.sleep(0.1)  # sync-ok: a worker that waits for the test\n")
    return {"apiVersion": "heterotrain.io/v1alpha1", "kind": "HeteroTrainingJob",
            "metadata": {"name": name, "labels": {kueue.QUEUE_LABEL: "team-q"}},
            "spec": {"worker": {"command": ["python", "-c", code],
                                "env": [{"name": "HTJ_SIM_DELAY_PER_SAMPLE_S", "value": "0"}]},
                     "images": [], "gpus": {"ranks": 3, "minRanks": 3,
                                            "allowedProducts": ["NVIDIA-A100-SXM4-40GB", "Tesla-T4"]},
                     "training": {"globalBatchSize": 48},
                     "runPolicy": {"backoffLimit": 2}}}


def workload(cluster: Cluster, ns: str, version: str = kueue.VERSION) -> dict[str, Any] | None:
    found = cluster.api.objects(kueue.workloads(version), ns)
    return found[0] if len(found) == 1 else None


ASSIGN = {"nvidia-a100-sxm4-40gb": "a100", "tesla-t4": "t4"}


def pods_ready(cluster: Cluster, ns: str) -> tuple[str, str]:
    c = condition(workload(cluster, ns), ks.PODS_READY)
    return c.get("status", ""), c.get("reason", "")


async def test_case41_pods_ready_is_true_before_the_wait_for_pods_ready_timeout(cluster, tmp_path_factory) -> None:
    tmp = tmp_path_factory.mktemp("ready")
    ns, name = "team-41", "ready"
    await cluster.apply(waiting_job(name, tmp), ns)
    wl = await cluster.wait_for(lambda: workload(cluster, ns), 30, "the Workload")
    await admit(cluster, wl, ASSIGN)
    # Kueue's waitForPodsReady: PodsReady=True within the timeout, or the Workload is evicted
    try:
        await cluster.wait_for(lambda: pods_ready(cluster, ns) == ("True", "Started"), READY_TIMEOUT_S,
                               f"PodsReady=True within {READY_TIMEOUT_S} s of admission (else PodsReadyTimeout)")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; Workload status {workload(cluster, ns).get('status')}, job "
                             f"{(cluster.job(name, ns) or {}).get('status')}, pods "
                             f"{[(p['metadata']['name'], p.get('status', {}).get('phase')) for p in cluster.pods(ns)]}") from None
    assert cluster.phase(name, ns) == "Running" and len(cluster.pods(ns)) == 2
    assert condition(workload(cluster, ns), "QuotaReserved")["status"] == "True"  # Kueue's kept

    (tmp / "fail").write_text("1")  # rank 1 fails: the gang restarts
    await cluster.wait_for(lambda: (cluster.job(name, ns) or {}).get("status", {}).get("restarts") == 1,
                           60, "the gang restart")
    await cluster.wait_for(lambda: pods_ready(cluster, ns) == ("True", "Recovered"), 60,
                           "PodsReady=True/Recovered (only reachable through WaitForRecovery)")
    (tmp / "go").write_text("1")
    await cluster.wait_for(lambda: cluster.phase(name, ns) == "Succeeded", 60, "Succeeded")
    await cluster.wait_for(lambda: condition(workload(cluster, ns), "Finished").get("status") == "True",
                           30, "Workload Finished")
    assert pods_ready(cluster, ns) == ("True", "Recovered")  # left as it was at the end


async def test_case42_admission_check_holds_the_pods_then_its_pod_set_updates_reach_them(
        cluster, tmp_path_factory) -> None:
    await cluster.idle()
    tmp = tmp_path_factory.mktemp("prov")
    ns, name = "team-42", "prov"
    await cluster.apply(waiting_job(name, tmp), ns)
    wl = await cluster.wait_for(lambda: workload(cluster, ns), 30, "the Workload")
    await admit(cluster, wl, ASSIGN)  # then make it "quota reserved, check pending" as Kueue would
    wl = workload(cluster, ns)
    status = copy.deepcopy(wl["status"])
    for c in status["conditions"]:
        if c["type"] == "Admitted":
            c.update(status="False", reason="UnsatisfiedChecks", message="The workload has not all checks ready")
    status["admissionChecks"] = [{"name": "dws-prov", "state": "Pending", "message": "Provisioning in progress",
                                  "lastTransitionTime": NOW}]
    await cluster.api.patch(kueue.WORKLOADS, ns, wl["metadata"]["name"], {"status": status}, subresource="status")
    await cluster.wait_for(lambda: "waiting for admission check dws-prov (Pending: Provisioning in progress)"
                           in job_condition(cluster, name, ns, "Suspended").get("message", ""), 30,
                           "the job names the pending check")
    assert cluster.pods(ns) == []

    wl = workload(cluster, ns)
    status = copy.deepcopy(wl["status"])
    for c in status["conditions"]:
        if c["type"] == "Admitted":
            c.update(status="True", reason="Admitted", message="The workload is admitted")
    status["admissionChecks"] = [{
        "name": "dws-prov", "state": "Ready", "message": "Provisioned", "lastTransitionTime": NOW,
        "podSetUpdates": [{"name": "tesla-t4", "annotations": PROV,
                           "nodeSelector": {"cloud.google.com/gke-queued": "true"}, "tolerations": [QUEUED]}]}]
    await cluster.api.patch(kueue.WORKLOADS, ns, wl["metadata"]["name"], {"status": status}, subresource="status")
    await cluster.wait_for(lambda: len(cluster.pods(ns)) == 2, 30, "the pods")
    pods = {p["metadata"]["name"]: p for p in cluster.pods(ns)}
    t4 = pods[f"{name}-g1"]
    assert {k: t4["metadata"]["annotations"].get(k) for k in PROV} == PROV
    assert t4["spec"]["nodeSelector"]["cloud.google.com/gke-queued"] == "true"
    assert t4["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "Tesla-T4"
    assert QUEUED in t4["spec"]["tolerations"]
    a100 = pods[f"{name}-g0"]  # no update for its pod set
    assert "cloud.google.com/gke-queued" not in a100["spec"]["nodeSelector"]
    assert not any(k in (a100["metadata"].get("annotations") or {}) for k in PROV)
    (tmp / "go").write_text("1")
    await cluster.wait_for(lambda: cluster.phase(name, ns) == "Succeeded", 60, "Succeeded")


async def test_a_users_suspend_releases_the_quota_and_a_resume_requeues(cluster, tmp_path_factory) -> None:
    await cluster.idle()
    tmp = tmp_path_factory.mktemp("suspend")
    ns, name = "team-s", "pausing"
    await cluster.apply(waiting_job(name, tmp), ns)
    wl = await cluster.wait_for(lambda: workload(cluster, ns), 30, "the Workload")
    await admit(cluster, wl, ASSIGN)
    await cluster.wait_for(lambda: cluster.phase(name, ns) == "Running", 60, "Running")
    job = cluster.job(name, ns)
    spec = copy.deepcopy(job["spec"])
    spec.setdefault("runPolicy", {})["suspend"] = True
    await cluster.api.patch(("heterotrain.io", "v1alpha1", "heterotrainingjobs"), ns, name, {"spec": spec})
    await cluster.wait_for(lambda: (workload(cluster, ns) or {}).get("spec", {}).get("active") is False,
                           30, "the Workload deactivated")
    # Kueue evicts a deactivated Workload (reason Deactivated); the operator stops the pods and
    # clears the admission: the ClusterQueue's quota is free again
    wl = workload(cluster, ns)
    conditions = [c for c in wl["status"]["conditions"] if c["type"] != "Evicted"] + [
        {"type": "Evicted", "status": "True", "reason": "Deactivated",
         "message": "The workload is deactivated", "lastTransitionTime": NOW}]
    await cluster.api.patch(kueue.WORKLOADS, ns, wl["metadata"]["name"],
                            {"status": {"conditions": conditions}}, subresource="status")
    await cluster.wait_for(lambda: cluster.pods(ns) == [], 60, "the pods stopped")
    await cluster.wait_for(lambda: "admission" not in (workload(cluster, ns).get("status") or {}), 30,
                           "the admission cleared (quota released)")
    wl = workload(cluster, ns)
    assert condition(wl, "QuotaReserved")["status"] == "False"
    assert condition(wl, "Requeued")["status"] == "False"  # not queued while suspended
    assert job_condition(cluster, name, ns, "Suspended")["status"] == "True"

    spec["runPolicy"]["suspend"] = False
    await cluster.api.patch(("heterotrain.io", "v1alpha1", "heterotrainingjobs"), ns, name, {"spec": spec})
    await cluster.wait_for(lambda: workload(cluster, ns)["spec"].get("active") is True, 30, "re-activated")
    assert ks.DEACTIVATED_BY not in (workload(cluster, ns)["metadata"].get("annotations") or {})
    await admit(cluster, workload(cluster, ns), ASSIGN)  # Kueue queues and admits it again
    await cluster.wait_for(lambda: cluster.phase(name, ns) == "Running", 60, "Running again")
    (tmp / "go").write_text("1")
    await cluster.wait_for(lambda: cluster.phase(name, ns) == "Succeeded", 60, "Succeeded")


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"],
                         ids=["case 49: Kueue serving only v1beta1 gets a v1beta1 Workload",
                              "control: Kueue serving only v1beta2 gets a v1beta2 Workload"])
async def test_case49_the_workload_is_made_in_the_version_kueue_serves(tmp_path_factory, version) -> None:
    async with Cluster(tmp_path_factory.mktemp(f"kueue-{version}"), kubelet=False,
                       kueue_version=version) as cl:
        await cl.add_nodes(pooled_nodes())
        await cl.start_operator(CONFIG)
        body = waiting_job("oldkueue", tmp_path_factory.mktemp("old"))
        body["spec"]["gpus"] = {"ranks": 2, "minRanks": 2,
                                "allowedProducts": ["NVIDIA-A100-SXM4-40GB", "Tesla-V100-SXM2-16GB"]}
        await cl.apply(body, "team-x")
        wl = await cl.wait_for(lambda: workload(cl, "team-x", version), 30, f"a {version} Workload")
        assert wl["apiVersion"] == f"kueue.x-k8s.io/{version}"
        suspended = await cl.wait_for(lambda: job_condition(cl, "oldkueue", "team-x", "Suspended")
                                      .get("reason") == "WaitingForAdmission"
                                      and job_condition(cl, "oldkueue", "team-x", "Suspended"), 30,
                                      "WaitingForAdmission")
        assert suspended["reason"] != "KueueNotInstalled"
        assert cl.pods("team-x") == []
