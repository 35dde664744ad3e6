"""Job conditions following the Kubernetes API conventions and Kubeflow's type names (pure).

Types: ``Created``, ``Running``, ``Restarting``, ``Succeeded``, ``Failed``, ``Suspended``.
``lastTransitionTime`` changes only when ``status`` changes; ``lastUpdateTime`` when reason or
message change.  Conditions are plain dicts, as the API stores them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

CREATED = "Created"
RUNNING = "Running"
RESTARTING = "Restarting"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED = "Suspended"
TYPES = (CREATED, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED)

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"

# Phases: the job's state word; Pending is "no pods yet" (waiting for capacity or backoff).
PENDING = "Pending"
PHASES = (PENDING, CREATED, RUNNING, RESTARTING, SUCCEEDED, FAILED, SUSPENDED)
FINISHED_PHASES = (SUCCEEDED, FAILED)

Condition = dict[str, Any]


def now_iso(now_s: float) -> str:
    """RFC 3339 UTC timestamp (seconds precision, ``Z`` suffix) for epoch ``now_s``."""
    return dt.datetime.fromtimestamp(int(now_s), tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 timestamp, ``None`` for ``None``/empty."""
    if not text:
        return None
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def set_condition(conditions: Iterable[Mapping[str, Any]], *, type_: str, status: str, reason: str,
                  message: str, now_s: float, generation: int | None = None) -> list[Condition]:
    """Return a new list with condition ``type_`` set.

    Args:
        conditions: the current ``status.conditions``.
        type_: one of :data:`TYPES`.
        status: ``"True"``, ``"False"`` or ``"Unknown"``.
        reason: CamelCase reason, e.g. ``"InsufficientGPUs"``.
        message: one sentence.
        now_s: current time, epoch seconds.
        generation: ``metadata.generation`` observed, stored as ``observedGeneration``.

    Raises:
        ValueError: unknown type or status.
    """
    if type_ not in TYPES:
        raise ValueError(f"condition type must be one of {', '.join(TYPES)}, got {type_!r}")
    if status not in (TRUE, FALSE, UNKNOWN):
        raise ValueError(f"condition status must be True, False or Unknown, got {status!r}")
    out: list[Condition] = []
    found = False
    stamp = now_iso(now_s)
    for cond in conditions:
        cond = dict(cond)
        if cond.get("type") == type_:
            found = True
            if cond.get("status") != status:
                cond["lastTransitionTime"] = stamp
            if (cond.get("status"), cond.get("reason"), cond.get("message")) != (status, reason, message):
                cond["lastUpdateTime"] = stamp
            cond.update(status=status, reason=reason, message=message)
            if generation is not None:
                cond["observedGeneration"] = generation
        out.append(cond)
    if not found:
        new: Condition = {"type": type_, "status": status, "reason": reason, "message": message,
                          "lastTransitionTime": stamp, "lastUpdateTime": stamp}
        if generation is not None:
            new["observedGeneration"] = generation
        out.append(new)
    return out


def get_condition(conditions: Iterable[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    """The condition of ``type_`` or ``None``."""
    return next((c for c in conditions if c.get("type") == type_), None)


def is_true(conditions: Iterable[Mapping[str, Any]], type_: str) -> bool:
    """True when condition ``type_`` exists with status ``"True"``."""
    cond = get_condition(conditions, type_)
    return cond is not None and cond.get("status") == TRUE


def apply_phase(conditions: Iterable[Mapping[str, Any]], *, phase: str, reason: str, message: str,
                now_s: float, generation: int | None = None) -> list[Condition]:
    """Set the conditions that express ``phase`` (Kubeflow semantics).

    ``Created`` stays True once pods were created; ``Running``/``Restarting``/``Suspended`` are
    mutually exclusive; ``Succeeded`` and ``Failed`` are terminal and turn ``Running`` False.
    ``Pending`` sets ``Created`` False with the reason (e.g. ``InsufficientGPUs``), unless pods
    were created before (then it is a restart backoff and ``Restarting`` carries it).

    Raises:
        ValueError: unknown phase.
    """
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    conds = list(conditions)
    kw = dict(now_s=now_s, generation=generation)

    def put(type_: str, status: str, why: str = reason, text: str = message) -> None:
        nonlocal conds
        conds = set_condition(conds, type_=type_, status=status, reason=why, message=text, **kw)

    def clear(type_: str) -> None:
        cond = get_condition(conds, type_)
        if cond is not None and cond.get("status") != FALSE:
            put(type_, FALSE)

    if phase == PENDING:
        if not is_true(conds, CREATED):
            put(CREATED, FALSE)
        for t in (RUNNING, SUSPENDED):
            clear(t)
    elif phase == CREATED:
        put(CREATED, TRUE)
        for t in (RUNNING, SUSPENDED):
            clear(t)
    elif phase == RUNNING:
        if not is_true(conds, CREATED):
            put(CREATED, TRUE)
        put(RUNNING, TRUE)
        for t in (RESTARTING, SUSPENDED):
            clear(t)
    elif phase == RESTARTING:
        put(RESTARTING, TRUE)
        clear(RUNNING)
    elif phase == SUSPENDED:
        put(SUSPENDED, TRUE)
        for t in (RUNNING, RESTARTING):
            clear(t)
    elif phase in (SUCCEEDED, FAILED):
        put(phase, TRUE)
        for t in (RUNNING, RESTARTING, SUSPENDED):
            clear(t)
    return conds
