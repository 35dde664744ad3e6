"""shared/cases/51 at operator level: the operator in process against the HTTP fake API server that
serves the case's two bound claims, and a kubelet that runs the pods (the case's "How to test";
a local kubelet does not emulate the attach/detach controller, so the check reads the
placement, not a Multi-Attach event).  The pure policy: tests/operator/test_case51.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from k8s.harness import Cluster, load_nodes  # noqa: E402

from builders import e2e_config, script_job  # noqa: E402

CASE = Path(__file__).resolve().parents[1] / "fixtures" / "cases" / "51-rwo-checkpoint-claim-across-nodes.yaml"
PVCS = ("", "v1", "persistentvolumeclaims")
NS = "team-x"

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(240)]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    async with Cluster(tmp_path_factory.mktemp("cluster51")) as cl:
        await cl.add_nodes(load_nodes())
        for doc in yaml.safe_load_all(CASE.read_text()):
            if doc and doc.get("kind") == "PersistentVolumeClaim":
                await cl.api.create(PVCS, NS, {"apiVersion": "v1", **doc})
        await cl.start_operator(e2e_config())
        yield cl


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def idle_cluster(cluster: Cluster) -> None:
    """Each test starts on an idle cluster (GPUs of the other test released)."""
    await cluster.idle()


def _job(name: str, claim: str) -> dict[str, Any]:
    return script_job(name, "pass", gpus={"ranks": 4, "minRanks": 2},
                      training={"checkpoint": {"path": f"/tmp/heterotrain-case51/{name}",
                                               "persistentVolumeClaim": claim}})


def _warnings(cluster: Cluster, name: str) -> list[str]:
    return [e["message"] for e in cluster.events(name, NS) if e["reason"] == "ReadWriteOnceClaim"]


async def test_51_the_rwo_claim_keeps_the_pods_on_one_node_with_a_warning(cluster: Cluster) -> None:
    await cluster.apply(_job("ckpt-job", "ckpt-rwo"), namespace=NS)
    await cluster.wait_for(lambda: len(cluster.pods(NS, job="ckpt-job")) >= 1 and bool(_warnings(cluster, "ckpt-job")),
                           60, "pods and the ReadWriteOnceClaim Warning")
    nodes = {p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchFields"][0]["values"][0] for p in cluster.pods(NS, job="ckpt-job")}
    assert nodes == {"node-t4"}, nodes
    (warning,) = set(_warnings(cluster, "ckpt-job"))
    assert "PersistentVolumeClaim ckpt-rwo" in warning and "is ReadWriteOnce" in warning
    assert cluster.job("ckpt-job", NS)["status"]["plan"]["worldSize"] == 2


async def test_51_control_the_rwx_claim_spreads_over_three_nodes_without_a_warning(cluster: Cluster) -> None:
    await cluster.apply(_job("ckpt-rwx-job", "ckpt-rwx"), namespace=NS)
    await cluster.wait_for(lambda: (cluster.job("ckpt-rwx-job", NS).get("status") or {}).get("plan"), 60, "a plan")
    groups = cluster.job("ckpt-rwx-job", NS)["status"]["plan"]["groups"]
    assert len({g["node"] for g in groups}) == 3 and _warnings(cluster, "ckpt-rwx-job") == []
