"""DRA, to the driver (issue 21): a MIG parent is not offered whole (shared case 39), partitionable
devices drawing on shared counters (dynamic MIG, KEP-4815) are read and what is allocated from a
counter set is subtracted, and a device the driver taints is not free.

Case 39's fixture: two nodes with 2 x A100 80GB PCIe each; node-a with MIG off, node-b with both
GPUs split into 4 x ``1g.10gb``, whose slice also lists the two whole GPUs (same ``uuid`` as the
MIG devices' ``parentUUID``), as kubernetes-sigs/dra-driver-nvidia-gpu#719 shows.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import CATALOG_118_124_128, make_job

from hetero_operator.api import types as model
from hetero_operator.cluster import dra
from hetero_operator.planning.plan import plan_job

CASE = Path(__file__).resolve().parents[1] / "fixtures" / "cases" / "39-dra-mig-node-also-publishes-whole-gpus.yaml"
IMAGES = [*CATALOG_118_124_128, {"image": "reg/w:cu130", "cudaVersion": "13.0",
                                 "computeCapabilities": ["8.0"]}]


def case39_shapes() -> tuple[dict[str, Any], dict[str, Any]]:
    """The case's whole-GPU and MIG device, as the driver publishes them."""
    slice_, _expected = yaml.safe_load_all(CASE.read_text())
    whole, mig = slice_["spec"]["devices"]
    return whole, mig


def node(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {}},
            "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                   "allocatable": {"cpu": "64"}, "capacity": {"cpu": "64"}}}


def gpu(template: dict[str, Any], index: int, uuid: str) -> dict[str, Any]:
    dev = copy.deepcopy(template)
    dev["name"] = f"gpu-{index}"
    dev["attributes"]["uuid"] = {"string": uuid}
    dev["attributes"]["pcieBusID"] = {"string": f"0000:0{index + 1}:00.0"}
    return dev


def mig(template: dict[str, Any], parent: int, start: int, parent_uuid: str) -> dict[str, Any]:
    dev = copy.deepcopy(template)
    dev["name"] = f"gpu-{parent}-mig-19-{start}-1"
    dev["attributes"]["uuid"] = {"string": f"MIG-{parent}{start}000000-0000-0000-0000-000000000000"}
    dev["attributes"]["parentUUID"] = {"string": parent_uuid}
    return dev


