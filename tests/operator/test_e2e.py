"""End to end: the operator (kopf, in process) against a Kubernetes API served over HTTP by kmock,
with a local kubelet that runs every pod as local processes (tests/k8s).

One fake cluster (examples/clusters/mixed.yaml: A100, V100, 2x T4) and one operator serve the
whole module; each test uses its own namespace.  Training is the real digits example, a few steps.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import sys
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import pytest_asyncio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from k8s.fakeapi import HTJ  # noqa: E402
from k8s.harness import Cluster, load_nodes  # noqa: E402

from builders import digits_job, e2e_config, script_job  # noqa: E402

PODS = ("", "v1", "pods")
SERVICES = ("", "v1", "services")
CONFIG = e2e_config()
TRAIN_TIMEOUT_S = 150

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(240)]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    async with Cluster(tmp_path_factory.mktemp("cluster")) as cl:
        await cl.add_nodes(load_nodes())
        await cl.start_operator(CONFIG)
        yield cl


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def idle_cluster(cluster: Cluster) -> None:
    """Each test starts on an idle cluster (GPUs of earlier tests released)."""
    await cluster.idle()


def cond(job: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in job["status"].get("conditions", []) if c["type"] == type_), {})


async def finished(cluster: Cluster, name: str, ns: str, timeout_s: float = TRAIN_TIMEOUT_S) -> dict[str, Any]:
    await cluster.wait_for(lambda: cluster.phase(name, ns) in ("Succeeded", "Failed"), timeout_s,
                           f"{ns}/{name} to finish (now {cluster.phase(name, ns)!r})")
    return cluster.job(name, ns)


def event_counts(cluster: Cluster, name: str, ns: str) -> dict[str, int]:
    """Occurrences per event reason (Events aggregate: a repeat bumps ``count``)."""
    out: dict[str, int] = {}
    for e in cluster.events(name, ns):
        out[e["reason"]] = out.get(e["reason"], 0) + int(e.get("count") or 1)
    return out


async def posted(cluster: Cluster, name: str, ns: str, reason: str, times: int = 1) -> dict[str, int]:
    """Wait until the operator's event ``reason`` arrived ``times`` times (its POST may still
    be on its way when the phase it reports is already visible); returns all counts."""
    await cluster.wait_for(lambda: event_counts(cluster, name, ns).get(reason, 0) >= times, 30,
                           f"event {reason} x{times} on {ns}/{name}")
    return event_counts(cluster, name, ns)


def _logs(cluster: Cluster, ns: str) -> str:
    assert cluster.kubelet is not None
    return "\n".join(cluster.kubelet.log(ns, p["metadata"]["name"]) for p in cluster.pods(ns))


async def test_digits_trains_on_the_mixed_cluster_and_succeeds_with_the_plan(
        cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("digits")
    result = tmp / "result.json"
    await cluster.apply(digits_job("digits", tmp, args=["--max-steps", "12", "--result-json", str(result)]),
                        namespace="train")
    job = await finished(cluster, "digits", "train")
    status = job["status"]
    assert status["phase"] == "Succeeded", (status, _logs(cluster, "train"))
    assert [(g["pod"], g["node"], g["gpuType"], g["precision"], g["localBatches"])
            for g in status["plan"]["groups"]] == [
        ("digits-g0", "node-a100", "NVIDIA-A100-SXM4-40GB", "bf16", [70]),
        ("digits-g1", "node-v100", "Tesla-V100-SXM2-16GB", "fp16", [28]),
        ("digits-g2", "node-t4", "Tesla-T4", "fp16", [15, 15])]
    assert status["plan"]["masterAddr"] == "digits-g0.digits.train.svc"
    assert (status["ranksWanted"], status["restarts"] if "restarts" in status else 0) == (4, 0), status
    assert cond(job, "Succeeded")["status"] == "True" and cond(job, "Created")["status"] == "True"
    assert json.loads(result.read_text())["steps"] == 12
    # cleanPodPolicy Running: pods still running when rank 0 succeeded are deleted, the rest stay
    await cluster.wait_for(lambda: all(p["status"]["phase"] == "Succeeded" and not p["metadata"].get(
        "deletionTimestamp") for p in cluster.pods("train", job="digits")), 30, "cleanup")
    pods = cluster.pods("train", job="digits")
    assert "digits-g0" in {p["metadata"]["name"] for p in pods}
    envs = [{e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]} for p in pods]
    assert {e["MASTER_ADDR"] for e in envs} == {"digits-g0.digits.train.svc"}
    assert cluster.api.get(SERVICES, "train", "digits")["spec"]["clusterIP"] == "None"
    counts = await posted(cluster, "digits", "train", "JobSucceeded")
    assert cluster.events("digits", "train")[0]["reason"] == "Planned" and counts["Planned"] == 1


async def test_job_that_does_not_fit_waits_with_the_shortfall_and_starts_when_a_node_is_added(
        cluster: Cluster) -> None:
    await cluster.apply(script_job("big", "pass", gpus={"ranks": 5, "minRanks": 5},
                               training={"globalBatchSize": 40}), namespace="pending")
    await cluster.wait_for(lambda: cluster.phase("big", "pending") == "Pending", 30, "Pending")
    job = cluster.job("big", "pending")
    assert job["status"]["message"].startswith("Unschedulable: ")
    assert "need" in job["status"]["message"] and "free" in job["status"]["message"]
    assert cond(job, "Created")["status"] == "False" and cond(job, "Created")["reason"] == "InsufficientGPUs"
    plans = cluster.memo.metrics.plans.labels(result="unschedulable")
    tried = plans._value.get()
    await cluster.wait_for(lambda: plans._value.get() >= tried + 1, 30, "the next planning attempt")
    assert cluster.pods("pending") == [] and cluster.phase("big", "pending") == "Pending"
    assert (await posted(cluster, "big", "pending", "InsufficientGPUs"))["InsufficientGPUs"] == 1
    extra = copy.deepcopy(load_nodes()[2])
    extra["metadata"]["name"] = "node-t4-b"
    await cluster.add_nodes([extra])
    job = await finished(cluster, "big", "pending", 60)
    assert job["status"]["phase"] == "Succeeded"
    assert job["status"]["plan"]["worldSize"] == 5
    assert "node-t4-b" in {g["node"] for g in job["status"]["plan"]["groups"]}
    await cluster.api.delete(("", "v1", "nodes"), None, "node-t4-b")


async def test_killed_rank_restarts_all_pods_resumes_from_checkpoint_and_succeeds(
        cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("crash")
    await cluster.apply(digits_job("crash", tmp, args=["--max-steps", "400", "--checkpoint-every", "5"],
                               gpus={"ranks": 4, "minRanks": 4},
                               training={"checkpoint": {"path": str(tmp / "ckpt"), "intervalSteps": 5}}),
                        namespace="crash")
    ckpt = tmp / "ckpt"
    assert cluster.kubelet is not None
    await cluster.wait_for(lambda: cluster.phase("crash", "crash") == "Running" and ckpt.exists()
                           and any(ckpt.iterdir()) and ("crash", "crash-g2") in cluster.kubelet.procs,
                           TRAIN_TIMEOUT_S, "a checkpoint")
    first_uids = {p["metadata"]["uid"] for p in cluster.pods("crash")}
    assert cluster.kubelet is not None
    cluster.kubelet.kill("crash", "crash-g2")
    await cluster.wait_for(lambda: (cluster.job("crash", "crash")["status"].get("restarts") == 1), 60, "restart")
    job = await finished(cluster, "crash", "crash")
    assert job["status"]["phase"] == "Succeeded", _logs(cluster, "crash")
    assert job["status"]["restarts"] == 1 and job["status"]["attempt"] == 2
    assert job["status"]["lastFailure"].startswith("crash-g2 (Tesla-T4) failed: Error exit 137")
    assert not first_uids & {p["metadata"]["uid"] for p in cluster.pods("crash")}
    assert "resumed at step" in cluster.kubelet.log("crash", "crash-g0")
    counts = await posted(cluster, "crash", "crash", "JobSucceeded")
    assert counts["Planned"] == 2 and counts["RankFailed"] == 1


async def test_exceeding_backoff_limit_fails_the_job_and_removes_all_pods(cluster: Cluster) -> None:
    await cluster.apply(script_job("loop", "import sys; sys.exit(3)",
                               runPolicy={"backoffLimit": 2, "cleanPodPolicy": "All"}), namespace="loop")
    job = await finished(cluster, "loop", "loop", 90)
    assert job["status"]["phase"] == "Failed"
    assert cond(job, "Failed")["reason"] == "BackoffLimitExceeded"
    assert job["status"]["restarts"] == 2
    await cluster.wait_for(lambda: cluster.pods("loop") == [], 30, "all pods removed")
    created = [(name, labels["heterotrain.io/attempt"]) for res, ns, name, _, labels in cluster.api.created
               if res == PODS and ns == "loop"]
    assert sorted(created) == sorted((f"loop-g{g}", str(a)) for g in range(3) for a in (1, 2, 3))  # case 21


async def test_operator_restart_mid_job_creates_no_duplicates(cluster: Cluster) -> None:
    await cluster.apply(script_job("steady", "import time; time.sleep(6)"), namespace="steady")  # sync-ok: the workload
    await cluster.wait_for(lambda: cluster.phase("steady", "steady") == "Running", 60, "Running")
    await cluster.stop_operator()
    await cluster.start_operator(CONFIG)
    job = await finished(cluster, "steady", "steady", 60)
    assert job["status"]["phase"] == "Succeeded" and job["status"]["attempt"] == 1
    created = [(name, labels["heterotrain.io/attempt"]) for res, ns, name, _, labels in cluster.api.created
               if res == PODS and ns == "steady"]
    assert sorted(created) == [("steady-g0", "1"), ("steady-g1", "1"), ("steady-g2", "1")]
    assert cluster.kubelet is not None
    assert len([k for k in cluster.kubelet.started if k[0] == "steady"]) == 3


async def test_deleting_the_job_removes_everything_without_finalizers(cluster: Cluster) -> None:
    await cluster.apply(script_job("gone", "import time; time.sleep(60)"), namespace="gone")  # sync-ok: the workload
    await cluster.wait_for(lambda: cluster.phase("gone", "gone") == "Running", 60, "Running")
    assert not cluster.job("gone", "gone")["metadata"].get("finalizers")
    await cluster.api.delete(HTJ, "gone", "gone")
    assert cluster.job("gone", "gone") is None  # no finalizer holds it (case 23)
    await cluster.wait_for(lambda: cluster.pods("gone") == [] and cluster.api.objects(SERVICES, "gone") == [],
                           30, "pods and service garbage-collected")


async def test_suspended_job_starts_only_when_resumed(cluster: Cluster) -> None:
    """spec.runPolicy.suspend by hand; Kueue admission (Workloads) is tests/operator/test_kueue_e2e.py."""
    body = script_job("queued", "pass", runPolicy={"suspend": True})
    await cluster.apply(body, namespace="queued")
    await cluster.wait_for(lambda: cluster.phase("queued", "queued") == "Suspended", 30, "Suspended")
    assert cluster.pods("queued") == []
    await cluster.api.patch(HTJ, "queued", "queued", {"spec": {"runPolicy": {"suspend": False}}})
    job = await finished(cluster, "queued", "queued", 60)
    assert job["status"]["phase"] == "Succeeded" and cond(job, "Suspended")["status"] == "False"


async def test_invalid_manifest_is_refused_by_the_schema_and_by_the_operator(cluster: Cluster) -> None:
    body = script_job("bad", "pass", gpus={"ranks": 2, "minRanks": 3})
    cfg = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=os.environ["KUBECONFIG"], client_configuration=cfg)
    api = kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(cfg))
    with pytest.raises(kubernetes.client.ApiException) as err:
        await asyncio.to_thread(api.create_namespaced_custom_object, *HTJ[:2], "invalid", HTJ[2], body)
    assert err.value.status == 422
    assert "spec.gpus.minRanks must not exceed spec.gpus.ranks" in json.loads(err.value.body)["message"]
    cluster.api.validate_htj = False  # an old CRD without the rule
    try:
        await cluster.apply(body, namespace="invalid")
    finally:
        cluster.api.validate_htj = True
    await cluster.wait_for(lambda: cluster.phase("bad", "invalid") == "Failed", 30, "Failed")
    failed = cond(cluster.job("bad", "invalid"), "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert failed["message"] == ("Invalid spec: spec.gpus.minRanks: 3 exceeds spec.gpus.ranks=2; "
                                 "lower minRanks or raise ranks")
    assert cluster.pods("invalid") == []


async def test_deleted_node_restarts_onto_the_remaining_capacity_uncounted(cluster: Cluster) -> None:
    # The first attempt runs until the node loss restarts it (it never finishes on its own, however
    # slow the machine); the re-planned attempt (generation 1) exits at once.
    body = script_job("shrink", "import os, time; "
                  "time.sleep(300 if os.environ['HTJ_RESTART_GENERATION'] == '0' else 0)",  # sync-ok: the workload
                  gpus={"ranks": 4, "minRanks": 2})
    await cluster.apply(body, namespace="shrink")
    await cluster.wait_for(lambda: cluster.phase("shrink", "shrink") == "Running", 60, "Running")
    t4 = cluster.api.get(("", "v1", "nodes"), None, "node-t4")
    await cluster.api.delete(("", "v1", "nodes"), None, "node-t4")
    try:
        job = await finished(cluster, "shrink", "shrink", 60)
    finally:
        t4["metadata"] = {k: v for k, v in t4["metadata"].items() if k in ("name", "labels")}
        await cluster.add_nodes([t4])
    assert job["status"]["phase"] == "Succeeded"
    assert job["status"]["infrastructureRestarts"] == 1 and "restarts" not in job["status"]
    assert (job["status"]["lastNodeLoss"]["node"], job["status"]["lastNodeLoss"]["reason"]) == ("node-t4", "Deleted")
    assert [(g["node"], g["ranks"]) for g in job["status"]["plan"]["groups"]] == [("node-a100", 1), ("node-v100", 1)]
    assert (await posted(cluster, "shrink", "shrink", "NodeLost"))["NodeLost"] == 1
