"""The job's result in rank 0's termination message, and what a failed rank's message says
(issue 33, item 4).  Torch- and kopf-free: the worker writes, the operator reads.

A Kubernetes container may leave a message in the file at its ``terminationMessagePath``
(``/dev/termination-log`` unless set; the kubelet creates it) which the kubelet copies into the
pod's ``status.containerStatuses[].state.terminated.message`` (at most 4096 bytes).  With
``terminationMessagePolicy: FallbackToLogsOnError`` (which the operator sets on the worker
container) a container that failed with an empty file gets the tail of its log there instead
(https://kubernetes.io/docs/tasks/debug/debug-application/determine-reason-pod-failure/).

* Rank 0, when it ends well, writes one JSON object (:func:`record`): the job's final ``step``,
  ``totalSteps``, last ``loss`` (``Trainer.close``) and the script's ``metrics``
  (``heterotrain_common.rundir.write_result``: held-out accuracy, perplexity).  The operator
  writes it into ``status.result`` and the final ``status.progress`` (:func:`parse_result`).
* A failed rank's message is its log's tail: :func:`last_lines` keeps the last lines for the job's
  condition and Event.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

TERMINATION_LOG = "/dev/termination-log"
"""Kubernetes' default ``terminationMessagePath``."""
TERMINATION_LOG_ENV = "HTJ_TERMINATION_LOG"
"""Another path for the file (a kubelet that runs containers as host processes sets it); unset:
:data:`TERMINATION_LOG`.  Not part of the env contract: the worker only writes when the file
exists (the kubelet created it), so nothing is written outside a pod."""
MARKER = "heterotrain.io/result"
"""Key (value 1) that tells the operator the message is a result, not a log tail."""
MESSAGE_MAX_BYTES = 4096
"""The kubelet keeps at most this much of the file (Kubernetes' limit per container)."""


def termination_log(environ: Mapping[str, str] | None = None) -> Path:
    """The termination-message file: ``HTJ_TERMINATION_LOG``, else ``/dev/termination-log``."""
    env = os.environ if environ is None else environ
    return Path(env.get(TERMINATION_LOG_ENV) or TERMINATION_LOG)


def record(values: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Path | None:
    """Merge ``values`` into the result in the termination-message file (rank 0, at the end).

    Only when the file exists (the kubelet made it): outside a pod nothing is written.  Values
    are JSON numbers, strings or a ``metrics`` mapping of them; the file stays below
    :data:`MESSAGE_MAX_BYTES` (metrics that do not fit are left out, the last first).

    Returns:
        The file written, or None when there is none (or it cannot be written: the result is
        advice, a failure to write it never fails the job).
    """
    path = termination_log(environ)
    if not path.is_file():
        return None
    try:
        current = parse_result(path.read_text(encoding="utf-8", errors="replace")) or {}
        merged: dict[str, Any] = {MARKER: 1, **current}
        for key, value in values.items():
            if key == "metrics" and isinstance(value, Mapping):
                merged["metrics"] = {**(merged.get("metrics") or {}), **_plain(value)}
            elif _is_plain(value):
                merged[key] = value
        text = json.dumps(merged, sort_keys=True)
        while len(text.encode()) > MESSAGE_MAX_BYTES and merged.get("metrics"):
            merged["metrics"].pop(sorted(merged["metrics"])[-1])
            text = json.dumps(merged, sort_keys=True)
        path.write_text(text + "\n", encoding="utf-8")
    except OSError:
        return None
    return path


def _is_plain(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _plain(values: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k): v for k, v in values.items() if _is_plain(v) and not isinstance(v, bool)}


def parse_result(message: str | None) -> dict[str, Any] | None:
    """The result object of a termination message (its last line that is a JSON object with
    :data:`MARKER`), without the marker; None when it holds none (a log tail, empty)."""
    for line in reversed((message or "").strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get(MARKER) == 1:
            return {k: v for k, v in data.items() if k != MARKER}
    return None


def last_lines(message: str | None, *, lines: int = 5, max_chars: int = 600) -> str:
    """The last ``lines`` non-empty lines of a log tail, joined with `` | ``, at most
    ``max_chars`` characters (cut at the front); ``""`` for none."""
    kept = [line.strip() for line in (message or "").splitlines() if line.strip()][-lines:]
    text = " | ".join(kept)
    return text if len(text) <= max_chars else "..." + text[-(max_chars - 3):]
