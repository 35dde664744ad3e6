"""Pods of a start that the API server refused (ResourceQuota, LimitRange, Pod Security, a webhook).

The reconciler deletes what was created of such a start, waits ``Pending`` with the server's
message and retries after an exponential backoff (shared/cases/21: no create/delete storm); this
module tells a refusal from other failures and words it.  Anything but a refusal (timeouts, 5xx
after the retries) propagates: the next reconcile retries the creates (deterministic names: 409s).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

REFUSED = "PodsRefused"
"""Reason of a start whose pods the API server refused (quota, limits, Pod Security, webhooks)."""
REFUSAL_STATUSES = frozenset({400, 403, 422})
"""HTTP statuses of an admission refusal: Forbidden (quota, Pod Security, a webhook), Invalid,
BadRequest; retried with backoff, never in a storm."""


def not_a_refusal(errors: Iterable[BaseException]) -> BaseException | None:
    """The first error that is no admission refusal (its ``status`` not in
    :data:`REFUSAL_STATUSES`), None when all are refusals."""
    return next((e for e in errors if getattr(e, "status", None) not in REFUSAL_STATUSES), None)


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
    count and the backoff (``refusals`` in a row, this one included; next try in ``delay_s``)."""
    said = (f"The API server refused pod {pod_name}: {server_message(exc)}. The pods created for "
            "this start were deleted; the job retries with exponential backoff")
    return said, f"{said} (refusal {refusals}, next try in {delay_s:.3g} s)."
