"""Hierarchical process groups and the hierarchical sum all-reduce built on them.

``torch.distributed.new_group`` is collective over the default group: every rank must call it for
every group, in the same order, including the groups it is not a member of; otherwise init hangs
(case 16; pytorch/pytorch#81291, sgl-project/sglang#15805). :func:`build_process_groups` therefore
walks the plan's full, identically ordered group list on every rank: first each intra group, then
the leaders' group, then (hierarchical layouts only) a broadcast copy of each intra group of two
or more ranks (same ranks and backend, so the communicator rule holds for it as for its original;
the pipelined hierarchy broadcasts on it, :mod:`hetero_worker.comm.pipeline`).

Backends come from :func:`hetero_worker.comm.commplan.plan_communicators` (the communicator rule: NCCL
only inside one GPU type and PyTorch build, Gloo for everything that crosses; the default group is
Gloo only). This module only carries the plan out; ``create`` is the seam through which every
group is made (tests record it). Collectives on a Gloo group with CUDA tensors go through a host
copy (Gloo has no CUDA ``reduce``; torch.distributed backend table).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hetero_worker.comm.collectives import gloo_collective_
from hetero_worker.comm.commplan import GLOO, CommPlan, CommRank, comm_ranks, plan_communicators
from heterotrain_common.contract import RankEntry
from heterotrain_common.topology import GroupLayout, build_layout

GroupFactory = Callable[[Sequence[int], str], Any]
"""``create(ranks, backend)`` -> process group; the default calls ``dist.new_group``."""
IDENTITY_BYTES = 256
"""Fixed size of the per-rank identity record gathered at start-up (UTF-8 JSON, zero padded)."""


def _new_group(ranks: Sequence[int], backend: str) -> Any:
    from hetero_worker.runtime.rendezvous import collective_timeout  # the job's training timeout
    return dist.new_group(ranks=list(ranks), backend=backend, timeout=collective_timeout())


@dataclass(kw_only=True)
class ProcessGroups:
    """The process groups one rank uses.

    Attributes:
        layout: the layout they were built from.
        rank: this rank's global rank.
        intra: process group of this rank's layout group (``dist.group.WORLD`` for a flat layout
            on Gloo).
        intra_ranks: global ranks of ``intra``, ascending; ``intra_ranks[0]`` is the leader.
        leaders: the leaders' group when this rank is a leader and there are >= 2 groups, else None.
        intra_crosses: True when ``intra`` spans more than one topology group (counts as
            inter-group traffic).
        leaders_cross: True when the leaders' group spans more than one topology group.
        plan: the communicator plan carried out (backends of every group).
        intra_backend: backend of ``intra`` (``"nccl"`` or ``"gloo"``).
        ddp_group: the group DDP is built on (``plan.ddp``).
        intra_bcast: a second process group over ``intra_ranks`` (same backend) for the
            in-group broadcast of the pipelined hierarchy (:mod:`hetero_worker.comm.pipeline`),
            so a bucket's broadcast and a later bucket's reduce are in flight together; None on
            flat layouts and for a group of one rank.
        created: every group this call created (member or not), for :meth:`destroy`.
    """

    layout: GroupLayout
    rank: int
    intra: Any
    intra_ranks: tuple[int, ...]
    leaders: Any | None
    intra_crosses: bool
    leaders_cross: bool
    plan: CommPlan | None = None
    intra_backend: str = GLOO
    ddp_group: Any = None
    intra_bcast: Any | None = None
    created: list[Any] = field(default_factory=list)

    @property
    def leader(self) -> int:
        """Global rank of this rank's group leader."""
        return self.intra_ranks[0]

    @property
    def is_leader(self) -> bool:
        """True when this rank leads its group."""
        return self.rank == self.leader

    def destroy(self) -> None:
        """Destroy the groups :func:`build_process_groups` created (never the default group).

        Idempotent; call on every rank (probe groups of ``hierarchy: Auto``)."""
        for pg in self.created:
            if pg is not None and pg != dist.GroupMember.NON_GROUP_MEMBER:
                dist.destroy_process_group(pg)
        self.created = []


def _crosses(ranks: Sequence[int], topology_group_of: Sequence[int]) -> bool:
    return len({topology_group_of[r] for r in ranks}) > 1


def gloo_plan(layout: GroupLayout) -> CommPlan:
    """The plan for CPU ranks: every group on Gloo (the rule has nothing to forbid there)."""
    n = sum(len(g) for g in layout.groups)
    ranks = [CommRank(rank=r, node="", gpu_type="cpu", torch_build="", on_cuda=False)
             for r in range(n)]
    return plan_communicators(ranks, layout)


def build_hierarchy_groups(topology: Sequence[RankEntry], ranks: Sequence[CommRank], rank: int,
                           mode: str) -> ProcessGroups:
    """The process groups of hierarchy ``mode`` (``flat``, ``group``, ...) under the communicator
    rule: the topology's layout (:func:`heterotrain_common.topology.build_layout`), its
    communicator plan over ``ranks`` (:func:`plan_communicators`), then :func:`build_process_groups`.

    Collective: every rank calls it with the same ``mode``; the caller owns the result.
    """
    plan = plan_communicators(ranks, build_layout(topology, mode))
    return build_process_groups(plan, rank, topology_group_of=[e.group for e in topology])


