"""Inventory from realistic Node fixtures: exact devices, resource names, chosen image, reasons."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from builders import CATALOG_118_124_128, make_job, make_node, make_pod
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_operator.api import types as model
from hetero_operator.cluster import gfd
from hetero_operator.cluster.inventory import build_inventory, used_resources
from hetero_operator.planning.images import choose_image
from hetero_operator.planning.plan import plan_job

NODES = Path(__file__).resolve().parent.parent / "fixtures" / "nodes"
A100_80 = "NVIDIA-A100-SXM4-80GB"


def load(name: str) -> list[dict]:
    return yaml.safe_load((NODES / f"{name}.yaml").read_text())["items"]


def devices(inv: model.Inventory) -> list[tuple]:
    """(node, product, mig_profile, cc, arch, memory_mib, resource, total, free, replicas)."""
    return [(d.node, d.product, d.mig_profile, d.compute_capability, d.architecture, d.memory_mib,
             d.resource_name, d.total, d.free, d.time_sliced_replicas) for d in inv.devices()]


FIXTURES = [
    ("a100-whole", [("dgx-a100-0", A100_80, "", "8.0", "ampere", 81920, "nvidia.com/gpu", 8, 8, 1)],
     (12, 4), "reg/train:cu124"),
    ("a100-mig-mixed", [
        ("a100-mig-0", A100_80, "1g.10gb", "8.0", "ampere", 9728, "nvidia.com/mig-1g.10gb", 4, 4, 1),
        ("a100-mig-0", A100_80, "2g.20gb", "8.0", "ampere", 19968, "nvidia.com/mig-2g.20gb", 2, 2, 1),
        ("a100-mig-0", A100_80, "3g.40gb", "8.0", "ampere", 40192, "nvidia.com/mig-3g.40gb", 2, 2, 1)],
     (12, 2), "reg/train:cu118"),
    ("a100-mig-single", [("a100-single-0", "NVIDIA-A100-PCIE-40GB", "2g.10gb", "8.0", "ampere", 9728,
                          "nvidia.com/gpu", 6, 6, 1)], (12, 4), "reg/train:cu124"),
    ("h100", [("h100-0", "NVIDIA-H100-80GB-HBM3", "", "9.0", "hopper", 81559, "nvidia.com/gpu", 4, 4, 1)],
     (12, 8), "reg/train:cu128"),
    ("v100", [("v100-0", "Tesla-V100-SXM2-16GB", "", "7.0", "volta", 16160, "nvidia.com/gpu", 4, 4, 1)],
     (11, 4), ""),
    ("t4", [("t4-0", "Tesla-T4", "", "7.5", "turing", 15360, "nvidia.com/gpu", 2, 2, 1)],
     (13, 0), "reg/train:cu128"),
    ("l4", [("l4-0", "NVIDIA-L4", "", "8.9", "ada-lovelace", 23034, "nvidia.com/gpu", 1, 1, 1)],
     (12, 4), "reg/train:cu124"),
    ("l40s", [("l40s-0", "NVIDIA-L40S", "", "8.9", "ada-lovelace", 46068, "nvidia.com/gpu", 4, 4, 1)],
     (12, 8), "reg/train:cu128"),
    ("a10g-time-sliced", [("a10g-shared-0", "NVIDIA-A10G", "", "8.6", "ampere", 23028, "nvidia.com/gpu",
                           1, 1, 4)], (12, 4), "reg/train:cu124"),
    ("deprecated-only", [("v100s-old-0", "Tesla-V100S-PCIE-32GB", "", "7.0", "volta", 32768,
                          "nvidia.com/gpu", 2, 2, 1)], (12, 2), "reg/train:cu118"),
    ("wrong-family", [("l40s-old-0", "NVIDIA-L40S", "", "8.9", "ada-lovelace", 46068, "nvidia.com/gpu",
                       2, 2, 1)], (12, 4), "reg/train:cu124"),
]


@pytest.mark.parametrize(
    ("fixture", "expected", "max_cuda", "image"), FIXTURES,
    ids=["8 whole A100s are one class of 8", "A100 MIG mixed lists every profile's resource",
         "A100 MIG single is 2g.10gb slices behind nvidia.com/gpu", "H100 is hopper cc 9.0",
         "V100 on driver 470 gets no image from cu118+", "T4 on driver 580 takes cu128",
         "L4 is ada-lovelace", "L40S is ada-lovelace", "time-sliced A10G counts 1 physical GPU",
         "deprecated-only labels are read", "a wrong family label is overridden by cc"])
def test_fixture_devices_cuda_and_image(fixture: str, expected: list[tuple], max_cuda: tuple,
                                        image: str) -> None:
    inv = build_inventory(load(fixture))
    assert devices(inv) == expected
    assert inv.excluded == ()
    assert inv.nodes[0].max_cuda == max_cuda
    choice = choose_image(tuple(make_job(images=CATALOG_118_124_128).images),
                          compute_capability=expected[0][3], max_cuda=max_cuda,
                          driver_version=inv.nodes[0].driver_version)
    assert choice.image == image


def test_v100_on_470_is_excluded_for_the_job_naming_the_driver() -> None:
    plan = plan_job(make_job(ranks=1, images=CATALOG_118_124_128), build_inventory(load("v100")))
    assert isinstance(plan, model.Unschedulable)
    (excluded,) = plan.excluded
    assert (excluded.node, excluded.reason) == ("v100-0", "NoCompatibleImage")
    assert "driver 470.239.06 supports CUDA <= 11.4" in excluded.message
    assert plan.message.startswith("Tesla-V100-SXM2-16GB: need 1, free 0 (v100-0: no compatible "
                                   "image). To plan: add 1 more Tesla-V100-SXM2-16GB GPU (a node, or "
                                   "free used ones); or add a spec.images variant that fits v100-0 "
                                   "(driver 470.239.06 supports CUDA <= 11.4;")


def test_missing_product_label_is_classified_from_compute_capability_and_memory() -> None:
    """cc 7.5 and 15360 MiB: everything needed to plan is labelled; only T4 matches for speed."""
    inv = build_inventory(load("missing-product"))
    assert inv.excluded == ()
    assert devices(inv) == [("noproduct-0", "unlabelled-cc7.5-15360MiB", "", "7.5", "turing", 15360,
                             "nvidia.com/gpu", 2, 2, 1)]
    assert inv.devices()[0].relative_speed == pytest.approx(65 / 312)
    (warning,) = inv.warnings
    assert (warning.node, warning.reason) == ("noproduct-0", "GpuProductLabelMissing")
    assert "classified from compute capability 7.5 (turing) and nvidia.com/gpu.memory=15360 MiB" in (
        warning.message)
    assert "speed of the T4" in warning.message


def test_missing_product_without_a_table_match_uses_the_architecture_speed() -> None:
    inv = build_inventory([make_node(product=None, cc="8.6", memory_mib=12000)])
    assert devices(inv)[0][1:6] == ("unlabelled-cc8.6-12000MiB", "", "8.6", "ampere", 12000)
    assert [w.reason for w in inv.warnings] == ["GpuProductLabelMissing", "UnknownGpuSpeed"]


def test_missing_product_and_compute_capability_is_still_malformed() -> None:
    inv = build_inventory([make_node(product=None, cc=None)])
    assert [(e.node, e.reason) for e in inv.excluded] == [("node-a", "MalformedLabels")]
    assert "nvidia.com/gpu.product is missing too" in inv.excluded[0].message


def test_wrong_family_label_produces_exactly_one_warning() -> None:
    inv = build_inventory(load("wrong-family"))
    assert [(w.node, w.reason, w.message.split(";")[0]) for w in inv.warnings] == [
        ("l40s-old-0", "GpuFamilyLabelMismatch", "l40s-old-0 says ampere, cc 8.9 => ada-lovelace")]


def test_deprecated_driver_text_is_assembled_from_parts() -> None:
    node = build_inventory(load("deprecated-only")).nodes[0]
    assert (node.driver_version, node.driver_cuda) == ("535.104.05", (12, 2))


HEALTH = [
    (dict(unschedulable=True), "Unschedulable", "cordoned"),
    (dict(ready=False), "NotReady", "KubeletNotReady"),
    (dict(taints=[{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]), "Tainted",
     "dedicated=infer:NoSchedule"),
    (dict(taints=[{"key": "spot", "effect": "NoExecute"}]), "Tainted", "spot:NoExecute"),
    (dict(mig_state="pending"), "MigReconfigurationPending", "pending"),
    (dict(mig_state="rebooting"), "MigReconfigurationPending", "rebooting"),
    (dict(mig_state="failed"), "MigReconfigurationFailed", "failed"),
    (dict(product="NVIDIA-A100-SXM4-40GB-MIG-INVALID", count=0, whole_allocatable=0),
     "MigReconfigurationFailed", "invalid MIG layout"),
    (dict(labels={"nvidia.com/gpu.memory": "lots"}), "MalformedLabels", "nvidia.com/gpu.memory"),
    (dict(labels={"nvidia.com/gpu.compute.major": "eight"}), "MalformedLabels", "gpu.compute.major"),
    (dict(labels={"nvidia.com/cuda.driver-version.full": "550.x"}), "MalformedLabels", "550.x"),
    (dict(allocatable={"nvidia.com/gpu": "two"}), "MalformedLabels", "status.allocatable"),
    (dict(whole_allocatable=0), "NoGPUs", "no allocatable"),
]


@pytest.mark.parametrize(("kwargs", "reason", "fragment"), HEALTH, ids=[
    "cordoned node", "NotReady node", "NoSchedule taint", "NoExecute taint", "MIG pending",
    "MIG rebooting", "MIG failed", "MIG-INVALID product", "non-numeric memory", "non-numeric cc",
    "non-numeric driver", "non-numeric allocatable", "no allocatable GPUs"])
def test_excluded_nodes_carry_camelcase_reasons(kwargs: dict, reason: str, fragment: str) -> None:
    inv = build_inventory([make_node("node-x", **kwargs)])
    assert inv.nodes == ()
    assert [(e.node, e.reason) for e in inv.excluded] == [("node-x", reason)]
    assert fragment in inv.excluded[0].message


def test_tolerated_and_soft_taints_do_not_exclude() -> None:
    node = make_node(taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                             {"key": "busy", "effect": "PreferNoSchedule"}])
    assert [n.name for n in build_inventory([node]).nodes] == ["node-a"]


def test_cpu_node_is_no_gpus() -> None:
    cpu = {"metadata": {"name": "cpu-0", "labels": {"kubernetes.io/os": "linux"}},
           "status": {"allocatable": {"cpu": "8"}}}
    assert [(e.node, e.reason) for e in build_inventory([cpu]).excluded] == [("cpu-0", "NoGPUs")]


def test_bound_pods_reduce_free_and_finished_pods_do_not() -> None:
    nodes = [make_node("a", count=4), make_node("m", mig_mixed={"1g.10gb": (7, 9728)},
                                                  product=A100_80, memory_mib=81920)]
    pods = [make_pod("a", {"nvidia.com/gpu": 3}), make_pod("a", {"nvidia.com/gpu": 1}, phase="Succeeded"),
            make_pod("m", {"nvidia.com/mig-1g.10gb": 2}), make_pod("m", {"nvidia.com/mig-1g.10gb": 9},
                                                                    phase="Failed")]
    inv = build_inventory(nodes, pods)
    assert [(d.node, d.resource_name, d.total, d.free) for d in inv.devices()] == [
        ("a", "nvidia.com/gpu", 4, 1), ("m", "nvidia.com/mig-1g.10gb", 7, 5)]


def test_used_resources_takes_the_larger_of_init_and_main_containers() -> None:
    pod = make_pod("n", {"nvidia.com/gpu": 1})
    pod["spec"]["containers"].append({"name": "b", "resources": {"requests": {"nvidia.com/gpu": "1"}}})
    pod["spec"]["initContainers"] = [{"name": "i", "resources": {"limits": {"nvidia.com/gpu": "3"}}}]
    assert used_resources([pod, {"spec": {}}]) == {"n": {"nvidia.com/gpu": 3}}


def test_time_sliced_free_is_capped_by_free_replicas() -> None:
    node = make_node("s", product="NVIDIA-A10G", count=2, memory_mib=23028, cc="8.6", replicas=4)
    busy = build_inventory([node], [make_pod("s", {"nvidia.com/gpu": 7})]).devices()[0]
    assert (busy.total, busy.free, busy.time_sliced_replicas) == (2, 1, 4)


def test_cuda_label_exceeding_the_driver_is_capped_with_a_warning() -> None:
    inv = build_inventory([make_node(driver="470.129.06", runtime="11.7")])
    assert inv.nodes[0].max_cuda == (11, 4)
    assert [w.reason for w in inv.warnings] == ["CudaLabelExceedsDriver"]


def test_no_cuda_labels_means_unknown_with_a_warning() -> None:
    inv = build_inventory([make_node(driver=None, runtime=None)])
    assert (inv.nodes[0].max_cuda, inv.nodes[0].driver_version) == (None, "")
    assert [w.reason for w in inv.warnings] == ["CudaVersionUnknown"]


def test_missing_cc_falls_back_to_product_table_then_family() -> None:
    by_table = build_inventory([make_node(product="NVIDIA-L40S", cc=None, family="ampere")])
    assert by_table.devices()[0].compute_capability == "8.9"
    assert by_table.warnings[0].reason == "GpuFamilyLabelMismatch"
    by_family = build_inventory([make_node(product="NVIDIA-Mystery-GPU", cc=None, family="hopper")])
    assert (by_family.devices()[0].compute_capability, by_family.devices()[0].architecture) == (
        "9.0", "hopper")
    assert [w.reason for w in by_family.warnings] == ["UnknownGpuSpeed"]
    neither = build_inventory([make_node(product="NVIDIA-Mystery-GPU", cc=None)])
    assert neither.excluded[0].reason == "MalformedLabels"


def test_missing_memory_label_falls_back_to_name_then_table() -> None:
    named = build_inventory([make_node(product="NVIDIA-A100-SXM4-80GB", memory_mib=None)])
    table = build_inventory([make_node(product="Tesla-T4", cc="7.5", memory_mib=None)])
    assert (named.devices()[0].memory_mib, table.devices()[0].memory_mib) == (81920, 15360)


def test_build_inventory_is_sorted_by_node_name_and_never_raises_on_garbage() -> None:
    junk = [{"metadata": {"name": "z", "labels": "not-a-map"}}, {}, make_node("b"), make_node("a")]
    inv = build_inventory(junk)
    assert [n.name for n in inv.nodes] == ["a", "b"]
    assert [(e.node, e.reason) for e in inv.excluded] == [("<unnamed>", "NoGPUs"), ("z", "NoGPUs")]


LABEL_KEYS = ["nvidia.com/gpu.product", "nvidia.com/gpu.count", "nvidia.com/gpu.memory", "nvidia.com/gpu.family",
              "nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor", "nvidia.com/gpu.replicas",
              "nvidia.com/gpu.sharing-strategy", "nvidia.com/mig.strategy", "nvidia.com/mig.config.state",
              "nvidia.com/cuda.driver-version.full", "nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor",
              "nvidia.com/cuda.runtime-version.full", "nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor",
              "nvidia.com/mig-1g.5gb.count", "nvidia.com/mig-1g.5gb.memory", "nvidia.com/mig-zz.count"]
VALUES = st.one_of(st.sampled_from(["", "8", "0", "-1", "1.5", "12.4", "550.54.15", "x", "NVIDIA-A100-SXM4-40GB",
                                    "Tesla-T4-SHARED", "NVIDIA-A100-MIG-1g.5gb", "A100-MIG-INVALID", "A100-MIG-bogus",
                                    "pending", "none", "ampere"]),
                   st.text(max_size=8), st.integers(-3, 100), st.none())


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(LABEL_KEYS), VALUES, max_size=12),
       st.dictionaries(st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.5gb", "nvidia.com/mig-bad"]),
                       st.one_of(st.sampled_from(["0", "1", "7", "x", "-2"]), st.integers(0, 9)), max_size=3))
def test_garbage_labels_never_raise(labels: dict, allocatable: dict) -> None:
    node = {"metadata": {"name": "fuzz", "labels": labels}, "status": {"allocatable": allocatable}}
    inv = build_inventory([node])
    assert len(inv.nodes) + len(inv.excluded) == 1
    for d in inv.devices():
        assert 0 <= d.free <= d.total and d.memory_mib > 0 and d.relative_speed > 0


def test_single_strategy_slice_without_the_mig_suffix_is_read_from_mig_config() -> None:
    """Case 03's detection rule: ``mig.strategy=single`` and ``gpu.memory`` far below nominal."""
    labels = {"nvidia.com/mig.strategy": "single", "nvidia.com/mig.config": "all-1g.5gb"}
    node = make_node(product="NVIDIA-A100-PCIE-40GB", count=7, memory_mib=4864, labels=labels)
    (dev,) = build_inventory([node]).devices()
    assert (dev.mig_profile, dev.memory_mib, dev.resource_name, dev.total, dev.compute_slices) == (
        "1g.5gb", 4864, "nvidia.com/gpu", 7, 1)
    unknown = make_node(product="NVIDIA-A100-PCIE-40GB", count=7, memory_mib=4864,
                        labels={"nvidia.com/mig.strategy": "single"})
    assert build_inventory([unknown]).excluded[0].reason == "MalformedLabels"
    whole = make_node(product="NVIDIA-A100-PCIE-40GB", memory_mib=40536, labels=labels)
    assert build_inventory([whole]).devices()[0].mig_profile == ""


