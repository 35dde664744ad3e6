"""The job's step count: optimizer steps taken and the step limit (``HTJ_MAX_STEPS``), one object
the Trainer's parts share (the loaders end at the limit, the checkpoint saves and restores the
count, the step and the graceful stop read it)."""

from __future__ import annotations

from typing import Protocol


class StepLimit(Protocol):
    """What a loader reads to end an epoch at the step limit (:class:`StepCount` has it)."""

    global_step: int
    max_steps: int | None

    @property
    def done(self) -> bool:
        """True once ``max_steps`` steps are taken."""
        ...


class StepCount:
    """Optimizer steps taken (skipped ones included) and the limit.

    Args:
        max_steps: ``HTJ_MAX_STEPS`` (``heterotrain run --max-steps``); None: no limit.

    Attributes:
        global_step: steps taken so far (restored from a checkpoint on resume).
        max_steps: the limit.
    """

    def __init__(self, max_steps: int | None = None) -> None:
        self.global_step = 0
        self.max_steps = max_steps

    @property
    def done(self) -> bool:
        """True once :attr:`max_steps` steps are taken."""
        return self.max_steps is not None and self.global_step >= self.max_steps