def build_process_groups(layout: GroupLayout | CommPlan, rank: int, *,
                         topology_group_of: Sequence[int],
                         create: GroupFactory | None = None) -> ProcessGroups:
    """Create the groups of a plan; call on every rank with identical arguments but ``rank``.

    Args:
        layout: a :class:`~hetero_worker.comm.commplan.CommPlan` (identical on every rank), or a bare
            layout for CPU ranks (all Gloo, :func:`gloo_plan`).
        rank: this rank.
        topology_group_of: the contract's group index of each rank, ``len == world_size``.
        create: group factory (default ``dist.new_group``); tests pass a recording one.

    Returns:
        This rank's :class:`ProcessGroups`.

    Raises:
        RuntimeError: the default process group is not initialised.
    """
    if not dist.is_initialized():
        raise RuntimeError("init the default process group first (hetero_worker.runtime.rendezvous)")
    plan = layout if isinstance(layout, CommPlan) else gloo_plan(layout)
    make = create or _new_group
    made: dict[tuple[str, tuple[int, ...]], Any] = {}
    created = []
    for group in plan.to_create():  # every rank creates every group, same order (case 16)
        pg = make(group.ranks, group.backend)
        made[(group.role, group.ranks)] = pg
        created.append(pg)
    bcast: dict[tuple[int, ...], Any] = {}
    if not plan.layout.is_flat:  # the pipeline's in-group broadcast groups, same order everywhere
        for group in plan.intra:
            if group is not plan.world and len(group.ranks) > 1:
                pg = make(group.ranks, group.backend)
                bcast[group.ranks] = pg
                created.append(pg)
    mine = plan.intra_of(rank)
    intra = dist.group.WORLD if mine is plan.world else made[("intra", mine.ranks)]
    leaders = None
    if plan.leaders is not None and rank in plan.leaders.ranks:
        leaders = made[("leaders", plan.leaders.ranks)]
    ddp_group = dist.group.WORLD if plan.ddp is plan.world else made[("intra", plan.ddp.ranks)]
    return ProcessGroups(
        layout=plan.layout, rank=rank, intra=intra, intra_ranks=mine.ranks, leaders=leaders,
        intra_crosses=_crosses(mine.ranks, topology_group_of),
        leaders_cross=(plan.leaders is not None
                       and _crosses(plan.leaders.ranks, topology_group_of)),
        plan=plan, intra_backend=mine.backend, ddp_group=ddp_group,
        intra_bcast=bcast.get(mine.ranks), created=created)


def torch_build() -> str:
    """This process's PyTorch build: version, plus the NCCL version when CUDA is available."""
    build = torch.__version__
    if torch.cuda.is_available():
        try:
            build += "/nccl-" + ".".join(str(v) for v in torch.cuda.nccl.version())
        except (RuntimeError, AttributeError, TypeError):
            pass
    return build


def physical_gpu_id(device: torch.device) -> str:
    """PCI address of the physical GPU behind ``device`` (a MIG slice reports its parent), or
    ``""`` on CPU or when torch does not expose it."""
    if device.type != "cuda":
        return ""
    props = torch.cuda.get_device_properties(device)
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return ""
    return (f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:"
            f"{getattr(props, 'pci_device_id', 0):02x}")


def warn_mixed_builds(ranks: Sequence[CommRank]) -> None:
    """Warn when ``ranks`` run different PyTorch builds: groups that would cross them use Gloo
    (one build per job is the plan's rule)."""
    builds = sorted({r.torch_build for r in ranks})
    if len(builds) > 1:
        warnings.warn(f"ranks run different PyTorch builds ({', '.join(builds)}); groups that "
                      "would cross them use Gloo (plan one build per job)", stacklevel=3)


def gather_comm_ranks(topology: Sequence[Any], device: torch.device) -> list[CommRank]:
    """Every rank's :class:`~hetero_worker.comm.commplan.CommRank` (collective on the Gloo default group).

    Each rank contributes its PyTorch build, whether it trains on CUDA and its physical GPU as a
    fixed-size byte record (no pickling: ranks may run different builds, which is exactly what
    this finds out).

    Args:
        topology: ``Contract.topology``.
        device: this rank's training device.
    """
    mine = json.dumps({"build": torch_build(), "cuda": device.type == "cuda",
                       "gpu": physical_gpu_id(device)}).encode()[:IDENTITY_BYTES]
    record = torch.zeros(IDENTITY_BYTES, dtype=torch.uint8)
    record[:len(mine)] = torch.tensor(list(mine), dtype=torch.uint8)
    records = [torch.zeros_like(record) for _ in range(dist.get_world_size())]
    dist.all_gather(records, record)
    parsed = [json.loads(bytes(r.tolist()).rstrip(b"\0").decode()) for r in records]
    return comm_ranks(topology, torch_builds=[p["build"] for p in parsed],
                      on_cuda=[p["cuda"] for p in parsed],
                      physical_gpus=[p["gpu"] for p in parsed])


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
    gloo_intra = groups.intra_backend == GLOO
    if groups.layout.is_flat:
        gloo_collective_(tensor, lambda t: dist.all_reduce(t, group=groups.intra), gloo=gloo_intra)
        return nbytes if groups.intra_crosses else 0
    sent = 0
    multi = len(groups.intra_ranks) > 1
    if multi:
        gloo_collective_(tensor, lambda t: dist.reduce(t, dst=groups.leader, group=groups.intra),
                         gloo=gloo_intra)
        sent += nbytes if groups.intra_crosses else 0
    if groups.leaders is not None and leaders_reduce is not None:
        sent += leaders_reduce(tensor)
    elif groups.leaders is not None:
        gloo_collective_(tensor, lambda t: dist.all_reduce(t, group=groups.leaders), gloo=True)
        sent += nbytes if groups.leaders_cross else 0
    if multi:
        gloo_collective_(tensor, lambda t: dist.broadcast(t, src=groups.leader, group=groups.intra),
                         gloo=gloo_intra)
    return sent

