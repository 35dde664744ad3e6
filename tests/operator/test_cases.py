"""Every node-side case of ``shared/cases`` (copied to ``tests/fixtures/cases``) as a planner test.

The cases' job fields are illustrative (``hetero.example.io``); each test maps them onto our CRD
(``globalBatchSize`` -> ``spec.training.globalBatchSize``, ``cudaVariants``/``archVariants`` ->
``spec.images`` entries, ``allowMig`` -> ``spec.gpus.allowMig``).  Where a case encodes a different
policy than ours, the test asserts OUR documented policy (``docs/planning.md``) and says why.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import CATALOG_118_124_128, make_job

from hetero_operator.api import types as model
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.plan import plan_job
from hetero_operator.render.env import render_rank_envs
from heterotrain_common.contract import parse_contract

CASES = Path(__file__).resolve().parent.parent / "fixtures" / "cases"


def case_docs(prefix: str) -> list[dict[str, Any]]:
    (path,) = CASES.glob(f"{prefix}-*.yaml")
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def case_nodes(prefix: str) -> list[dict[str, Any]]:
    return case_docs(prefix)[0]["items"]


def planned(job: Any, nodes: list[dict[str, Any]]) -> model.Plan:
    plan = plan_job(job, build_inventory(nodes))
    assert isinstance(plan, model.Plan), getattr(plan, "message", plan)
    return plan


def envs(plan: model.Plan, job: Any) -> list[dict[str, str]]:
    rendered = render_rank_envs(plan, job, master_addr="job", master_port=29500, simulated=False)
    for env in rendered:
        parse_contract(env)
    return rendered


# --- 01 --------------------------------------------------------------------------------------

def test_01_mig_mixed_inventory_is_six_mig_devices_and_no_whole_gpus() -> None:
    inv = build_inventory(case_nodes("01"))
    assert [(d.mig_profile, d.compute_capability, d.architecture, d.multiprocessors, d.memory_mib,
             d.resource_name, d.total) for d in inv.devices()] == [
        ("1g.5gb", "8.0", "ampere", 14, 4864, "nvidia.com/mig-1g.5gb", 4),
        ("2g.10gb", "8.0", "ampere", 28, 9728, "nvidia.com/mig-2g.10gb", 2)]


def test_01_mig_mixed_plan_splits_64_as_16_16_8_8_8_8() -> None:
    """Case 01 expects [8, 8, 8, 8, 16, 16] split by SM count; our split is by speed, and a MIG
    device's speed is its parent's times slices/7, which gives the same 1:2 ratio here (14 vs 28
    SMs).  Our ranks are ordered strongest first, so the vector reads [16, 16, 8, 8, 8, 8]."""
    job = make_job(ranks=6, global_batch=64, gpus={"allowMig": True}, images=[
        {"image": "registry.example/train:cu121", "cudaVersion": "12.1", "computeCapabilities": ["8.0"]}])
    plan = planned(job, case_nodes("01"))
    assert [r.local_batch for r in plan.ranks] == [16, 16, 8, 8, 8, 8]
    assert [r.resource_name for r in plan.ranks] == ["nvidia.com/mig-2g.10gb"] * 2 + ["nvidia.com/mig-1g.5gb"] * 4
    assert [r.memory_mib for r in plan.ranks] == [9728, 9728, 4864, 4864, 4864, 4864]
    assert [g.ranks for g in plan.groups] == [(0,), (1,), (2,), (3,), (4,), (5,)]
    assert all(g.resource_name != "nvidia.com/gpu" for g in plan.groups)
    rendered = envs(plan, job)
    assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["NCCL_P2P_DISABLE"]) for e in rendered} == {("6", "1", "1")}
    assert [parse_contract(e).local_batch for e in rendered] == [16, 16, 8, 8, 8, 8]


# --- 03 --------------------------------------------------------------------------------------

def test_03_mig_single_node_is_fourteen_1g5gb_slices_behind_nvidia_gpu() -> None:
    inv = build_inventory(case_nodes("03"))
    assert [(d.node, d.product, d.mig_profile, d.memory_mib, d.multiprocessors, d.resource_name, d.total)
            for d in inv.devices()] == [
        ("node-a", "NVIDIA-A100-PCIE-40GB", "1g.5gb", 4864, 14, "nvidia.com/gpu", 14),
        ("node-b", "NVIDIA-A100-PCIE-40GB", "", 40960, 0, "nvidia.com/gpu", 1)]


def test_03_a100_plus_two_slices_split_128_as_100_14_14() -> None:
    """Case 03 splits by SMs (108:14:14 -> [102, 13, 13]).  Our speed model scales a MIG slice by
    compute slices / 7 (a 1g slice = 1/7 of the A100), so the split is 7:1:1 of 128 ->
    99.6, 14.2, 14.2 -> largest remainder [100, 14, 14].  Each slice rank is a pod of its own
    requesting ``nvidia.com/gpu: 1`` with the slice's memory in its device profile."""
    job = make_job(ranks=3, global_batch=128)
    plan = planned(job, case_nodes("03"))
    assert [(r.node, r.mig_profile, r.local_batch) for r in plan.ranks] == [
        ("node-b", "", 100), ("node-a", "1g.5gb", 14), ("node-a", "1g.5gb", 14)]
    assert [(g.node, g.resource_name, g.gpu_count) for g in plan.groups] == [
        ("node-b", "nvidia.com/gpu", 1), ("node-a", "nvidia.com/gpu", 1), ("node-a", "nvidia.com/gpu", 1)]
    profile = parse_contract(envs(plan, job)[1]).device
    assert (profile.product, profile.memory_mib, profile.mig_profile) == (
        "NVIDIA-A100-PCIE-40GB-MIG-1g.5gb", 4864, "1g.5gb")


