"""The graceful stop: a part of the Trainer with its own state that turns a SIGTERM into a stop at
a step every rank agrees on, with one checkpoint, and exit code 75 (the narrative, and the
interval rule :func:`~hetero_worker.runtime.preemption.agreement_interval_steps`, are
:mod:`hetero_worker.runtime.preemption`'s).

Each agreement is an asynchronous element-wise ``MAX`` of three integers (:func:`hetero_worker.comm.
agree.start_max`): "have I been asked to stop", minus "how many steps until the next agreement",
and "does a member wait to join" (an elastic job growing, :meth:`GracefulStop.watch_joins`),
started at the beginning of an agreement step and waited for at its end.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from hetero_worker.comm.agree import PendingMax, start_max
from hetero_worker.runtime.preemption import agreement_interval_steps
from hetero_worker.runtime.ranklog import log
from heterotrain_common.envnames import PREEMPTED_EXIT_CODE


class GracefulStop:
    """Stop at an agreed step after SIGTERM (installs the SIGTERM handler when built in the main
    thread).

    Args:
        rank: this rank.
        group: the checkpoint process group the agreement runs on (None: no agreement; a lone
            process stops on its own).
        termination_grace_s: the pod's grace period (only said in the SIGTERM line).

    Attributes:
        stop_requested: this rank received SIGTERM.
        stopping: every rank agreed to stop after :attr:`stop_step`.
        stop_step: the agreed step (None before).
        agreements: agreements started so far (a test's and a profile's view of the cost).
        join_due: every rank agreed, after :attr:`join_step`, that a member waiting to join is
            let in now (an elastic job; :meth:`regroup` clears it).
        join_step: the step after which the ranks agreed to let it in (None before).
    """

    def __init__(self, rank: int, group: Any, *, termination_grace_s: float) -> None:
        self.rank, self.group, self.termination_grace_s = rank, group, termination_grace_s
        self.stop_requested = False
        self.stopping = False
        self.stop_step: int | None = None
        self.agreements = 0
        self.join_due = False
        self.join_step: int | None = None
        self._join_waiting: Callable[[], bool] = lambda: False
        self._pending: PendingMax | None = None
        self._agree_at_step = 0  # the global step at which the next agreement starts
        self._agreed_from: tuple[int, float] | None = None  # (global step, perf_counter) of the last start
        self._sigterm_at: float | None = None
        self._step_at_sigterm: Callable[[], int] = lambda: 0
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def watch(self, global_step: Callable[[], int]) -> None:
        """Name the step count the SIGTERM line reports."""
        self._step_at_sigterm = global_step

    def watch_joins(self, waiting: Callable[[], bool]) -> None:
        """Name the question each agreement also asks: "does a member wait to join" (an elastic
        job's membership part; cheap: asked once per agreement)."""
        self._join_waiting = waiting

    def _on_sigterm(self, signum: int, _frame: object) -> None:
        if self.stop_requested:  # a second one: no more grace
            os._exit(128 + signum)
        self.stop_requested = True
        self._sigterm_at = time.monotonic()
        log(f"SIGTERM at step {self._step_at_sigterm()}: stopping at the next step every rank "
            f"agrees on, with one checkpoint (grace {self.termination_grace_s:g} s)", rank=self.rank)

    def begin(self, global_step: int) -> None:
        """Start the agreement when ``global_step`` is an agreement step (it overlaps the step);
        every rank has the same ``global_step`` and the same next agreement step, so they all
        start it at the same steps."""
        if self.group is None or not dist.is_initialized() or global_step < self._agree_at_step:
            return
        now = time.perf_counter()
        step_s = None
        if self._agreed_from is not None and global_step > self._agreed_from[0]:
            step_s = (now - self._agreed_from[1]) / (global_step - self._agreed_from[0])
        self._agreed_from = (global_step, now)
        self._pending = start_max([1 if self.stop_requested else 0,
                                   -agreement_interval_steps(step_s),
                                   1 if self._join_waiting() else 0], self.group)
        self.agreements += 1

    def end(self, global_step: int) -> None:
        """Wait for this step's agreement; every rank sets :attr:`stopping` after the same step."""
        if self._pending is None:
            if self.stop_requested and not dist.is_initialized():
                self.stopping, self.stop_step = True, global_step  # a lone process
            return
        stop, neg_interval, join = self._pending.wait()
        self._pending = None
        assert self._agreed_from is not None
        self._agree_at_step = self._agreed_from[0] + max(1, -neg_interval)
        if stop:
            self.stopping, self.stop_step = True, global_step
        elif join:
            self.join_due, self.join_step = True, global_step

    def regroup(self, rank: int, group: Any, *, at_step: int) -> None:
        """Continue on a new group as ``rank`` (an elastic job's new generation): an agreement in
        flight died with the old group, so the next one starts at ``at_step``."""
        self.rank, self.group = rank, group
        self._pending, self._agreed_from, self._agree_at_step = None, None, at_step
        self.join_due = False

    def exit(self, global_step: int, *, save: Callable[[], str] | None,
             close: Callable[[], None]) -> None:
        """Write the stop checkpoint (``save``, when the job has a checkpoint directory), leave
        the group (``close``) and exit with :data:`~heterotrain_common.envnames.PREEMPTED_EXIT_CODE`.

        Collective: every rank calls it after the same step (when :attr:`stopping` is set).

        Raises:
            SystemExit: always (code 75).
        """
        saved = ""
        if save is not None:
            path = save()
            saved = f"; checkpoint of step {global_step} in {path}"
        took = "" if self._sigterm_at is None else f" {time.monotonic() - self._sigterm_at:.1f} s after SIGTERM"
        log(f"stopped after step {global_step} as every rank agreed{took}{saved}; "
            f"exit {PREEMPTED_EXIT_CODE} (the restart resumes here)", rank=self.rank)
        close()
        sys.exit(PREEMPTED_EXIT_CODE)
