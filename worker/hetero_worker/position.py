"""The job's data position under an uneven split, shared by both loaders' positions: the
map-style :class:`~hetero_worker.sampler.HeteroBatchSampler` and the stream's
:class:`~hetero_worker.streaming.StreamPosition`.

Both cut the epoch's order the same way: step ``s`` consumes the next ``B = sum(local_batches)``
samples and rank ``r`` takes the ``local_batches[r]`` of them starting at
``sum(local_batches[:r])``; ``cursor`` counts the samples of the epoch consumed by all ranks
together, so a split change or a resume under another world size continues at the same sample.

The position is where the Trainer's split lives (:class:`hetero_worker.loading.TrainData`, the
data part, holds it): :meth:`SplitPosition.set_split` is the one place a split changes, and what
follows the split (the gradient sync's weights, the sharded sync, the rebalancer, the gauge) is
told through :attr:`SplitPosition.listeners`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class SplitPosition:
    """Epoch, cursor and the split of every global batch.

    Args:
        local_batches: samples per step of every rank, ``len == world_size``, all >= 1.
        rank: this rank.

    Attributes:
        rank: this rank.
        epoch: the current epoch (pass over the data).
        cursor: samples of this epoch consumed, all ranks together.
        local_batches: the current split.
        listeners: called with the new split after every :meth:`set_split` (in order).
        moves: how many times :meth:`move_to` moved the position (a loader that fetched ahead
            refetches when it changes).

    Raises:
        ValueError: from :meth:`set_split`.
    """

    def __init__(self, local_batches: Sequence[int], rank: int) -> None:
        self.rank, self.epoch, self.cursor, self.moves = rank, 0, 0, 0
        self.local_batches: tuple[int, ...] = ()
        self.listeners: list[Callable[[tuple[int, ...]], None]] = []
        self.set_split(local_batches)

    @property
    def global_batch(self) -> int:
        """``sum(local_batches)``."""
        return sum(self.local_batches)

    def set_split(self, local_batches: Sequence[int]) -> None:
        """Change the split from the next step on (every rank, at a step boundary); then every
        listener follows it.

        Raises:
            ValueError: a batch below 1, ``rank`` outside the list, or what
                :meth:`check_split` refuses.
        """
        batches = tuple(int(b) for b in local_batches)
        if not batches or min(batches) < 1 or not 0 <= self.rank < len(batches):
            raise ValueError(f"local_batches must be >= 1 with an entry for rank {self.rank}, "
                             f"got {list(batches)}")
        self.check_split(batches)
        self.local_batches = batches
        for listener in self.listeners:
            listener(batches)

    def move_to(self, *, rank: int, local_batches: Sequence[int], epoch: int,
                cursor: int) -> None:
        """A membership change (``hetero_worker.membership``): this process is now ``rank`` of
        ``len(local_batches)`` ranks and the job continues at sample ``cursor`` of ``epoch``'s
        order (the start of the step to redo, or of the next one). The loader refetches from here.

        Raises:
            ValueError: from :meth:`set_split`.
        """
        self.rank = int(rank)
        self.set_split(local_batches)
        self.epoch, self.cursor = int(epoch), int(cursor)
        self.moves += 1

    def check_split(self, batches: tuple[int, ...]) -> None:
        """Further conditions on a new split (none here; raises ``ValueError``)."""

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning."""
        self.epoch, self.cursor = int(epoch), 0

    def my_slice(self) -> slice:
        """This rank's part of a step's ``global_batch`` samples, ``slice(start, start + n)``."""
        start = sum(self.local_batches[:self.rank])
        return slice(start, start + self.local_batches[self.rank])
