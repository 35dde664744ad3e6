"""Every default that more than one place needs, defined once.

The spec parser (:mod:`hetero_operator.api.spec`), the env contract
(:mod:`heterotrain_common.contract`), the worker and the operator's settings read these; the CRD
(``crds/`` and the chart's copy) repeats the spec's in its schema, and
``tests/operator/test_defaults_agree.py`` checks that the CRD, the chart's CRD, the spec, the
contract and the code agree.
"""

from __future__ import annotations

POWERSGD_RANK = 16
"""PowerSGD factor rank (``spec.training.compression.powerSGDRank``, ``HTJ_POWERSGD_RANK``): rank 4
trained the speed benchmark's MLP to a loss 4.5-6.7 % above uncompressed, rank 16 within 1.4 %, at
about 1/22 of fp32's bytes (docs/speed.md)."""
CHECKPOINT_INTERVAL_STEPS = 50
"""Steps between checkpoints (``spec.training.checkpoint.intervalSteps``,
``HTJ_CHECKPOINT_INTERVAL_STEPS``)."""
REBALANCE_INTERVAL_STEPS = 0
"""Steps between rebalances, 0 = off (``spec.training.rebalance.intervalSteps``)."""
NODE_LOSS_GRACE_S = 300
"""How long a node may be NotReady/Unknown or unreachable before its pods count as lost
(``spec.runPolicy.nodeLossGraceSeconds``; Kubernetes' default ``tolerationSeconds`` for the
unreachable taint)."""
BACKOFF_LIMIT = 3
"""Restarts of the whole job before it fails (``spec.runPolicy.backoffLimit``)."""
RENDEZVOUS_TIMEOUT_S = 600.0
"""How long ranks > 0 wait for rank 0 to become reachable (``HTJ_RENDEZVOUS_TIMEOUT_S``)."""
COLLECTIVE_TIMEOUT_S = 600.0
"""Timeout of every collective of the process groups (``init_process_group`` / ``new_group``)."""
SIM_DELAY_PER_SAMPLE_S = 0.002
"""Simulated seconds per sample of a device of relative speed 1.0 (``HTJ_SIM_DELAY_PER_SAMPLE_S``)."""
PENDING_TIMEOUT_S = 300.0
"""Re-plan a job whose pods stayed Pending this long (``HTJ_PENDING_TIMEOUT_S``)."""
BACKOFF_BASE_S = 10.0
"""First restart delay; doubles per restart (``HTJ_BACKOFF_BASE_S``)."""
BACKOFF_MAX_S = 300.0
"""Largest restart delay (``HTJ_BACKOFF_MAX_S``)."""
CHECKPOINT_KEEP = 2
"""Verified checkpoints kept (``spec.training.checkpoint.keep``, ``HTJ_CHECKPOINT_KEEP``): the newest
and one to fall back to when the newest is unreadable."""
CHECKPOINT_MAX_FAILURES = 3
"""Periodic checkpoint saves that may fail in a row (a full disk, a storage fault) before the job
fails (``HTJ_CHECKPOINT_MAX_FAILURES``); each failure is a warning and
``htj_checkpoint_save_failures_total``, and the save is tried again at the next interval."""
CHECKPOINT_TIMEOUT_S = 1800
"""Timeout of the checkpoint process group, seconds (``spec.training.checkpoint.timeoutSeconds``,
``HTJ_CHECKPOINT_TIMEOUT_S``): a save to slow storage may take this long before the ranks give up."""
TERMINATION_GRACE_S = 300
"""``terminationGracePeriodSeconds`` of worker pods when the template sets none: long enough for
the ranks to reach the next step, agree and write one checkpoint (docs/cluster-jobs.md, "Preemption")."""
STOP_AGREEMENT_PERIOD_S = 1.0
"""How often, at most, the ranks agree on a SIGTERM: every step once a step takes this long, else
every ``floor(period / step time)`` steps (at most :data:`STOP_AGREEMENT_MAX_STEPS`), so a fast
step does not pay one more collective each time (docs/speed.md, "The stop agreement")."""
STOP_AGREEMENT_MAX_STEPS = 100
"""Most steps between two stop agreements, whatever the step time."""
SHM_PER_LOCAL_RANK_BYTES = 2 * 2**30
"""Default ``/dev/shm`` size per local rank (``spec.worker.sharedMemorySize`` unset): DataLoader
workers and NCCL's shared-memory transport; capped at half the worker container's memory limit."""
