"""Global-norm gradient clipping over every rank's gradients (issue 29, item 5; case 60).

``torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)`` sees only the gradients this
process holds. That is the whole gradient where it is replicated (no sharding: after the weighted
sync every rank holds the same full-batch gradient) but only a slice under sharding: under
``Full`` each rank holds its uneven flat slice (``htj_shard``), under ``Group`` its FSDP2 chunk of
its GPU-type group's copy (a ``DTensor``, whose norm the stock function reduces over the group's
mesh). Clipping Full's plain slices each by its own norm gives every rank another factor (case 60:
0.855, 0.742 and 0.931 where the full gradient's norm is 1.466; pytorch/pytorch#72548).

Here the norm is the full gradient's, counted once: the ranks of rank 0's *shard group* (the ranks
its gradient is split over: itself alone without sharding, its GPU-type group under ``Group``,
every rank under ``Full``) together hold each element exactly once, so they add the squares of what
they hold and every other rank adds 0; one float64 all-reduce (SUM) over the world group gives every
rank the same squared norm, hence the same factor ``min(1, max_norm / (norm + 1e-6))``, applied as
``torch.nn.utils.clip_grad_norm_`` applies it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["CLIP_EPS", "clip_grad_norm_", "global_grad_norm", "scale_grads_"]

CLIP_EPS = 1e-6
"""Added to the norm before dividing, as ``torch.nn.utils.clip_grad_norm_`` does."""


def _local_grads(params: Iterable[torch.nn.Parameter]) -> list[torch.Tensor]:
    """The gradients this rank holds (a DTensor's local chunk; parameters without one skipped)."""
    grads = []
    for p in params:
        g = p.grad
        if g is None:
            continue
        grads.append(g.to_local() if hasattr(g, "to_local") else g)
    return grads


def global_grad_norm(params: Iterable[torch.nn.Parameter], *, shard_ranks: Sequence[int],
                     group: Any = None) -> float:
    """The 2-norm of the full gradient of ``params`` over every rank (collective).

    Args:
        params: this rank's parameters (slices or DTensor chunks under sharding).
        shard_ranks: the global ranks this rank's gradient is sharded over, itself included:
            ``(rank,)`` without sharding, the GPU-type group's ranks under Group, every rank under
            Full (a sharding sync's ``intra_ranks``). Only the ranks of rank 0's shard group count
            their squares, so each element is counted once.
        group: the process group over all ranks (None: the default group; Gloo in this worker).

    Returns:
        The norm in float64 precision, the same on every rank (``inf``/``nan`` when a gradient
        is not finite).
    """
    grads = _local_grads(params)
    squares = torch.zeros((), dtype=torch.float64)
    if 0 in shard_ranks:
        for g in grads:
            squares += g.detach().double().square().sum().cpu()
    if dist.is_initialized():
        dist.all_reduce(squares, group=group)  # CPU float64: the Gloo world group
    return math.sqrt(squares.item())


def scale_grads_(params: Iterable[torch.nn.Parameter], factor: float) -> None:
    """Multiply every gradient this rank holds by ``factor`` in place (no communication)."""
    for g in _local_grads(params):
        g.detach().mul_(factor)


def clip_grad_norm_(params: Iterable[torch.nn.Parameter], max_norm: float, *,
                    shard_ranks: Sequence[int], group: Any = None) -> float:
    """Scale the gradients by ``min(1, max_norm / (norm + 1e-6))``, ``norm`` being the full
    gradient's over every rank (:func:`global_grad_norm`; collective, the same factor everywhere).

    Call it after the gradients are synchronised and unscaled (the fp16 loss scaler's
    ``unscale_``), before the optimizer step; ``Trainer(max_grad_norm=...)`` does.

    Args:
        params: this rank's parameters.
        max_norm: the largest norm kept (> 0).
        shard_ranks: see :func:`global_grad_norm`.
        group: see :func:`global_grad_norm`.

    Returns:
        The norm before clipping. A non-finite norm leaves the gradients as they are (under fp16
        the scaler skips that step on every rank).

    Raises:
        ValueError: ``max_norm`` is not a positive number.
    """
    if not max_norm > 0:
        raise ValueError(f"max_grad_norm must be a positive number, got {max_norm!r}")
    params = list(params)
    norm = global_grad_norm(params, shard_ranks=shard_ranks, group=group)
    if math.isfinite(norm):
        scale_grads_(params, min(1.0, max_norm / (norm + CLIP_EPS)))
    return norm
