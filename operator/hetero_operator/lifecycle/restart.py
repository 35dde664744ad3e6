"""The one restart policy: what follows a failed rank, in the operator and in ``heterotrain run``.

As Kubeflow's run policy: a failed rank restarts the *whole* gang (collectives need every rank),
up to ``spec.runPolicy.backoffLimit`` restarts, each after an exponential backoff
(:func:`backoff_s`: ``HTJ_BACKOFF_BASE_S * 2**(n-1)``, capped at ``HTJ_BACKOFF_MAX_S``); past the
limit the job fails with ``BackoffLimitExceeded``.  A job that checkpoints
(``spec.training.checkpoint.path``) resumes from its last checkpoint; one that does not restarts
from step 0, as a PyTorchJob's pods restart whatever the script saves, and the message says so.

The operator (:func:`hetero_operator.lifecycle.decisions.decide`) and ``heterotrain run``
(:func:`hetero_operator.local.supervise.supervise`) both ask :func:`after_failure`;
``tests/operator/test_restart_policy.py`` holds one table of cases against both.  Failures that
are not the job's fault (a lost node, an eviction) are the operator's infrastructure restarts and
never reach this policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from heterotrain_common import defaults

RANK_FAILED = "RankFailed"
BACKOFF_LIMIT_EXCEEDED = "BackoffLimitExceeded"


@dataclass(frozen=True, kw_only=True, slots=True)
class AfterFailure:
    """The policy's answer to a failed rank.

    Attributes:
        restart: True: restart every rank; False: the job fails.
        reason: ``RankFailed`` (restarting) or ``BackoffLimitExceeded``.
        restart_number: the restart this is, 1-based (0 when not restarting).
        delay_s: seconds to wait before the ranks start again (0 when not restarting).
        source: where training continues: ``"the last checkpoint"``, or step 0 with why.
        message: the clause after the failure, e.g. ``"restarting all ranks from the last
            checkpoint (restart 1 of 3) in 10 s"`` or ``"3 restart(s) reached backoffLimit 3"``.
    """

    restart: bool
    reason: str
    restart_number: int = 0
    delay_s: float = 0.0
    source: str = ""
    message: str = ""


def backoff_s(restart_number: int, *, base_s: float = defaults.BACKOFF_BASE_S,
              max_s: float = defaults.BACKOFF_MAX_S) -> float:
    """Delay before restart number ``restart_number`` (1-based): ``base * 2**(n-1)``, capped."""
    return min(base_s * 2 ** max(restart_number - 1, 0), max_s)


def restart_source(*, checkpointing: bool, checkpoint_saved: bool | None = None) -> str:
    """Where a restart continues from.

    Args:
        checkpointing: the job sets ``spec.training.checkpoint.path``.
        checkpoint_saved: a checkpoint exists (``heterotrain run`` can look); None when it
            cannot be known (the operator: the checkpoint lies on the job's volume).
    """
    if not checkpointing:
        return "step 0 (the job does not checkpoint: spec.training.checkpoint.path is not set)"
    if checkpoint_saved is False:
        return "the start (no checkpoint saved yet)"
    return "the last checkpoint"


def after_failure(*, restarts: int, backoff_limit: int, checkpointing: bool,
                  checkpoint_saved: bool | None = None, base_s: float = defaults.BACKOFF_BASE_S,
                  max_s: float = defaults.BACKOFF_MAX_S, source: str = "") -> AfterFailure:
    """Restart or fail after a rank failed.

    Args:
        restarts: restarts counted against ``backoffLimit`` so far.
        backoff_limit: ``spec.runPolicy.backoffLimit``.
        checkpointing, checkpoint_saved: as :func:`restart_source`.
        base_s, max_s: the backoff (``HTJ_BACKOFF_BASE_S``, ``HTJ_BACKOFF_MAX_S``), seconds.
        source: where the restart continues when the caller knows better (the operator:
            :func:`hetero_operator.lifecycle.ckptplace.restart_source`); ``""``: :func:`restart_source`.

    Returns:
        The :class:`AfterFailure`.
    """
    if restarts >= backoff_limit:
        return AfterFailure(restart=False, reason=BACKOFF_LIMIT_EXCEEDED,
                            message=f"{restarts} restart(s) reached backoffLimit {backoff_limit}")
    n = restarts + 1
    delay = backoff_s(n, base_s=base_s, max_s=max_s)
    source = source or restart_source(checkpointing=checkpointing, checkpoint_saved=checkpoint_saved)
    return AfterFailure(restart=True, reason=RANK_FAILED, restart_number=n, delay_s=delay,
                        source=source,
                        message=f"restarting all ranks from {source} (restart {n} of "
                                f"{backoff_limit}) in {delay:.0f} s")
