"""Batch sampler for uneven local batches: equal step counts, each sample once per epoch.

Every epoch draws one permutation of the dataset from ``seed + epoch`` (identical on every rank).
Step ``s`` consumes the next ``B = sum(local_batches)`` positions of it; rank ``r`` takes the slice
starting at ``sum(local_batches[:r])`` of length ``local_batches[r]``. Hence

* every rank yields the same number of batches per epoch (it depends on ``B`` only), so no rank
  takes a different number of optimizer steps;
* the union of all ranks' batches in an epoch is a set: each sample at most once.

**Remainder rule.** An epoch ends when fewer than ``B`` samples of the permutation remain; those
are dropped. With a constant ``B`` that is the last ``len(dataset) % B`` samples of the epoch's
permutation: a different, seed-determined set each epoch, so every sample is used over epochs.

**Split change.** :meth:`HeteroBatchSampler.set_split` between two steps changes the slices from
the next batch on; since the sampler keeps a cursor into the permutation (not a step index), the
epoch still covers each sample at most once, and exactly once except the remainder. All ranks must
make the same change at the same step (the rebalancer decides collectively).

Batches are computed lazily, one per ``next()``. A ``DataLoader`` with workers asks for batches
ahead of training; the trainer's loader (:mod:`hetero_worker.loading`) therefore reads them with
:meth:`HeteroBatchSampler.batches_from` and moves the sampler's position only as batches are
trained, so a split change or a checkpoint refers to the batch actually trained.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Sampler

from hetero_worker.position import SplitPosition


class HeteroBatchSampler(SplitPosition, Sampler[list[int]]):
    """Yields this rank's index lists, one per optimizer step (the split, epoch and cursor are
    :class:`~hetero_worker.position.SplitPosition`'s).

    Args:
        num_samples: dataset length (>= global batch).
        local_batches: samples per step of every rank, ``len == world_size``, all >= 1.
        rank: this rank.
        seed: permutation seed, identical on every rank.
        shuffle: False uses ``0..n-1`` in order every epoch (remainder = the last samples).

    Attributes:
        epoch: current epoch (advances when an iteration runs to its end).
        cursor: samples of this epoch's permutation already handed out (all ranks together).

    Raises:
        ValueError: bad batches or rank, or a dataset smaller than one global batch.
    """

    def __init__(self, num_samples: int, local_batches: Sequence[int], rank: int, *,
                 seed: int = 0, shuffle: bool = True) -> None:
        self.num_samples = int(num_samples)
        self.seed = seed
        self.shuffle = shuffle
        SplitPosition.__init__(self, local_batches, rank)

    def check_split(self, batches: tuple[int, ...]) -> None:
        """A split's global batch must fit the dataset (:meth:`SplitPosition.set_split` calls it).

        Raises:
            ValueError: a global batch larger than the dataset.
        """
        if sum(batches) > self.num_samples:
            raise ValueError(f"global batch {sum(batches)} exceeds the dataset "
                             f"({self.num_samples} samples)")

    def permutation(self, epoch: int) -> torch.Tensor:
        """The epoch's order of sample indices, ``[num_samples]`` int64, same on every rank."""
        if not self.shuffle:
            return torch.arange(self.num_samples)
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.num_samples, generator=generator)

    def __len__(self) -> int:
        """Batches left in the current epoch under the current split."""
        return (self.num_samples - self.cursor) // self.global_batch

    def __iter__(self) -> Iterator[list[int]]:
        for batch, cursor in self.batches_from(self.epoch, self.cursor):
            self.cursor = cursor
            yield batch
        self.set_epoch(self.epoch + 1)

    def batches_from(self, epoch: int, cursor: int) -> Iterator[tuple[list[int], int]]:
        """This rank's batches of ``epoch`` from position ``cursor`` on, without moving the
        sampler: ``(indices, cursor after the batch)`` each, under the split current when each
        batch is made (the trainer's loader fetches ahead with it and moves :attr:`cursor` as
        batches are trained)."""
        order = self.permutation(epoch)
        while self.num_samples - cursor >= self.global_batch:
            mine = self.my_slice()
            batch = order[cursor + mine.start:cursor + mine.stop].tolist()
            cursor += self.global_batch
            yield batch, cursor

    def state_dict(self) -> dict[str, Any]:
        """The job's global data position (the same on every rank), plain types only.

        Returns:
            ``epoch``, ``consumed`` (samples of the epoch's global order handed out to all ranks
            together), ``seed``, ``shuffle``, ``num_samples``. No split and no per-rank position:
            any split and world size can continue from it.
        """
        return {"epoch": self.epoch, "consumed": self.cursor, "seed": self.seed,
                "shuffle": self.shuffle, "num_samples": self.num_samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at a saved global position under this sampler's split (which may differ).

        The next batch takes positions ``consumed + sum(local_batches[:rank])`` onwards of the
        epoch's order, so the samples before ``consumed`` are not seen again this epoch and none
        after it is skipped, whatever the new split or world size.

        Raises:
            ValueError: the position is for a dataset of another length, seed or order, or for
                a stream (:class:`hetero_worker.streaming.StreamPosition`).
        """
        if state.get("stream"):
            raise ValueError(f"checkpoint data position is of a stream (an IterableDataset, "
                             f"{state.get('consumed')} samples into pass {state.get('epoch')}) and "
                             "this job's loader reads a map-style dataset: resume with the same "
                             "kind of dataset")
        shuffle = bool(state.get("shuffle", self.shuffle))
        if (state["num_samples"], state["seed"], shuffle) != (self.num_samples, self.seed,
                                                               self.shuffle):
            raise ValueError(f"checkpoint data position is for {state['num_samples']} samples, "
                             f"seed {state['seed']}, shuffle {shuffle}; this sampler has "
                             f"{self.num_samples}, {self.seed}, {self.shuffle}")
        consumed = int(state["consumed"] if "consumed" in state else state["cursor"])
        if not 0 <= consumed <= self.num_samples:
            raise ValueError(f"checkpoint data position {consumed} outside 0..{self.num_samples}")
        self.epoch, self.cursor = int(state["epoch"]), consumed


class BatchedTensors(torch.utils.data.Dataset):
    """A ``TensorDataset`` that ``DataLoader`` fetches a whole batch at a time.

    ``__getitems__`` (which ``DataLoader``'s map-style fetcher calls when a dataset has it) returns
    each tensor's ``index_select`` of the batch's indices: what the default per-sample fetch plus ``default_collate``
    make of a ``TensorDataset`` batch (a list of stacked tensors, same values, dtypes and shapes),
    with one indexing op per tensor. The benchmark's 128-sample batches took 0.7 ms per step the
    default way, on the slowest rank's critical path.

    Args:
        inner: the user's dataset (its tensors are indexed, never copied up front).
    """

    def __init__(self, inner: torch.utils.data.TensorDataset) -> None:
        self.inner = inner

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
        return self.inner[index]

    def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
        index = torch.as_tensor(indices, dtype=torch.long)
        return [tensor.index_select(0, index.to(tensor.device)) for tensor in self.inner.tensors]


def as_fetched(batch: list[torch.Tensor]) -> list[torch.Tensor]:
    """Collation for :class:`BatchedTensors`: the batch is already collated."""
    return batch
