"""SIGTERM ends the job at a step boundary every rank agrees on, with one checkpoint (issue 20).

A spot reclaim, a node drain or an eviction sends SIGTERM to one pod's ranks (through
``heterotrain launch``), in the middle of a step.  A rank cannot simply exit: its peers would wait
for it in the next collective until their timeout, and the step since the last checkpoint would be
lost.  So:

* the SIGTERM handler only records the request (a second SIGTERM exits at once, code 143);
* an agreement step starts a two-integer ``MAX`` all-reduce of "have I been asked to stop" and
  "how many steps until the next agreement" (negated, so ``MAX`` is the smallest proposal) on the
  checkpoint process group (asynchronous: it overlaps the step's compute) and waits for it at the
  end of the step: every rank learns the same answer after the same step, and the same next
  agreement step.  Each rank proposes ``floor(period / its mean step time)`` steps, between 1 and
  :data:`~heterotrain_common.defaults.STOP_AGREEMENT_MAX_STEPS`, with the period
  :data:`~heterotrain_common.defaults.STOP_AGREEMENT_PERIOD_S` (1 s): a step of 5 ms no longer pays
  one more collective every time (it cost 5 % of a hierarchical step on 2 cores, issue 23), and a
  SIGTERM is acted on within about one period plus one step;
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

from heterotrain_common import defaults, envnames

PREEMPTED_EXIT_CODE = envnames.PREEMPTED_EXIT_CODE


def agreement_interval_steps(step_s: float | None, period_s: float = defaults.STOP_AGREEMENT_PERIOD_S,
                             max_steps: int = defaults.STOP_AGREEMENT_MAX_STEPS) -> int:
    """Steps until the next stop agreement one rank proposes.

    Args:
        step_s: this rank's mean wall time per step since the last agreement, seconds (the
            user's code between steps included); None before any was measured.
        period_s: the agreement period, seconds.
        max_steps: the cap.

    Returns:
        ``floor(period_s / step_s)`` within ``[1, max_steps]``; 1 when ``step_s`` is unknown.
    """
    if step_s is None or step_s <= 0:
        return 1
    return max(1, min(max_steps, int(period_s // step_s)))


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
        self._agree_at_step = 0  # the global step at which the next agreement starts
        self._agreed_from: tuple[int, float] | None = None  # (global step, perf_counter) of the last start
        self.stop_agreements = 0
        """Agreements started so far (a test's and a profile's view of the cost)."""
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
        """Start the all-reduce of the stop requests when this step is an agreement step (it
        overlaps the step); every rank has the same ``global_step`` and the same next agreement
        step, so they all start it at the same steps."""
        group = getattr(self, "ckpt_group", None)
        if group is None or not dist.is_initialized() or self.global_step < self._agree_at_step:
            return
        now = time.perf_counter()
        step_s = None
        if self._agreed_from is not None and self.global_step > self._agreed_from[0]:
            step_s = (now - self._agreed_from[1]) / (self.global_step - self._agreed_from[0])
        self._agreed_from = (self.global_step, now)
        self._stop_flag = torch.tensor([1 if self.stop_requested else 0,
                                        -agreement_interval_steps(step_s)], dtype=torch.int64)
        self._stop_work = dist.all_reduce(self._stop_flag, op=dist.ReduceOp.MAX, group=group,
                                          async_op=True)
        self.stop_agreements += 1

    def _end_stop_agreement(self) -> None:
        """Wait for this step's stop agreement; every rank sets :attr:`stopping` after the same step."""
        if self._stop_work is None:
            if self.stop_requested and not dist.is_initialized():
                self.stopping, self.stop_step = True, self.global_step  # a lone process
            return
        self._stop_work.wait()
        self._stop_work = None
        assert self._stop_flag is not None and self._agreed_from is not None
        stop, neg_interval = (int(v) for v in self._stop_flag.tolist())
        self._agree_at_step = self._agreed_from[0] + max(1, -neg_interval)
        if stop:
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
