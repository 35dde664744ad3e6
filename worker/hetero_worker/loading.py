"""The Trainer's data loader (a mixin of :class:`hetero_worker.trainer.Trainer`): this rank's uneven
batches of the job's global order (:class:`hetero_worker.sampler.HeteroBatchSampler`), ending at
``HTJ_MAX_STEPS``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hetero_worker.sampler import BatchedTensors, HeteroBatchSampler, as_fetched


class Loading:
    """The Trainer's :meth:`loader` (a mixin of :class:`hetero_worker.trainer.Trainer`)."""

    def loader(self, dataset: Any, *, shuffle: bool = True,
               collate_fn: Callable[..., Any] | None = None,
               epochs: int | None = None, pin_memory: bool = False,
               num_workers: int = 0) -> torch.utils.data.DataLoader:
        """A ``DataLoader`` over this rank's uneven batches (:class:`HeteroBatchSampler`).

        Iterating it runs one epoch; every rank gets the same number of batches. Uses
        ``num_workers=0`` so split changes and checkpoints refer to the batch being trained.
        A ``TensorDataset`` with the default collation is fetched a batch at a time
        (:class:`BatchedTensors`: the same tensors, without a Python index and a stack per sample).

        Once :attr:`max_steps` steps are taken an iteration ends at once and moves to the next
        epoch, so a ``while t.epoch < n`` loop ends too.

        Args:
            epochs: how many epochs the script will run (None: unknown); with it the progress
                display shows a total (``epochs * batches per epoch``, at most
                :attr:`max_steps`), also without it when :attr:`max_steps` is set.
            pin_memory: PyTorch's ``DataLoader(pin_memory=...)``: batches in page-locked memory
                for faster host-to-GPU copies (``to_device`` copies non-blocking).
            num_workers: must be 0.

        Raises:
            ValueError: ``num_workers`` > 0: the DataLoader's workers fetch batches ahead, so a
                rebalanced split would train prefetched batches of the old sizes with the new
                weights, and a checkpoint would skip them on resume.
            TypeError: ``dataset`` has no ``len()`` (an ``IterableDataset``): every rank draws
                its share of each global batch from one permutation of a map-style dataset.
        """
        if num_workers:
            raise ValueError(
                f"Trainer.loader(num_workers={num_workers}): must be 0. Workers fetch batches "
                "ahead of training, so a rebalanced split would train prefetched batches of the "
                "old sizes and a checkpoint would skip them on resume; make a sample cheap to "
                "fetch instead (pre-tokenize, a TensorDataset).")
        if not hasattr(dataset, "__len__") or isinstance(dataset, torch.utils.data.IterableDataset):
            raise TypeError(
                f"Trainer.loader({type(dataset).__name__}): needs a map-style dataset (len() and "
                "indexing); an IterableDataset (a stream) is not supported: every rank takes its "
                "uneven share of each global batch from one permutation of the samples.")
        self.sampler = HeteroBatchSampler(len(dataset), self.local_batches, self.rank,
                                          seed=self.seed, shuffle=shuffle)
        if collate_fn is None and type(dataset) is torch.utils.data.TensorDataset:
            dataset, collate_fn = BatchedTensors(dataset), as_fetched
        total = None if epochs is None else int(epochs) * len(self.sampler)
        if self.max_steps is not None:
            total = self.max_steps if total is None else min(total, self.max_steps)
        if total is not None:
            self.metrics.set_total_steps(total)
        batches = _UntilMaxSteps(self.sampler, self) if self.max_steps is not None else self.sampler
        return torch.utils.data.DataLoader(dataset, batch_sampler=batches, collate_fn=collate_fn,
                                           num_workers=0, pin_memory=pin_memory)


class _UntilMaxSteps:
    """A batch sampler that yields the trainer's sampler's batches until ``trainer.done``; then
    the iteration ends and the epoch advances (the data position of a stopped run is not resumed:
    the run ends there)."""

    def __init__(self, sampler: HeteroBatchSampler, trainer: Any) -> None:
        self.sampler, self.trainer = sampler, trainer

    def __len__(self) -> int:
        """Batches left in this epoch, at most the steps left before ``max_steps``."""
        left = (self.trainer.max_steps or 0) - self.trainer.global_step
        return max(0, min(len(self.sampler), left))

    def __iter__(self) -> Any:
        if self.trainer.done:
            self.sampler.set_epoch(self.sampler.epoch + 1)
            return
        for batch in self.sampler:
            yield batch
            if self.trainer.done:
                self.sampler.set_epoch(self.sampler.epoch + 1)
                return

