"""The Trainer's loader over an ``IterableDataset`` (a stream): this rank's uneven share of every
global batch of the stream's order (issue 22).

Every rank reads the same stream in the same order (the same files, shards and shuffle seed on
every rank) and cuts it like the map-style sampler cuts its permutation: step ``s`` consumes the
next ``B = sum(local_batches)`` samples, and rank ``r`` keeps the ``local_batches[r]`` of them
starting at ``sum(local_batches[:r])``. Hence, as for a map-style dataset:

* each sample of the stream is trained once per epoch, by one rank; the update is the
  full-batch gradient of the step's ``B`` samples (the gradient sync weighs rank ``r`` by
  ``local_batches[r] / B``);
* every rank takes the same number of steps: the epoch ends, on every rank at the same step,
  when fewer than ``B`` samples remain (those are dropped: the remainder rule), with no
  collective to agree on it;
* a split change applies from the next step (the slices are cut in the training process, so
  samples the ``DataLoader``'s workers fetched ahead need no refetch);
* a checkpoint holds the samples consumed by the steps trained (``epoch``, ``consumed``); a
  resume, under the same plan or a new one, reads past that many samples of the epoch's stream
  and continues.

The cost: every rank reads every sample of the stream (and drops the others' shares). With
``num_workers > 0`` the ``DataLoader`` replicates the dataset into each worker, as in PyTorch: the
dataset must split itself over the workers (``torch.utils.data.get_worker_info()``, e.g. sample
``i`` to worker ``i % num_workers``, which keeps the stream's order), or each worker yields the
whole stream. Before each epoch's pass ``dataset.set_epoch(epoch)`` is called where the dataset has
it (Hugging Face streaming datasets reshuffle with it; the workers are started anew for each pass,
``persistent_workers`` being refused by :meth:`hetero_worker.loading.TrainData.loader`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

import torch
from torch.utils.data import default_collate
from torch.utils.data._utils.pin_memory import pin_memory as pin_batch

from hetero_worker.position import SplitPosition
from hetero_worker.steps import StepLimit


class StreamPosition(SplitPosition):
    """The job's position in a stream: the trainer's ``sampler`` for an ``IterableDataset`` (the
    split, epoch and cursor are :class:`~hetero_worker.position.SplitPosition`'s; any global
    batch fits a stream).

    Args:
        local_batches: samples per step of every rank.
        rank: this rank.

    Attributes:
        epoch: passes over the stream completed.
        cursor: samples of this epoch's pass consumed by the steps trained (all ranks together).
    """

    def state_dict(self) -> dict[str, Any]:
        """``stream`` (True), ``epoch``, ``consumed``: the same on every rank, plain types."""
        return {"stream": True, "epoch": self.epoch, "consumed": self.cursor}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at a saved position (any split or world size).

        Raises:
            ValueError: the position is of a map-style dataset's sampler, or negative.
        """
        if not state.get("stream"):
            raise ValueError(f"checkpoint data position is of a map-style dataset "
                             f"({state.get('num_samples')} samples) and this job's loader reads "
                             "a stream (an IterableDataset): resume with the same kind of dataset")
        consumed = int(state["consumed"])
        if consumed < 0:
            raise ValueError(f"checkpoint stream position {consumed} is negative")
        self.epoch, self.cursor = int(state["epoch"]), consumed


class StreamLoader:
    """Iterating it runs one pass of the stream: this rank's batches, collated (and pinned).

    Args:
        dataset: the ``IterableDataset``.
        position: the trainer's :class:`StreamPosition` (moved as batches are handed out).
        steps: the step count: ``done`` (``HTJ_MAX_STEPS`` reached) ends the pass.
        collate_fn: makes a batch of this rank's samples (None: ``default_collate``).
        pin_memory: pin each batch's tensors (page-locked, for non-blocking host-to-GPU copies).
        **dataloader_args: the inner per-sample ``DataLoader``'s arguments (``num_workers``,
            ``prefetch_factor``, ``worker_init_fn``, ...).
    """

    def __init__(self, dataset: torch.utils.data.IterableDataset, position: StreamPosition,
                 steps: StepLimit, *, collate_fn: Callable[..., Any] | None = None,
                 pin_memory: bool = False, **dataloader_args: Any) -> None:
        self.dataset, self.position, self.steps = dataset, position, steps
        self.collate_fn = collate_fn or default_collate
        self.pin_memory = bool(pin_memory) and torch.cuda.is_available()
        self._own_generator = dataloader_args.get("generator") is None
        if self._own_generator:  # not the global RNG (see HeteroLoader._fetching)
            dataloader_args["generator"] = torch.Generator()
        self.samples = torch.utils.data.DataLoader(dataset, batch_size=None, **dataloader_args)
        self.num_workers = self.samples.num_workers

    def __iter__(self) -> Iterator[Any]:
        position = self.position
        if self.steps.done:
            position.set_epoch(position.epoch + 1)
            return
        if callable(getattr(self.dataset, "set_epoch", None)):
            self.dataset.set_epoch(position.epoch)
        if self._own_generator:  # a pass starts alike whether or not the run resumed in it
            self.samples.generator.manual_seed(position.epoch)
        stream = iter(self.samples)
        skipped = sum(1 for _ in islice(stream, position.cursor))  # resumed mid-pass
        if skipped == position.cursor:
            while True:
                need = position.global_batch
                samples = list(islice(stream, need))
                if len(samples) < need:  # the remainder rule: the pass ends on every rank
                    break
                position.cursor += need
                batch = self.collate_fn(samples[position.my_slice()])
                yield pin_batch(batch) if self.pin_memory else batch
                if self.steps.done:
                    break
        position.set_epoch(position.epoch + 1)