# --- labels and resources that disagree (issue 10) ----------------------------------------------

A100_40 = "NVIDIA-A100-PCIE-40GB"


def test_stale_whole_gpus_next_to_mig_slices_are_not_offered() -> None:
    """Both GPUs carved into 3g.40gb x2, allocatable still says nvidia.com/gpu: 2 (issue 10)."""
    node = make_node(product=A100_80, count=2, memory_mib=81920,
                     mig_mixed={"3g.40gb": (4, 40192)}, whole_allocatable=2)
    inv = build_inventory([node])
    assert [(d.resource_name, d.total, d.free) for d in inv.devices()] == [("nvidia.com/mig-3g.40gb", 4, 4)]
    (warning,) = inv.warnings
    assert warning.reason == "GpuOfferedTwice"
    assert "offers 2 whole nvidia.com/gpu" in warning.message
    assert "occupy at least 2 of the 2 GPUs" in warning.message


def test_a_partly_carved_node_offers_whole_gpus_only_when_allocatable_is_consistent() -> None:
    """4 GPUs, one of them carved (7 x 1g.10gb). Allocatable saying 3 whole is consistent and
    trusted; saying 4 it is stale, and since the slices could sit on more GPUs than the fewest
    they fit (a layout may leave compute slices idle), none is offered whole."""
    consistent = make_node(product=A100_80, count=4, memory_mib=81920,
                           mig_mixed={"1g.10gb": (7, 9728)}, whole_allocatable=3)
    inv = build_inventory([consistent], [make_pod("node-a", {"nvidia.com/gpu": 1})])
    assert [(d.resource_name, d.total, d.free) for d in inv.devices()] == [
        ("nvidia.com/gpu", 3, 2), ("nvidia.com/mig-1g.10gb", 7, 7)]
    assert inv.warnings == ()
    stale = make_node(product=A100_80, count=4, memory_mib=81920,
                      mig_mixed={"1g.10gb": (7, 9728)}, whole_allocatable=4)
    inv = build_inventory([stale])
    assert [(d.resource_name, d.total) for d in inv.devices()] == [("nvidia.com/mig-1g.10gb", 7)]
    (warning,) = inv.warnings
    assert warning.reason == "GpuOfferedTwice" and "offering none" in warning.message


