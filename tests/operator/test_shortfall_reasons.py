"""The shortfall message names every reason a GPU is not free (issue 21): GPUs in use by pods, GPUs
``status.capacity`` counts and allocatable does not (the device plugin's unhealthy GPUs, e.g.
after an XID error), a node whose every GPU is unhealthy, devices a DRA driver's ResourceClaims
hold and devices it taints."""

from __future__ import annotations

from builders import CATALOG_118_124_128, make_job, make_node, make_pod
from test_dra_driver import case39_shapes, gpu, node, slice_of

from hetero_operator.api import types as model
from hetero_operator.cluster import dra
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.plan import plan_job

T4 = {"product": "Tesla-T4", "memory_mib": 15360, "cc": "7.5"}


def unhealthy(name: str, count: int, allocatable: int) -> dict:
    n = make_node(name, count=count, **T4)
    n["status"]["allocatable"]["nvidia.com/gpu"] = str(allocatable)  # capacity keeps all of them
    return n


def job(ranks: int):
    return make_job(name="j", ranks=ranks, global_batch=64, images=CATALOG_118_124_128,
                    gpus={"selection": "All"})


def test_a_gpu_in_capacity_but_not_allocatable_is_named_unhealthy() -> None:
    inv = build_inventory([unhealthy("t4-a", 4, 3)], [make_pod("t4-a", {"nvidia.com/gpu": 1})])
    (device,) = inv.nodes[0].devices
    assert (device.total, device.free, device.unhealthy) == (3, 2, 1)
    result = plan_job(job(4), inv)
    assert isinstance(result, model.Unschedulable) and result.reason == "InsufficientGPUs"
    assert ("Tesla-T4: need 4, free 2 (t4-a: 1 of 3 in use, 1 more unhealthy (in capacity but not "
            "allocatable, or tainted by the DRA driver: e.g. an XID error))") in result.message


def test_a_node_whose_every_gpu_is_unhealthy_is_named_with_the_fix() -> None:
    inv = build_inventory([unhealthy("t4-a", 2, 2), unhealthy("t4-dead", 1, 0)])
    (excluded,) = inv.excluded
    assert (excluded.node, excluded.reason, excluded.gpu_type) == ("t4-dead", model.GPUS_UNHEALTHY, "Tesla-T4")
    result = plan_job(job(3), inv)
    assert isinstance(result, model.Unschedulable)
    assert "t4-dead: all GPUs unhealthy" in result.message
    assert "repair the GPUs of t4-dead (1 nvidia.com/gpu in capacity but not allocatable" in result.message


def test_dra_devices_claimed_and_tainted_are_both_named() -> None:
    whole, _ = case39_shapes()
    sick = gpu(whole, 1, "GPU-s1")
    sick["taints"] = [{"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": "NoExecute"}]
    claim = {"metadata": {"name": "notebook", "namespace": "other"}, "status": {"allocation": {"devices": {
        "results": [{"driver": dra.DRIVER, "pool": "node-d", "device": "gpu-0", "request": "gpus"}]}}}}
    inv = dra.build_dra_inventory([node("node-d")], (), [slice_of("node-d", [gpu(whole, 0, "GPU-s0"), sick])],
                                  [claim])
    result = plan_job(make_job(name="j", ranks=1, global_batch=8, gpus={"selection": "All"},
                               images=[*CATALOG_118_124_128, {"image": "reg/w:cu130", "cudaVersion": "13.0",
                                                               "computeCapabilities": ["8.0"]}]),
                      inv.inventory)
    assert isinstance(result, model.Unschedulable)
    assert ("node-d: 1 of 1 in use (1 allocated to DRA ResourceClaims), 1 more unhealthy") in result.message


def test_a_healthy_node_says_nothing_more() -> None:
    inv = build_inventory([unhealthy("t4-a", 2, 2)], [make_pod("t4-a", {"nvidia.com/gpu": 2})])
    result = plan_job(job(1), inv)
    assert isinstance(result, model.Unschedulable)
    assert "t4-a: 2 of 2 in use)" in result.message and "unhealthy" not in result.message
