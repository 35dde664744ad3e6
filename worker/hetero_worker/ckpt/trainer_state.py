"""Checkpoints of a :class:`~hetero_worker.trainer.Trainer`: save, save every N steps, resume
(the state itself is :mod:`hetero_worker.ckpt.resume`'s)."""

from __future__ import annotations

from typing import Any

import torch

from hetero_worker.ckpt import checkpoint, resume, saving, tracked


class Checkpointing:
    """The Trainer's checkpoint methods (a mixin of :class:`hetero_worker.trainer.Trainer`; the state is :mod:`hetero_worker.ckpt.resume`'s)."""

    # --- checkpoints ------------------------------------------------------------------------
    def track(self, name: str, obj: Any) -> Any:
        """Save ``obj``'s state in every checkpoint and restore it in :meth:`resume`.

        ``obj`` has ``state_dict()`` and ``load_state_dict(state)`` (the ``Stateful`` protocol
        of ``torch.distributed.checkpoint``: an LR scheduler, a counter of your own); its state
        is job-wide (rank 0's is saved, every rank gets it back) and plain
        (:mod:`hetero_worker.ckpt.tracked`). Call it on every rank, before :meth:`resume`, e.g.
        ``sched = t.track("lr", LambdaLR(opt, f))``.

        Returns:
            ``obj``.

        Raises:
            TypeError: no ``state_dict``/``load_state_dict``, or a state weights-only loading
                refuses (named with its path and the fix).
            ValueError: ``name`` is tracked already (for another object).
            RuntimeError: :meth:`resume` ran already (the state would not be restored).
        """
        tracked.check_stateful(name, obj)
        registry: dict[str, Any] = self.__dict__.setdefault("tracked", {})
        if registry.get(name, obj) is not obj:
            raise ValueError(f"Trainer.track({name!r}): that name tracks another "
                             f"{type(registry[name]).__name__} already; choose another name")
        if self.__dict__.get("_resume_called"):
            raise RuntimeError(f"Trainer.track({name!r}) after resume(): its saved state would "
                               "not be restored; track it before t.resume(opt)")
        tracked.check_plain(name, obj.state_dict())
        registry[name] = obj
        return obj

    def _checkpoint_dir(self, directory: str | None) -> str:
        chosen = directory or self.contract.checkpoint.dir
        if not chosen:
            raise ValueError("no checkpoint directory: set HTJ_CHECKPOINT_DIR or pass one")
        return chosen

    def save_checkpoint(self, optimizer: torch.optim.Optimizer,
                        directory: str | None = None) -> str:
        """Write a checkpoint (collective; rank 0 writes atomically). Returns its path.

        Holds model, optimizer, scaler, the job's global data position, the plan, per-rank
        RNG and compression state (:mod:`hetero_worker.ckpt.resume`) and what :meth:`track`
        registered."""
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
        saves = self.__dict__.get("_periodic_saves")
        if saves is None:  # a failed save: a warning and a metric, fatal after N in a row
            saves = self.__dict__["_periodic_saves"] = saving.PeriodicSaves(
                max_failures=self.contract.checkpoint.max_failures, rank=self.rank,
                metrics=self.metrics)
        return saves.run(lambda: self.save_checkpoint(optimizer), self.global_step) is not None

    def resume(self, optimizer: torch.optim.Optimizer, directory: str | None = None) -> bool:
        """Restore the latest checkpoint if there is one; True when resumed (collective).

        The ranks agree on the newest checkpoint every one of them can read (an unreadable
        newest one is passed over on every rank, and rank 0 says so); a rank with no usable
        checkpoint while others have one makes every rank raise
        :class:`~hetero_worker.ckpt.agreement.ResumeDisagreement`. Under the same plan the split, RNG
        and compression state continue exactly; under a new plan (another world size or split)
        the data continue from the global position with fresh RNG
        (:func:`hetero_worker.ckpt.resume.resume_trainer`). What :meth:`track` registered gets
        its saved state back. Call it after :meth:`wrap`, :meth:`loader` and :meth:`track`, before
        the first step.
        """
        self.__dict__["_resume_called"] = True
        resumed = resume.resume_trainer(self, optimizer, directory or self.contract.checkpoint.dir)
        if resumed:
            self.metrics.set_resumed_step(self.global_step)
            if checkpoint.LAST_RESUME.get("fallback"):  # a newer one was unreadable somewhere
                self.metrics.record_checkpoint_fallback()
        return resumed
