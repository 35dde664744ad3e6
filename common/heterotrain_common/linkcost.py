"""Link cost model and the hierarchy chooser behind ``HTJ_HIERARCHY=auto``.

Pure Python (no torch).  A gradient sync in a hierarchy with groups ``G_1..G_k`` runs three phases:
reduce inside every group to its leader (groups in parallel), a ring all-reduce among the leaders,
and a broadcast inside every group.  ``flat`` is one ring all-reduce over all ranks.

A ring collective over ``n`` ranks moving ``B`` bytes takes ``2 (n - 1)`` rounds of ``B / n``
bytes on every ring edge, i.e. ``B * 2 (n - 1) / n`` bytes per rank.  A round lasts as long as
its slowest edge: an edge inside a node moves ``B / n`` at the intra-node bandwidth; an edge that
leaves a node shares that node's egress bandwidth with every other ring edge leaving the same node
at the same time (concurrent groups included), plus one hop latency.  Reduce and broadcast are
modelled as ``2 (n - 1)`` rounds too (reduce-scatter + gather, scatter + all-gather).  This is the
alpha-beta model of Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication
Operations in MPICH" (IJHPCA 2005), with per-node egress sharing added; gloo's CPU all-reduce is
a ring (``gloo/allreduce.cc``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FIXED_MODES: tuple[str, ...] = ("flat", "group", "node", "arch")
"""The contract's fixed ``HTJ_HIERARCHY`` values (``auto`` picks one of these)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkModel:
    """Bandwidths and latencies of the two link classes.

    Attributes:
        intra_bw_bytes_per_s: bandwidth between ranks on one node (NVLink/PCIe/loopback), > 0.
        inter_bw_bytes_per_s: egress bandwidth of one node towards the others, > 0.
        intra_latency_s: per-round latency inside a node, >= 0.
        inter_latency_s: per-round latency between nodes, >= 0.
        ring_bw_bytes_per_s: optional measured bandwidth of one ring over *all* ranks (the flat
            all-reduce); when set it replaces the per-edge model for ``flat``, which then also
            accounts for effects the per-edge model misses (CPU contention of many ranks on few
            cores, NIC sharing).  None: use the per-edge model.
        ring_latency_s: per-round latency of that ring.
    """

    intra_bw_bytes_per_s: float
    inter_bw_bytes_per_s: float
    intra_latency_s: float = 20e-6
    inter_latency_s: float = 100e-6
    ring_bw_bytes_per_s: float | None = None
    ring_latency_s: float = 0.0

    def __post_init__(self) -> None:
        if self.intra_bw_bytes_per_s <= 0 or self.inter_bw_bytes_per_s <= 0:
            raise ValueError("bandwidths must be > 0 bytes/s")
        if self.intra_latency_s < 0 or self.inter_latency_s < 0:
            raise ValueError("latencies must be >= 0 s")


@dataclass(frozen=True, kw_only=True, slots=True)
class RankPlace:
    """Where a rank sits: its node and its architecture key (compute capability) and topology group."""

    node: str
    arch: str
    group: int


def partition(places: Sequence[RankPlace], mode: str) -> list[list[int]]:
    """Groups of global ranks for a hierarchy mode, ordered by their lowest rank.

    The same call gives the same list on every rank (case 16: every rank must create every group
    in the same order).

    Args:
        places: one entry per rank, index = global rank.
        mode: ``flat`` (one group), ``group`` (topology group), ``node`` or ``arch``.

    Raises:
        ValueError: unknown mode.
    """
    if mode == "flat":
        return [list(range(len(places)))]
    keys = {"group": lambda p: p.group, "node": lambda p: p.node, "arch": lambda p: p.arch}
    if mode not in keys:
        raise ValueError(f"hierarchy mode must be one of {', '.join(FIXED_MODES)}, got {mode!r}")
    groups: dict[object, list[int]] = {}
    for rank, place in enumerate(places):
        groups.setdefault(keys[mode](place), []).append(rank)
    return sorted(groups.values(), key=lambda g: g[0])


