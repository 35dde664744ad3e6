"""The Trainer's data part (:class:`TrainData`): the split, the position in the data, and the loader
over this rank's uneven batches of the job's global order (:class:`hetero_worker.sampler.HeteroBatchSampler`) through a
PyTorch ``DataLoader`` with its own arguments (workers, pinned memory, collation), ending at
``HTJ_MAX_STEPS``.

**Workers fetch ahead; the position follows training.** A ``DataLoader`` with ``num_workers > 0``
asks its batch sampler for ``prefetch_factor * num_workers`` batches ahead of the one trained.
:class:`HeteroLoader` therefore reads index batches from the sampler's position without moving it
(:meth:`~hetero_worker.sampler.HeteroBatchSampler.batches_from`), notes the position after each,
and moves the sampler (``cursor``, then ``epoch`` at the epoch's end) only when a batch is handed
to the training loop. A checkpoint holds the position of the last batch trained, never of one
fetched ahead; ``t.epoch`` advances when the last batch of the epoch was trained. When the split
changes (a rebalance, a resume onto the saved split) while batches of the old sizes wait in the
workers, those are dropped and fetching starts again from the trained position with the new
split (the workers are replaced; ``persistent_workers=True`` is refused until the cause of two
hangs in CI's whole-suite process is known: one with a persistent pool reset mid-epoch, one
with a plain 2-worker stream, docs/worker.md), so every step trains slices of the split it is weighted by, and each sample of the epoch is still
taken once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from hetero_worker.position import SplitPosition
from hetero_worker.sampler import BatchedTensors, HeteroBatchSampler, as_fetched
from hetero_worker.steps import StepLimit
from hetero_worker.streaming import StreamLoader, StreamPosition

REFUSED_ARGS = {
    "batch_size": "the batch size is the plan's (this rank's HTJ_TOPOLOGY entry, its share)",
    "sampler": "the trainer's sampler gives every rank its share of one global order",
    "batch_sampler": "the trainer's sampler gives every rank its share of one global order",
    "drop_last": "an epoch ends when fewer than a global batch remain (the remainder rule)",
    "in_order": "checkpoints and split changes need batches in the order they were asked for",
    "persistent_workers": "not supported yet: the trainer restarts the workers when the split "
                          "changes, and a hang seen with a persistent pool reset mid-epoch (CI, "
                          "2 Dec 2026) is not explained yet",
}
"""``DataLoader`` arguments :meth:`TrainData.loader` does not pass, and why."""


class TrainData:
    """The Trainer's data part: it alone owns the split (its :attr:`position`), the sampler or
    stream position, and the loader.

    Before :meth:`loader` the split sits in a bare :class:`~hetero_worker.position.SplitPosition`;
    the loader's sampler (map-style) or :class:`~hetero_worker.streaming.StreamPosition` (a stream)
    then takes it over, with its listeners. A split changes only through
    ``position.set_split`` (``Trainer.set_split`` calls it); what follows the split registers with
    :meth:`follow_split`.

    Args:
        local_batches: the starting split (samples per step of every rank).
        rank: this rank.
        seed: the sampler's seed (same on every rank).
        steps: the step count (``global_step``, ``max_steps``, ``done``).
        metrics: the rank's metrics (``set_total_steps``).

    Attributes:
        position: where the split and the data position live.
        sampler: the loader's position (None before :meth:`loader`).
    """

    def __init__(self, local_batches: Sequence[int], rank: int, *, seed: int, steps: StepLimit,
                 metrics: Any) -> None:
        self.rank, self.seed, self.steps, self.metrics = rank, seed, steps, metrics
        self.position: SplitPosition = SplitPosition(local_batches, rank)
        self.sampler: HeteroBatchSampler | StreamPosition | None = None

    @property
    def local_batches(self) -> list[int]:
        """The current split, in rank order."""
        return list(self.position.local_batches)

    @property
    def local_batch(self) -> int:
        """This rank's samples per step."""
        return self.position.local_batches[self.rank]

    @property
    def epoch(self) -> int:
        """The loader's epoch (0 before :meth:`loader`)."""
        return self.sampler.epoch if self.sampler is not None else 0

    def follow_split(self, listener: Callable[[tuple[int, ...]], None]) -> None:
        """Call ``listener(split)`` after every split change from now on."""
        self.position.listeners.append(listener)

    def _take_position(self, position: HeteroBatchSampler | StreamPosition) -> None:
        """The new loader's position takes over the split's listeners."""
        position.listeners = self.position.listeners
        self.position = self.sampler = position

    def state_dict(self) -> dict[str, Any] | None:
        """The job's global data position (None before :meth:`loader`): the ``data`` of a
        checkpoint."""
        return self.sampler.state_dict() if self.sampler is not None else None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at a saved data position (needs :meth:`loader` first; ValueError: another
        kind of dataset, from the sampler)."""
        if self.sampler is not None:
            self.sampler.load_state_dict(state)

    def loader(self, dataset: Any, *, shuffle: bool | None = None,
               collate_fn: Callable[..., Any] | None = None,
               epochs: int | None = None, num_workers: int = 0, pin_memory: bool = False,
               persistent_workers: bool = False, prefetch_factor: int | None = None,
               worker_init_fn: Callable[[int], None] | None = None,
               **dataloader_args: Any) -> torch.utils.data.DataLoader | StreamLoader:
        """A ``DataLoader`` over this rank's uneven batches (:class:`HeteroBatchSampler`).

        Iterating it runs one epoch; every rank gets the same number of batches. An
        ``IterableDataset`` (a stream, read in the same order on every rank) gives this rank its
        share of every global batch of the stream's order (:mod:`hetero_worker.streaming`). A
        ``TensorDataset`` with the default collation is fetched a batch at a time
        (:class:`BatchedTensors`: the same tensors, without a Python index and a stack per sample).
        Workers may fetch ahead: checkpoints and split changes still refer to the batch being
        trained (:class:`HeteroLoader`).

        Once ``max_steps`` steps are taken an iteration ends at once and moves to the next
        epoch, so a ``while t.epoch < n`` loop ends too.

        Args:
            dataset: a map-style dataset (``len()`` and indexing) or an ``IterableDataset``.
            shuffle: a new seeded permutation every epoch (None, the default, and True; False:
                ``0..n-1``); a stream is read in its own order (shuffle=True is refused).
            epochs: how many epochs the script will run (None: unknown); with it the progress
                display shows a total (``epochs * batches per epoch``, at most
                ``max_steps``), also without it when ``max_steps`` is set (a stream has
                no length: its total is ``max_steps`` alone).
            collate_fn, num_workers, pin_memory, prefetch_factor,
                worker_init_fn: PyTorch's ``DataLoader`` arguments, passed through (so are
                ``timeout``, ``multiprocessing_context``, ``generator``, ``pin_memory_device``
                in ``dataloader_args``); ``pin_memory`` puts batches in page-locked memory for
                faster host-to-GPU copies (``to_device`` copies non-blocking).

        Raises:
            TypeError: ``dataset`` is neither map-style nor an ``IterableDataset``, a stream
                with ``shuffle=True``, or an argument the trainer's batches replace
                (:data:`REFUSED_ARGS`: ``batch_size``, ``sampler``, ``batch_sampler``,
                ``drop_last``, ``in_order``, ``persistent_workers=True``).
            ValueError: what ``DataLoader`` itself refuses (e.g. ``prefetch_factor`` with
                ``num_workers=0``).
        """
        refused = set(dataloader_args) | ({"persistent_workers"} if persistent_workers else set())
        for name in sorted(refused & set(REFUSED_ARGS)):
            raise TypeError(f"Trainer.loader({name}=...): not passed to the DataLoader: "
                            f"{REFUSED_ARGS[name]}; leave it out")
        workers = {"num_workers": num_workers,
                   "prefetch_factor": prefetch_factor, "worker_init_fn": worker_init_fn,
                   **dataloader_args}
        if isinstance(dataset, torch.utils.data.IterableDataset):
            return self._stream_loader(dataset, shuffle, collate_fn, pin_memory, workers)
        if not hasattr(dataset, "__len__") or not hasattr(dataset, "__getitem__"):
            raise TypeError(
                f"Trainer.loader({type(dataset).__name__}): needs a map-style dataset (len() and "
                "indexing) or a torch.utils.data.IterableDataset (a stream); wrap an iterator in "
                "an IterableDataset whose __iter__ yields the samples")
        sampler = HeteroBatchSampler(len(dataset), self.local_batches, self.rank, seed=self.seed,
                                     shuffle=True if shuffle is None else bool(shuffle))
        self._take_position(sampler)
        if collate_fn is None and type(dataset) is torch.utils.data.TensorDataset:
            dataset, collate_fn = BatchedTensors(dataset), as_fetched
        total = None if epochs is None else int(epochs) * len(sampler)
        max_steps = self.steps.max_steps
        if max_steps is not None:
            total = max_steps if total is None else min(total, max_steps)
        if total is not None:
            self.metrics.set_total_steps(total)
        return HeteroLoader(dataset, sampler, self.steps, collate_fn=collate_fn,
                            pin_memory=pin_memory, **workers)

    def _stream_loader(self, dataset: torch.utils.data.IterableDataset, shuffle: bool | None,
                       collate_fn: Callable[..., Any] | None, pin_memory: bool,
                       workers: dict[str, Any]) -> StreamLoader:
        """:meth:`loader` of an ``IterableDataset`` (:mod:`hetero_worker.streaming`)."""
        if shuffle:
            raise TypeError(
                f"Trainer.loader({type(dataset).__name__}, shuffle=True): a stream is read in its "
                "own order, the same on every rank: shuffle it in the dataset (e.g. with a seeded "
                "buffer, Hugging Face's .shuffle(seed=..., buffer_size=...)) and leave shuffle out")
        position = StreamPosition(self.local_batches, self.rank)
        self._take_position(position)
        if self.steps.max_steps is not None:  # a stream has no length: the total is the step limit
            self.metrics.set_total_steps(self.steps.max_steps)
        return StreamLoader(dataset, position, self.steps, collate_fn=collate_fn,
                            pin_memory=pin_memory, **workers)


class Loading:
    """:meth:`loader` for an object that keeps its own ``rank``, ``local_batches``, ``seed``,
    ``metrics`` and step count (``global_step``, ``max_steps``, ``done``), as a test's stand-in
    for a Trainer does: it builds a :class:`TrainData` over them and keeps its ``sampler``."""

    def loader(self, dataset: Any, **kwargs: Any) -> torch.utils.data.DataLoader | StreamLoader:
        """:meth:`TrainData.loader` (same arguments); sets ``self.sampler``."""
        data = TrainData(self.local_batches, self.rank, seed=self.seed,  # type: ignore[attr-defined]
                         steps=self, metrics=self.metrics)  # type: ignore[attr-defined,arg-type]
        loader = data.loader(dataset, **kwargs)
        self.sampler = data.sampler
        return loader


class HeteroLoader(torch.utils.data.DataLoader):
    """A ``DataLoader`` whose batches are the trainer's and whose position follows training.

    Args:
        dataset: the (map-style) dataset.
        position: the trainer's sampler: its ``epoch`` and ``cursor`` are the trained position.
        steps: the step count (``max_steps``, ``global_step``, ``done``).
        **kwargs: the ``DataLoader``'s other arguments.
    """

    def __init__(self, dataset: Any, position: HeteroBatchSampler, steps: StepLimit,
                 **kwargs: Any) -> None:
        self.position, self.steps = position, steps
        self._dispatch = _Dispatch(position, steps)
        self._own_generator = kwargs.get("generator") is None
        if self._own_generator:
            kwargs["generator"] = torch.Generator()
        super().__init__(dataset, batch_sampler=self._dispatch, **kwargs)

    def _fetching(self) -> Iterator[Any]:
        """A fresh fetch from the trained position (the batches fetched ahead are forgotten).

        Each fetch draws the workers' base seed from the loader's own generator, seeded from the
        position, never from the global RNG (``DataLoader`` draws from it when it has no
        ``generator``): a run resumed at a step draws the same dropout masks after it as the
        uninterrupted run (the global RNG is part of the checkpoint)."""
        self._dispatch.ahead.clear()
        if self._own_generator:
            p = self.position
            self.generator.manual_seed((p.seed * 1_000_003 + p.epoch) * 1_000_033 + p.cursor)
        return super().__iter__()

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        position, ahead = self.position, self._dispatch.ahead
        if self.steps.done:
            position.set_epoch(position.epoch + 1)
            return
        fetched: Iterator[Any] | None = self._fetching()
        epoch, moves = position.epoch, position.moves
        while True:
            if position.moves != moves:  # a membership change moved the position (redo a step)
                moves = position.moves
                if position.epoch != epoch:  # the job is in another epoch: that loop takes it
                    return
                fetched = None
                fetched = self._fetching()
            elif ahead and ahead[0][1] != position.local_batches:  # fetched under the old split
                fetched = None  # a worker iterator that is not persistent shuts down here
                fetched = self._fetching()
            try:
                batch = next(fetched)  # type: ignore[arg-type]
            except StopIteration:
                break
            position.cursor = ahead.popleft()[0]  # this batch is the one trained now
            yield batch
            if self.steps.done:
                break
        position.set_epoch(position.epoch + 1)


class _Dispatch:
    """The ``DataLoader``'s batch sampler: this rank's index batches from the trained position,
    each noted in :attr:`ahead` with the position after it and the split it was cut with (the
    ``DataLoader`` asks for them ahead of training when it has workers)."""

    def __init__(self, position: HeteroBatchSampler, steps: StepLimit) -> None:
        self.position, self.steps = position, steps
        self.ahead: deque[tuple[int, tuple[int, ...]]] = deque()

    def __len__(self) -> int:
        """Batches left in this epoch, at most the steps left before ``max_steps``."""
        left = len(self.position)
        if self.steps.max_steps is not None:
            left = max(0, min(left, self.steps.max_steps - self.steps.global_step))
        return left

    def __iter__(self) -> Iterator[list[int]]:
        position = self.position
        for batch, cursor in position.batches_from(position.epoch, position.cursor):
            self.ahead.append((cursor, position.local_batches))
            yield batch
