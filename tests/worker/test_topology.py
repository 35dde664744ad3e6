"""Group layouts per hierarchy mode (pure)."""

from __future__ import annotations

import pytest

from heterotrain_common.contract import RankEntry
from heterotrain_common.topology import build_layout, layout_from_node_sizes


def entry(rank: int, group: int, node: str, product: str, cc: str) -> RankEntry:
    return RankEntry(rank=rank, group=group, node=node, gpu_product=product,
                     compute_capability=cc, local_batch=4)


# node-a: 2x A100 (group 0) + 1x T4 (group 1); node-b: 2x T4 (group 2); node-c: 1x A100 (group 3)
TOPOLOGY = [entry(0, 0, "node-a", "A100", "8.0"), entry(1, 0, "node-a", "A100", "8.0"),
            entry(2, 1, "node-a", "T4", "7.5"), entry(3, 2, "node-b", "T4", "7.5"),
            entry(4, 2, "node-b", "T4", "7.5"), entry(5, 3, "node-c", "A100", "8.0")]


@pytest.mark.parametrize(("mode", "groups", "leaders"), [
    ("group", [[0, 1], [2], [3, 4], [5]], [0, 2, 3, 5]),
    ("node", [[0, 1, 2], [3, 4], [5]], [0, 3, 5]),
    ("arch", [[0, 1, 5], [2, 3, 4]], [0, 2]),
    ("flat", [[0, 1, 2, 3, 4, 5]], [0]),
    ("auto", [[0, 1], [2], [3, 4], [5]], [0, 2, 3, 5]),
], ids=["topology groups", "one group per node", "one group per compute capability",
        "flat", "auto on several nodes is group"])
def test_layout_per_mode(mode: str, groups: list[list[int]], leaders: list[int]) -> None:
    layout = build_layout(TOPOLOGY, mode)
    assert [list(g) for g in layout.groups] == groups
    assert list(layout.leaders) == leaders
    assert layout.is_flat is (len(groups) == 1)
    assert all(layout.leader_of(r) == min(layout.group_of(r)) for r in range(6))


def test_auto_on_one_node_is_flat() -> None:
    one_node = [entry(r, r // 2, "localhost", "T4", "7.5") for r in range(4)]
    assert build_layout(one_node, "auto").mode == "flat"


@pytest.mark.parametrize(("sizes", "groups", "leaders"), [
    ([2, 2], [[0, 1], [2, 3]], [0, 2]), ([3, 1], [[0, 1, 2], [3]], [0, 3])],
    ids=["case 16 sizes 2,2", "case 16 sizes 3,1"])
def test_case16_node_sizes(sizes: list[int], groups: list[list[int]], leaders: list[int]) -> None:
    layout = layout_from_node_sizes(sizes)
    assert [list(g) for g in layout.groups] == groups and list(layout.leaders) == leaders


def test_unknown_mode_is_rejected() -> None:
    with pytest.raises(ValueError, match="ring"):
        build_layout(TOPOLOGY, "ring")
