"""The pipeline's part of the rank env contract (issue 30): the stage layout every rank reads.

:class:`PipelineSettings` is the contract's ``pipeline`` group (:mod:`heterotrain_common.contract`
walks its fields like every other group; the names are in :mod:`heterotrain_common.envnames`).
All at their defaults (``stage_blocks == ()``) means no pipeline. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from heterotrain_common.envfields import count, one_of, var
from heterotrain_common.envnames import (PIPELINE_MICRO_BATCHES, PIPELINE_SCHEDULE, PIPELINE_STAGE,
                                         PIPELINE_STAGE_BLOCKS, PIPELINE_STAGE_RANKS)
from heterotrain_common.envread import ContractError
from heterotrain_common.pipelineschedules import SCHEDULES


def parse_counts(text: str, name: str) -> tuple[int, ...]:
    """``"8,3,1"`` -> ``(8, 3, 1)`` (each >= 1); blank -> ``()``.

    Raises:
        ContractError: an entry that is not an integer >= 1.
    """
    text = text.strip()
    if not text:
        return ()
    parts = [p.strip() for p in text.split(",")]
    if not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ContractError(name, f"must be integers >= 1 separated by commas, got {text!r}")
    return tuple(int(p) for p in parts)


def parse_stage_ranks(text: str, name: str) -> tuple[tuple[int, ...], ...]:
    """``"0,3;1,4"`` -> ``((0, 3), (1, 4))``; blank -> ``()``.

    Raises:
        ContractError: a stage without ranks or an entry that is not an integer >= 0.
    """
    text = text.strip()
    if not text:
        return ()
    stages = []
    for part in text.split(";"):
        ranks = [r.strip() for r in part.split(",")]
        if not all(r.isdigit() for r in ranks):
            raise ContractError(name, f"must be stages separated by ';', each its ranks (integers "
                                      f">= 0) separated by ',', got {text!r}")
        stages.append(tuple(int(r) for r in ranks))
    return tuple(stages)


def write_stage_ranks(stages: tuple[tuple[int, ...], ...]) -> str:
    """The inverse of :func:`parse_stage_ranks`."""
    return ";".join(",".join(str(r) for r in ranks) for ranks in stages)


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineSettings:
    """This rank's place in the pipeline (all at their defaults: no pipeline).

    Attributes:
        stage: this rank's stage (``HTJ_PIPELINE_STAGE``).
        stage_blocks: blocks per stage, pipeline order; ``()`` = no pipeline
            (``HTJ_PIPELINE_STAGE_BLOCKS``).
        stage_ranks: every stage's ranks, replica order (``HTJ_PIPELINE_STAGE_RANKS``).
        micro_batches: micro-batches per step, 0 without a pipeline (``HTJ_PIPELINE_MICRO_BATCHES``).
        schedule: ``1F1B`` or ``GPipe`` (``HTJ_PIPELINE_SCHEDULE``).
    """

    stage: int = var(PIPELINE_STAGE, count(0), default=0)
    stage_blocks: tuple[int, ...] = var(PIPELINE_STAGE_BLOCKS, parse_counts, default=(),
                                        write=lambda blocks: ",".join(map(str, blocks)))
    stage_ranks: tuple[tuple[int, ...], ...] = var(PIPELINE_STAGE_RANKS, parse_stage_ranks,
                                                   default=(), write=write_stage_ranks)
    micro_batches: int = var(PIPELINE_MICRO_BATCHES, count(0), default=0)
    schedule: str = var(PIPELINE_SCHEDULE, one_of(SCHEDULES), default=SCHEDULES[0])

    @property
    def enabled(self) -> bool:
        """True when the job runs as a pipeline."""
        return bool(self.stage_blocks)


def replica_of(settings: PipelineSettings, rank: int) -> int:
    """``rank``'s replica index in its stage (the pipeline it belongs to)."""
    return settings.stage_ranks[settings.stage].index(rank)


def check_pipeline(settings: PipelineSettings, rank: int, world_size: int) -> None:
    """Cross-check the pipeline variables with each other and with the rank.

    Raises:
        ContractError: naming the first offending variable: stage ranks not one entry per stage,
            not every rank exactly once, uneven replicas per stage, the rank outside its stage,
            no micro-batch.
    """
    if not settings.enabled:
        return
    s = settings
    if len(s.stage_ranks) != len(s.stage_blocks):
        raise ContractError(PIPELINE_STAGE_RANKS, f"has {len(s.stage_ranks)} stages but "
                            f"{PIPELINE_STAGE_BLOCKS} has {len(s.stage_blocks)}")
    flat = sorted(r for ranks in s.stage_ranks for r in ranks)
    if flat != list(range(world_size)):
        raise ContractError(PIPELINE_STAGE_RANKS, f"must name every rank 0..{world_size - 1} once "
                            f"(WORLD_SIZE={world_size}), got {write_stage_ranks(s.stage_ranks)!r}")
    if len({len(ranks) for ranks in s.stage_ranks}) != 1:
        raise ContractError(PIPELINE_STAGE_RANKS, "every stage must have the same number of "
                            f"replicas, got {write_stage_ranks(s.stage_ranks)!r}")
    if s.stage >= len(s.stage_blocks) or rank not in s.stage_ranks[s.stage]:
        raise ContractError(PIPELINE_STAGE, f"{s.stage} but rank {rank} is not among that stage's "
                            f"ranks in {PIPELINE_STAGE_RANKS}")
    if s.micro_batches < 1:
        raise ContractError(PIPELINE_MICRO_BATCHES, "must be >= 1 under a pipeline")
