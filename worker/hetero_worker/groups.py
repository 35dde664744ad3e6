"""Hierarchical process groups and the hierarchical sum all-reduce built on them.

``torch.distributed.new_group`` is collective over the default group: every rank must call it for
every group, in the same order, including the groups it is not a member of; otherwise init hangs
(case 16; pytorch/pytorch#81291, sgl-project/sglang#15805). :func:`build_process_groups` therefore
walks the layout's full, identically ordered group list on every rank: first each intra group, then
the leaders' group.

Backends: intra groups use NCCL when the ranks run on CUDA, Gloo on CPU; the leaders' group always
uses Gloo (it crosses nodes and GPU generations, where NCCL peer-to-peer is the fragile part; see
docs gpu-facts "Interconnect").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hetero_worker.topology import GroupLayout


@dataclass(kw_only=True)
class ProcessGroups:
    """The process groups one rank uses.

    Attributes:
        layout: the layout they were built from.
        rank: this rank's global rank.
        intra: process group of this rank's layout group (``dist.group.WORLD`` for a flat layout).
        intra_ranks: global ranks of ``intra``, ascending; ``intra_ranks[0]`` is the leader.
        leaders: the leaders' group when this rank is a leader and there are >= 2 groups, else None.
        intra_crosses: True when ``intra`` spans more than one topology group (counts as
            inter-group traffic).
        leaders_cross: True when the leaders' group spans more than one topology group.
    """

    layout: GroupLayout
    rank: int
    intra: Any
    intra_ranks: tuple[int, ...]
    leaders: Any | None
    intra_crosses: bool
    leaders_cross: bool

    @property
    def leader(self) -> int:
        """Global rank of this rank's group leader."""
        return self.intra_ranks[0]

    @property
    def is_leader(self) -> bool:
        """True when this rank leads its group."""
        return self.rank == self.leader


def _crosses(ranks: Sequence[int], topology_group_of: Sequence[int]) -> bool:
    return len({topology_group_of[r] for r in ranks}) > 1


def build_process_groups(layout: GroupLayout, rank: int, *, topology_group_of: Sequence[int],
                         intra_backend: str = "gloo") -> ProcessGroups:
    """Create the groups of ``layout``; call on every rank with identical arguments but ``rank``.

    Args:
        layout: identical on every rank (:func:`hetero_worker.topology.build_layout`).
        rank: this rank.
        topology_group_of: the contract's group index of each rank, ``len == world_size``.
        intra_backend: ``"nccl"`` on CUDA, ``"gloo"`` on CPU.

    Returns:
        This rank's :class:`ProcessGroups`.

    Raises:
        RuntimeError: the default process group is not initialised.
    """
    if not dist.is_initialized():
        raise RuntimeError("init the default process group first (hetero_worker.rendezvous)")
    mine = layout.group_of(rank)
    if layout.is_flat:
        return ProcessGroups(layout=layout, rank=rank, intra=dist.group.WORLD, intra_ranks=mine,
                             leaders=None, intra_crosses=_crosses(mine, topology_group_of),
                             leaders_cross=False)
    intra = None
    for members in layout.groups:  # every rank creates every group, same order (case 16)
        pg = dist.new_group(ranks=list(members), backend=intra_backend)
        if rank in members:
            intra = pg
    leaders_pg = dist.new_group(ranks=list(layout.leaders), backend="gloo")
    return ProcessGroups(
        layout=layout, rank=rank, intra=intra, intra_ranks=mine,
        leaders=leaders_pg if rank in layout.leaders else None,
        intra_crosses=_crosses(mine, topology_group_of),
        leaders_cross=_crosses(layout.leaders, topology_group_of))


def hierarchical_all_reduce_(tensor: torch.Tensor, groups: ProcessGroups, *,
                             leaders_reduce: Callable[[torch.Tensor], int] | None = None,
                             payload_numel: int | None = None) -> int:
    """Sum ``tensor`` over all ranks in place: reduce in group, all-reduce leaders, broadcast.

    Blocking (every collective is waited for before the next starts), so it is safe to call from a
    DDP communication hook on Gloo, where chaining collectives in future callbacks can deadlock.

    Args:
        tensor: any shape and dtype; on CPU or the rank's CUDA device. Overwritten with the sum.
        groups: from :func:`build_process_groups`.
        leaders_reduce: replaces the leaders' plain all-reduce (e.g. a compressing codec); takes
            the tensor, sums it in place over the leaders and returns the bytes it sent.
        payload_numel: elements counted as payload in the byte count (default all; a caller
            that appends bookkeeping elements counts only the gradient).

    Returns:
        Payload bytes this rank put into collectives that cross topology groups (for
        ``htj_inter_group_bytes_total``).
    """
    numel = tensor.numel() if payload_numel is None else payload_numel
    nbytes = numel * tensor.element_size()
    if groups.layout.is_flat:
        dist.all_reduce(tensor, group=groups.intra)
        return nbytes if groups.intra_crosses else 0
    sent = 0
    multi = len(groups.intra_ranks) > 1
    if multi:
        dist.reduce(tensor, dst=groups.leader, group=groups.intra)
        sent += nbytes if groups.intra_crosses else 0
    if groups.leaders is not None and leaders_reduce is not None:
        sent += leaders_reduce(tensor)
    elif groups.leaders is not None:
        _leaders_all_reduce_(tensor, groups.leaders)
        sent += nbytes if groups.leaders_cross else 0
    if multi:
        dist.broadcast(tensor, src=groups.leader, group=groups.intra)
    return sent


def _leaders_all_reduce_(tensor: torch.Tensor, leaders: Any) -> None:
    """All-reduce on the Gloo leaders' group; CUDA tensors go through a host copy."""
    if tensor.device.type == "cpu":
        dist.all_reduce(tensor, group=leaders)
        return
    host = tensor.to("cpu")
    dist.all_reduce(host, group=leaders)
    tensor.copy_(host)
