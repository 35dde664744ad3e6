"""The communicator rule (pure): exact groups and backends for every layout on 1 to 4 GPU types,
MIG slices, time-sliced GPUs, mixed PyTorch builds and CPU ranks."""

from __future__ import annotations

import pytest

from hetero_worker.comm.commplan import (CommRank, comm_ranks, nccl_verdict, plan_communicators,
                                         rule_violations)
from heterotrain_common.contract import RankEntry
from heterotrain_common.envnames import HIERARCHIES
from heterotrain_common.topology import build_layout

BUILD = "2.13.0+cu128/nccl-2.27.5"
MIG1 = "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
MIG3 = "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"


def topo(*rows: tuple) -> tuple[list[RankEntry], list[CommRank]]:
    """Rows ``(group, node, product, cc[, build[, physical_gpu[, on_cuda]]])`` in rank order."""
    entries, ranks = [], []
    for rank, row in enumerate(rows):
        group, node, product, cc, *rest = row
        build = rest[0] if len(rest) > 0 else BUILD
        physical = rest[1] if len(rest) > 1 else ""
        on_cuda = rest[2] if len(rest) > 2 else True
        entries.append(RankEntry(rank=rank, group=group, node=node, gpu_product=product,
                                 compute_capability=cc, local_batch=4))
        ranks.append(CommRank(rank=rank, node=node, gpu_type=product, torch_build=build,
                              on_cuda=on_cuda, physical_gpu=physical))
    return entries, ranks


TOPOLOGIES = {
    # one GPU type on two nodes
    "1 type": topo((0, "a", "NVIDIA-A100-SXM4-40GB", "8.0"), (0, "a", "NVIDIA-A100-SXM4-40GB", "8.0"),
                   (1, "b", "NVIDIA-A100-SXM4-40GB", "8.0"), (1, "b", "NVIDIA-A100-SXM4-40GB", "8.0")),
    # two types on one node
    "2 types": topo((0, "a", "NVIDIA-A100-SXM4-40GB", "8.0"), (0, "a", "NVIDIA-A100-SXM4-40GB", "8.0"),
                    (1, "a", "Tesla-V100-SXM2-16GB", "7.0"), (1, "a", "Tesla-V100-SXM2-16GB", "7.0")),
    # A100 + V100 on node a, two T4 on node b
    "3 types": topo((0, "a", "NVIDIA-A100-SXM4-40GB", "8.0"), (1, "a", "Tesla-V100-SXM2-16GB", "7.0"),
                    (2, "b", "Tesla-T4", "7.5"), (2, "b", "Tesla-T4", "7.5")),
    # H100 + H800 (both 9.0: one arch group, two types; NVIDIA/nccl#1110), A100, two L4
    "4 types": topo((0, "a", "NVIDIA-H100-80GB-HBM3", "9.0"), (1, "a", "NVIDIA-H800", "9.0"),
                    (2, "b", "NVIDIA-A100-SXM4-40GB", "8.0"), (3, "b", "NVIDIA-L4", "8.9"),
                    (3, "b", "NVIDIA-L4", "8.9")),
    # two 1g.5gb slices on node a (maybe one GPU), one on node b, one 3g.20gb on node b
    "MIG": topo((0, "a", MIG1, "8.0"), (0, "a", MIG1, "8.0"), (1, "b", MIG1, "8.0"),
                (2, "b", MIG3, "8.0")),
    # GFD-renamed time-slicing on a; unrenamed replicas of one T4 on b (same PCI id); two T4 on c
    "time-sliced": topo((0, "a", "Tesla-T4-SHARED", "7.5"), (0, "a", "Tesla-T4-SHARED", "7.5"),
                        (1, "b", "Tesla-T4", "7.5", BUILD, "0000:3b:00"),
                        (1, "b", "Tesla-T4", "7.5", BUILD, "0000:3b:00"),
                        (2, "c", "Tesla-T4", "7.5", BUILD, "0000:3b:00"),
                        (2, "c", "Tesla-T4", "7.5", BUILD, "0000:af:00")),
    # one type, but node a runs two PyTorch builds
    "2 builds": topo((0, "a", "NVIDIA-A100-SXM4-40GB", "8.0", BUILD),
                     (0, "a", "NVIDIA-A100-SXM4-40GB", "8.0", "2.7.1+cu126/nccl-2.21.5"),
                     (1, "b", "NVIDIA-A100-SXM4-40GB", "8.0"), (1, "b", "NVIDIA-A100-SXM4-40GB", "8.0")),
    "CPU": topo((0, "a", "cpu", "", "2.13.0+cpu", "", False), (1, "b", "cpu", "", "2.13.0+cpu", "", False)),
}

