"""End to end on a DRA cluster (issue 15): the operator (kopf, in process) plans a job on nodes whose
GPUs only NVIDIA's DRA driver publishes (tests/fixtures/dra/dra-cluster.yaml: ResourceSlices, no GFD
labels, no nvidia.com/* allocatable, one T4 already claimed), creates one ResourceClaimTemplate per
group and pods that claim from it, and the job runs to success on the local kubelet.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import pytest_asyncio
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from k8s.harness import Cluster  # noqa: E402

from builders import e2e_config  # noqa: E402
from hetero_operator.controller.objects import (RESOURCE_CLAIM_TEMPLATES,  # noqa: E402
                                                RESOURCE_CLAIMS, RESOURCE_SLICES)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dra"
CONFIG = e2e_config()
pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(180)]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    nodes, slices, claims = yaml.safe_load_all((FIXTURES / "dra-cluster.yaml").read_text())
    async with Cluster(tmp_path_factory.mktemp("dra")) as cl:
        await cl.add_nodes(nodes["items"])
        for s in slices["items"]:
            await cl.api.create(RESOURCE_SLICES, None, s)
        for c in claims["items"]:
            await cl.api.create(RESOURCE_CLAIMS, c["metadata"]["namespace"], c)
        await cl.start_operator(CONFIG)
        yield cl


async def test_job_on_dra_nodes_claims_its_gpus_through_templates(cluster: Cluster) -> None:
    job = {"apiVersion": "heterotrain.io/v1alpha1", "kind": "HeteroTrainingJob",
           "metadata": {"name": "dra"},
           "spec": {"worker": {"command": ["python", "-c", "pass"]},
                    "images": [{"image": "reg/train:cu118", "cudaVersion": "11.8",
                                "computeCapabilities": ["7.5", "8.0"]},
                               {"image": "reg/train:cu124", "cudaVersion": "12.4",
                                "computeCapabilities": ["7.5", "8.0"]}],
                    "gpus": {"ranks": 6}, "training": {"globalBatchSize": 60}}}
    await cluster.apply(job, "ml")
    await cluster.wait_for(lambda: cluster.phase("dra", "ml") in ("Succeeded", "Failed"), 90, "finish")
    status = cluster.job("dra", "ml")["status"]
    assert status["phase"] == "Succeeded", status
    assert [(g["node"], g["gpuType"]) for g in status["plan"]["groups"]] == [
        ("a100-0", "NVIDIA-A100-SXM4-80GB"), ("a100-mig-0", "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"),
        ("a100-mig-0", "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"), ("t4-0", "Tesla-T4")]
    templates = sorted(cluster.api.objects(RESOURCE_CLAIM_TEMPLATES, "ml"), key=lambda t: t["metadata"]["name"])
    assert [t["metadata"]["name"] for t in templates] == ["dra-a1-g0", "dra-a1-g1", "dra-a1-g2", "dra-a1-g3"]
    uid = cluster.job("dra", "ml")["metadata"]["uid"]
    assert all(t["metadata"]["ownerReferences"][0]["uid"] == uid for t in templates)
    assert [t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] for t in templates] == [2, 1, 1, 2]
    created = sorted(name for res, ns, name, _, _ in cluster.api.created
                     if res == ("", "v1", "pods") and ns == "ml")
    assert created == ["dra-g0", "dra-g1", "dra-g2", "dra-g3"]
    # cleanPodPolicy Running may already have removed a pod still running at success: check those left
    pods = sorted(cluster.pods("ml", job="dra"), key=lambda p: p["metadata"]["name"])
    assert pods and all(p["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
                        == p["metadata"]["name"].replace("dra-", "dra-a1-") for p in pods)
    for obj in [*templates, *pods]:
        clean = {k: v for k, v in obj.items() if k != "status"}
        clean["metadata"] = {k: v for k, v in obj["metadata"].items()
                             if k in ("name", "namespace", "labels", "annotations", "ownerReferences")}
        kubernetes_validate.validate(clean, "1.34.0", strict=True)
        limits = [c["resources"].get("limits", {}) for c in obj.get("spec", {}).get("containers", [])]
        assert not any(k.startswith("nvidia.com/") for lim in limits for k in lim)


async def test_a_replan_onto_another_gpu_type_gets_claims_for_the_new_plan(cluster: Cluster,
                                                                          tmp_path_factory) -> None:
    """Issue 21: attempt 1 runs on a100-0's two A100s; the node is cordoned and a rank fails, so
    attempt 2 is planned onto t4-0's T4s.  Its pods claim from attempt 2's template, whose request
    is exactly the new plan's devices (T4, two per pod), and attempt 1's template is gone (a
    template named by group alone was reused with the A100 request: pods Pending for ever)."""
    await cluster.idle()
    flag = tmp_path_factory.mktemp("replan") / "fail"
    code = ("import os, sys, time\n"
            "if os.environ['HTJ_RESTART_GENERATION'] != '0':\n"
            "    sys.exit(0)\n"
            f"while not os.path.exists({str(flag)!r}):\n"
            "    time.sleep(0.1)  # sync-ok: attempt 1 runs until the test fails it\n"
            "sys.exit(3)\n")
    job = {"apiVersion": "heterotrain.io/v1alpha1", "kind": "HeteroTrainingJob",
           "metadata": {"name": "replan"},
           "spec": {"worker": {"command": ["python", "-c", code]},
                    "images": [{"image": "reg/train:cu118", "cudaVersion": "11.8",
                                "computeCapabilities": ["7.5", "8.0"]},
                               {"image": "reg/train:cu124", "cudaVersion": "12.4",
                                "computeCapabilities": ["7.5", "8.0"]}],
                    "gpus": {"ranks": 2, "minRanks": 2, "allowMig": False},
                    "training": {"globalBatchSize": 32}, "runPolicy": {"backoffLimit": 2}}}
    ns = "replan"
    await cluster.apply(job, ns)
    await cluster.wait_for(lambda: cluster.phase("replan", ns) == "Running", 60, "attempt 1 running")
    first = cluster.job("replan", ns)["status"]["plan"]["groups"]
    assert [(g["node"], g["gpuType"], g["ranks"]) for g in first] == [("a100-0", "NVIDIA-A100-SXM4-80GB", 2)]
    assert names(cluster, ns) == ["replan-a1-g0"]
    await cluster.api.patch(("", "v1", "nodes"), None, "a100-0", {"spec": {"unschedulable": True}})
    try:
        flag.write_text("1")
        try:
            await cluster.wait_for(lambda: cluster.phase("replan", ns) in ("Succeeded", "Failed"), 90,
                                   "attempt 2 ends")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {cluster.job('replan', ns)['status']}; pods "
                                 f"{[(p['metadata']['name'], p.get('status')) for p in cluster.pods(ns)]}") from None
        status = cluster.job("replan", ns)["status"]
        assert status["phase"] == "Succeeded" and status["attempt"] == 2, status
        second = status["plan"]["groups"]
        assert [(g["node"], g["gpuType"], g["ranks"]) for g in second] == [("t4-0", "Tesla-T4", 2)]
        assert names(cluster, ns) == ["replan-a2-g0"]  # attempt 1's template removed with it
        (template,) = cluster.api.objects(RESOURCE_CLAIM_TEMPLATES, ns)
        (request,) = template["spec"]["spec"]["devices"]["requests"]
        assert request["exactly"]["count"] == 2 and request["exactly"]["deviceClassName"] == "gpu.nvidia.com"
        assert request["exactly"]["selectors"] == [{"cel": {"expression":
                                                            'device.attributes["gpu.nvidia.com"].productName == "Tesla T4"'}}]
        attempt2 = [p for p in cluster.api.created if p[0] == ("", "v1", "pods") and p[1] == ns
                    and p[4].get("heterotrain.io/attempt") == "2"]
        assert [p[2] for p in attempt2] == ["replan-g0"]
        pod = cluster.api.get(("", "v1", "pods"), ns, "replan-g0")
        if pod is not None:  # cleanPodPolicy may have removed it after the success
            assert pod["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "replan-a2-g0"}]
    finally:
        await cluster.api.patch(("", "v1", "nodes"), None, "a100-0", {"spec": {"unschedulable": None}})


def names(cluster: Cluster, ns: str) -> list[str]:
    return sorted(t["metadata"]["name"] for t in cluster.api.objects(RESOURCE_CLAIM_TEMPLATES, ns))
