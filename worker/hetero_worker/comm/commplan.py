"""The communicator rule, by construction: which process groups a job creates, on which backend.

Pure and torch-free. :func:`plan_communicators` maps the job's ranks (GPU type, node, physical GPU,
PyTorch build, CUDA or not) and a :class:`~heterotrain_common.topology.GroupLayout` to every group the
job creates, each with its backend; :mod:`hetero_worker.comm.groups` only carries the plan out.

The rule (docs/worker.md "Process groups and backends"):

* the default (world) group is **Gloo only**; it never holds an NCCL communicator, because a
  world-wide NCCL communicator spans GPU generations, where NCCL hangs in the field
  (NVIDIA/nccl#794 A100 + V100, #1184 A100 + H100, #1110 H100 + H800);
* a layout group gets **NCCL** only when every member runs on CUDA, shares one GPU type (GFD
  product, which carries the MIG profile as ``-MIG-<profile>``) and one PyTorch build, and no two
  members can sit on the same physical GPU: NCCL >= 2.5 refuses two ranks of one communicator on
  one GPU ("Duplicate GPU detected", NVIDIA/nccl#418, #103) and identifies a MIG instance by its
  parent GPU (NVIDIA/nccl#1716). Members whose physical GPU is known must all differ; a MIG or
  time-sliced (``-SHARED``) member whose GPU is unknown allows no other member on its node.
  Otherwise the group uses **Gloo**. A group of one on CUDA is NCCL (no peer at all);
* the leaders' group is always **Gloo** (it crosses nodes and GPU types);
* DDP gets the flat layout's NCCL group when that one exists (a single-type job), else the Gloo
  world group; the comm hook does the real reduction over the groups above.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from heterotrain_common.topology import GroupLayout

GLOO = "gloo"
NCCL = "nccl"
CPU_TYPE = "cpu"


@dataclass(frozen=True, kw_only=True, slots=True)
class CommRank:
    """What the rule needs to know about one rank.

    Attributes:
        rank: global rank.
        node: node name.
        gpu_type: GFD product with MIG profile (``"NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"``), possibly
            with GFD's ``-SHARED`` suffix under time-slicing; ``"cpu"`` for a CPU rank.
        torch_build: PyTorch build string, e.g. ``"2.13.0+cu128/nccl-2.27.5"``.
        on_cuda: True when the rank trains on a CUDA device.
        physical_gpu: identity of the physical GPU on ``node`` (PCI bus id), ``""`` when unknown.
    """

    rank: int
    node: str
    gpu_type: str
    torch_build: str
    on_cuda: bool
    physical_gpu: str = ""

    @property
    def may_share_gpu(self) -> bool:
        """True for a MIG slice or a time-sliced (``-SHARED``) device: other ranks may sit on the
        same physical GPU."""
        return "-MIG-" in self.gpu_type or self.gpu_type.endswith("-SHARED")


@dataclass(frozen=True, kw_only=True, slots=True)
class CommGroup:
    """One process group of the plan.

    Attributes:
        role: ``"world"`` (the default group), ``"intra"`` (a layout group) or ``"leaders"``.
        ranks: ascending global ranks.
        backend: ``"gloo"`` or ``"nccl"``.
        reason: why this backend, one short phrase (logged and shown by tests).
    """

    role: str
    ranks: tuple[int, ...]
    backend: str
    reason: str


@dataclass(frozen=True, kw_only=True, slots=True)
class CommPlan:
    """Every group a job uses, in creation order.

    Attributes:
        layout: the layout the plan carries out.
        world: the default group (always Gloo).
        intra: one group per layout group, same order as ``layout.groups``; for a flat layout on
            Gloo this is the world group itself (nothing to create).
        leaders: the leaders' group (Gloo) when the layout has >= 2 groups, else None.
        ddp: the group DDP is built on.
    """

    layout: GroupLayout
    world: CommGroup
    intra: tuple[CommGroup, ...]
    leaders: CommGroup | None
    ddp: CommGroup

    def to_create(self) -> list[CommGroup]:
        """Groups to create with ``new_group``, in order (every rank creates every one, case 16):
        the intra groups that are not the world group, then the leaders' group."""
        made = [g for g in self.intra if g is not self.world]
        return made + ([self.leaders] if self.leaders is not None else [])

    def intra_of(self, rank: int) -> CommGroup:
        """The intra group holding ``rank``.

        Raises:
            KeyError: no group holds it.
        """
        for group in self.intra:
            if rank in group.ranks:
                return group
        raise KeyError(f"rank {rank} is in no group of {[g.ranks for g in self.intra]}")