def test_slices_that_leave_compute_idle_do_not_free_a_whole_gpu() -> None:
    """The property test's counterexample: 7 GPUs each carved 3 x 2g.20gb (6 of 7 compute slices
    used) with allocatable still saying 7 whole. 42 compute slices would fit 6 GPUs, but all 7
    are carved: no whole GPU exists, and none may be offered."""
    node = make_node(product=A100_80, count=7, memory_mib=81920,
                     mig_mixed={"2g.20gb": (21, 19968)}, whole_allocatable=7)
    inv = build_inventory([node])
    assert [(d.resource_name, d.total) for d in inv.devices()] == [("nvidia.com/mig-2g.20gb", 21)]
    assert [w.reason for w in inv.warnings] == ["GpuOfferedTwice"]


def test_whole_gpus_next_to_slices_without_a_gpu_count_are_not_offered() -> None:
    node = make_node(product=A100_80, memory_mib=81920, mig_mixed={"1g.10gb": (7, 9728)},
                     whole_allocatable=1)
    del node["metadata"]["labels"]["nvidia.com/gpu.count"]
    inv = build_inventory([node])
    assert [d.resource_name for d in inv.devices()] == ["nvidia.com/mig-1g.10gb"]
    assert "nvidia.com/gpu.count is missing" in inv.warnings[0].message


