"""The BatchNorm policy under uneven per-rank batches and micro-batches (shared/cases/57).

A heterogeneous job gives ranks deliberately unequal batches (an A100 with 7 samples beside a T4
with 2) and cuts a rank's batch into micro-batches (:mod:`hetero_worker.memory.microbatch`).
BatchNorm in training normalises each forward's input by that input's own mean and variance, so:

* a piece of **one sample** makes ``BatchNorm`` raise ("Expected more than 1 value per channel when
  training", pytorch#4534) in the middle of a run;
* otherwise every rank normalises by its own batch (plain DDP does too), and a rank with
  micro-batches by each micro-batch: the update is not the full-batch update the rest of the
  product reproduces, and the running statistics differ per rank (DDP copies rank 0's buffers at
  each forward).

**Policy** (:func:`check_norm_layers`, called by ``Trainer.wrap``): the worker does not combine
BatchNorm statistics across ranks.  It

* **refuses** at wrap a model with BatchNorm when this rank would run a one-sample piece (a local
  batch of 1, or micro-batches of which the smallest holds 1), naming the rank and the layer;
* **refuses** ``SyncBatchNorm`` on a rank that runs several micro-batches: it synchronises on every
  forward, so ranks running different numbers of forwards would mismatch their collectives;
* **warns** (:class:`BatchNormWarning`, on stderr, naming the layers) for any other BatchNorm: the
  statistics are per rank and per micro-batch.  The alternatives: ``GroupNorm`` or ``LayerNorm``
  (per sample: exact under any split, tested against the full-batch reference), or ``SyncBatchNorm``
  on GPU ranks without micro-batches (torch weights each rank's statistics by its sample count).

Micro-batches are cut balanced (7 with a bound of 3: 3, 2, 2), so a one-sample piece arises only when
the bound itself forces it (a bound of 1, or 2 with an odd batch).
"""

from __future__ import annotations

import warnings

import torch

from hetero_worker.memory.microbatch import micro_slices

__all__ = ["BatchNormWarning", "batchnorm_layers", "check_norm_layers", "smallest_piece"]

ALTERNATIVES = ("GroupNorm or LayerNorm (per sample: the same under any split), or SyncBatchNorm on "
                "GPU ranks without micro-batches")


class BatchNormWarning(UserWarning):
    """BatchNorm layers normalise per rank (and per micro-batch) in this job."""


def batchnorm_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``(qualified name, module)`` of every BatchNorm layer (``SyncBatchNorm`` included)."""
    return [(name or type(model).__name__, m) for name, m in model.named_modules()
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]


def smallest_piece(local_batch: int, micro_batch_size: int) -> int:
    """Samples in the smallest micro-batch this rank runs (the local batch without micro-batches)."""
    return min(hi - lo for lo, hi in micro_slices(local_batch, micro_batch_size))


def check_norm_layers(model: torch.nn.Module, *, rank: int, local_batch: int,
                      micro_batch_size: int) -> str:
    """Apply the BatchNorm policy to ``model`` on this rank (see the module docstring).

    Args:
        model: the user's model, before wrapping.
        rank: this rank (named in the messages).
        local_batch: its samples per step.
        micro_batch_size: ``HTJ_MICRO_BATCH_SIZE`` (0: the whole local batch at once).

    Returns:
        The warning text (also issued as :class:`BatchNormWarning`), ``""`` without BatchNorm.

    Raises:
        ValueError: a BatchNorm layer would see one sample on this rank, or ``SyncBatchNorm`` with
            several micro-batches; names the rank, the layer, the sizes and the fix.
    """
    layers = batchnorm_layers(model)
    if not layers:
        return ""
    pieces = micro_slices(local_batch, micro_batch_size)
    smallest = min(hi - lo for lo, hi in pieces)
    name, layer = layers[0]
    cut = (f"its local batch of {local_batch} in micro-batches of at most {micro_batch_size} "
           f"(HTJ_MICRO_BATCH_SIZE): {[hi - lo for lo, hi in pieces]}") if len(pieces) > 1 else (
        f"its local batch of {local_batch}")
    if smallest < 2:
        raise ValueError(
            f"rank {rank}: {type(layer).__name__} layer {name!r} would normalise one sample "
            f"({cut}), which BatchNorm refuses in training (\"Expected more than 1 value per "
            f"channel\"): use {ALTERNATIVES}, or give this rank at least 2 samples per micro-batch "
            "(a larger spec.training.globalBatchSize or more memory per rank)")
    syncs = [n for n, m in layers if isinstance(m, torch.nn.SyncBatchNorm)]
    if syncs and len(pieces) > 1:
        raise ValueError(
            f"rank {rank}: SyncBatchNorm layer {syncs[0]!r} synchronises on every forward, and this "
            f"rank runs {len(pieces)} micro-batches ({cut}) while others may run another number: "
            "their collectives would not match. Use GroupNorm or LayerNorm, or plain BatchNorm "
            "(per micro-batch statistics)")
    names = ", ".join(repr(n) for n, _ in layers[:5]) + (" ..." if len(layers) > 5 else "")
    where = "per rank and per micro-batch" if len(pieces) > 1 else "per rank"
    message = (f"rank {rank}: BatchNorm layers {names} normalise {where} ({cut}): the update is "
               "not the full-batch one and the running statistics differ between ranks. For "
               f"the full-batch update use {ALTERNATIVES}")
    if syncs:
        return ""  # SyncBatchNorm on one forward per step: statistics over every rank's batch
    warnings.warn(message, BatchNormWarning, stacklevel=3)
    return message