# --- 05 --------------------------------------------------------------------------------------

def _h100_state2() -> list[dict[str, Any]]:
    docs = case_docs("05")
    node = copy.deepcopy(docs[0]["items"][0])
    node["metadata"]["labels"].update(docs[1]["metadata"]["labels"])
    node["status"] = docs[1]["status"]
    return [node]


def test_05_h100_state1_is_eight_hopper_ranks_in_one_bf16_group() -> None:
    job = make_job(ranks=8, global_batch=256, images=CATALOG_118_124_128)
    plan = planned(job, case_nodes("05"))
    assert {(r.architecture, r.compute_capability, r.precision, r.memory_mib, r.image) for r in plan.ranks} == {
        ("hopper", "9.0", "bf16", 81559, "reg/train:cu124")}
    assert [(g.resource_name, g.gpu_count, g.extra_env) for g in plan.groups] == [("nvidia.com/gpu", 8, {})]
    assert {e["LOCAL_WORLD_SIZE"] for e in envs(plan, job)} == {"8"}


def test_05_h100_state2_has_no_whole_gpus_and_56_mig_devices() -> None:
    inv = build_inventory(_h100_state2())
    assert [(d.resource_name, d.total, d.memory_mib) for d in inv.devices()] == [
        ("nvidia.com/mig-1g.10gb", 56, 9984)]
    plan = planned(make_job(ranks=8, global_batch=64), _h100_state2())
    assert {g.resource_name for g in plan.groups} == {"nvidia.com/mig-1g.10gb"}
    no_mig = plan_job(make_job(ranks=8, global_batch=64, gpus={"allowMig": False}), inv)
    assert isinstance(no_mig, model.Unschedulable)
    assert no_mig.message == ("need 8 ranks (spec.gpus.minRanks, default spec.gpus.ranks), 0 free: no eligible GPUs "
                              "(denied by spec.gpus on 1 node). To plan: add 8 GPUs of a type spec.gpus "
                              "allows; or allow NVIDIA-H100-80GB-HBM3-MIG-1g.10gb in spec.gpus "
                              "(NVIDIA-H100-80GB-HBM3-MIG-1g.10gb is a MIG device and spec.gpus.allowMig is false)")


def test_05_state2_with_stale_whole_gpus_in_allocatable_never_requests_nvidia_gpu() -> None:
    """Issue 10's variant of case 05: after the MIG switch allocatable still advertises the 8
    whole GPUs.  ``gpu.count`` = 8 and 56 x 1g slices occupy all 8, so none is offered whole and a
    ``GpuOfferedTwice`` warning says why."""
    (node,) = _h100_state2()
    node["status"] = {"allocatable": {"nvidia.com/gpu": "8", "nvidia.com/mig-1g.10gb": "56"}}
    inv = build_inventory([node])
    assert [(d.resource_name, d.total) for d in inv.devices()] == [("nvidia.com/mig-1g.10gb", 56)]
    assert [w.reason for w in inv.warnings] == ["GpuOfferedTwice"]
    plan = planned(make_job(ranks=8, global_batch=64), [node])
    assert {g.resource_name for g in plan.groups} == {"nvidia.com/mig-1g.10gb"}
    whole_only = plan_job(make_job(ranks=8, global_batch=64, gpus={"allowMig": False}), inv)
    assert isinstance(whole_only, model.Unschedulable)


# --- 08 --------------------------------------------------------------------------------------

ARCH_IMAGES = [
    {"image": f"registry.example/train:{tag}", "cudaVersion": "12.4", "computeCapabilities": [cc]}
    for tag, cc in (("ampere-sm86", "8.6"), ("ada-sm89", "8.9"), ("hopper-sm90", "9.0"))]