def test_slices_needing_more_gpus_than_gpu_count_warn() -> None:
    node = make_node(product=A100_80, count=1, memory_mib=81920, mig_mixed={"3g.40gb": (4, 40192)})
    inv = build_inventory([node])
    assert [(d.resource_name, d.total) for d in inv.devices()] == [("nvidia.com/mig-3g.40gb", 4)]
    assert [w.reason for w in inv.warnings] == ["GpuCountMismatch"]


def test_mig_resource_and_labels_are_joined_by_slices_not_the_memory_string() -> None:
    """``3g.20gb`` resource next to ``3g.21gb`` labels: request the resource, read the labels."""
    node = make_node(product=A100_40, count=1, memory_mib=40536, whole_allocatable=0,
                     labels={"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-3g.21gb.count": "2",
                             "nvidia.com/mig-3g.21gb.memory": "20096",
                             "nvidia.com/mig-3g.21gb.multiprocessors": "42"},
                     allocatable={"nvidia.com/mig-3g.20gb": "2"})
    inv = build_inventory([node])
    (dev,) = inv.devices()
    assert (dev.mig_profile, dev.resource_name, dev.memory_mib, dev.multiprocessors, dev.total,
            dev.compute_slices) == ("3g.20gb", "nvidia.com/mig-3g.20gb", 20096, 42, 2, 3)
    assert [w.reason for w in inv.warnings] == ["MigProfileNameMismatch"]
    plan = plan_job(make_job(ranks=2), inv)
    assert {g.resource_name for g in plan.groups} == {"nvidia.com/mig-3g.20gb"}
    assert {r.memory_mib for r in plan.ranks} == {20096}


