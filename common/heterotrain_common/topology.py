"""Group layout of a job: which ranks reduce together first, and who leads each group.

Pure and torch-free: derives the layout for each hierarchy mode from the parsed contract's
topology (``HTJ_TOPOLOGY``), so every rank computes the *same* ordered list of groups (the
precondition of :mod:`hetero_worker.comm.groups`, see case 16).

Modes (``HTJ_HIERARCHY``):

* ``group``: the topology's groups (same node and GPU type, the fast interconnect);
* ``node``: one group per node;
* ``arch``: one group per compute capability (may span nodes; members need not be contiguous);
* ``flat``: one group holding every rank (a single all-reduce);
* ``auto``: ``flat`` when the whole job sits on one node, else ``group``.

Groups are ordered by their lowest rank; the leader of a group is its lowest rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from heterotrain_common.contract import RankEntry
from heterotrain_common.envnames import HIERARCHIES


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupLayout:
    """An ordered partition of the ranks into reduction groups.

    Attributes:
        mode: the hierarchy mode it was built for (``auto`` already resolved).
        groups: tuple of groups, each an ascending tuple of global ranks; ordered by lowest rank.
        leaders: lowest rank of each group, same order as ``groups``.
    """

    mode: str
    groups: tuple[tuple[int, ...], ...]
    leaders: tuple[int, ...]

    def group_of(self, rank: int) -> tuple[int, ...]:
        """The group holding ``rank``; raises ``KeyError`` if no group does."""
        for group in self.groups:
            if rank in group:
                return group
        raise KeyError(f"rank {rank} is in no group of {self.groups}")

    def leader_of(self, rank: int) -> int:
        """Lowest rank of ``rank``'s group."""
        return self.group_of(rank)[0]

    @property
    def is_flat(self) -> bool:
        """True when there is a single group (one all-reduce, no leaders' stage)."""
        return len(self.groups) == 1


def _key_function(mode: str) -> Callable[[RankEntry], object]:
    keys: dict[str, Callable[[RankEntry], object]] = {
        "flat": lambda e: 0,
        "group": lambda e: e.group,
        "node": lambda e: e.node,
        "arch": lambda e: e.compute_capability,
    }
    return keys[mode]


def resolve_mode(mode: str, topology: Sequence[RankEntry]) -> str:
    """Resolve ``auto``; check the mode name.

    Raises:
        ValueError: ``mode`` is not one of :data:`heterotrain_common.envnames.HIERARCHIES`.
    """
    if mode not in HIERARCHIES:
        raise ValueError(f"hierarchy must be one of {', '.join(HIERARCHIES)}, got {mode!r}")
    if mode == "auto":
        return "flat" if len({e.node for e in topology}) <= 1 else "group"
    return mode


def build_layout(topology: Sequence[RankEntry], mode: str) -> GroupLayout:
    """Partition the ranks of ``topology`` for ``mode``.

    Args:
        topology: one entry per rank, ordered by rank (``Contract.topology``).
        mode: a hierarchy mode, see the module docstring.

    Returns:
        The :class:`GroupLayout`; identical on every rank for the same inputs.

    Raises:
        ValueError: unknown mode or empty topology.
    """
    if not topology:
        raise ValueError("topology is empty")
    resolved = resolve_mode(mode, topology)
    key = _key_function(resolved)
    members: dict[object, list[int]] = {}
    for entry in sorted(topology, key=lambda e: e.rank):
        members.setdefault(key(entry), []).append(entry.rank)
    groups = tuple(sorted((tuple(m) for m in members.values()), key=lambda g: g[0]))
    return GroupLayout(mode=resolved, groups=groups, leaders=tuple(g[0] for g in groups))


def layout_from_node_sizes(node_sizes: Sequence[int]) -> GroupLayout:
    """Layout for contiguous nodes of the given sizes, e.g. ``[3, 1]`` -> ``[[0,1,2],[3]]``.

    Raises:
        ValueError: a size below 1.
    """
    if any(size < 1 for size in node_sizes):
        raise ValueError(f"node sizes must be >= 1, got {list(node_sizes)}")
    groups, start = [], 0
    for size in node_sizes:
        groups.append(tuple(range(start, start + size)))
        start += size
    return GroupLayout(mode="node", groups=tuple(groups), leaders=tuple(g[0] for g in groups))
