"""SIGTERM ends the job at a step boundary every rank agrees on, with one checkpoint (issue 20).

A spot reclaim, a node drain or an eviction sends SIGTERM to one pod's ranks (through
``heterotrain launch``), in the middle of a step.  A rank cannot simply exit: its peers would wait
for it in the next collective until their timeout, and the step since the last checkpoint would be
lost.  So:

* the SIGTERM handler only records the request (a second SIGTERM exits at once, code 143);
* every step starts a one-integer ``MAX`` all-reduce of "have I been asked to stop" on the
  checkpoint process group (asynchronous: it overlaps the step's compute) and waits for it at the
  end of the step: every rank learns the same answer after the same step;
* once it says stop, the next :meth:`~hetero_worker.trainer.Trainer.step` or
  :meth:`~hetero_worker.ckpt.trainer_state.Checkpointing.maybe_checkpoint` call writes one
  checkpoint at that step (when the job has a checkpoint directory), leaves the process group and
  exits with :data:`heterotrain_common.envnames.PREEMPTED_EXIT_CODE` (75) on every rank, within
  the pod's ``terminationGracePeriodSeconds`` when that is sized as one step plus one save.

The operator counts a gang that stopped this way as an infrastructure restart, not against
``backoffLimit``, and the restart resumes at the saved step (the data position is global, so every
sample is seen once per epoch).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any

import torch
import torch.distributed as dist

from heterotrain_common import envnames

PREEMPTED_EXIT_CODE = envnames.PREEMPTED_EXIT_CODE


def _log(rank: int, message: str) -> None:
    print(f"heterotrain: rank {rank}: {message}", file=sys.stderr, flush=True)


class GracefulStop:
    """The Trainer's stop-at-an-agreed-step machinery (a mixin of :class:`hetero_worker.trainer.Trainer`).

    Uses the trainer's ``rank``, ``global_step``, ``contract`` (``checkpoint.dir``,
    ``run.termination_grace_s``), ``ckpt_group`` and its checkpoint and close methods.
    """

    stop_requested: bool = False
    """This rank received SIGTERM."""
    stopping: bool = False
    """Every rank agreed to stop after :attr:`stop_step`."""
    stop_step: int | None = None

    def _init_stop(self) -> None:
        self.stop_requested = False
        self.stopping = False
        self.stop_step = None
        self._stop_flag: torch.Tensor | None = None
        self._stop_work: Any = None
        self._sigterm_at: float | None = None
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, _frame: object) -> None:
        if self.stop_requested:  # a second one: no more grace
            os._exit(128 + signum)
        self.stop_requested = True
        self._sigterm_at = time.monotonic()
        grace = self.contract.run.termination_grace_s
        _log(self.rank, f"SIGTERM at step {self.global_step}: stopping at the next step every rank "
                        f"agrees on, with one checkpoint (grace {grace:g} s)")

    def _begin_stop_agreement(self) -> None:
        """Start this step's all-reduce of the stop requests (overlaps the step)."""
        group = getattr(self, "ckpt_group", None)
        if group is None or not dist.is_initialized():
            return
        self._stop_flag = torch.tensor([1 if self.stop_requested else 0], dtype=torch.int32)
        self._stop_work = dist.all_reduce(self._stop_flag, op=dist.ReduceOp.MAX, group=group,
                                          async_op=True)

    def _end_stop_agreement(self) -> None:
        """Wait for this step's stop agreement; every rank sets :attr:`stopping` after the same step."""
        if self._stop_work is None:
            if self.stop_requested and not dist.is_initialized():
                self.stopping, self.stop_step = True, self.global_step  # a lone process
            return
        self._stop_work.wait()
        self._stop_work = None
        if self._stop_flag is not None and int(self._stop_flag.item()):
            self.stopping, self.stop_step = True, self.global_step

    def stop_now(self, optimizer: torch.optim.Optimizer) -> None:
        """Write the stop checkpoint (with a checkpoint directory), leave the group, exit 75.

        Collective: every rank calls it after the same step (when :attr:`stopping` is set).
        """
        saved = ""
        if self.contract.checkpoint.dir:
            path = self.save_checkpoint(optimizer)  # type: ignore[attr-defined]
            saved = f"; checkpoint of step {self.global_step} in {path}"
        took = "" if self._sigterm_at is None else f" {time.monotonic() - self._sigterm_at:.1f} s after SIGTERM"
        _log(self.rank, f"stopped after step {self.global_step} as every rank agreed{took}{saved}; "
                        f"exit {PREEMPTED_EXIT_CODE} (the restart resumes here)")
        self.close()  # type: ignore[attr-defined]
        sys.exit(PREEMPTED_EXIT_CODE)