W, N, G = "world", "nccl", "gloo"
# per topology and mode: (intra groups as (ranks, backend) with "world" for the Gloo world group,
#                         leaders ranks or None, DDP group as (ranks, backend))
EXPECTED = {
    "1 type": {
        "flat": ([((0, 1, 2, 3), N)], None, ((0, 1, 2, 3), N)),
        "group": ([((0, 1), N), ((2, 3), N)], (0, 2), W),
        "node": ([((0, 1), N), ((2, 3), N)], (0, 2), W),
        "arch": ([((0, 1, 2, 3), N)], None, ((0, 1, 2, 3), N)),
        "auto": ([((0, 1), N), ((2, 3), N)], (0, 2), W),
    },
    "2 types": {
        "flat": ([W], None, W),
        "group": ([((0, 1), N), ((2, 3), N)], (0, 2), W),
        "node": ([W], None, W),
        "arch": ([((0, 1), N), ((2, 3), N)], (0, 2), W),
        "auto": ([W], None, W),  # one node: flat
    },
    "3 types": {
        "flat": ([W], None, W),
        "group": ([((0,), N), ((1,), N), ((2, 3), N)], (0, 1, 2), W),
        "node": ([((0, 1), G), ((2, 3), N)], (0, 2), W),
        "arch": ([((0,), N), ((1,), N), ((2, 3), N)], (0, 1, 2), W),
        "auto": ([((0,), N), ((1,), N), ((2, 3), N)], (0, 1, 2), W),
    },
    "4 types": {
        "flat": ([W], None, W),
        "group": ([((0,), N), ((1,), N), ((2,), N), ((3, 4), N)], (0, 1, 2, 3), W),
        "node": ([((0, 1), G), ((2, 3, 4), G)], (0, 2), W),
        "arch": ([((0, 1), G), ((2,), N), ((3, 4), N)], (0, 2, 3), W),
        "auto": ([((0,), N), ((1,), N), ((2,), N), ((3, 4), N)], (0, 1, 2, 3), W),
    },
    "MIG": {
        "flat": ([W], None, W),
        "group": ([((0, 1), G), ((2,), N), ((3,), N)], (0, 2, 3), W),
        "node": ([((0, 1), G), ((2, 3), G)], (0, 2), W),
        "arch": ([W], None, W),  # all 8.0 but two profiles
        "auto": ([((0, 1), G), ((2,), N), ((3,), N)], (0, 2, 3), W),
    },
    "time-sliced": {
        "flat": ([W], None, W),
        "group": ([((0, 1), G), ((2, 3), G), ((4, 5), N)], (0, 2, 4), W),
        "node": ([((0, 1), G), ((2, 3), G), ((4, 5), N)], (0, 2, 4), W),
        "arch": ([W], None, W),  # Tesla-T4-SHARED and Tesla-T4 are two types
        "auto": ([((0, 1), G), ((2, 3), G), ((4, 5), N)], (0, 2, 4), W),
    },
    "2 builds": {
        "flat": ([W], None, W),
        "group": ([((0, 1), G), ((2, 3), N)], (0, 2), W),
        "node": ([((0, 1), G), ((2, 3), N)], (0, 2), W),
        "arch": ([W], None, W),
        "auto": ([((0, 1), G), ((2, 3), N)], (0, 2), W),
    },
    "CPU": {
        "flat": ([W], None, W),
        "group": ([((0,), G), ((1,), G)], (0, 1), W),
        "node": ([((0,), G), ((1,), G)], (0, 1), W),
        "arch": ([W], None, W),
        "auto": ([((0,), G), ((1,), G)], (0, 1), W),
    },
}


def describe(plan):  # type: ignore[no-untyped-def]
    def one(group):  # type: ignore[no-untyped-def]
        return W if group is plan.world else (group.ranks, group.backend)
    leaders = None
    if plan.leaders is not None:
        assert plan.leaders.backend == G
        leaders = plan.leaders.ranks
    return [one(g) for g in plan.intra], leaders, one(plan.ddp)


CASES = [(name, mode) for name in TOPOLOGIES for mode in HIERARCHIES]


