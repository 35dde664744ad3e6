"""What a rank pod's container says when it ends, and which failures no restart can fix (pure;
issue 33, item 4).

The worker container runs with ``terminationMessagePolicy: FallbackToLogsOnError``
(:mod:`hetero_operator.render.pods`), so a failed rank's ``state.terminated.message`` is the tail
of its log unless it wrote a message itself, and rank 0's message on success is the job's result
(:mod:`heterotrain_common.termination`).

A failure is **deterministic** when the same command in the same image must fail again: the
script or module is not there, an import or the script's syntax fails, the worker refuses its
contract, the command is not found or not executable (exit 127 / 126, the runtime's
``StartError``/``ContainerCannotRun``).  Restarting the gang then only burns
``spec.runPolicy.backoffLimit`` and time (a typo in the script path cost 3 gang restarts and
72 s before), so the job fails at once (:func:`startup_error`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from heterotrain_common.termination import last_lines, parse_result

STARTUP_ERROR = "StartupError"
"""Reason of the Failed condition for a deterministic start-up failure."""
WORKER = "worker"
"""The worker container's name (:data:`hetero_operator.render.pods.CONTAINER`)."""

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"can't open file '?([^':\n]+)'?"), "the script {0} does not exist in the image"),
    (re.compile(r"No module named '?([\w.]+)'?"), "module {0} is not in the image"),
    (re.compile(r"\bImportError: (.{0,120})"), "an import fails: {0}"),
    (re.compile(r"\bSyntaxError: (.{0,120})"), "the script does not parse: SyntaxError: {0}"),
    (re.compile(r"heterotrain worker: invalid contract: (.{0,160})"),
     "the worker refuses its environment: {0}"),
)
_EXIT_CODES = {127: "the command is not found in the image (exit 127)",
               126: "the command is not executable (exit 126)"}
_RUNTIME_REASONS = ("StartError", "ContainerCannotRun")
TELLING_LINES = 6
"""Only the last lines of the message are read for a start-up error: a traceback's exception line
and the launcher's line after it (an ``ImportError`` a library printed as a warning early in a
long log is no reason to skip the restarts)."""
RESULT_METRICS_MAX = 32
"""``status.result.metrics``: at most this many (the CRD's ``maxProperties``)."""


def worker_terminated(pod_status: Mapping[str, Any]) -> Mapping[str, Any]:
    """``state.terminated`` of the worker container (of the last run when it restarted in
    place), ``{}`` while it has not ended."""
    for cs in pod_status.get("containerStatuses") or ():
        if cs.get("name") == WORKER:
            done = (cs.get("state") or {}).get("terminated") or (
                cs.get("lastState") or {}).get("terminated")
            return done or {}
    return {}


def startup_error(terminated: Mapping[str, Any]) -> str:
    """Why this failure is deterministic (one phrase, naming the script or module), or ``""``
    when a restart may help (a crash mid-run, an OOM kill, a lost peer)."""
    code = terminated.get("exitCode")
    if not code:
        return ""
    lines = [line for line in str(terminated.get("message") or "").splitlines() if line.strip()]
    message = "\n".join(lines[-TELLING_LINES:])  # the error that ended it, not a warning before
    for pattern, text in _PATTERNS:
        found = pattern.search(message)
        if found:
            return text.format(*(g.strip() for g in found.groups()))
    if code in _EXIT_CODES:
        return _EXIT_CODES[code]
    if terminated.get("reason") in _RUNTIME_REASONS:
        return f"the container runtime cannot start the command ({terminated['reason']}: " \
               f"{last_lines(message, lines=1, max_chars=160)})"
    return ""


def log_tail(terminated: Mapping[str, Any]) -> str:
    """The last lines of a failed container's message (its log's tail), ``""`` for none."""
    if not terminated.get("exitCode"):
        return ""
    return last_lines(str(terminated.get("message") or ""))


def result(terminated: Mapping[str, Any]) -> dict[str, Any] | None:
    """The job's result a succeeded rank 0 left (:func:`heterotrain_common.termination.parse_result`)."""
    if terminated.get("exitCode") != 0:
        return None
    return parse_result(str(terminated.get("message") or ""))


def unschedulable(pod_status: Mapping[str, Any]) -> str:
    """The scheduler's word for a pod it cannot place (the ``PodScheduled`` condition, status
    False, reason ``Unschedulable``: what ``FailedScheduling`` Events say, e.g. ``0/3 nodes are
    available: persistentvolumeclaim "ckpt" not found``), ``""`` otherwise."""
    for cond in pod_status.get("conditions") or ():
        if (cond.get("type") == "PodScheduled" and str(cond.get("status")) == "False"
                and cond.get("reason") == "Unschedulable"):
            return str(cond.get("message") or "Unschedulable").strip()
    return ""


def _decimal(value: Any) -> str | None:
    """A number as the decimal string the status holds (no floats in the API object)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return str(value) if isinstance(value, int) else f"{value:.6g}"


def result_status(values: Mapping[str, Any] | None) -> dict[str, Any]:
    """``status.result`` from rank 0's result: ``step`` and ``totalSteps`` (integers), ``loss``
    and every metric as decimal strings (``metrics``: name -> string); ``{}`` for none."""
    if not values:
        return {}
    out: dict[str, Any] = {}
    for key in ("step", "totalSteps"):
        if isinstance(values.get(key), int) and not isinstance(values.get(key), bool):
            out[key] = int(values[key])
    if _decimal(values.get("loss")) is not None:
        out["loss"] = _decimal(values["loss"])
    metrics = {str(k)[:63]: _decimal(v) if _decimal(v) is not None else str(v)[:256]
               for k, v in sorted((values.get("metrics") or {}).items())[:RESULT_METRICS_MAX]}
    if metrics:
        out["metrics"] = metrics
    return out


def result_text(values: Mapping[str, Any] | None) -> str:
    """`` at step 132 (loss 0.0512, accuracy 0.972)`` for the Succeeded message; ``""``."""
    shown = result_status(values)
    if not shown:
        return ""
    parts = ([f"loss {shown['loss']}"] if "loss" in shown else []) + [
        f"{k} {v}" for k, v in (shown.get("metrics") or {}).items()]
    at = f" at step {shown['step']}" if "step" in shown else ""
    return at + (f" ({', '.join(parts)})" if parts else "")
