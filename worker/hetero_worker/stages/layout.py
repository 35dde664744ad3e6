"""Which rank runs which stage, and the process groups of a pipeline with data parallelism inside
every stage (issue 30, item 3).

A layout lists each stage's ranks (its replicas). Every stage has the same replica count ``R`` in
this slice: replica ``r`` of every stage forms pipeline ``r`` (its activations travel on a Gloo
group of its own), and a stage's replicas average their gradients on the stage's group after the
backward (:func:`reduce_stage_gradients_`). A stage's replicas are of one GPU type, so its group
may use that type's backend; the pipeline groups span types and are always Gloo.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from hetero_worker.comm.collectives import flat_reduce_, gloo_collective_


@dataclass(frozen=True, kw_only=True, slots=True)
class StageLayout:
    """Ranks per stage.

    Attributes:
        stage_ranks: ``stage_ranks[i]`` = the global ranks of stage ``i``, replica order.
    """

    stage_ranks: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        counts = {len(r) for r in self.stage_ranks}
        if not self.stage_ranks or min(counts) < 1:
            raise ValueError("every stage needs at least one rank")
        if len(counts) != 1:
            raise ValueError(f"every stage needs the same number of replicas in this version, got "
                             f"{[len(r) for r in self.stage_ranks]}")
        flat = [rank for ranks in self.stage_ranks for rank in ranks]
        if sorted(flat) != list(range(len(flat))):
            raise ValueError(f"the stages' ranks must be 0..{len(flat) - 1}, each once, got {flat}")

    @property
    def replicas(self) -> int:
        """Replicas per stage (pipelines side by side)."""
        return len(self.stage_ranks[0])

    def pipelines(self) -> list[list[int]]:
        """``pipelines()[r]`` = replica ``r`` of every stage, stage order."""
        return [[ranks[r] for ranks in self.stage_ranks] for r in range(self.replicas)]

    def place(self, rank: int) -> tuple[int, int]:
        """``(stage index, replica)`` of ``rank``.

        Raises:
            ValueError: a rank in no stage.
        """
        for stage, ranks in enumerate(self.stage_ranks):
            if rank in ranks:
                return stage, ranks.index(rank)
        raise ValueError(f"rank {rank} is in no stage")


@dataclass(frozen=True, slots=True)
class StageGroups:
    """This rank's groups: its pipeline's (Gloo, stage order) and its stage's replicas'."""

    pipeline: dist.ProcessGroup
    stage: dist.ProcessGroup


def build_stage_groups(layout: StageLayout, rank: int, *, stage_backend: str = "gloo") -> StageGroups:
    """Create every pipeline and stage group on every rank (``new_group`` is collective, so all
    ranks create all groups in the same order) and return this rank's two.

    Args:
        layout: the stages' ranks.
        rank: this process's global rank.
        stage_backend: backend of the stages' replica groups (one GPU type each); pipelines are Gloo.
    """
    stage_index, replica = layout.place(rank)
    pipelines = [dist.new_group(ranks, backend="gloo") for ranks in layout.pipelines()]
    stages = [dist.new_group(list(ranks), backend=stage_backend) for ranks in layout.stage_ranks]
    return StageGroups(pipeline=pipelines[replica], stage=stages[stage_index])


def reduce_stage_gradients_(module: nn.Module, group: dist.ProcessGroup) -> None:
    """Average ``module``'s gradients over the stage's replicas (one flat all-reduce, then divide
    by the replica count); every replica must have run the same micro-batch count."""
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    size = dist.get_world_size(group)
    if size == 1 or not grads:
        return

    def reduce(flat: torch.Tensor) -> None:
        gloo_collective_(flat, lambda t: dist.all_reduce(t, group=group),
                         gloo=dist.get_backend(group) == "gloo")
        flat.div_(size)

    flat_reduce_(grads, reduce)