@pytest.mark.parametrize(("name", "mode"), CASES, ids=[f"{n}/{m}" for n, m in CASES])
def test_exact_groups_and_backends(name: str, mode: str) -> None:
    entries, ranks = TOPOLOGIES[name]
    plan = plan_communicators(ranks, build_layout(entries, mode))
    assert describe(plan) == EXPECTED[name][mode]
    assert plan.world.backend == G and plan.world.ranks == tuple(range(len(ranks)))
    created = [(g.backend, g.ranks) for g in plan.to_create()] + [(plan.world.backend, None)]
    assert rule_violations(ranks, created) == []


def test_every_mode_and_topology_has_an_expectation() -> None:
    assert set(EXPECTED) == set(TOPOLOGIES)
    assert all(set(modes) == set(HIERARCHIES) for modes in EXPECTED.values())


def test_groups_are_created_in_layout_order_then_leaders() -> None:
    entries, ranks = TOPOLOGIES["3 types"]
    plan = plan_communicators(ranks, build_layout(entries, "node"))
    assert [(g.role, g.ranks, g.backend) for g in plan.to_create()] == [
        ("intra", (0, 1), G), ("intra", (2, 3), N), ("leaders", (0, 2), G)]
    assert "crosses GPU types" in plan.intra[0].reason


@pytest.mark.parametrize(("members", "allowed", "reason"), [
    ([("a", MIG1, ""), ("b", MIG1, "")], True, "one GPU type"),  # one slice per node: may span nodes
    ([("a", MIG1, ""), ("a", MIG1, "")], False, "may share its GPU"),
    ([("a", MIG1, "0000:07:00"), ("a", MIG1, "0000:0f:00")], True, "one GPU type"),  # two GPUs, known
    ([("a", MIG1, "0000:07:00"), ("a", MIG1, "0000:07:00")], False, "one physical GPU"),
    ([("a", "Tesla-T4", "0000:3b:00"), ("b", "Tesla-T4", "0000:3b:00")], True, "one GPU type"),
    ([("a", "Tesla-T4-SHARED", "")], True, "one rank"),
], ids=["MIG across nodes", "MIG same node unknown GPU", "MIG same node two GPUs",
        "MIG same parent GPU", "same PCI id on two nodes", "time-sliced alone"])
def test_nccl_verdict_on_shared_devices(members: list[tuple[str, str, str]], allowed: bool,
                                        reason: str) -> None:
    ranks = [CommRank(rank=i, node=node, gpu_type=gpu, torch_build=BUILD, on_cuda=True,
                      physical_gpu=phys) for i, (node, gpu, phys) in enumerate(members)]
    verdict = nccl_verdict(ranks)
    assert verdict[0] is allowed and reason in verdict[1]


def test_violations_are_named() -> None:
    _, ranks = TOPOLOGIES["3 types"]
    assert rule_violations(ranks, [("cpu:gloo,cuda:nccl", None), ("nccl", [0, 1]),
                                   ("nccl", [2, 3]), ("gloo", [0, 1, 2, 3])]) == [
        "default group has backend 'cpu:gloo,cuda:nccl' (must be Gloo only)",
        "NCCL group [0, 1]: crosses GPU types NVIDIA-A100-SXM4-40GB, Tesla-V100-SXM2-16GB"]


def test_comm_ranks_from_topology_and_reports() -> None:
    entries, _ = TOPOLOGIES["2 types"]
    got = comm_ranks(entries, torch_builds=[BUILD] * 4, on_cuda=[True] * 4,
                     physical_gpus=["0000:07:00", "0000:0f:00", "0000:47:00", "0000:4e:00"])
    assert [(r.rank, r.node, r.gpu_type, r.physical_gpu) for r in got] == [
        (0, "a", "NVIDIA-A100-SXM4-40GB", "0000:07:00"), (1, "a", "NVIDIA-A100-SXM4-40GB", "0000:0f:00"),
        (2, "a", "Tesla-V100-SXM2-16GB", "0000:47:00"), (3, "a", "Tesla-V100-SXM2-16GB", "0000:4e:00")]
    with pytest.raises(ValueError, match="one entry per rank"):
        comm_ranks(entries, torch_builds=[BUILD], on_cuda=[True] * 4)


def test_plan_refuses_a_layout_that_misses_ranks() -> None:
    entries, ranks = TOPOLOGIES["1 type"]
    with pytest.raises(ValueError, match="does not partition"):
        plan_communicators(ranks[:3], build_layout(entries, "group"))