def test_join_prefers_exact_names_then_the_nearest_memory_of_the_same_slices() -> None:
    pairs, unmatched = gfd.join_mig_profiles(["1g.10gb", "1g.20gb", "7g.80gb"],
                                             ["1g.11gb", "1g.20gb", "2g.20gb", "zz"])
    assert pairs == {"1g.10gb": "1g.11gb", "1g.20gb": "1g.20gb", "7g.80gb": None}
    assert unmatched == ("2g.20gb", "zz")
    assert gfd.profile_identity("1c.3g.20gb") == gfd.ProfileIdentity(1, 3, False)
    assert gfd.profile_identity("1g.10gb+me") == gfd.ProfileIdentity(1, 1, True)
    with pytest.raises(gfd.LabelError):
        gfd.join_mig_profiles(["bogus"], [])


def test_label_families_nothing_matches_warn_and_are_not_offered() -> None:
    node = make_node(product=A100_40, count=1, memory_mib=40536, whole_allocatable=0,
                     mig_mixed={"1g.5gb": (2, 4864)},
                     labels={"nvidia.com/mig-2g.10gb.count": "2", "nvidia.com/mig-2g.10gb.memory": "9728"})
    inv = build_inventory([node])
    assert [d.resource_name for d in inv.devices()] == ["nvidia.com/mig-1g.5gb"]
    (warning,) = inv.warnings
    assert warning.reason == "MigLabelsUnmatched"
    assert "nvidia.com/mig-2g.10gb.* count 2 devices" in warning.message