def test_08_l40s_is_ada_with_one_warning_and_images_by_arch() -> None:
    """Case 08 names the architecture ``ada``; we use GFD's family name ``ada-lovelace``."""
    job = make_job(ranks=2, global_batch=48, images=ARCH_IMAGES)
    plan = planned(job, case_nodes("08"))
    assert [(r.node, r.architecture, r.image, r.group, r.local_batch) for r in plan.ranks] == [
        ("node-a", "ada-lovelace", "registry.example/train:ada-sm89", 0, 40),
        ("node-b", "ampere", "registry.example/train:ampere-sm86", 1, 8)]
    mismatch = [w for w in plan.warnings if w.reason == "GpuFamilyLabelMismatch"]
    assert [(w.node, w.message.split(";")[0]) for w in mismatch] == [
        ("node-a", "node-a says ampere, cc 8.9 => ada-lovelace")]


def test_08_without_compute_labels_the_product_table_gives_ada() -> None:
    nodes = copy.deepcopy(case_nodes("08"))
    for key in ("nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor"):
        del nodes[0]["metadata"]["labels"][key]
    plan = planned(make_job(ranks=2, global_batch=48, images=ARCH_IMAGES), nodes)
    assert (plan.ranks[0].compute_capability, plan.ranks[0].architecture, plan.ranks[0].image) == (
        "8.9", "ada-lovelace", "registry.example/train:ada-sm89")


# --- 09 --------------------------------------------------------------------------------------

def test_09_time_sliced_a10g_counts_one_physical_gpu() -> None:
    inv = build_inventory(case_nodes("09"))
    assert [(d.node, d.product, d.architecture, d.compute_capability, d.memory_mib, d.total,
             d.time_sliced_replicas) for d in inv.devices()] == [
        ("node-a", "NVIDIA-A10G", "ampere", "8.6", 23028, 1, 4),
        ("node-b", "NVIDIA-A10G", "ampere", "8.6", 23028, 1, 1)]


def test_09_two_ranks_go_one_per_node_and_three_are_unschedulable() -> None:
    """Case 09 calls the pending reason ``NoGpuCapacity``; ours is ``InsufficientGPUs``."""
    plan = planned(make_job(ranks=2, global_batch=32), case_nodes("09"))
    assert [(r.node, r.local_batch) for r in plan.ranks] == [("node-a", 16), ("node-b", 16)]
    three = plan_job(make_job(ranks=3, global_batch=32), build_inventory(case_nodes("09")))
    assert isinstance(three, model.Unschedulable)
    assert (three.reason, three.message) == (
        "InsufficientGPUs", "NVIDIA-A10G: need 3, free 2 (node-a: 1 free, node-b: 1 free). To plan: "
        "set spec.gpus.minRanks to 2 or less (it defaults to spec.gpus.ranks); or add 1 more "
        "NVIDIA-A10G GPU (a node, or free used ones)")


# --- 11 --------------------------------------------------------------------------------------

def _cuda_catalog(versions: dict[str, str]) -> list[dict[str, Any]]:
    """Case 11's ``cudaVariants`` as our image entries, with kernels for all three nodes' GPUs."""
    return [{"image": f"registry.example/train:{tag}", "cudaVersion": v,
             "computeCapabilities": ["7.0", "8.0", "8.6"]} for v, tag in versions.items()]


def test_11_image_per_node_driver_and_a_warning_for_the_overstated_label() -> None:
    job = make_job(ranks=3, global_batch=48, images=_cuda_catalog(
        {"11.3": "cu113", "12.1": "cu121", "12.4": "cu124", "12.8": "cu128"}))
    inv = build_inventory(case_nodes("11"))
    assert [(n.name, n.driver_version, n.max_cuda) for n in inv.nodes] == [
        ("node-a", "470.129.06", (11, 4)), ("node-b", "550.144.03", (12, 4)),
        ("node-c", "580.126.20", (13, 0))]
    plan = planned(job, case_nodes("11"))
    assert {r.node: r.image.split(":")[1] for r in plan.ranks} == {
        "node-a": "cu113", "node-b": "cu124", "node-c": "cu128"}
    assert [(w.node, w.reason) for w in plan.warnings] == [("node-a", "CudaLabelExceedsDriver")]


def test_11_no_fitting_variant_excludes_node_a_naming_the_driver() -> None:
    """Case 11 names the reason ``NoCompatibleCudaImage``; ours is ``NoCompatibleImage``."""
    job = make_job(ranks=3, min_ranks=2, global_batch=48,
                   images=_cuda_catalog({"12.1": "cu121", "12.4": "cu124"}))
    plan = planned(job, case_nodes("11"))
    assert sorted(r.node for r in plan.ranks) == ["node-b", "node-c"]
    assert [(e.node, e.reason) for e in plan.excluded] == [("node-a", "NoCompatibleImage")]
    assert plan.excluded[0].message.startswith("driver 470.129.06 supports CUDA <= 11.4; ")