def slice_of(node_name: str, devices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node_name}-gpu.nvidia.com"},
            "spec": {"driver": dra.DRIVER, "nodeName": node_name,
                     "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices, **extra}}


def case39(with_mig: bool = True) -> dra.DraInventory:
    whole, part = case39_shapes()
    a = [gpu(whole, i, f"GPU-a{i}") for i in range(2)]
    b = [gpu(whole, i, f"GPU-b{i}") for i in range(2)]
    if with_mig:
        b += [mig(part, i, s, f"GPU-b{i}") for i in range(2) for s in range(4)]
    return dra.build_dra_inventory([node("node-a"), node("node-b")], (),
                                   [slice_of("node-a", a), slice_of("node-b", b)], ())


def offered(inv: dra.DraInventory) -> dict[str, dict[str, tuple[int, int]]]:
    return {n.name: {d.gpu_type: (d.total, d.free) for d in n.devices} for n in inv.inventory.nodes}


A100_PCIE = "NVIDIA-A100-80GB-PCIe"


def test_case39_a_mig_parent_is_not_offered_whole() -> None:
    inv = case39()
    assert offered(inv) == {"node-a": {A100_PCIE: (2, 2)},
                            "node-b": {f"{A100_PCIE}-MIG-1g.10gb": (8, 8)}}
    (warning,) = [w for w in inv.inventory.warnings if w.reason == model.GPU_OFFERED_TWICE]
    assert warning.node == "node-b"
    assert "gpu-0, gpu-1 are in MIG mode" in warning.message and "not offered whole" in warning.message


def test_case39_four_whole_gpu_ranks_do_not_fit_and_never_land_on_the_mig_node() -> None:
    inv = case39().inventory
    four = make_job(name="whole", ranks=4, global_batch=64, images=IMAGES, gpus={"allowMig": False})
    result = plan_job(four, inv)
    assert isinstance(result, model.Unschedulable) and result.reason == "InsufficientGPUs"
    assert "need 4, free 2" in result.message
    ten = plan_job(make_job(name="mixed", ranks=10, global_batch=64, images=IMAGES, gpus={"selection": "All"}), inv)
    assert isinstance(ten, model.Plan)
    on_b = {r.gpu_type for r in ten.ranks if r.node == "node-b"}
    assert on_b == {f"{A100_PCIE}-MIG-1g.10gb"}  # never node-b's whole GPUs next to its slices


def test_case39_control_without_mig_devices_node_b_offers_its_whole_gpus() -> None:
    inv = case39(with_mig=False)
    assert offered(inv)["node-b"] == {A100_PCIE: (2, 2)}
    assert not [w for w in inv.inventory.warnings if w.reason == model.GPU_OFFERED_TWICE]


# --- dynamic MIG: shared counters -------------------------------------------------------------------

def counted(dev: dict[str, Any], counter_set: str, slices: list[int], compute: int) -> dict[str, Any]:
    """A partitionable device consuming memory slices ``slices`` and ``compute`` compute slices."""
    out = copy.deepcopy(dev)
    out["consumesCounters"] = [{"counterSet": counter_set, "counters": {
        **{f"memory-slice-{i}": {"value": "1"} for i in slices}, "compute": {"value": str(compute)}}}]
    return out


def dynamic_node(allocated: list[str]) -> dra.DraInventory:
    """node-d: one A100 80GB in dynamic MIG mode: the whole GPU (all 8 memory slices, 7 compute)
    or 1g.10gb partitions at each of 7 placements (one memory slice, 1 compute), or 3g.40gb
    partitions at placements 0 and 4 (four memory slices, 3 compute)."""
    whole, part = case39_shapes()
    devices = [counted(gpu(whole, 0, "GPU-d0"), "gpu-0", list(range(8)), 7)]
    for start in range(7):
        devices.append(counted(mig(part, 0, start, "GPU-d0"), "gpu-0", [start], 1))
    big = copy.deepcopy(part)
    big["attributes"]["profile"] = {"string": "3g.40gb"}
    big["capacity"] = {"memory": {"value": "40Gi"}, "multiprocessors": {"value": "42"}}
    for start in (0, 4):
        d = counted(mig(big, 0, start, "GPU-d0"), "gpu-0", list(range(start, start + 4)), 3)
        d["name"] = f"gpu-0-mig-9-{start}-4"
        devices.append(d)
    counters = {"name": "gpu-0", "counters": {**{f"memory-slice-{i}": {"value": "1"} for i in range(8)},
                                             "compute": {"value": "7"}}}
    claims = [{"metadata": {"name": f"c{i}", "namespace": "other"}, "status": {"allocation": {"devices": {
        "results": [{"driver": dra.DRIVER, "pool": "node-d", "device": name, "request": "gpus"}]}}}}
        for i, name in enumerate(allocated)]
    return dra.build_dra_inventory([node("node-d")], (), [slice_of("node-d", devices, sharedCounters=[counters])],
                                   claims)


@pytest.mark.parametrize(("allocated", "want"), [
    ([], {A100_PCIE: (1, 1)}),
    (["gpu-0-mig-19-0-1"], {f"{A100_PCIE}-MIG-1g.10gb": (4, 3), f"{A100_PCIE}-MIG-3g.40gb": (1, 1)}),
    (["gpu-0-mig-9-0-4", "gpu-0-mig-19-4-1"],
     {f"{A100_PCIE}-MIG-1g.10gb": (3, 2), f"{A100_PCIE}-MIG-3g.40gb": (1, 0)}),
    (["gpu-0"], {A100_PCIE: (1, 0)}),
], ids=["nothing allocated: the whole GPU, not its partitions as well",
        "one 1g.10gb taken: the largest partitions that still fit, without overlap (3g.40gb at "
        "slices 4-7, then 1g.10gb at 1, 2, 3: compute 1 + 3 + 3 = 7)",
        "3g.40gb at 0 and 1g.10gb at 4 taken: what is left (two 1g.10gb), never the whole GPU",
        "the whole GPU taken: nothing free"])
def test_shared_counters_allocated_are_subtracted_and_nothing_is_offered_twice(allocated, want) -> None:
    inv = dynamic_node(allocated)
    assert offered(inv) == {"node-d": want}


def test_a_device_the_driver_taints_is_not_free_and_says_why() -> None:
    whole, _ = case39_shapes()
    sick = gpu(whole, 1, "GPU-t1")
    sick["taints"] = [{"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": "NoSchedule"}]
    inv = dra.build_dra_inventory([node("node-t")], (), [slice_of("node-t", [gpu(whole, 0, "GPU-t0"), sick])], ())
    (device,) = inv.inventory.nodes[0].devices
    assert (device.total, device.free, device.unhealthy) == (1, 1, 1)  # usable 1, plus 1 unhealthy


@pytest.mark.parametrize("prefix", ["39", "41", "42", "43", "49"])
def test_issue21_cases_are_copied_into_the_project(prefix: str) -> None:
    cases = CASE.parent
    assert len(list(cases.glob(f"{prefix}-*.yaml"))) == 1 and len(list(cases.glob(f"{prefix}-*.md"))) == 1