def _ring_round_s(rings: Sequence[Sequence[int]], nodes: Sequence[str], chunk_bytes: Sequence[float],
                  link: LinkModel) -> list[float]:
    """Duration of one round of each of several concurrent rings (index-aligned with ``rings``)."""
    egress: dict[str, int] = {}
    edges = []
    for ring in rings:
        ring_edges = [(ring[i], ring[(i + 1) % len(ring)]) for i in range(len(ring))] if len(ring) > 1 else []
        edges.append(ring_edges)
        for a, b in ring_edges:
            if nodes[a] != nodes[b]:
                egress[nodes[a]] = egress.get(nodes[a], 0) + 1
    rounds = []
    for ring_edges, chunk in zip(edges, chunk_bytes):
        worst = 0.0
        for a, b in ring_edges:
            if nodes[a] != nodes[b]:
                t = chunk * egress[nodes[a]] / link.inter_bw_bytes_per_s + link.inter_latency_s
            else:
                t = chunk / link.intra_bw_bytes_per_s + link.intra_latency_s
            worst = max(worst, t)
        rounds.append(worst)
    return rounds


def collective_s(groups: Sequence[Sequence[int]], nodes: Sequence[str], nbytes: float,
                 link: LinkModel, *, kind: str) -> float:
    """Seconds for one collective run concurrently in every group (the slowest group).

    Args:
        groups: disjoint lists of global ranks.
        nodes: node name per global rank.
        nbytes: bytes of the tensor each rank holds.
        kind: ``allreduce``, ``reduce`` or ``broadcast``; all three take ``2 (n - 1)`` rounds of
            ``B / n`` (reduce = reduce-scatter + gather, broadcast = scatter + all-gather; for
            two ranks that is the whole ``B`` over the one link, the least possible).
    """
    if kind not in ("allreduce", "reduce", "broadcast"):
        raise ValueError(f"kind must be allreduce, reduce or broadcast, got {kind!r}")
    chunks = [nbytes / max(len(g), 1) for g in groups]
    round_s = _ring_round_s(groups, nodes, chunks, link)
    return max((2 * (len(g) - 1) * r for g, r in zip(groups, round_s)), default=0.0)


def sync_cost_s(groups: Sequence[Sequence[int]], nodes: Sequence[str], grad_bytes: float,
                link: LinkModel, *, leader_bytes: float | None = None) -> float:
    """Predicted seconds of one gradient sync for a hierarchy given by ``groups``.

    Args:
        groups: the partition (one group = flat all-reduce).
        nodes: node name per global rank.
        grad_bytes: bytes of the gradients (fp32) per rank.
        leader_bytes: bytes on the leaders' all-reduce when compressed (default ``grad_bytes``).
    """
    if len(groups) == 1:
        return _allreduce_s(groups[0], nodes, grad_bytes, link)
    leaders = [g[0] for g in groups]
    inner = [g for g in groups if len(g) > 1]
    return (collective_s(inner, nodes, grad_bytes, link, kind="reduce")
            + _allreduce_s(leaders, nodes, grad_bytes if leader_bytes is None else leader_bytes, link)
            + collective_s(inner, nodes, grad_bytes, link, kind="broadcast"))


def _allreduce_s(ranks: Sequence[int], nodes: Sequence[str], nbytes: float, link: LinkModel) -> float:
    """One all-reduce; a ring over every rank uses the measured ring bandwidth when known."""
    n = len(ranks)
    if link.ring_bw_bytes_per_s and n == len(nodes) and n > 1:
        return 2 * (n - 1) * (nbytes / n / link.ring_bw_bytes_per_s + link.ring_latency_s)
    return collective_s([ranks], nodes, nbytes, link, kind="allreduce")


def predict_modes(places: Sequence[RankPlace], grad_bytes: float, link: LinkModel, *,
                  leader_bytes: float | None = None) -> dict[str, float]:
    """Predicted sync seconds for every fixed mode (``flat``, ``group``, ``node``, ``arch``)."""
    nodes = [p.node for p in places]
    return {mode: sync_cost_s(partition(places, mode), nodes, grad_bytes, link,
                              leader_bytes=None if mode == "flat" else leader_bytes)
            for mode in FIXED_MODES}


def choose_hierarchy(places: Sequence[RankPlace], grad_bytes: float, link: LinkModel, *,
                     leader_bytes: float | None = None) -> str:
    """The fixed mode with the lowest predicted sync time; ties go to the simpler mode.

    Order of preference on ties: flat, group, node, arch (fewer collectives first).
    """
    costs = predict_modes(places, grad_bytes, link, leader_bytes=leader_bytes)
    return min(FIXED_MODES, key=lambda m: (round(costs[m], 9), FIXED_MODES.index(m)))
