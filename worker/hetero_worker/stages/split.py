"""Cut a model given as a sequence of blocks into contiguous stages (pure torch, no communication).

The block counts come from the operator's stage planner (through ``HTJ_PIPELINE_STAGE_BLOCKS``)
or from the user; every rank cuts the same model the same way and keeps its own stage.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def stage_bounds(block_counts: Sequence[int], block_total: int) -> list[tuple[int, int]]:
    """``(first, end)`` of every stage: stage ``i`` holds blocks ``first <= j < end``.

    Args:
        block_counts: blocks per stage, pipeline order, each >= 1.
        block_total: blocks in the model.

    Raises:
        ValueError: a stage without blocks, or counts that do not add up to ``block_total``.
    """
    if not block_counts or min(block_counts) < 1:
        raise ValueError(f"every pipeline stage needs at least one block, got {list(block_counts)}")
    if sum(block_counts) != block_total:
        raise ValueError(f"the stages' block counts {list(block_counts)} add up to "
                         f"{sum(block_counts)}, the model has {block_total} blocks")
    bounds, first = [], 0
    for count in block_counts:
        bounds.append((first, first + count))
        first += count
    return bounds


def stage_module(model: nn.Sequential, block_counts: Sequence[int], stage_index: int) -> nn.Sequential:
    """Stage ``stage_index``'s blocks of ``model``, the same module objects (parameters shared).

    Raises:
        TypeError: ``model`` is not an ``nn.Sequential``.
        ValueError: bad counts (see :func:`stage_bounds`) or a stage index out of range.
    """
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"a pipelined model is an nn.Sequential of blocks, got {type(model).__name__}")
    bounds = stage_bounds(block_counts, len(model))
    if not 0 <= stage_index < len(bounds):
        raise ValueError(f"stage index {stage_index} outside 0..{len(bounds) - 1}")
    first, end = bounds[stage_index]
    return nn.Sequential(*list(model)[first:end])
