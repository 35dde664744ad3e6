"""Pure tests of the link cost model and the hierarchy chooser."""

from __future__ import annotations

import pytest

from heterotrain_common.linkcost import (LinkModel, RankPlace, choose_hierarchy, collective_s,
                                         partition, predict_modes)

MBIT = 1e6 / 8
TWO_NODES = [RankPlace(node="a", arch="8.0", group=0), RankPlace(node="a", arch="7.5", group=1),
             RankPlace(node="b", arch="8.0", group=2), RankPlace(node="b", arch="7.5", group=3)]


def test_partition_modes():
    assert partition(TWO_NODES, "flat") == [[0, 1, 2, 3]]
    assert partition(TWO_NODES, "node") == [[0, 1], [2, 3]]
    assert partition(TWO_NODES, "arch") == [[0, 2], [1, 3]]
    assert partition(TWO_NODES, "group") == [[0], [1], [2], [3]]
    with pytest.raises(ValueError, match="hierarchy mode"):
        partition(TWO_NODES, "ring")


def test_ring_allreduce_matches_textbook_formula():
    link = LinkModel(intra_bw_bytes_per_s=1e9, inter_bw_bytes_per_s=1e9, intra_latency_s=1e-5,
                     inter_latency_s=1e-5)
    nodes = ["a"] * 4
    # B * 2(n-1)/n / bw + 2(n-1) * latency
    assert collective_s([[0, 1, 2, 3]], nodes, 8e6, link, kind="allreduce") == pytest.approx(
        8e6 * 2 * 3 / 4 / 1e9 + 6 * 1e-5)


def test_flat_over_two_nodes_is_bottlenecked_by_the_slow_link():
    link = LinkModel(intra_bw_bytes_per_s=1e9, inter_bw_bytes_per_s=100 * MBIT, inter_latency_s=0)
    nodes = ["a", "a", "b", "b"]
    t = collective_s([[0, 1, 2, 3]], nodes, 4e6, link, kind="allreduce")
    assert t == pytest.approx(6 * 1e6 / (100 * MBIT), rel=0.01)


@pytest.mark.parametrize(("inter_mbit", "grad_mb", "expected"), [
    (100, 4, "node"), (16_000, 4, "flat"),
], ids=["slow inter-node link favours per-node hierarchy",
        "a link as fast as loopback favours one flat all-reduce"])
def test_choice(inter_mbit, grad_mb, expected):
    link = LinkModel(intra_bw_bytes_per_s=2e9, inter_bw_bytes_per_s=inter_mbit * MBIT,
                     intra_latency_s=50e-6, inter_latency_s=200e-6)
    costs = predict_modes(TWO_NODES, grad_mb * 1e6, link)
    assert choose_hierarchy(TWO_NODES, grad_mb * 1e6, link) == expected
    assert costs[expected] == min(costs.values())


def test_arch_groups_crossing_the_link_cost_more_than_node_groups():
    link = LinkModel(intra_bw_bytes_per_s=2e9, inter_bw_bytes_per_s=100 * MBIT)
    costs = predict_modes(TWO_NODES, 4e6, link)
    assert costs["arch"] > costs["node"]
    assert costs["node"] < costs["flat"]


def test_compressed_leaders_make_hierarchy_cheaper():
    link = LinkModel(intra_bw_bytes_per_s=2e9, inter_bw_bytes_per_s=100 * MBIT)
    plain = predict_modes(TWO_NODES, 4e6, link)
    packed = predict_modes(TWO_NODES, 4e6, link, leader_bytes=1e6)
    assert packed["node"] < plain["node"] / 2
    assert packed["flat"] == plain["flat"]


def test_measured_ring_bandwidth_replaces_the_flat_edge_model():
    """A full ring measured slower than its edges (e.g. 4 ranks on 2 cores) makes flat lose."""
    fast = dict(intra_bw_bytes_per_s=1e9, inter_bw_bytes_per_s=1e9)
    edges = LinkModel(**fast)
    measured = LinkModel(**fast, ring_bw_bytes_per_s=0.2e9, ring_latency_s=1e-4)
    assert choose_hierarchy(TWO_NODES, 5e6, edges) == "flat"
    assert choose_hierarchy(TWO_NODES, 5e6, measured) == "node"
    assert predict_modes(TWO_NODES, 5e6, measured)["flat"] == pytest.approx(6 * (5e6 / 4 / 0.2e9 + 1e-4))
