"""Planner policy: selection, groups, filters, precision, all-or-nothing, messages, determinism."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from builders import make_job, make_node, make_pod
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_operator.api import types as model
from hetero_operator.api.errors import SpecError
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.eligibility import precision_for
from hetero_operator.planning.plan import plan_job
from hetero_operator.planning.pools import is_consumer_gpu

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"


def t4(name: str, count: int, **kw) -> dict:
    return make_node(name, product="Tesla-T4", count=count, memory_mib=15360, cc="7.5", **kw)


def plan(job, nodes, pods=()) -> model.Plan:
    result = plan_job(job, build_inventory(nodes, pods))
    assert isinstance(result, model.Plan), getattr(result, "message", result)
    return result


def test_strongest_devices_first() -> None:
    nodes = [t4("t4", 4), make_node("a100", product=A100, count=8, memory_mib=81920),
             make_node("h100", product=H100, count=4, memory_mib=81559, cc="9.0")]
    p = plan(make_job(ranks=6, global_batch=120), nodes)
    assert [(g.node, g.gpu_count) for g in p.groups] == [("h100", 4), ("a100", 2)]


def test_fewest_nodes_best_fit_for_the_last_partial_need() -> None:
    nodes = [t4("t4-a", 4), t4("t4-b", 2), t4("t4-c", 2), t4("t4-d", 1)]
    assert plan(make_job(ranks=2), nodes).nodes == ("t4-b",)
    assert plan(make_job(ranks=5), nodes).nodes == ("t4-a", "t4-d")
    assert plan(make_job(ranks=6), nodes).nodes == ("t4-a", "t4-b")
    assert plan(make_job(ranks=4), nodes).nodes == ("t4-a",)


def test_a_weaker_tier_prefers_nodes_the_plan_already_uses() -> None:
    mixed = make_node("mix", product=A100, count=2, memory_mib=81920, whole_allocatable=1,
                      mig_mixed={"3g.40gb": (2, 40192)})
    other = make_node("aaa", product=A100, count=1, memory_mib=81920, mig_mixed={"3g.40gb": (2, 40192)})
    p = plan(make_job(ranks=3), [mixed, other])
    assert p.nodes == ("mix",)
    assert [(g.resource_name, g.gpu_count) for g in p.groups] == [
        ("nvidia.com/gpu", 1), ("nvidia.com/mig-3g.40gb", 1), ("nvidia.com/mig-3g.40gb", 1)]


def test_ranks_are_contiguous_per_group_and_group_rank_counts_within() -> None:
    nodes = [t4("t4", 2), make_node("a100", product=A100, count=2, memory_mib=81920)]
    p = plan(make_job(ranks=4, global_batch=64), nodes)
    assert [(r.rank, r.group, r.group_rank) for r in p.ranks] == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert [g.ranks for g in p.groups] == [(0, 1), (2, 3)]
    assert [g.local_batches for g in p.groups] == [(26, 26), (6, 6)]


def test_fewer_free_than_ranks_but_at_least_min_ranks_plans_what_fits() -> None:
    p = plan(make_job(ranks=8, min_ranks=2, global_batch=32), [t4("t4", 3)])
    assert (p.world_size, [r.local_batch for r in p.ranks]) == (3, [11, 11, 10])


def test_all_or_nothing_message_names_type_need_free_and_reasons() -> None:
    nodes = [t4("node-a", 1), t4("node-c", 2, mig_state="pending"),
             make_node("node-z", product=A100, count=1, memory_mib=81920)]
    job = make_job(ranks=2, gpus={"allowedProducts": ["Tesla-T4"]})
    result = plan_job(job, build_inventory(nodes))
    assert isinstance(result, model.Unschedulable)
    assert result.message == (
        "Tesla-T4: need 2, free 1 (node-a: 1 free, node-c: MIG reconfiguration pending). To plan: "
        "set spec.gpus.minRanks to 1 or less (it defaults to spec.gpus.ranks); or add 1 more "
        "Tesla-T4 GPU (a node, or free used ones); or allow NVIDIA-A100-SXM4-80GB in spec.gpus "
        "(NVIDIA-A100-SXM4-80GB is not in spec.gpus.allowedProducts); or wait for the MIG "
        "reconfiguration on node-c to finish")
    assert [(s.gpu_type, s.need, s.free, s.reasons) for s in result.shortfalls] == [
        ("Tesla-T4", 2, 1, ("node-a: 1 free", "node-c: MIG reconfiguration pending"))]
    assert [(e.node, e.reason) for e in result.excluded] == [
        ("node-c", "MigReconfigurationPending"), ("node-z", "DeniedBySpec")]


def test_unschedulable_over_several_types_counts_used_devices() -> None:
    nodes = [t4("t4", 2), make_node("a100", product=A100, count=2, memory_mib=81920),
             make_node("cordoned", product=A100, count=4, memory_mib=81920, unschedulable=True)]
    pods = [make_pod("a100", {"nvidia.com/gpu": 1}), make_pod("t4", {"nvidia.com/gpu": 2})]
    result = plan_job(make_job(ranks=4), build_inventory(nodes, pods))
    assert isinstance(result, model.Unschedulable)
    assert result.message == (
        f"need 4 ranks (spec.gpus.minRanks, default spec.gpus.ranks), 1 free: {A100}: free 1 "
        "(a100: 1 of 2 in use, cordoned: cordoned); Tesla-T4: free 0 (t4: 2 of 2 in use). To plan: "
        "set spec.gpus.minRanks to 1 or less (it defaults to spec.gpus.ranks); or add 3 more "
        f"{A100} or Tesla-T4 GPUs (a node, or free used ones); or uncordon cordoned (kubectl "
        "uncordon cordoned)")


def test_global_batch_below_min_ranks_is_unschedulable_and_above_ranks_caps_them() -> None:
    # parse_job refuses it as invalid (issue 33: it could never fit); the planner's own guard
    # stays for a JobSpec built otherwise
    with pytest.raises(SpecError, match=r"^spec.training.globalBatchSize: 3 is below spec.gpus.minRanks 4"):
        make_job(ranks=4, global_batch=3)
    job = make_job(ranks=4, global_batch=4)
    job = replace(job, training=replace(job.training, global_batch_size=3))
    small = plan_job(job, build_inventory([t4("t4", 4)]))
    assert isinstance(small, model.Unschedulable) and small.reason == "GlobalBatchTooSmall"
    capped = plan(make_job(ranks=4, min_ranks=2, global_batch=3), [t4("t4", 4)])
    assert [r.local_batch for r in capped.ranks] == [1, 1, 1]


@pytest.mark.parametrize(("gpus", "expected_nodes", "excluded"), [
    ({"allowedProducts": ["Tesla-T4"]}, ("t4",), [("a100", "DeniedBySpec"), ("mig", "DeniedBySpec")]),
    ({"deniedProducts": [A100]}, ("t4",), [("a100", "DeniedBySpec"), ("mig", "DeniedBySpec")]),
    ({"allowMig": False, "deniedProducts": ["Tesla-T4"]}, ("a100",), [("mig", "DeniedBySpec"), ("t4", "DeniedBySpec")]),
    ({"allowedMigProfiles": ["1g.10gb"], "deniedProducts": ["Tesla-T4"]}, ("a100",),
     [("mig", "DeniedBySpec"), ("t4", "DeniedBySpec")]),
    ({"deniedMigProfiles": ["3g.40gb"], "allowedProducts": [A100]}, ("a100",),
     [("mig", "DeniedBySpec"), ("t4", "DeniedBySpec")]),
    ({"minMemoryMiB": 20000}, ("a100", "mig"), [("t4", "InsufficientMemory")]),
], ids=["allow list", "deny list", "no MIG", "allowed MIG profile", "denied MIG profile", "min memory"])
def test_filters(gpus: dict, expected_nodes: tuple, excluded: list) -> None:
    nodes = [t4("t4", 2), make_node("a100", product=A100, count=1, memory_mib=81920),
             make_node("mig", product=A100, count=1, memory_mib=81920, mig_mixed={"3g.40gb": (2, 40192)})]
    p = plan(make_job(ranks=2, min_ranks=1, gpus=gpus), nodes)
    assert p.nodes == expected_nodes
    assert [(e.node, e.reason) for e in p.excluded] == excluded


def test_allowed_mig_profile_keeps_only_that_profile() -> None:
    node = make_node("mig", product=A100, mig_mixed={"3g.40gb": (2, 40192), "1g.10gb": (1, 9728)})
    p = plan(make_job(ranks=3, min_ranks=1, gpus={"allowedMigProfiles": ["1g.10gb"]}), [node])
    assert [r.mig_profile for r in p.ranks] == ["1g.10gb"]


@pytest.mark.parametrize(("cc", "policy", "precision"), [
    ("9.0", "Auto", "bf16"), ("8.0", "Auto", "bf16"), ("7.5", "Auto", "fp16"), ("7.0", "Auto", "fp16"),
    ("6.0", "Auto", "fp32"), ("7.5", "FP32", "fp32"), ("8.0", "FP16", "fp16")])
def test_precision_per_compute_capability(cc: str, policy: str, precision: str) -> None:
    assert precision_for(policy, cc) == precision


def test_forced_bf16_excludes_pre_ampere_devices() -> None:
    nodes = [make_node("v100", product="Tesla-V100-SXM2-16GB", memory_mib=16384, cc="7.0"),
             make_node("a100", product=A100, memory_mib=81920)]
    p = plan(make_job(ranks=2, min_ranks=1, training={"precision": "BF16"}), nodes)
    assert [(r.node, r.precision) for r in p.ranks] == [("a100", "bf16")]
    assert [(e.node, e.reason) for e in p.excluded] == [("v100", "PrecisionUnsupported")]


def test_speed_overrides_change_the_split_and_mig_scaling() -> None:
    nodes = [t4("t4", 1), make_node("a100", product=A100, memory_mib=81920)]
    even = plan(make_job(ranks=2, global_batch=40, gpus={"speedOverrides": [
        {"device": "Tesla-T4", "relativeSpeedPercent": 100}]}), nodes)
    assert [r.local_batch for r in even.ranks] == [20, 20]
    mig = make_node("mig", product=A100, mig_mixed={"1g.10gb": (1, 9728), "3g.40gb": (1, 40192)})
    scaled = plan(make_job(ranks=2, global_batch=40, gpus={"speedOverrides": [
        {"device": A100, "relativeSpeedPercent": 140}, {"device": "1g.10gb", "relativeSpeedPercent": 60}]}), [mig])
    assert [(r.mig_profile, round(r.relative_speed, 6)) for r in scaled.ranks] == [("1g.10gb", 0.6), ("3g.40gb", 0.6)]


def test_equal_split_policy_and_expected_speedup() -> None:
    nodes = [t4("t4", 2), make_node("a100", product=A100, memory_mib=81920)]
    prop = plan(make_job(ranks=3, global_batch=96), nodes)
    assert [r.local_batch for r in prop.ranks] == [68, 14, 14]
    # equal: 32 / 0.2083 = 153.6; ours: max(68 / 1, 14 / 0.2083) = 68 -> 2.258824
    assert prop.expected_speedup_over_equal == pytest.approx(153.6 / 68, rel=1e-6)
    equal = plan(make_job(ranks=3, global_batch=96, training={"batchSplit": "Equal"}), nodes)
    assert ([r.local_batch for r in equal.ranks], equal.expected_speedup_over_equal) == ([32, 32, 32], 1.0)


def test_memory_caps_hold_the_split() -> None:
    nodes = [t4("t4", 1), make_node("a100", product=A100, memory_mib=81920)]
    p = plan(make_job(ranks=2, global_batch=90, training={"memoryPerSampleMiB": 1000}), nodes)
    assert [r.local_batch for r in p.ranks] == [76, 14]  # T4 cap (15360 - 1024) // 1000 = 14 binds
    assert all(r.local_batch * 1000 <= r.memory_mib - 1024 for r in p.ranks)


def test_consumer_gpu_detection() -> None:
    assert [is_consumer_gpu(p) for p in ("NVIDIA-GeForce-RTX-4090", "NVIDIA-RTX-3080", "NVIDIA-RTX-A6000",
                                        "Tesla-T4", "NVIDIA-TITAN-RTX")] == [True, True, False, False, True]


def test_plan_is_deterministic_under_node_order() -> None:
    nodes = [t4(f"t4-{i}", 1 + i % 3) for i in range(12)] + [
        make_node(f"a-{i}", product=A100, count=2, memory_mib=81920) for i in range(3)]
    job = make_job(ranks=13, global_batch=500)
    first = plan(job, nodes)
    shuffled = nodes[:]
    random.Random(7).shuffle(shuffled)
    assert plan(job, shuffled) == first


# --- property test over random inventories ---------------------------------------------------

PRODUCTS = [(A100, "8.0", 81920), (H100, "9.0", 81559), ("Tesla-T4", "7.5", 15360),
            ("Tesla-V100-SXM2-16GB", "7.0", 16384), ("NVIDIA-L4", "8.9", 23034)]


@st.composite
def clusters(draw: st.DrawFn) -> list[dict]:
    nodes = []
    for i in range(draw(st.integers(1, 12))):
        product, cc, mem = draw(st.sampled_from(PRODUCTS))
        if product == A100 and draw(st.booleans()):
            nodes.append(make_node(f"n{i:02d}", product=product, cc=cc, memory_mib=mem, mig_mixed={
                "1g.10gb": (draw(st.integers(0, 7)), 9728), "3g.40gb": (draw(st.integers(0, 2)), 40192)}))
        else:
            nodes.append(make_node(f"n{i:02d}", product=product, cc=cc, memory_mib=mem,
                                   count=draw(st.integers(1, 8))))
    return nodes


@settings(max_examples=120, deadline=None)
@given(clusters(), st.integers(1, 40), st.integers(1, 600), st.sampled_from([0, 500, 2000]))
def test_plan_invariants(nodes: list[dict], ranks: int, batch: int, per_sample: int) -> None:
    inv = build_inventory(nodes)
    job = make_job(ranks=ranks, min_ranks=1, global_batch=batch, training={"memoryPerSampleMiB": per_sample},
                   gpus={"selection": "All"})  # every allowed device; Throughput: see below
    result = plan_job(job, inv)
    if isinstance(result, model.Unschedulable):
        # a cluster of only empty MIG nodes (every profile count 0) has no device at all
        no_devices = not any(d.free for d in inv.devices())
        assert result.reason == ("InsufficientGPUs" if no_devices else "InsufficientMemory")
        return
    free_speeds = sorted((d.relative_speed for d in inv.devices() for _ in range(d.free)), reverse=True)
    n = min(ranks, batch, len(free_speeds))
    assert result.world_size == n
    assert sum(r.local_batch for r in result.ranks) == batch
    assert all(r.local_batch >= 1 for r in result.ranks)
    if per_sample:
        assert all(r.local_batch * per_sample <= r.memory_mib - 1024 for r in result.ranks)
    assert sum(r.relative_speed for r in result.ranks) == pytest.approx(sum(free_speeds[:n]))
    used: dict[tuple, int] = {}
    for r in result.ranks:
        used[(r.node, r.resource_name)] = used.get((r.node, r.resource_name), 0) + 1
    free = {(d.node, d.resource_name): d.free for d in inv.devices()}
    assert all(k <= free[key] for key, k in used.items())
    flat = [rank for g in result.groups for rank in g.ranks]
    assert flat == list(range(n))
    assert result == plan_job(job, inv)
