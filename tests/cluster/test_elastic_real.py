"""Issue 31's acceptance on the real control plane: an elastic job (``spec.elastic: {minRanks: 2}``)
of 4 ranks on 3 nodes (A100, V100, node-t4 with 2x T4) loses node-t4 when its kubelet stops; the
job goes on with 2 ranks, the survivors' pods never restart (same uids, same processes); the node
comes back and the job grows back to 4 at a step boundary; ``status.elastic`` and Events show both
changes, and neither counts as a restart. Then node-t4 dies again while the spare T4 node is free:
the lost pod comes back on the spare (a reclaimed spot node replaced by a new one).

The operator (kopf, in process), the real kube-apiserver, scheduler and controller-manager (its
node lifecycle controller turns the node ``Ready=Unknown`` once the lease is stale) and the local
kubelet running the pods as processes: the ranks train digits for real (Gloo), and the job's
membership keeper pod (``heterotrain keeper``) announces each generation.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from builders import digits_job
from realcluster import GRACE_S, SPARE, RealCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

MAX_STEPS = 200
"""Long enough that the job still runs after its ranks joined twice (about 0.3 s a step with the
simulated delay below, on this 2-core machine: one run grew back at step 30 and again at step 52);
the job is checked to end well."""


def _elastic(job: dict[str, Any]) -> dict[str, Any]:
    return (job.get("status") or {}).get("elastic") or {}


def _revived(cluster: RealCluster) -> None:
    assert cluster.kubelet is not None
    cluster.on_kubelet(cluster.kubelet.revive("node-t4"))
    cluster.wait_for(lambda: "node-t4" in cluster.ready_nodes() and not any(
        t["key"].startswith("node.kubernetes.io/") for t in cluster.node("node-t4")["spec"].get("taints") or ()),
        90, "node-t4 Ready again, untainted")


def test_an_elastic_job_shrinks_when_its_t4_node_dies_and_grows_back_when_it_returns(
        cluster: RealCluster, tmp_path: Path) -> None:
    ns = cluster.namespace("elastic")
    body = digits_job("el", tmp_path, args=["--epochs", "60", "--max-steps", str(MAX_STEPS)],
                      elastic={"minRanks": 2},
                      runPolicy={"nodeLossGraceSeconds": 2, "backoffLimit": 2, "cleanPodPolicy": "None"})
    body["spec"]["gpus"]["minRanks"] = 4
    body["spec"]["worker"]["env"] = [{"name": "HTJ_SIM_DELAY_PER_SAMPLE_S", "value": "0.004"}]
    cluster.apply(body, ns)
    cluster.wait_for(lambda: ((cluster.job("el", ns) or {}).get("status", {}).get("progress") or {})
                     .get("step", 0) >= 5, 180, "step 5")
    job = cluster.job("el", ns)
    assert job is not None
    assert _elastic(job) == {"attempt": 1, "generation": 0, "ranks": 4, "lostPods": [], "regrows": 0,
                             "gpuTypes": [{"gpuType": "NVIDIA-A100-SXM4-40GB", "ranks": 1},
                                          {"gpuType": "Tesla-V100-SXM2-16GB", "ranks": 1},
                                          {"gpuType": "Tesla-T4", "ranks": 2}]}
    pods = {p["metadata"]["name"]: p for p in cluster.pods(ns, job="el")}
    assert set(pods) == {"el-g0", "el-g1", "el-g2", "el-membership"}
    assert pods["el-membership"]["spec"]["nodeName"] == "node-a100"  # rank 0's node
    survivors = {n: pods[n]["metadata"]["uid"] for n in ("el-g0", "el-g1", "el-membership")}
    assert cluster.kubelet is not None
    cluster.loop.call_soon_threadsafe(cluster.kubelet.stop_heartbeat, "node-t4")
    revived = False
    try:
        shrunk = cluster.wait_for(lambda: _elastic(cluster.job("el", ns) or {}).get("generation") == 1
                                  and cluster.job("el", ns), GRACE_S + 60, "the shrink")
        elastic = _elastic(shrunk)
        assert (elastic["ranks"], elastic["reason"]) == (2, "ElasticShrink")
        assert [(p["pod"], p["node"], p["ranks"]) for p in elastic["lostPods"]] == [("el-g2", "node-t4", 2)]
        assert elastic["message"].startswith("pod el-g2 (2 Tesla-T4 ranks) node node-t4 lost")
        assert shrunk["status"]["phase"] == "Running"
        # the ranks re-formed without node-t4: the keeper announced generation 1 with 2 ranks
        cluster.wait_for(lambda: re.search(r"generation 1: 4 -> 2 ranks", cluster.log(ns, "el-membership")),
                         60, "the keeper's shrink")
        _revived(cluster)
        revived = True
        grown = cluster.wait_for(lambda: _elastic(cluster.job("el", ns) or {}).get("generation") == 2
                                 and cluster.job("el", ns), 60, "the growth")
        assert (_elastic(grown)["ranks"], _elastic(grown)["reason"], _elastic(grown)["regrows"]) == \
            (4, "ElasticGrow", 1)
        cluster.wait_for(lambda: re.search(r"generation 2: 2 -> 4 ranks", cluster.log(ns, "el-membership")),
                         120, "the keeper's growth")
        # the ranks re-formed with the T4 ranks (rank 0 prints it once the switch is done); a loss
        # during a re-formation is not handled (docs/elastic.md), so the next one waits for this
        cluster.wait_for(lambda: re.search(r"joined; generation 2: 2 -> 4 ranks, split \[70, 28, 15, 15\]",
                                           cluster.log(ns, "el-g0")), 60, "the T4 ranks joined at a step boundary")
        # node-t4 dies again while the spare T4 node is free: the pod comes back there
        cluster.core.patch_node(SPARE, {"spec": {"unschedulable": False}})
        revived = False
        cluster.loop.call_soon_threadsafe(cluster.kubelet.stop_heartbeat, "node-t4")
        moved = cluster.wait_for(lambda: _elastic(cluster.job("el", ns) or {}).get("generation") == 4
                                 and cluster.job("el", ns), GRACE_S + 90, "the shrink and the move")
        assert (_elastic(moved)["ranks"], _elastic(moved)["reason"], _elastic(moved)["regrows"]) == \
            (4, "ElasticGrow", 2)
        assert _elastic(moved)["message"].startswith(f"Pod el-g2 on {SPARE} (node-t4 is not healthy")
        cluster.wait_for(lambda: re.search(r"joined; generation 4: 2 -> 4 ranks", cluster.log(ns, "el-g0")),
                         120, "the T4 ranks joined again from the spare")
        assert {p["metadata"]["name"]: p["spec"].get("nodeName") for p in cluster.pods(ns, job="el")}[
            "el-g2"] == SPARE
    finally:
        cluster.core.patch_node(SPARE, {"spec": {"unschedulable": True}})
        if not revived:
            _revived(cluster)
    done = cluster.finished("el", ns, 300)
    status = done["status"]
    assert status["phase"] == "Succeeded", status
    assert "restarts" not in status and "infrastructureRestarts" not in status
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in cluster.pods(ns, job="el")}
    assert {n: after.get(n) for n in survivors} == survivors  # never restarted
    counts = cluster.event_counts("el", ns)
    assert (counts.get("ElasticShrink"), counts.get("ElasticGrow")) == (2, 2), counts
    rank0 = cluster.log(ns, "el-g0")
    assert "resumed at step" not in rank0 and "no checkpoint read" in rank0
    t4 = cluster.log(ns, "el-g2")
    assert "joined" in t4, t4[-2000:]
