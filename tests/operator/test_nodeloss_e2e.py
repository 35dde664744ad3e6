"""End to end, issue 10: nodes that die, shut down or get evicted under a running job.

The operator (kopf, in process) against the fake API server with the local kubelet (tests/k8s).
The cluster is examples/clusters/mixed.yaml (A100, V100, node-t4 with 2x T4) plus a spare
``node-t4-b`` (2x T4), cordoned until the job runs so the first plan always uses node-t4.  The
node faults are written the way Kubernetes writes them: a dead machine keeps its pods "Running"
(nobody reports) and never finishes a deletion; the node lifecycle controller marks it
``Ready=Unknown`` with the unreachable taints; the taint manager evicts with a
``DisruptionTarget`` condition; a graceful node shutdown fails the pods with reason
``Terminated``.

The ranks run a script that waits while ``HTJ_RESTART_GENERATION`` is 0 and succeeds in any
later generation, so "the job runs again and succeeds" proves that it was restarted, and with
one generation number on every pod.
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
from k8s.harness import NODES, PODS, Cluster, load_nodes  # noqa: E402

from hetero_operator.api import conditions as c  # noqa: E402
from builders import e2e_config  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CONFIG = e2e_config({"restart.unschedulable_retry_s": 1.0})
GRACE_S = 2
WAIT_S = 90
SPARE = "node-t4-b"
RANK_CODE = ("import os, sys, time\n"
             "if os.environ['HTJ_RESTART_GENERATION'] != '0':\n"
             "    sys.exit(0)\n"
             "time.sleep(300)  # sync-ok: generation 0 runs until its node is lost\n")

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(240)]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    async with Cluster(tmp_path_factory.mktemp("nodeloss")) as cl:
        nodes = load_nodes()
        spare = copy.deepcopy(nodes[2])
        spare["metadata"]["name"] = SPARE
        spare.setdefault("spec", {})["unschedulable"] = True
        await cl.add_nodes([*nodes, spare])
        await cl.start_operator(CONFIG)
        yield cl


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def healthy_cluster(cluster: Cluster) -> Any:
    """Each test starts with node-t4 healthy and the spare cordoned; afterwards node-t4 is back."""
    await cluster.api.patch(NODES, None, SPARE, {"spec": {"unschedulable": True}})
    await cluster.idle()
    yield
    await cluster.node_healthy("node-t4")


def job(name: str, **run_policy: Any) -> dict[str, Any]:
    """examples/digits.yaml with 4 ranks (all or nothing) running :data:`RANK_CODE`."""
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"]["name"] = name
    body["spec"]["worker"].update(command=["python", "-c", RANK_CODE], args=[], env=[])
    body["spec"]["gpus"].update(ranks=4, minRanks=4)
    body["spec"]["training"].pop("checkpoint", None)
    # cleanPodPolicy None keeps every pod after the job ends, for generations(): under the
    # default (Running) a rank-0 success deletes a peer that is still starting, as Kubeflow does,
    # and about 1 run in 7 at load 2 the respawned g2 on the spare was still Pending then (issue 22).
    body["spec"]["runPolicy"] = {"nodeLossGraceSeconds": GRACE_S, "cleanPodPolicy": "None",
                                 **run_policy}
    return body


async def running_on_node_t4(cluster: Cluster, name: str) -> None:
    """Start the job, wait until it runs with group 2 on node-t4, then uncordon the spare."""
    await cluster.wait_for(lambda: cluster.phase(name, name) == "Running", WAIT_S, f"{name} Running")
    groups = cluster.job(name, name)["status"]["plan"]["groups"]
    assert [(g["pod"], g["node"], g["ranks"]) for g in groups] == [
        (f"{name}-g0", "node-a100", 1), (f"{name}-g1", "node-v100", 1), (f"{name}-g2", "node-t4", 2)]
    await cluster.api.patch(NODES, None, SPARE, {"spec": {"unschedulable": None}})


def reasons(cluster: Cluster, name: str) -> list[str]:
    return [e["reason"] for e in cluster.events(name, name)]


def event(cluster: Cluster, name: str, reason: str) -> dict[str, Any] | None:
    return next((e for e in cluster.events(name, name) if e["reason"] == reason), None)


def generations(cluster: Cluster, name: str) -> dict[str, str]:
    """``HTJ_RESTART_GENERATION`` of each current pod of the job."""
    out = {}
    for p in cluster.pods(name, job=name):
        env = {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}
        assert env["TORCHELASTIC_RESTART_COUNT"] == env["HTJ_RESTART_GENERATION"]
        out[p["metadata"]["name"]] = env["HTJ_RESTART_GENERATION"]
    return out


async def succeeded(cluster: Cluster, name: str) -> dict[str, Any]:
    await cluster.wait_for(lambda: cluster.phase(name, name) in ("Succeeded", "Failed"), WAIT_S,
                           f"{name} to finish (now {cluster.phase(name, name)!r})")
    status = cluster.job(name, name)["status"]
    assert status["phase"] == "Succeeded", status
    return status


def second_plan(status: dict[str, Any]) -> list[tuple[str, str, int]]:
    return [(g["pod"], g["node"], g["ranks"]) for g in status["plan"]["groups"]]


async def test_a_node_not_ready_with_its_kubelet_dead_is_lost_after_the_grace_and_the_job_moves(
        cluster: Cluster) -> None:
    name = "dead"
    await cluster.apply(job(name, backoffLimit=0), namespace=name)
    await running_on_node_t4(cluster, name)
    assert cluster.kubelet is not None
    cluster.kubelet.kill_node("node-t4")        # the machine dies: its pod keeps saying Running
    await cluster.node_unreachable("node-t4")   # the node lifecycle controller notices
    unreachable_at = c.parse_iso(cluster.api.get(NODES, None, "node-t4")["status"]["conditions"][0]["lastTransitionTime"])
    status = await succeeded(cluster, name)
    assert (status.get("restarts", 0), status["infrastructureRestarts"], status["attempt"]) == (0, 1, 2)
    loss = status["lastNodeLoss"]
    assert (loss["node"], loss["pods"]) == ("node-t4", [f"{name}-g2"])
    assert loss["reason"] == "Ready=Unknown (NodeStatusUnknown), taint node.kubernetes.io/unreachable"
    assert c.parse_iso(loss["notReadySince"]) == unreachable_at
    assert c.parse_iso(loss["lostTime"]) == unreachable_at + GRACE_S
    assert second_plan(status) == [(f"{name}-g0", "node-a100", 1), (f"{name}-g1", "node-v100", 1),
                                   (f"{name}-g2", SPARE, 2)]
    # the pod on the dead node went by a force delete (grace 0); its peers gracefully
    deletes = [(n, g) for r, ns, n, g in cluster.api.deletions if r == PODS and ns == name]
    assert (f"{name}-g2", 0) in deletes and {(f"{name}-g0", None), (f"{name}-g1", None)} <= set(deletes)
    assert generations(cluster, name) == {f"{name}-g0": "1", f"{name}-g1": "1", f"{name}-g2": "1"}
    lost = await cluster.wait_for(lambda: event(cluster, name, "NodeLost"), 30, "the NodeLost event")
    assert lost["type"] == "Warning"
    assert lost["message"].startswith(
        f"Node node-t4 is lost: Ready=Unknown (NodeStatusUnknown), taint node.kubernetes.io/unreachable "
        f"since {loss['notReadySince']}, nodeLossGraceSeconds={GRACE_S} passed at {loss['lostTime']}; "
        f"force-deleted pod(s) {name}-g2. Restarting all ranks on the remaining capacity "
        "(infrastructure restart 1; not counted against backoffLimit 0")


async def test_an_evicted_pod_stuck_terminating_on_an_unreachable_node_does_not_block_the_job(
        cluster: Cluster) -> None:
    name = "evicted"
    await cluster.apply(job(name), namespace=name)
    await running_on_node_t4(cluster, name)
    assert cluster.kubelet is not None
    cluster.kubelet.kill_node("node-t4")
    await cluster.evict(name, f"{name}-g2")     # the taint manager's eviction: graceful, never confirmed
    await cluster.wait_for(lambda: event(cluster, name, "PodEvicted"), 30, "the PodEvicted event")
    # the gang restart is under way: the peers are gone, the evicted pod is stuck Terminating
    await cluster.wait_for(lambda: [p["metadata"]["name"] for p in cluster.pods(name)] == [f"{name}-g2"],
                           30, "the peers to be deleted")
    stuck = cluster.api.get(PODS, name, f"{name}-g2")
    assert stuck["metadata"]["deletionTimestamp"] and stuck["status"]["phase"] == "Running"
    assert cluster.phase(name, name) == "Restarting"
    await cluster.node_unreachable("node-t4")   # now the node counts as lost after the grace
    status = await succeeded(cluster, name)
    assert (status.get("restarts", 0), status["infrastructureRestarts"]) == (0, 1)
    assert status["lastDisruption"] == f"{name}-g2 on node-t4 was evicted (DeletionByTaintManager)"
    assert (f"{name}-g2", 0) in [(n, g) for r, ns, n, g in cluster.api.deletions if r == PODS and ns == name]
    assert second_plan(status)[2] == (f"{name}-g2", SPARE, 2)
    assert generations(cluster, name) == {f"{name}-g0": "1", f"{name}-g1": "1", f"{name}-g2": "1"}


async def test_a_node_shutdown_with_backoff_limit_zero_does_not_fail_the_job(cluster: Cluster) -> None:
    name = "shutdown"
    await cluster.apply(job(name, backoffLimit=0, nodeLossGraceSeconds=300), namespace=name)
    await running_on_node_t4(cluster, name)
    assert cluster.kubelet is not None
    await cluster.kubelet.shutdown_node("node-t4")
    status = await succeeded(cluster, name)
    assert (status.get("restarts", 0), status["infrastructureRestarts"], status["attempt"]) == (0, 1, 2)
    assert status["lastDisruption"] == f"{name}-g2 on node-t4 was stopped by its node's shutdown (Terminated)"
    assert "lastNodeLoss" not in status  # no grace needed: the pod failed, nothing is stuck
    assert second_plan(status)[2] == (f"{name}-g2", SPARE, 2)
    shutdown = await cluster.wait_for(lambda: event(cluster, name, "NodeShutdown"), 30, "the NodeShutdown event")
    assert shutdown["type"] == "Warning" and "not counted against backoffLimit 0" in shutdown["message"]
    assert "BackoffLimitExceeded" not in reasons(cluster, name)