def nccl_verdict(members: Sequence[CommRank]) -> tuple[bool, str]:
    """Whether an NCCL communicator may hold exactly ``members``, and why (see module docstring).

    Returns:
        ``(allowed, reason)``.
    """
    if not members:
        return False, "empty group"
    if not all(m.on_cuda for m in members):
        return False, "a member is not on CUDA"
    types = sorted({m.gpu_type for m in members})
    if len(types) > 1:
        return False, f"crosses GPU types {', '.join(types)}"
    builds = sorted({m.torch_build for m in members})
    if len(builds) > 1:
        return False, f"crosses PyTorch builds {', '.join(builds)}"
    if len(members) == 1:
        return True, "one rank"
    known = [(m.node, m.physical_gpu) for m in members if m.physical_gpu]
    if len(set(known)) < len(known):
        return False, "two members on one physical GPU"
    for m in members:
        if m.may_share_gpu and not m.physical_gpu:
            if any(o.node == m.node and o.rank != m.rank for o in members):
                return False, f"{m.gpu_type} on {m.node} may share its GPU with another member"
    return True, f"one GPU type ({types[0]}) and PyTorch build"


def plan_communicators(ranks: Sequence[CommRank], layout: GroupLayout) -> CommPlan:
    """Apply the communicator rule to ``layout``.

    Args:
        ranks: one entry per rank, index = global rank (identical on every rank).
        layout: from :func:`heterotrain_common.topology.build_layout` (``auto`` already resolved).

    Returns:
        The :class:`CommPlan`; identical on every rank for identical inputs.

    Raises:
        ValueError: ``ranks`` is not indexed by rank or the layout names a rank outside it.
    """
    if [r.rank for r in ranks] != list(range(len(ranks))):
        raise ValueError(f"ranks must be ordered 0..{len(ranks) - 1}, got {[r.rank for r in ranks]}")
    everyone = tuple(range(len(ranks)))
    if sorted(r for g in layout.groups for r in g) != list(everyone):
        raise ValueError(f"layout {layout.groups} does not partition ranks 0..{len(ranks) - 1}")
    world = CommGroup(role="world", ranks=everyone, backend=GLOO,
                      reason="default group: Gloo only, never a world-wide NCCL")
    intra = []
    for members in layout.groups:
        allowed, why = nccl_verdict([ranks[r] for r in members])
        if members == everyone and not allowed:
            intra.append(world)  # flat on Gloo: the world group itself
            continue
        intra.append(CommGroup(role="intra", ranks=tuple(members),
                               backend=NCCL if allowed else GLOO, reason=why))
    leaders = None
    if len(layout.groups) > 1:
        leaders = CommGroup(role="leaders", ranks=tuple(layout.leaders), backend=GLOO,
                            reason="leaders cross nodes and GPU types: always Gloo")
    ddp = intra[0] if layout.is_flat and intra[0].backend == NCCL else world
    return CommPlan(layout=layout, world=world, intra=tuple(intra), leaders=leaders, ddp=ddp)


def comm_ranks(topology: Sequence[object], *, torch_builds: Sequence[str],
               on_cuda: Sequence[bool], physical_gpus: Sequence[str] | None = None) -> list[CommRank]:
    """:class:`CommRank` per rank from the contract's topology entries plus what each rank reported.

    Args:
        topology: ``Contract.topology`` (``rank``, ``node``, ``gpu_product`` per entry).
        torch_builds: each rank's PyTorch build (gathered at start-up).
        on_cuda: whether each rank trains on CUDA.
        physical_gpus: each rank's physical GPU id on its node (``""`` unknown); default all unknown.

    Raises:
        ValueError: lengths differ.
    """
    n = len(topology)
    physical = list(physical_gpus) if physical_gpus is not None else [""] * n
    if not len(torch_builds) == len(on_cuda) == len(physical) == n:
        raise ValueError("topology, torch_builds, on_cuda and physical_gpus need one entry per rank")
    return [CommRank(rank=e.rank, node=e.node,  # type: ignore[attr-defined]
                     gpu_type=e.gpu_product or CPU_TYPE,  # type: ignore[attr-defined]
                     torch_build=torch_builds[i], on_cuda=bool(on_cuda[i]),
                     physical_gpu=physical[i]) for i, e in enumerate(topology)]


def rule_violations(ranks: Sequence[CommRank],
                    created: Iterable[tuple[str, Sequence[int] | None]]) -> list[str]:
    """Check groups that were actually created against the rule.

    Args:
        ranks: the job's ranks.
        created: ``(backend, ranks)`` per created group; ``ranks`` None means the world group.
            ``backend`` is torch's string (``"gloo"``, ``"nccl"``, ``"cpu:gloo,cuda:nccl"``).

    Returns:
        One message per violating group (empty when the rule holds).
    """
    problems = []
    for backend, members in created:
        member_ranks = list(range(len(ranks))) if members is None else sorted(members)
        if NCCL not in backend.lower():
            continue
        if members is None:
            problems.append(f"default group has backend {backend!r} (must be Gloo only)")
            continue
        allowed, why = nccl_verdict([ranks[r] for r in member_ranks])
        if not allowed:
            problems.append(f"NCCL group {member_ranks}: {why}")
    return problems
