"""Micro-batches with gradient accumulation: a rank's local batch in memory-sized pieces (issue 12).

The planner sets ``HTJ_MICRO_BATCH_SIZE`` where a rank's share of the global batch does not fit its
memory at once.  :func:`accumulate` runs the local batch as ``ceil(local / m)`` forward/backward
passes; each micro-batch's *mean* loss is weighted by ``len(micro) / len(local)``, so the
accumulated gradient is the gradient of the local mean loss, exactly what one pass over the whole
local batch gives.  Gradient synchronisation happens once per step: every micro-batch but the last
runs under DDP's ``no_sync()`` (PyTorch's own accumulation path: DDP reduces the accumulated
gradients in the last backward; ``torch.nn.parallel.DistributedDataParallel.no_sync`` docs), or
with FSDP2's ``set_requires_gradient_sync(False)`` under Group sharding.

Activation checkpointing (``HTJ_ACTIVATION_CHECKPOINTING=1``): :func:`checkpoint_blocks` wraps the
forward of each instance of the user's block class in ``torch.utils.checkpoint.checkpoint``
(non-reentrant), so a block keeps only its inputs for backward and recomputes the rest.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from heterotrain_common.split import split_batch

__all__ = ["accumulate", "checkpoint_blocks", "even_slices", "micro_slices"]


def micro_slices(n: int, micro_batch_size: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` ranges of at most ``micro_batch_size`` samples covering ``0..n``, balanced:
    the fewest pieces that fit (``ceil(n / micro_batch_size)``), their sizes differing by at most
    one (:func:`even_slices`), so no piece is a small remainder (shared/cases/57: a one-sample
    piece makes BatchNorm raise in training).

    Args:
        n: samples in the local batch (>= 1).
        micro_batch_size: most samples per micro-batch; 0 = all at once.

    Returns:
        e.g. ``micro_slices(7, 3) == [(0, 3), (3, 5), (5, 7)]`` (3, 2, 2; not 3, 3, 1).
    """
    if micro_batch_size <= 0 or micro_batch_size >= n:
        return [(0, n)]
    return even_slices(n, -(-n // micro_batch_size))


def even_slices(n: int, count: int) -> list[tuple[int, int]]:
    """``count`` ranges of sizes differing by at most one covering ``0..n`` (the one splitter's
    equal split, :func:`heterotrain_common.split.split_batch`: the larger pieces first); empty
    ranges (``lo == hi``) when ``n < count``.

    Under Group sharding every rank of a group runs the same number of micro-batches (FSDP2's
    gathers and reduce-scatters are collectives of the group), so a rank with fewer samples splits
    them into as many pieces as its busiest group member needs.

    Returns:
        e.g. ``even_slices(8, 3) == [(0, 3), (3, 6), (6, 8)]``, ``even_slices(2, 3) == [(0, 1),
        (1, 2), (2, 2)]``.
    """
    ends = [0, *itertools.accumulate(split_batch(n, [1] * count, min_batch=0))]
    return list(zip(ends, ends[1:]))


def _batch_len(batch: Sequence[Any]) -> int:
    sizes = {len(t) for t in batch if isinstance(t, torch.Tensor) and t.dim() > 0}
    if len(sizes) != 1:
        raise ValueError("Trainer.step(batch=...) takes a tuple of tensors that share their first "
                         f"dimension (the samples), got first dimensions {sorted(sizes)}")
    return sizes.pop()


def accumulate(model: torch.nn.Module, loss_fn: Callable[..., torch.Tensor], batch: Sequence[Any],
               micro_batch_size: int, *, autocast: Callable[[], Any],
               backward: Callable[[torch.Tensor], None],
               around_micro: Callable[[], Any] | None = None,
               count: int | None = None) -> torch.Tensor:
    """Forward and backward of the local batch in micro-batches, one synchronisation at the end.

    Args:
        model: the wrapped model (DDP: ``no_sync()`` is used for all but the last micro-batch).
        loss_fn: ``loss_fn(model, *micro_batch)`` returns the *mean* loss over that micro-batch.
        batch: tensors with the local batch's samples along dim 0 (non-tensors passed through).
        micro_batch_size: most samples per micro-batch; 0 = the whole local batch at once.
        autocast: the rank's autocast context factory.
        backward: ``backward(weighted_loss)`` (scaler and sync weighting applied by the caller).
        around_micro: optional context factory entered around each micro-batch's forward and
            backward (the simulated memory cap, :mod:`hetero_worker.memory.caps`).
        count: run exactly this many micro-batches (:func:`even_slices`; Group sharding: the
            group's largest count); an empty one runs the first sample with weight 0, so the
            group's collectives stay matched and the gradient is unchanged.

    Returns:
        The local batch's mean loss (detached), equal to one pass over the whole batch.
    """
    n = _batch_len(batch)
    slices = micro_slices(n, micro_batch_size) if count is None else even_slices(n, count)
    total = torch.zeros((), dtype=torch.float64)
    no_sync = getattr(model, "no_sync", None)
    fsdp_sync = getattr(model, "set_requires_gradient_sync", None)  # FSDP2 (Group sharding)
    for i, (lo, hi) in enumerate(slices):
        empty = hi == lo
        take = (0, 1) if empty else (lo, hi)
        micro = [t[take[0]:take[1]] if isinstance(t, torch.Tensor) and t.dim() > 0 else t
                 for t in batch]
        last = i == len(slices) - 1
        if fsdp_sync is not None:
            fsdp_sync(last)  # reduce-scatter inside the group in the last backward only
        sync_ctx = contextlib.nullcontext() if last or no_sync is None else no_sync()
        with sync_ctx, (around_micro() if around_micro else contextlib.nullcontext()):
            with autocast():
                loss = loss_fn(model, *micro)
            weighted = loss * ((hi - lo) / n) if len(slices) > 1 else loss  # 0 when empty
            backward(weighted)
        total += weighted.detach().double().cpu()
    return total


def checkpoint_blocks(model: torch.nn.Module, block: type[torch.nn.Module] | None) -> int:
    """Recompute each ``block`` instance's activations in backward (``torch.utils.checkpoint``).

    Args:
        model: the user's model (before DDP).
        block: the class whose instances are checkpointed (e.g. the transformer layer); None:
            nothing to checkpoint.

    Returns:
        How many modules were wrapped.
    """
    if block is None:
        return 0
    count = 0
    for module in model.modules():
        if isinstance(module, block) and not getattr(module, "_htj_checkpointed", False):
            forward = module.forward
            module.forward = functools.partial(checkpoint, forward, use_reentrant=False)  # type: ignore[method-assign]
            module._htj_checkpointed = True  # type: ignore[attr-defined]
            count += 1
    return count