def test_mig_resource_without_labels_takes_memory_from_its_name_with_a_warning() -> None:
    node = make_node(product=A100_40, count=1, memory_mib=40536, whole_allocatable=0,
                     allocatable={"nvidia.com/mig-2g.10gb": "3"})
    inv = build_inventory([node])
    assert [(d.resource_name, d.memory_mib, d.multiprocessors) for d in inv.devices()] == [
        ("nvidia.com/mig-2g.10gb", 10240, 0)]
    assert [w.reason for w in inv.warnings] == ["MigLabelsMissing"]


def test_paused_for_mig_change_means_mid_reconfiguration() -> None:
    node = make_node(labels={"nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change",
                             "nvidia.com/gpu.deploy.dcgm-exporter": "paused-for-mig-change",
                             "nvidia.com/gpu.deploy.mig-manager": "true",
                             "nvidia.com/mig.config": "all-3g.40gb"})
    inv = build_inventory([node])
    assert [(e.node, e.reason) for e in inv.excluded] == [("node-a", "MigReconfigurationPending")]
    assert inv.excluded[0].message == (
        "MIG reconfiguration to all-3g.40gb is in progress: the MIG manager paused "
        "nvidia.com/gpu.deploy.dcgm-exporter, nvidia.com/gpu.deploy.device-plugin "
        "(paused-for-mig-change); wait until it restores them")


