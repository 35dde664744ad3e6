"""A local run as ``heterotrain status`` and ``heterotrain logs`` show it: which run directory,
its plan, state, progress and result, and a rank's log (followed while the run lives).

Reads only what the run left (:mod:`.runstate`, :mod:`.rundirs`, :mod:`heterotrain_common.rundir`);
torch-free.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero_operator.local import rundirs, runstate
from heterotrain_common import rundir

POLL_S = 0.2
"""Seconds between looks at a followed log."""


class RunNotFound(LookupError):
    """No run directory matches; the message says where it looked and what to pass."""


def run_dirs(runs: Path) -> list[Path]:
    """The run directories of ``heterotrain run`` under ``runs``, oldest first (by creation
    time of the run's marker, then name)."""
    if not runs.is_dir():
        return []
    found = [d for d in runs.iterdir() if d.is_dir() and (d / rundirs.RUN_MARKER).is_file()]
    return sorted(found, key=lambda d: ((d / rundirs.RUN_MARKER).stat().st_mtime, d.name))


def find_run_dir(target: str | None, runs: Path) -> Path:
    """The run directory ``target`` names: a directory of ``heterotrain run``; a job name (its
    latest run under ``runs``); None: the latest run of any job.

    Raises:
        RunNotFound: nothing matches.
    """
    if target is not None and Path(target).is_dir():
        path = Path(target)
        if not (path / rundirs.RUN_MARKER).is_file() and not (path / rundirs.RUN_FILE).is_file():
            raise RunNotFound(f"{target} is no run directory of heterotrain run (no "
                              f"{rundirs.RUN_MARKER})")
        return path
    mine = run_dirs(runs)
    if target is not None:
        mine = [d for d in mine if job_of(d) == target]
    if not mine:
        what = f"no run of job {target!r}" if target else "no run"
        raise RunNotFound(f"{what} under {runs}/ (heterotrain run writes runs/<job>-<time>; pass "
                          "a run directory, or a job name with --namespace for a job on a cluster)")
    return mine[-1]


def job_of(workdir: Path) -> str:
    """The job name of a run directory (its manifest copy's ``metadata.name``; else the
    directory name without the time stamp)."""
    import yaml
    try:
        doc = yaml.safe_load((workdir / rundirs.JOB_COPY).read_text())
        return str(doc["metadata"]["name"])
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        parts = workdir.name.split("-")
        return "-".join(parts[:-2]) if len(parts) > 2 else workdir.name


@dataclass(frozen=True, kw_only=True, slots=True)
class RunView:
    """What ``heterotrain status RUNDIR`` prints.

    Attributes:
        workdir: the run directory.
        job: the job's name.
        state: the run's state (:class:`~.runstate.RunState`).
        world_size: ranks of the plan (0 when the plan was not recorded).
        devices: ``(GPU type, ranks)`` of the plan, most first.
        nodes: nodes of the plan.
        global_batch: samples per step of the plan (0 when unknown).
        step / total_steps: rank 0's job step (resumed step + steps taken) and the total when
            the script told it; None when unknown.
        loss: rank 0's last loss, None when not reported.
        result: rank 0's ``result.json``, None when not written.
        log_dir: where ``rank-<r>.log`` are.
    """

    workdir: Path
    job: str
    state: runstate.RunState
    world_size: int
    devices: tuple[tuple[str, int], ...]
    nodes: int
    global_batch: int
    step: int | None
    total_steps: int | None
    loss: float | None
    result: dict[str, Any] | None
    log_dir: Path

    def lines(self) -> list[str]:
        """The status as ``field  value`` lines."""
        plan = (f"{self.world_size} ranks on {self.nodes} node{'s' if self.nodes != 1 else ''}: "
                + ", ".join(f"{n}x {d}" for d, n in self.devices)
                + (f"; global batch {self.global_batch}" if self.global_batch else "")
                if self.world_size else "not recorded (a run of an older version)")
        state = self.state.state + (f" (pid {self.state.pid})" if self.state.running else "")
        if self.state.exit_code not in (None, 0):
            state += f", exit code {self.state.exit_code}"
        if self.state.reason:
            state += f": {self.state.reason}"
        if self.step is None:
            progress = "no statistics yet (rank 0 writes rank-0.json once it steps)"
        else:
            progress = f"step {self.step}" + (f" of {self.total_steps}" if self.total_steps else "")
            if self.loss is not None:
                progress += f", loss {self.loss:.4f}"
        out = [("Run", str(self.workdir)), ("Job", self.job), ("Plan", plan), ("State", state),
               ("Progress", progress)]
        if self.result:
            out.append(("Result", ", ".join(f"{k} {_number(v)}" for k, v in sorted(self.result.items()))))
        elif not self.state.running:
            out.append(("Result", "none written (the script reports one with "
                                  "heterotrain_common.rundir.write_result on rank 0)"))
        out.append(("Logs", f"{self.log_dir}/rank-<r>.log (heterotrain logs {self.workdir} --rank R)"))
        return [f"{k:<9} {v}" for k, v in out]


def view(workdir: Path) -> RunView:
    """Read a run directory (any file may be missing: a run that just started, an old run)."""
    finished, _ = rundirs.finished_step(workdir)
    plan = runstate.read_plan(workdir) or {}
    ranks = plan.get("ranks") or []
    stats = rundir.read_json(rundir.rank_stats_path(workdir, 0))
    step = total = loss = None
    if stats is not None:
        step = int(stats.get("resumed_step") or 0) + int(stats.get("steps") or 0)
        total = stats.get("total_steps")
        loss = stats.get("loss")
    return RunView(
        workdir=workdir, job=job_of(workdir), state=runstate.read_state(workdir, finished),
        world_size=int(plan.get("world_size") or len(ranks)),
        devices=tuple(Counter(str(r.get("product", "?")) for r in ranks).most_common()),
        nodes=len({r.get("node") for r in ranks}),
        global_batch=sum(int(r.get("local_batch") or 0) for r in ranks),
        step=step, total_steps=int(total) if isinstance(total, int) else None,
        loss=float(loss) if isinstance(loss, int | float) else None,
        result=rundir.read_json(workdir / rundir.RESULT_FILE), log_dir=log_dir(workdir))


def log_dir(workdir: Path) -> Path:
    """Where the run's ``rank-<r>.log`` are: its ``--log-dir`` when it had one, else itself."""
    try:
        options = rundirs.read_run_file(workdir)
    except ValueError:
        return workdir
    return Path(options["log_dir"]) if options.get("log_dir") else workdir


def rank_log(workdir: Path, rank: int) -> Path:
    """``rank-<rank>.log`` of the run."""
    return log_dir(workdir) / f"rank-{rank}.log"


def follow(path: Path, *, running: Callable[[], bool], wait_s: float,
           sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic
           ) -> Iterator[str]:
    """The text of ``path``, then what is appended while ``running()`` is true; ends once the
    run has ended and the file has nothing more.

    A bounded wait: when the file does not exist yet it waits at most ``wait_s`` seconds for it
    (while the run lives), and when the run's state cannot be known (``running`` false from the
    start) it prints what is there and ends.

    Raises:
        FileNotFoundError: ``path`` did not appear within ``wait_s``.
    """
    deadline = clock() + wait_s
    while not path.exists():
        if not running() or clock() >= deadline:
            raise FileNotFoundError(f"{path} does not exist" + (f" after {wait_s:g} s" if running() else ""))
        sleep(POLL_S)
    with path.open("r", errors="replace") as f:
        while True:
            chunk = f.read()
            if chunk:
                yield chunk
                continue
            if not running():
                rest = f.read()  # written between the last read and the end
                if rest:
                    yield rest
                return
            sleep(POLL_S)


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
