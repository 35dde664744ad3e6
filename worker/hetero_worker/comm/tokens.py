"""Token-weighted steps: the update is the mean over every valid token of the global batch
(issue 29, item 6; case 59).

The weighted sync (:mod:`hetero_worker.comm.sync`) weights rank r's mean loss by ``b_r / B``
(samples) and a micro-batch by its share of the rank's samples, which makes the update the
full-batch mean *per sample*. A language model's loss is a mean *per valid token*
(``F.cross_entropy(..., ignore_index=-100)``); with uneven batches and lengths a token on rank r
then weighs ``(b_r / B) / n_r`` instead of ``1 / N`` (``n_r`` the rank's valid tokens, ``N`` the
job's): case 59 is 14 % off the single-process token mean, 25 % with micro-batches
(huggingface/transformers#34242, pytorch/torchtitan#1842).

Given each rank's count (``Trainer.step(..., num_tokens=n)``), one all-reduce of the counts per
step gives ``N``; rank r's loss is multiplied by :attr:`TokenWeights.loss_factor`
``(n_r / N) / (b_r / B)``, so whatever the sync does with ``b_r / B`` (DDP hook, flat fast path,
codecs, Group or Full sharding) the rank weighs ``n_r / N``; and a micro-batch m of the rank weighs
``n_m / n_r`` instead of its share of the samples (:func:`micro_token_weighted`). The sum is
``sum_r (n_r / N) * sum_m (n_m / n_r) * grad(S_m / n_m) = grad(sum of all token losses) / N``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["TokenWeights", "agree_tokens", "micro_token_weighted", "per_sample_counts"]

COUNT_FIX = ("pass each sample's count, e.g. num_tokens=(labels != -100).sum(dim=1)")


def per_sample_counts(num_tokens: Any, batch: Sequence[Any]) -> torch.Tensor:
    """``num_tokens`` as a 1-D float64 CPU tensor of each sample's valid tokens.

    Args:
        num_tokens: each sample's count (a tensor or sequence).
        batch: the local batch's tensors, samples along dim 0.

    Raises:
        ValueError: not one non-negative count per sample (the message names the fix).
    """
    samples = next((len(t) for t in batch if isinstance(t, torch.Tensor) and t.dim() > 0), 0)
    counts = torch.as_tensor(num_tokens).detach().to("cpu", torch.float64)
    if counts.dim() != 1 or counts.numel() != samples:
        raise ValueError(f"t.step(batch=..., num_tokens=...) needs one count per sample of the "
                         f"batch ({samples}), got shape {tuple(counts.shape)}: {COUNT_FIX}")
    if bool((counts < 0).any()):
        raise ValueError(f"num_tokens has a negative count: {COUNT_FIX}")
    return counts


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenWeights:
    """One step's token counts.

    Attributes:
        rank_tokens: this rank's valid tokens ``n_r``.
        total_tokens: every rank's together, ``N``.
        sample_weight: the sync's weight of this rank, ``b_r / B``.
    """

    rank_tokens: float
    total_tokens: float
    sample_weight: float

    @property
    def loss_factor(self) -> float:
        """``(n_r / N) / (b_r / B)``: on top of the sync's ``b_r / B`` the rank weighs ``n_r / N``."""
        return self.rank_tokens / self.total_tokens / self.sample_weight


def agree_tokens(rank_tokens: float, *, local_batches: Sequence[int], rank: int,
                 group: Any = None) -> TokenWeights:
    """Sum every rank's token count (one float64 all-reduce over ``group``; collective: every
    rank passes its count in the same step).

    Args:
        rank_tokens: this rank's valid tokens in its local batch.
        local_batches: the split (the sync's sample weights), ``len == world_size``.
        rank: this rank.
        group: the process group over all ranks (None: the default one, Gloo in this worker).

    Raises:
        ValueError: no rank has a valid token (raised on every rank alike).
    """
    total = torch.tensor(float(rank_tokens), dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(total, group=group)
    if not total.item() > 0:
        raise ValueError("num_tokens: no rank has a valid token in this step (every label is "
                         "padding?); skip such a batch on every rank")
    return TokenWeights(rank_tokens=float(rank_tokens), total_tokens=total.item(),
                        sample_weight=local_batches[rank] / sum(local_batches))


def micro_token_weighted(loss_fn: Callable[..., torch.Tensor], batch: Sequence[Any],
                         counts: torch.Tensor
                         ) -> tuple[Callable[..., torch.Tensor], tuple[Any, ...]]:
    """``(loss_fn', batch')`` for :func:`hetero_worker.memory.microbatch.accumulate` that weigh
    each micro-batch by its share of the rank's tokens instead of its share of the samples.

    ``batch'`` carries ``counts`` as its last tensor, so each micro-batch receives its own slice;
    ``loss_fn'(model, *micro, counts_m)`` is ``loss_fn(model, *micro)`` times
    ``(n_m / n_r) / (len_m / b_r)``, which the accumulation's sample share ``len_m / b_r`` turns
    into ``n_m / n_r``. The returned loss is then the rank's token mean.

    Args:
        loss_fn: ``loss_fn(model, *micro_batch)``, the token mean of that micro-batch.
        batch: the local batch's tensors (samples along dim 0).
        counts: :func:`per_sample_counts` of the batch (``n_r = counts.sum() > 0``).
    """
    samples, rank_tokens = counts.numel(), counts.sum().item()

    def weighted(model: Any, *micro: Any) -> torch.Tensor:
        *parts, micro_counts = micro
        if not rank_tokens:  # the rank weighs 0 (TokenWeights.loss_factor)
            return loss_fn(model, *parts) * 0.0
        share = micro_counts.sum().item() / rank_tokens * samples / micro_counts.numel()
        return loss_fn(model, *parts) * share

    return weighted, (*batch, counts)