# A100-80GB MIG layouts of one GPU (NVIDIA MIG user guide, A100 80GB profiles): each sums to <= 7
# compute slices.
LAYOUTS = [{"1g.10gb": 7}, {"2g.20gb": 3}, {"3g.40gb": 2}, {"7g.80gb": 1}, {"4g.40gb": 1, "3g.40gb": 1},
           {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}]
MEMORY = {"1g.10gb": 9728, "2g.20gb": 19968, "3g.40gb": 40192, "4g.40gb": 40192, "7g.80gb": 80896}


@st.composite
def faulty_nodes(draw: st.DrawFn) -> tuple[list[dict], dict[str, dict[str, int]]]:
    """Nodes whose true layout is known, rendered with the label faults of issue 10.

    Returns:
        ``(nodes, truth)``; truth is ``{node: {resource: devices that exist}}``.
    """
    nodes, truth = [], {}
    for i in range(draw(st.integers(1, 4))):
        name = f"n{i}"
        gpus = draw(st.integers(1, 8))
        carved = [draw(st.sampled_from(LAYOUTS)) for _ in range(draw(st.integers(0, gpus)))]
        slices: dict[str, int] = {}
        for layout in carved:
            for profile, n in layout.items():
                slices[profile] = slices.get(profile, 0) + n
        truth[name] = {"nvidia.com/gpu": gpus - len(carved),
                       **{f"nvidia.com/mig-{p}": n for p, n in slices.items()}}
        stale_whole = draw(st.booleans())     # allocatable still advertises every GPU whole
        drift = draw(st.booleans())           # GFD spells the memory 1 GB higher than the resource
        labels = {"nvidia.com/mig.strategy": "mixed"} if slices else {}
        for profile, n in slices.items():
            ci, mem = profile.split("g.")
            family = f"{ci}g.{int(mem[:-2]) + 1}gb" if drift else profile
            labels.update({f"nvidia.com/mig-{family}.count": str(n),
                           f"nvidia.com/mig-{family}.memory": str(MEMORY[profile])})
        node = make_node(name, product=A100_80, count=gpus, memory_mib=81920, labels=labels,
                         whole_allocatable=gpus if stale_whole else gpus - len(carved),
                         allocatable={f"nvidia.com/mig-{p}": str(n) for p, n in slices.items()})
        if draw(st.booleans()):
            del node["metadata"]["labels"]["nvidia.com/gpu.product"]
        nodes.append(node)
    return nodes, truth


@settings(max_examples=200, deadline=None)
@given(faulty_nodes(), st.integers(1, 80))
def test_no_plan_requests_a_device_that_does_not_exist(cluster: tuple, ranks: int) -> None:
    nodes, truth = cluster
    inv = build_inventory(nodes)
    for d in inv.devices():
        assert d.total <= truth[d.node].get(d.resource_name, 0), d
    plan = plan_job(make_job(ranks=ranks, min_ranks=1, global_batch=4 * ranks,
                             gpus={"selection": "All"}), inv)
    if isinstance(plan, model.Unschedulable):
        assert not any(d.free for d in inv.devices())
        return
    requested: dict[tuple[str, str], int] = {}
    for g in plan.groups:
        key = (g.node, g.resource_name)
        requested[key] = requested.get(key, 0) + g.gpu_count
    for (node, resource), n in requested.items():
        assert n <= truth[node].get(resource, 0), (node, resource, n, truth[node])
    # every device that exists is found (the plan takes min(ranks, all devices)), except whole GPUs
    # next to slices while allocatable still counts the carved ones: how many GPUs the slices
    # occupy is then unknown (3 x 2g.20gb leave a compute slice idle), so none is offered whole
    def offered(node: dict) -> int:
        t = truth[node["metadata"]["name"]]
        stale = int(node["status"]["allocatable"].get("nvidia.com/gpu", 0)) > t["nvidia.com/gpu"]
        return sum(t.values()) - (t["nvidia.com/gpu"] if stale else 0)
    assert plan.world_size == min(ranks, sum(offered(n) for n in nodes))
