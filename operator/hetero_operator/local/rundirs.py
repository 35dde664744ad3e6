"""The run directories of ``heterotrain run``: a new one per run (never shared, even by two runs
started in the same second), what a resume needs (``run.json``), and pruning old ones."""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

RUNS_DIR = "runs"
"""Where run directories go unless ``--workdir`` is given."""
RUN_MARKER = ".heterotrain-run"
"""Empty file marking a directory made by ``heterotrain run`` (``--keep-runs`` prunes only those)."""
RUN_FILE = "run.json"
"""What ``--resume RUNDIR`` reads: the job manifest's copy and the run's options."""
JOB_COPY = "job.yaml"
"""The manifest as the run read it (``--resume`` plans this copy, not a file edited since)."""
FINISHED_FILE = "finished.json"
"""Written when the run succeeded: its final step (``--resume`` of a finished run starts nothing)."""
RUN_UID_KEY = "run_uid"
"""``run.json``'s key for the run's identity, given to every rank as ``HTJ_JOB_UID`` (a job's
``metadata.uid`` on a cluster): a checkpoint belongs to the run that wrote it, so a new run in a
reused ``--workdir`` starts at step 0 beside an earlier run's checkpoints, while ``--resume`` keeps
the run's UID and continues from its own (issue 33; ``hetero_worker.ckpt.ownership``)."""
GENERATION_KEY = "restart_generation"
"""``run.json``'s key for the restart generation of the run's latest attempt: ``--resume`` goes on
above it, as checkpoint manifests of a newer generation of the same run UID would otherwise make
the resumed ranks a stale gang (``hetero_worker.ckpt.ownership.SupersededError``)."""
MAX_SAME_NAME = 10_000
"""Most runs of one job in one second (``-2`` .. suffixes) before giving up."""


def new_run_dir(runs: Path, job_name: str, *, now_s: float | None = None) -> Path:
    """Create and return ``runs/<job>-<YYYYmmdd-HHMMSS>``, or ``...-2``, ``-3``, ... when a run of
    the same job already took that name (another run started in the same second).

    The directory is created with an exclusive ``mkdir``, so two processes never get the same one.

    Args:
        runs: the parent directory (created when missing).
        job_name: ``metadata.name``.
        now_s: seconds since the epoch (default: now), local time in the name.

    Raises:
        OSError: the directory cannot be created (permissions, disk), or
            :data:`MAX_SAME_NAME` names are taken.
    """
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now_s is None else now_s))
    runs.mkdir(parents=True, exist_ok=True)
    for n in range(1, MAX_SAME_NAME + 1):
        candidate = runs / (f"{job_name}-{stamp}" + (f"-{n}" if n > 1 else ""))
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        (candidate / RUN_MARKER).touch()
        return candidate
    raise OSError(f"{runs}: {MAX_SAME_NAME} runs of {job_name} in the second {stamp}")


def write_run_file(workdir: Path, *, manifest_text: str, options: Mapping[str, Any]) -> str:
    """Keep what ``--resume`` needs: the manifest's text (``job.yaml``), the options
    (``run.json``, JSON values only: paths as absolute strings) and a new run UID
    (:data:`RUN_UID_KEY`), which it returns."""
    run_uid = str(uuid.uuid4())
    (workdir / JOB_COPY).write_text(manifest_text)
    (workdir / RUN_FILE).write_text(json.dumps({"options": dict(options), RUN_UID_KEY: run_uid},
                                               indent=1, sort_keys=True))
    return run_uid


def read_run_uid(workdir: Path) -> str:
    """The run UID ``run.json`` in ``workdir`` records; ``""`` for a run directory written before
    runs had one (its checkpoints carry none either: every one of them is the run's own)."""
    try:
        data = json.loads((workdir / RUN_FILE).read_text())
    except (OSError, ValueError):
        return ""
    return str(data.get(RUN_UID_KEY) or "") if isinstance(data, dict) else ""


def earlier_checkpoints_note(workdir: Path, *, invoked_as: str) -> str:
    """What a new run (not ``--resume``) in ``workdir`` says when ``workdir/checkpoints`` already
    holds files (an earlier run's, finished or not): it starts at step 0 beside them, and how to
    continue a run or keep runs apart instead; ``""`` when there are none."""
    directory = workdir / "checkpoints"
    if not directory.is_dir() or not any(p.is_file() for p in directory.rglob("*")):
        return ""
    return (f"checkpoint_not_resumed: {directory} holds checkpoints of an earlier run; this is a "
            "new run (a new run UID), so it starts at step 0 and leaves them as they are. To "
            f"continue a run from its checkpoints, resume it in its own directory instead: "
            f"{invoked_as} run --resume RUNDIR (before a new run is started there); to take "
            "another run's checkpoints in a new run, set spec.training.checkpoint.resumeFrom "
            "(that run's metadata.name, or AnyJob); to keep runs apart, give each a fresh --workdir (or leave it out)")


