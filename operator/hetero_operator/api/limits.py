"""Bounds of the lists the operator writes into a job's status (the CRD's ``maxItems``).

The real API server refuses a whole status write (422 ``Too many``) when one list is longer than
its ``maxItems``, so the status builder cuts each list that grows with the cluster to these
bounds; tests/operator/test_crd.py checks that the CRD says the same numbers.
"""

from __future__ import annotations

EXCLUDED_MAX = 256
"""``status.plan.excluded``: at most this many nodes listed (``maxItems``); the rest are counted
in ``status.plan.excludedCount`` and per reason in ``status.plan.excludedReasons``."""
EXCLUDED_REASONS_MAX = 64
"""``status.plan.excludedReasons``: distinct reasons listed (``maxItems``); reasons are CamelCase
constants, far fewer than this."""
PLAN_GROUPS_MAX = 4096
"""``status.plan.groups``: one entry per pod group (node and GPU type), at most this many
(``maxItems``); a plan with more groups is refused once (``PlanTooLarge``), since its status
could not be written and its pods could not be found again."""
