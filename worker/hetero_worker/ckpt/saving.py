"""A failed checkpoint save: one agreed error on every rank, and periodic saves that survive a full
disk (issue 32, F7 and F12).

**One error, every rank.**  Rank 0 writes, the others wait for it; whatever rank 0's write raises
(an ``OSError``, or the ``RuntimeError`` "unexpected pos ..." that ``torch.save`` raises on a full
disk), rank 0 removes its ``.tmp`` directory and reports the error in the save's agreement, and
every rank raises the same :class:`CheckpointSaveError` at once (never a peer left waiting for the
checkpoint timeout).  It derives from ``OSError`` and ``RuntimeError``, the two types the single-file
and the sharded save raised before.

**Periodic saves.**  A full disk must not become a crash loop: :class:`PeriodicSaves` (behind
``Trainer.maybe_checkpoint``) turns a failed periodic save into a warning line
(``checkpoint_save_failed``) and ``htj_checkpoint_save_failures_total``; the save is tried again at
the next interval, and only ``HTJ_CHECKPOINT_MAX_FAILURES`` failures in a row (default
:data:`heterotrain_common.defaults.CHECKPOINT_MAX_FAILURES`) fail the job.  Every rank holds the same
count, since every rank sees the same agreed error.  A gang superseded by a newer restart generation
(:mod:`hetero_worker.ckpt.ownership`) fails at once.  An explicit ``t.save_checkpoint`` (and the
preemption checkpoint) still raises on the first failure.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from heterotrain_common.envnames import CHECKPOINT_MAX_FAILURES

from hetero_worker.ckpt.ownership import SUPERSEDED
from hetero_worker.runtime.checks import at_least
from hetero_worker.runtime.ranklog import log

__all__ = ["CheckpointSaveError", "PeriodicSaves", "discard_tmp"]


class CheckpointSaveError(OSError, RuntimeError):
    """A checkpoint save failed on some rank; raised on every rank with the same message, and
    the earlier checkpoints stay.

    Attributes:
        superseded: a newer restart generation owns the directory (never retried).
    """

    @property
    def superseded(self) -> bool:
        """True when the failure is :class:`hetero_worker.ckpt.ownership.SupersededError`'s."""
        return SUPERSEDED in str(self) or "SupersededError: " in str(self)


def discard_tmp(tmp: Path) -> None:
    """Remove a failed save's ``.tmp`` directory (rank 0), so a full disk gets its space back;
    a removal that fails is left to the next save's prune (it removes stale ``.tmp`` directories)."""
    shutil.rmtree(tmp, ignore_errors=True)


class PeriodicSaves:
    """Runs periodic saves: a failure is a warning and a metric, fatal after ``max_failures`` in
    a row.

    Args:
        max_failures: failures in a row that fail the job (``HTJ_CHECKPOINT_MAX_FAILURES``, >= 1).
        rank: this rank (rank 0 writes the warning line).
        metrics: a :class:`hetero_worker.metrics.WorkerMetrics` (``record_checkpoint_save_failure``),
            or None.
    """

    def __init__(self, *, max_failures: int, rank: int = 0, metrics: Any = None) -> None:
        self.max_failures = at_least(max_failures, 1, "max_failures", source=CHECKPOINT_MAX_FAILURES)
        self.rank = rank
        self.metrics = metrics
        self.failures_in_row = 0

    def run(self, save: Callable[[], str], step: int) -> str | None:
        """Call ``save()`` (collective, on every rank at the same step).

        Returns:
            The checkpoint's path, or None when the save failed and will be tried again at the
            next interval.

        Raises:
            CheckpointSaveError: the ``max_failures``-th failure in a row (the last error and the
                count), or a superseded gang's (at once). Same on every rank.
        """
        try:
            path = save()
        except CheckpointSaveError as exc:
            if exc.superseded:
                raise
            self.failures_in_row += 1
            if self.metrics is not None:
                self.metrics.record_checkpoint_save_failure()
            if self.failures_in_row >= self.max_failures:
                raise CheckpointSaveError(
                    f"{self.failures_in_row} checkpoint saves in a row failed (at most "
                    f"HTJ_CHECKPOINT_MAX_FAILURES={self.max_failures}); the last, at step {step}: "
                    f"{exc}. Free space on the checkpoint volume or fix the storage, then restart "
                    "the job") from exc
            if self.rank == 0:
                log(rank=self.rank, message=f"checkpoint_save_failed: step {step}, failure "
                                f"{self.failures_in_row} of at most {self.max_failures} in a row "
                                f"(HTJ_CHECKPOINT_MAX_FAILURES); training goes on and the save is "
                                f"tried again at the next interval: {exc}")
            return None
        self.failures_in_row = 0
        return path
