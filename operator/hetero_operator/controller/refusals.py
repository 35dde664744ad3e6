"""Pods of a start that the API server refused (ResourceQuota, LimitRange, Pod Security, a webhook),
or an object of the job's name that is not the job's (:mod:`hetero_operator.controller.ownership`).

The reconciler deletes what was created of such a start, waits ``Pending`` with the server's
message and retries after an exponential backoff (shared/cases/21: no create/delete storm); this
module tells a refusal from other failures and words it.  Anything but a refusal (timeouts, 5xx
after the retries) propagates: the next reconcile retries the creates (deterministic names: 409s).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from hetero_operator.api import conditions as c
from hetero_operator.api import limits
from hetero_operator.lifecycle import decisions as lc

REFUSED = "PodsRefused"
"""Reason of a start whose pods the API server refused (quota, limits, Pod Security, webhooks)."""
REFUSAL_STATUSES = frozenset({400, 403, 422})
"""HTTP statuses of an admission refusal: Forbidden (quota, Pod Security, a webhook), Invalid,
BadRequest; retried with backoff, never in a storm."""


def not_a_refusal(errors: Iterable[BaseException]) -> BaseException | None:
    """The first error that is no admission refusal (its ``status`` not in
    :data:`REFUSAL_STATUSES`, and not an object of the job's name that is someone else's:
    :class:`hetero_operator.controller.ownership.NotOwned`), None when all are refusals."""
    return next((e for e in errors if getattr(e, "status", None) not in REFUSAL_STATUSES
                 and not getattr(e, "refusal", False)), None)


def server_message(exc: BaseException) -> str:
    """The API server's ``message`` of a refusal (its Status body), else the error text."""
    body = getattr(exc, "body", None)
    try:
        text = json.loads(body).get("message") if body else None
    except (ValueError, AttributeError):
        text = None
    return str(text or getattr(exc, "reason", None) or exc).rstrip(".")


def refusal_words(pod_name: str, exc: BaseException, *, refusals: int, delay_s: float) -> tuple[str, str]:
    """``(said, message)``: what the Warning Event says, and the status message that adds the
    count and the backoff (``refusals`` in a row, this one included; next try in ``delay_s``).
    An object of the job's name that is not the job's is said in its own words (which name it)."""
    why = (str(exc).rstrip(".") if getattr(exc, "refusal", False)
           else f"The API server refused pod {pod_name}: {server_message(exc)}")
    said = f"{why}. The pods created for this start were deleted; the job retries with exponential backoff"
    return said, f"{said} (refusal {refusals}, next try in {delay_s:.3g} s)."


PLAN_TOO_LARGE = "PlanTooLarge"
"""Reason of a job whose plan has more pod groups than its status holds."""


def plan_too_large(spec: Any, plan: Any) -> lc.Decision:
    """The failure of a job whose plan (``plan.groups``) has more than
    :data:`hetero_operator.api.limits.PLAN_GROUPS_MAX` pod groups: the API server would refuse
    its status on every reconcile, so the job fails once, with a Warning that says the fix.

    Args:
        spec: the job (:class:`hetero_operator.api.spec.JobSpec`).
        plan: its plan (:class:`hetero_operator.api.types.Plan`).
    """
    groups, most = len(plan.groups), limits.PLAN_GROUPS_MAX
    return lc.Decision(
        action=lc.FAIL, phase=c.FAILED, reason=PLAN_TOO_LARGE,
        message=f"The plan has {groups:,} pod groups (one per node and GPU type) for "
                f"{plan.world_size:,} ranks, more than the {most:,} a job's status holds "
                f"(status.plan.groups): lower spec.gpus.ranks (now {spec.gpus.ranks:,}) or limit "
                "spec.gpus.allowedProducts to GPU types with more devices per node, so that the "
                f"ranks fit in at most {most:,} groups, and create the job again.")