# --- 12 --------------------------------------------------------------------------------------

def test_12_geforce_groups_get_p2p_disabled_and_datacenter_groups_do_not() -> None:
    job = make_job(ranks=4, global_batch=32)
    plan = planned(job, case_nodes("12"))
    assert [(g.node, g.product, g.compute_capability, g.gpu_count, dict(g.extra_env)) for g in plan.groups] == [
        ("node-a", "NVIDIA-GeForce-RTX-4090", "8.9", 2, {"NCCL_P2P_DISABLE": "1"}),
        ("node-b", "NVIDIA-GeForce-RTX-3080", "8.6", 2, {"NCCL_P2P_DISABLE": "1"})]
    assert {e["NCCL_P2P_DISABLE"] for e in envs(plan, job)} == {"1"}
    h100_job = make_job(ranks=8, global_batch=64)
    assert all("NCCL_P2P_DISABLE" not in e for e in envs(planned(h100_job, case_nodes("05")), h100_job))


def test_12_a_single_geforce_gpu_needs_no_p2p_setting() -> None:
    plan = planned(make_job(ranks=1, global_batch=8, gpus={"allowedProducts": ["NVIDIA-GeForce-RTX-4090"]}),
                   case_nodes("12"))
    assert plan.groups[0].extra_env == {}


# --- 13 --------------------------------------------------------------------------------------

def test_13_one_mig_device_per_rank_and_pod_with_p2p_disabled() -> None:
    """Case 13's ``gpusPerRank: 2`` does not exist in our CRD: every rank uses exactly one device,
    and a MIG device is always a group (pod) of its own."""
    job = make_job(ranks=4, global_batch=64, gpus={"allowMig": True})
    plan = planned(job, case_nodes("13"))
    assert [(g.resource_name, g.gpu_count, g.local_batches) for g in plan.groups] == [
        ("nvidia.com/mig-3g.40gb", 1, (16,))] * 4
    rendered = envs(plan, job)
    assert [(e["LOCAL_WORLD_SIZE"], e["NCCL_P2P_DISABLE"]) for e in rendered] == [("1", "1")] * 4


# --- 15 --------------------------------------------------------------------------------------

def _case15_nodes() -> list[dict[str, Any]]:
    from builders import make_node
    return [make_node("gpu-16gb", product="Example-GPU-16GB", memory_mib=16384, cc="8.6", driver=None,
                      runtime=None),
            make_node("gpu-8gb", product="Example-GPU-8GB", memory_mib=8192, cc="8.6", driver=None,
                      runtime=None)]


def _case15_job(per_sample_mib: int) -> Any:
    return make_job(ranks=2, global_batch=18, gpus={"speedOverrides": [
        {"device": "Example-GPU-16GB", "relativeSpeedPercent": 100},
        {"device": "Example-GPU-8GB", "relativeSpeedPercent": 100}]},
        training={"memoryPerSampleMiB": per_sample_mib, "memoryReserveMiB": 1024})


def test_15_memory_caps_give_12_and_6() -> None:
    """Case 15 splits by memory; ours splits by speed and caps by memory.  With equal speeds the
    8 GiB card's cap (8192 - 1024) // 1100 = 6 binds and the rest goes to the 16 GiB card: [12, 6]."""
    plan = planned(_case15_job(1100), _case15_nodes())
    assert [(r.node, r.local_batch) for r in plan.ranks] == [("gpu-16gb", 12), ("gpu-8gb", 6)]


def test_15_caps_below_the_global_batch_are_unschedulable_not_silently_shrunk() -> None:
    """Case 15 allows gradient accumulation or a smaller global batch, stated in status; we keep the
    global batch exact, so caps 11 + 5 = 16 < 18 is ``InsufficientMemory`` with the numbers."""
    result = plan_job(_case15_job(1300), build_inventory(_case15_nodes()))
    assert isinstance(result, model.Unschedulable)
    assert result.reason == "InsufficientMemory"
    assert "globalBatchSize 18 exceeds what the chosen 2 devices hold" in result.message
    assert "(16 samples)" in result.message


@pytest.mark.parametrize("prefix", ["01", "03", "05", "08", "09", "11", "12", "13", "15"])
def test_every_node_case_is_copied_into_the_project(prefix: str) -> None:
    assert len(list(CASES.glob(f"{prefix}-*.yaml"))) == 1
    assert len(list(CASES.glob(f"{prefix}-*.md"))) == 1
