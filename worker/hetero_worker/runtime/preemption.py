"""SIGTERM ends the job at a step boundary every rank agrees on, with one checkpoint (issue 20).

A spot reclaim, a node drain or an eviction sends SIGTERM to one pod's ranks (through
``heterotrain launch``), in the middle of a step.  A rank cannot simply exit: its peers would wait
for it in the next collective until their timeout, and the step since the last checkpoint would be
lost.  So:

* the SIGTERM handler only records the request (a second SIGTERM exits at once, code 143);
* an agreement step starts a two-integer ``MAX`` all-reduce (:func:`hetero_worker.comm.agree.start_max`) of "have I been asked to stop" and
  "how many steps until the next agreement" (negated, so ``MAX`` is the smallest proposal) on the
  checkpoint process group (asynchronous: it overlaps the step's compute) and waits for it at the
  end of the step: every rank learns the same answer after the same step, and the same next
  agreement step.  Each rank proposes ``floor(period / its mean step time)`` steps, between 1 and
  :data:`~heterotrain_common.defaults.STOP_AGREEMENT_MAX_STEPS`, with the period
  :data:`~heterotrain_common.defaults.STOP_AGREEMENT_PERIOD_S` (1 s): a step of 5 ms no longer pays
  one more collective every time (it cost 5 % of a hierarchical step on 2 cores, issue 23), and a
  SIGTERM is acted on within about one period plus one step;
* once it says stop, the next :meth:`~hetero_worker.trainer.Trainer.step` or
  :meth:`~hetero_worker.trainer.Trainer.maybe_checkpoint` call writes one
  checkpoint at that step (when the job has a checkpoint directory), leaves the process group and
  exits with :data:`heterotrain_common.envnames.PREEMPTED_EXIT_CODE` (75) on every rank, within
  the pod's ``terminationGracePeriodSeconds`` when that is sized as one step plus one save.

The operator counts a gang that stopped this way as an infrastructure restart, not against
``backoffLimit``, and the restart resumes at the saved step (the data position is global, so every
sample is seen once per epoch).

The Trainer's part that does this is :class:`hetero_worker.stop.GracefulStop` (an object with its
own state); this module keeps the interval rule.
"""

from __future__ import annotations

from heterotrain_common import defaults


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
