"""A re-plan on a DRA cluster with the REAL scheduler's allocation (issue 21): NVIDIA's driver's
ResourceSlices published for node-a100 (one A100) and node-t4 (two T4s), the DeviceClasses its
chart installs, and kube-scheduler's DynamicResources plugin allocating the ResourceClaims that
kube-controller-manager makes from the operator's templates.

Attempt 1 runs on the A100; the node is cordoned and the rank fails, so attempt 2 is planned onto
a T4.  The second attempt's pod claims exactly the second plan's device: its claim is allocated
one device of node-t4's pool whose productName is the T4's; attempt 1's template is deleted and
its claim went with its pod.  (Per-group template names reused the A100 request there: the new pod
could never be scheduled.)  The local kubelet runs the pods without a kubelet plugin (no
NodePrepareResources), which changes nothing the scheduler decides.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from realcluster import GROUP, PLURAL, VERSION, RealCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
DRIVER = "gpu.nvidia.com"
RESOURCE = ("resource.k8s.io", "v1")


def device(name: str, product: str, cc: str, memory: str, uuid: str) -> dict[str, Any]:
    return {"name": name, "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": uuid}, "productName": {"string": product},
        "brand": {"string": "Nvidia"}, "architecture": {"string": "Ampere" if cc == "8.0.0" else "Turing"},
        "cudaComputeCapability": {"version": cc}, "driverVersion": {"version": "550.127.5"},
        "cudaDriverVersion": {"version": "12.4.0"}}, "capacity": {"memory": {"value": memory}}}


def slices() -> list[dict[str, Any]]:
    def one(node: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": f"{node}-{DRIVER}"},
                "spec": {"driver": DRIVER, "nodeName": node, "devices": devices,
                         "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}}}
    return [one("node-a100", [device("gpu-0", "NVIDIA A100-SXM4-40GB", "8.0.0", "40Gi", "GPU-a100")]),
            one("node-t4", [device(f"gpu-{i}", "Tesla T4", "7.5.0", "15Gi", f"GPU-t4-{i}") for i in range(2)])]


def device_classes() -> list[dict[str, Any]]:
    """As NVIDIA's chart installs them (gpu.nvidia.com for whole GPUs, mig.nvidia.com for MIG)."""
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
             "spec": {"selectors": [{"cel": {"expression":
                                             f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"}}]}}
            for name, kind in (("gpu.nvidia.com", "gpu"), ("mig.nvidia.com", "mig"))]


@pytest.fixture
def dra(cluster: RealCluster) -> Any:
    objs = [*device_classes(), *slices()]
    cluster.kubectl("apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    try:
        yield cluster
    finally:
        cluster.kubectl("delete", "resourceslices", *[s["metadata"]["name"] for s in slices()], "--ignore-not-found")
        cluster.kubectl("delete", "deviceclasses", "gpu.nvidia.com", "mig.nvidia.com", "--ignore-not-found")
        cluster.kubectl("uncordon", "node-a100", check=False)


def claims(cl: RealCluster, ns: str) -> list[dict[str, Any]]:
    return cl.custom.list_namespaced_custom_object(*RESOURCE, ns, "resourceclaims")["items"]


def templates(cl: RealCluster, ns: str) -> list[str]:
    return sorted(t["metadata"]["name"] for t in
                  cl.custom.list_namespaced_custom_object(*RESOURCE, ns, "resourceclaimtemplates")["items"])


def test_the_second_attempts_pod_claims_exactly_the_second_plans_devices(dra: RealCluster, tmp_path: Path) -> None:
    cl = dra
    ns = cl.namespace("dra-replan")
    flag = tmp_path / "fail"
    code = ("import os, sys, time\n"
            "if os.environ['HTJ_RESTART_GENERATION'] != '0':\n"
            "    sys.exit(0)\n"
            f"while not os.path.exists({str(flag)!r}):\n"
            "    time.sleep(0.2)  # sync-ok: attempt 1 runs until the test fails it\n"
            "sys.exit(3)\n")
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "HeteroTrainingJob", "metadata": {"name": "replan"},
            "spec": {"worker": {"command": ["python", "-c", code]},
                     "images": [{"image": "reg/train:cu124", "cudaVersion": "12.4", "torchVersion": "2.13.0",
                                 "computeCapabilities": ["7.5", "8.0"]}],
                     "gpus": {"ranks": 1, "minRanks": 1, "allowedProducts": ["NVIDIA-A100-SXM4-40GB", "Tesla-T4"]},
                     "training": {"globalBatchSize": 16}, "runPolicy": {"backoffLimit": 2}}}
    cl.apply(body, ns)
    cl.wait_for(lambda: cl.phase("replan", ns) == "Running", 90, "attempt 1 running")
    job = cl.job("replan", ns)
    assert [(g["node"], g["gpuType"]) for g in job["status"]["plan"]["groups"]] == [("node-a100", "NVIDIA-A100-SXM4-40GB")]
    assert templates(cl, ns) == ["replan-a1-g0"]
    (first,) = claims(cl, ns)
    assert _allocated(first) == [("node-a100", "gpu-0")]  # the real scheduler allocated the A100

    cl.kubectl("cordon", "node-a100")
    flag.write_text("1")
    cl.wait_for(lambda: (cl.job("replan", ns) or {}).get("status", {}).get("attempt") == 2, 90, "attempt 2")
    second = cl.job("replan", ns)["status"]["plan"]["groups"]
    assert [(g["node"], g["gpuType"], g["ranks"]) for g in second] == [("node-t4", "Tesla-T4", 1)]
    allocated = cl.wait_for(lambda: [c for c in claims(cl, ns) if _allocated(c)
                                     and c["metadata"]["ownerReferences"][0]["name"] == "replan-g0"
                                     and _allocated(c)[0][0] == "node-t4"], 60,
                            "attempt 2's claim allocated by the scheduler")
    (claim,) = allocated
    ((pool, dev),) = _allocated(claim)
    assert pool == "node-t4" and dev in ("gpu-0", "gpu-1")  # one T4 of node-t4: the new plan's device
    assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpus"
    assert templates(cl, ns) == ["replan-a2-g0"]  # attempt 1's template removed with its attempt
    job = cl.finished("replan", ns, 90)
    assert job["status"]["phase"] == "Succeeded" and job["status"]["attempt"] == 2, job["status"]
    cl.wait_for(lambda: not any(_allocated(c) == [("node-a100", "gpu-0")] for c in claims(cl, ns)), 60,
                "attempt 1's claim gone with its pod")


def _allocated(claim: dict[str, Any]) -> list[tuple[str, str]]:
    results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return [(r["pool"], r["device"]) for r in results if r.get("driver") == DRIVER]