def write_ranks(workdir: Path, ranks: list[dict[str, Any]]) -> None:
    """Add the running attempt's ranks to ``run.json`` (``ranks[]``: ``rank``, ``pid``,
    ``gpu_product``, ``node``), replacing an earlier attempt's; kept beside the options."""
    _update_run_file(workdir, "ranks", ranks)


def write_generation(workdir: Path, generation: int) -> None:
    """Record the restart generation of the attempt starting now (:data:`GENERATION_KEY`)."""
    _update_run_file(workdir, GENERATION_KEY, generation)


def next_generation(workdir: Path) -> int:
    """The restart generation a run's first attempt in ``workdir`` takes: one above the recorded
    one (``--resume``), 0 when none is recorded (a new run: its ``run.json`` was just written)."""
    try:
        data = json.loads((workdir / RUN_FILE).read_text())
    except (OSError, ValueError):
        return 0
    recorded = data.get(GENERATION_KEY) if isinstance(data, dict) else None
    return recorded + 1 if isinstance(recorded, int) else 0


def _update_run_file(workdir: Path, key: str, value: Any) -> None:
    """Set ``key`` in ``run.json``, keeping the rest."""
    path = workdir / RUN_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        data = {}
    data[key] = value
    path.write_text(json.dumps(data, indent=1, sort_keys=True))


def read_run_file(workdir: Path) -> dict[str, Any]:
    """The options a run in ``workdir`` was started with (see :func:`write_run_file`).

    Raises:
        ValueError: ``workdir`` holds no ``run.json`` / ``job.yaml`` of ``heterotrain run``, or
            they cannot be read; the message names the directory and what is missing.
    """
    path = workdir / RUN_FILE
    if not workdir.is_dir():
        raise ValueError(f"--resume {workdir}: no such directory")
    if not path.is_file() or not (workdir / JOB_COPY).is_file():
        raise ValueError(f"--resume {workdir}: not a run directory of heterotrain run (no "
                         f"{RUN_FILE} and {JOB_COPY}; runs before this version cannot be resumed "
                         "this way: pass JOB.yaml --workdir DIR instead)")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--resume {workdir}: {RUN_FILE} cannot be read ({exc})") from None
    options = data.get("options") if isinstance(data, dict) else None
    if not isinstance(options, dict):
        raise ValueError(f"--resume {workdir}: {RUN_FILE} has no options")
    return options


def mark_finished(workdir: Path, *, final_step: int | None) -> None:
    """Record that the run in ``workdir`` succeeded, after ``final_step`` steps (None: unknown,
    the worker wrote no statistics)."""
    (workdir / FINISHED_FILE).write_text(json.dumps({"final_step": final_step}))


def clear_finished(workdir: Path) -> None:
    """Forget a success recorded in ``workdir`` (a new attempt runs in it)."""
    (workdir / FINISHED_FILE).unlink(missing_ok=True)


def finished_step(workdir: Path) -> tuple[bool, int | None]:
    """(True, its final step or None) when the run in ``workdir`` succeeded; (False, None) when
    it did not finish (interrupted, failed, still running) or the record cannot be read."""
    try:
        data = json.loads((workdir / FINISHED_FILE).read_text())
    except (OSError, ValueError):
        return False, None
    step = data.get("final_step") if isinstance(data, dict) else None
    return True, int(step) if isinstance(step, int) else None


def prune_runs(runs: Path, *, keep: int, current: Path | None = None) -> list[Path]:
    """Delete all but the newest ``keep`` run directories under ``runs`` (by modification time).

    Only directories holding :data:`RUN_MARKER` (made by ``heterotrain run``) are considered, and
    ``current`` is never deleted.

    Returns:
        The directories removed.
    """
    if keep < 0 or not runs.is_dir():
        return []
    mine = [d for d in runs.iterdir() if d.is_dir() and (d / RUN_MARKER).is_file()]
    mine.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    keep_set = set(mine[:keep]) | ({current.resolve()} if current is not None else set())
    removed = [d for d in mine[keep:] if d.resolve() not in keep_set]
    for d in removed:
        shutil.rmtree(d, ignore_errors=True)
    return removed
