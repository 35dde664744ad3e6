"""Files a rank leaves for ``heterotrain run``: per-rank statistics and the job's result.

``heterotrain run`` sets ``HTJ_RUN_DIR`` (an extra variable beside the contract; a pod normally has
none). When it is set:

* every rank's :class:`hetero_worker.metrics.WorkerMetrics` keeps ``rank-<R>.json`` up to date
  (cumulative step, compute and wait time, samples, last loss; format in docs/embedded.md), at most
  a few times a second and once more at exit; the progress bar and the final table read it;
* rank 0 of a job that measures a result (held-out accuracy, perplexity) writes ``result.json``
  with :func:`write_result`, e.g. ``{"accuracy": 0.972}``.

Torch-free. Writes are atomic (temp file + rename) so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from heterotrain_common import envnames, termination

RUN_DIR = envnames.RUN_DIR
"""Environment variable: directory for the files of this module; unset disables them (defined and
parsed in :mod:`heterotrain_common.contract`; a parsed contract carries it as ``run.dir``)."""
RESULT_FILE = "result.json"
FIRST_STEP_KEYS = {"step_seconds": "first_step_seconds", "samples": "first_step_samples",
                   "compute_seconds": "first_step_compute_seconds",
                   "comm_wait_seconds": "first_step_comm_wait_seconds"}
"""Each total of ``rank-<R>.json`` -> the key holding its first step's share (the warm-up, kept
apart by the worker's metrics and left out by what the planner learns)."""


def run_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The run directory from the environment, None when unset or empty."""
    value = (os.environ if environ is None else environ).get(RUN_DIR, "")
    return Path(value) if value else None


def rank_stats_path(directory: Path, rank: int) -> Path:
    """``<dir>/rank-<rank>.json``."""
    return directory / f"rank-{rank}.json"


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write JSON to ``path`` through a temp file in the same directory and ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    """Read a JSON object; None when the file is missing or not a JSON object."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_result(values: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Path | None:
    """Record the job's result for ``heterotrain run`` (call on rank 0 only).

    Args:
        values: JSON-serialisable numbers and strings; ``accuracy`` (a ratio 0..1) is shown and
            checked by the embedded default's tests, other keys are listed as they are.
        environ: defaults to ``os.environ``.

    In a pod (no ``HTJ_RUN_DIR``) the values go into the container's termination message as the
    result's ``metrics``, which the operator writes into ``status.result``
    (:func:`heterotrain_common.termination.record`; issue 33).

    Returns:
        The file written, or None when ``HTJ_RUN_DIR`` is not set and there is no
        termination-message file (outside a pod).
    """
    directory = run_dir(environ)
    if directory is None:
        return termination.record({"metrics": dict(values)}, environ)
    path = directory / RESULT_FILE
    write_json_atomic(path, dict(values))
    return path
