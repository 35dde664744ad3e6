"""Checkpoints of a :class:`~hetero_worker.trainer.Trainer`: save, save every N steps, resume
(the state itself is :mod:`hetero_worker.ckpt.resume`'s)."""

from __future__ import annotations

import torch

from hetero_worker.ckpt import checkpoint, resume


class Checkpointing:
    """The Trainer's checkpoint methods (a mixin of :class:`hetero_worker.trainer.Trainer`; the state is :mod:`hetero_worker.ckpt.resume`'s)."""

    # --- checkpoints ------------------------------------------------------------------------
    def _checkpoint_dir(self, directory: str | None) -> str:
        chosen = directory or self.contract.checkpoint.dir
        if not chosen:
            raise ValueError("no checkpoint directory: set HTJ_CHECKPOINT_DIR or pass one")
        return chosen

    def save_checkpoint(self, optimizer: torch.optim.Optimizer,
                        directory: str | None = None) -> str:
        """Write a checkpoint (collective; rank 0 writes atomically). Returns its path.

        Holds model, optimizer, scaler, the job's global data position, the plan and per-rank
        RNG and compression state (:mod:`hetero_worker.ckpt.resume`)."""
        return resume.save_trainer_checkpoint(self, optimizer, self._checkpoint_dir(directory))

    def maybe_checkpoint(self, optimizer: torch.optim.Optimizer,
                         every_steps: int | None = None) -> bool:
        """Checkpoint when :attr:`global_step` is a multiple of the interval; True if saved.

        Args:
            optimizer: saved with the model.
            every_steps: interval; None uses ``HTJ_CHECKPOINT_INTERVAL_STEPS`` (default
                :data:`heterotrain_common.defaults.CHECKPOINT_INTERVAL_STEPS`) when
                ``HTJ_CHECKPOINT_DIR`` is set, and never saves without a directory; 0 never saves.
        """
        if every_steps is None:
            if not self.contract.checkpoint.dir:
                return False
            every_steps = self.contract.checkpoint.interval_steps
        if every_steps <= 0 or self.global_step % every_steps:
            return False
        self.save_checkpoint(optimizer)
        return True

    def resume(self, optimizer: torch.optim.Optimizer, directory: str | None = None) -> bool:
        """Restore the latest checkpoint if there is one; True when resumed (collective).

        The ranks agree on the newest checkpoint every one of them can read (an unreadable
        newest one is passed over on every rank, and rank 0 says so); a rank with no usable
        checkpoint while others have one makes every rank raise
        :class:`~hetero_worker.ckpt.agreement.ResumeDisagreement`. Under the same plan the split, RNG
        and compression state continue exactly; under a new plan (another world size or split)
        the data continue from the global position with fresh RNG
        (:func:`hetero_worker.ckpt.resume.resume_trainer`). Call it after :meth:`wrap` and
        :meth:`loader`, before the first step.
        """
        resumed = resume.resume_trainer(self, optimizer, directory or self.contract.checkpoint.dir)
        if resumed:
            self.metrics.set_resumed_step(self.global_step)
            if checkpoint.LAST_RESUME.get("fallback"):  # a newer one was unreadable somewhere
                self.metrics.record_checkpoint_fallback()
        return resumed
