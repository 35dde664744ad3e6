"""Supervise the ranks of ``heterotrain run``: start every rank, show progress, stop all when one
fails, restart under the run policy."""


from __future__ import annotations

import dataclasses
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hetero_operator.api import podtemplate
from hetero_operator.local import failure as failures
from hetero_operator.local import rundirs
from hetero_operator.local.elastic import ElasticWatch
from hetero_operator.lifecycle import restart
from hetero_operator.local import valueview
from hetero_operator.render.env import render_rank_envs
from heterotrain_common import defaults, envnames, envread, procs, rundir

STALL_WARN_S = 120.0
"""Warn when rank 0's step count has not moved for this many seconds."""
ATTEMPT_MARK = "--- attempt "
"""Each attempt's output in ``rank-<r>.log`` starts with ``--- attempt N ---``."""


def process_envs(rank_envs: Sequence[Mapping[str, str]], *, base_env: Mapping[str, str],
                 run_dir: Path, worker_env: Sequence[Mapping[str, Any]],
                 gpu_ids: Sequence[str] | None) -> list[dict[str, str]]:
    """The complete environment of each rank process.

    ``base_env`` (our own environment, minus any contract variables it carries), then the job's
    ``spec.worker.env`` (plain ``value`` entries), then the rank's contract, ``HTJ_RUN_DIR``,
    ``PYTHONUNBUFFERED=1``, ``OMP_NUM_THREADS`` (CPU cores / ranks unless set) and, on real GPUs,
    ``CUDA_VISIBLE_DEVICES`` = the rank's GPU by UUID (``gpu_ids``), which means the same GPU in
    any ``CUDA_DEVICE_ORDER``, so the order is left as the caller had it.
    """
    contract_vars = {*envnames.REQUIRED_VARS, *envnames.OPTIONAL_VARS, *envnames.MEMORY_VARS, envnames.FIRST_RANK,
                     *envnames.PIPELINE_VARS, "CUDA_VISIBLE_DEVICES"}
    base = {k: v for k, v in base_env.items() if k not in contract_vars}
    bin_dir = str(Path(sys.executable).parent)
    if bin_dir not in base.get("PATH", "").split(os.pathsep):
        base["PATH"] = os.pathsep.join(p for p in (bin_dir, base.get("PATH", "")) if p)
    for var in worker_env:
        if "name" in var and "value" in var:
            base[str(var["name"])] = str(var["value"])
    threads = str(procs.threads_per_rank(len(rank_envs)))
    envs = []
    for r, rank_env in enumerate(rank_envs):
        env = {**base, **rank_env, rundir.RUN_DIR: str(run_dir), "PYTHONUNBUFFERED": "1"}
        env.setdefault("OMP_NUM_THREADS", threads)
        if gpu_ids is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu_ids[r]
        envs.append(env)
    return envs


class Planned:
    """What planning produced: the job, plan, whether simulated, real GPU UUIDs per rank, and
    the learned table the plan was made with (``PlanInputs.learned``)."""

    def __init__(self, job: Any, plan: Any, simulated: bool, gpu_ids: list[str] | None, *,
                 learned: Mapping[tuple[str, str], Any] | None = None) -> None:
        self.job, self.plan, self.simulated, self.gpu_ids = job, plan, simulated, gpu_ids
        self.learned = dict(learned or {})
        self.true_speeds: dict[str, float] = {}  # simulated nodes' real speed (valueview)
        self.extra_env: dict[str, str] = {}  # run-wide knobs on every rank (HTJ_MAX_STEPS ...)


@dataclass(frozen=True, kw_only=True, slots=True)
class Ended:
    """How the supervised run ended.

    Attributes:
        outcome: the last attempt's gang outcome (``failed_index`` is the rank that started a
            failure, not the first exit seen).
        failure: that rank's exit code and first error line; None when no rank failed.
        reason: why no restart followed a failure (``no checkpointing ...``); ``""`` otherwise.
    """

    outcome: procs.Outcome
    failure: failures.RankFailure | None = None
    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class RankOutput:
    """Where the ranks' output goes (torchrun's ``--log-dir``, ``--tee``, ``--local-ranks-filter``).

    Attributes:
        log_dir: directory of ``rank-<r>.log`` (every rank, both streams, always).
        shown_ranks: ranks whose output is also shown on the console, each line prefixed
            ``rank <r> |``; None: every rank.
        tee: which of the shown ranks' streams the console gets: 0 none, 1 stdout, 2 stderr,
            3 both (torchrun's ``Std`` values).
    """

    log_dir: Path
    shown_ranks: frozenset[int] | None = frozenset({0})
    tee: int = 3

    def shows(self, rank: int) -> bool:
        """True when ``rank``'s output reaches the console."""
        return self.tee != 0 and (self.shown_ranks is None or rank in self.shown_ranks)


def supervise(planned: Planned, argv: list[str], *, workdir: Path, port_base: int, console: Any,
              grace_s: float, output: RankOutput | None = None) -> Ended:
    """Run attempts until success, a signal, the deadline, or no restart left (like the operator).

    A failure that repeats (same exit code and last log line of the failing rank) on two attempts in
    a row before any step completed is not retried further: the failure is deterministic (a wrong
    module name, a bad argument) and every restart up to ``backoffLimit`` would repeat it.
    """
    job = planned.job
    output = output or RankOutput(log_dir=workdir)
    checkpoint_dir = str((workdir / "checkpoints").resolve()) if job.training.checkpoint_path else ""
    limit_s = job.run_policy.active_deadline_seconds
    deadline_s = None if limit_s is None else time.monotonic() + limit_s
    attempt, first_generation = 0, rundirs.next_generation(workdir)  # --resume: above the last
    last_failure: tuple[int, str] | None = None
    backoff_base_s, backoff_max_s = backoff_settings(os.environ)
    while True:
        envs = render_envs(planned, port_base=port_base, checkpoint_dir=checkpoint_dir, workdir=workdir)
        rundirs.write_generation(workdir, first_generation + attempt)
        for env in envs:  # one restart generation on every rank, as the operator does (case 34)
            env[envnames.RESTART_GENERATION] = str(first_generation + attempt)
            env[envnames.TORCHELASTIC_RESTART_COUNT] = str(attempt)  # torchrun's: this launch's
            env[envnames.TERMINATION_GRACE_S] = f"{grace_s:g}"  # ours, not the pod's 300 s
        watch = (ElasticWatch(planned.plan, min_ranks=job.elastic.min_ranks,
                              max_ranks=job.elastic.max_ranks,
                              restart_limit=job.run_policy.backoff_limit, console=console,
                              workdir=workdir) if job.elastic is not None else None)
        if watch is not None:  # spec.elastic: a lost rank shrinks the job (local.elastic)
            watch.add_env(envs)
        started_s = time.time()
        outcome, cause = _attempt(argv, envs, workdir=workdir, console=console, attempt=attempt,
                                  grace_s=grace_s, deadline_s=deadline_s, output=output,
                                  elastic=watch, planned=planned)
        if watch is not None:
            watch.finish()
        if outcome.deadline_exceeded:
            console.print(f"[red]Job failed[/]: DeadlineExceeded (spec.runPolicy."
                          f"activeDeadlineSeconds={limit_s})")
            return Ended(outcome=outcome, reason="DeadlineExceeded")
        if outcome.exit_code == 0 or outcome.signal_received is not None:
            return Ended(outcome=outcome)
        progressed = _stepped_since(workdir, len(envs), started_s)
        failure = _failure_signature(output.log_dir, outcome)
        if not progressed and failure is not None and failure == last_failure:
            reason = ("it failed the same way twice before any step completed; a restart would "
                      "fail again, so the run stops here instead of retrying up to backoffLimit "
                      f"{job.run_policy.backoff_limit}")
            return _failed(console, outcome, cause, reason)
        last_failure = None if progressed else failure
        verdict = restart.after_failure(  # the operator's policy (lifecycle.restart)
            restarts=attempt, backoff_limit=job.run_policy.backoff_limit,
            checkpointing=bool(checkpoint_dir),
            checkpoint_saved=has_checkpoint(Path(checkpoint_dir)) if checkpoint_dir else None,
            base_s=backoff_base_s, max_s=backoff_max_s)
        if not verdict.restart:
            return _failed(console, outcome, cause,
                           f"backoffLimit {job.run_policy.backoff_limit} reached")
        attempt += 1
        console.print(f"[yellow]Restarting all ranks from {verdict.source}[/] "
                      f"(restart {attempt} of {job.run_policy.backoff_limit}) in "
                      f"{verdict.delay_s:.0f} s", highlight=False)
        _wait_backoff(verdict.delay_s, deadline_s)


def backoff_settings(environ: Mapping[str, str]) -> tuple[float, float]:
    """The restart backoff of ``heterotrain run``, seconds: the operator's own settings
    ``HTJ_BACKOFF_BASE_S`` and ``HTJ_BACKOFF_MAX_S`` (defaults in :mod:`heterotrain_common.defaults`).

    Raises:
        ContractError: a value is not a number >= 0.
    """
    return (envread.seconds_from_env(environ, "HTJ_BACKOFF_BASE_S", default_s=defaults.BACKOFF_BASE_S,
                                     allow_zero=True),
            envread.seconds_from_env(environ, "HTJ_BACKOFF_MAX_S", default_s=defaults.BACKOFF_MAX_S,
                                     allow_zero=True))


def _wait_backoff(delay_s: float, deadline_s: float | None) -> None:
    """Sleep the restart backoff, at most until the deadline (``time.monotonic()``)."""
    if deadline_s is not None:
        delay_s = min(delay_s, max(deadline_s - time.monotonic(), 0.0))
    if delay_s > 0:
        time.sleep(delay_s)  # sync-ok: the backoff between two attempts; no rank runs


def _failed(console: Any, outcome: procs.Outcome, cause: failures.RankFailure | None,
            reason: str) -> Ended:
    """Print ``Job failed: <the cause>; <reason>`` and return how it ended."""
    what = cause.sentence() if cause is not None else f"exit code {outcome.exit_code}"
    console.print(f"[red]Job failed[/]: {_escape(what)}; {reason}", highlight=False)
    return Ended(outcome=outcome, failure=cause, reason=reason)


def _stepped_since(workdir: Path, world: int, since_s: float) -> bool:
    """True when some rank's ``rank-<r>.json``, written since ``since_s`` (``time.time()``),
    reports a completed step."""
    for r in range(world):
        path = rundir.rank_stats_path(workdir, r)
        try:
            fresh = path.stat().st_mtime >= since_s
        except OSError:
            continue
        if fresh and int((rundir.read_json(path) or {}).get("steps") or 0) > 0:
            return True
    return False


def _failure_signature(log_dir: Path, outcome: procs.Outcome) -> tuple[int, str] | None:
    """(exit code, last non-empty line the failed rank printed in this attempt); None when no
    rank failed. The rank is left out: when every rank fails alike, which one is seen first varies."""
    r = outcome.failed_index
    if r is None:
        return None
    text = procs.tail(log_dir / f"rank-{r}.log", lines=200)
    attempt_lines = text.rsplit(ATTEMPT_MARK, 1)[-1].splitlines()[1:]
    last = next((line.strip() for line in reversed(attempt_lines) if line.strip()), "")
    return (outcome.exit_code, last)


def has_checkpoint(directory: Path) -> bool:
    """True when ``directory`` holds any file (a checkpoint was saved)."""
    return directory.is_dir() and any(p.is_file() for p in directory.rglob("*"))


def render_envs(planned: Planned, *, port_base: int, checkpoint_dir: str, workdir: Path) -> list[dict[str, str]]:
    """Every rank's complete process environment: the operator's rank envs, the simulated
    speeds, the run-wide knobs (:attr:`Planned.extra_env`)."""

    rank_envs = render_rank_envs(
        planned.plan, planned.job, master_addr="127.0.0.1", master_port=_free_port(),
        simulated=planned.simulated, metrics_port_base=port_base or None,
        checkpoint_dir=checkpoint_dir)
    if not port_base:
        for env in rank_envs:
            env[envnames.METRICS_PORT] = "0"
    if planned.simulated:
        valueview.apply_simulated_speeds(rank_envs, planned.plan, planned.true_speeds)
    envs = process_envs(rank_envs, base_env=os.environ, run_dir=workdir.resolve(),
                        worker_env=[*planned.job.worker.env, *podtemplate.worker_container(
                            planned.job.worker.template).get("env", ())], gpu_ids=planned.gpu_ids)
    for env in envs:
        env.update(planned.extra_env)
    return envs


def _attempt(argv: list[str], envs: list[dict[str, str]], *, workdir: Path, console: Any,
             attempt: int, grace_s: float, deadline_s: float | None, output: RankOutput,
             elastic: ElasticWatch | None = None, planned: Planned | None = None
             ) -> tuple[procs.Outcome, failures.RankFailure | None]:
    """Start every rank, show progress and the shown ranks' output, wait.

    Returns:
        The outcome (its ``failed_index`` and ``exit_code`` those of the rank that started the
        failure) and that rank's failure; None when no rank failed or a signal stopped the run.
    """
    import subprocess

    output.log_dir.mkdir(parents=True, exist_ok=True)
    logs = [output.log_dir / f"rank-{r}.log" for r in range(len(envs))]
    files = [procs.open_log(p) for p in logs]
    for f in files:
        f.write(f"{ATTEMPT_MARK}{attempt} ---\n".encode())
    shown = [output.shows(r) for r in range(len(envs))]
    try:
        gang = procs.Gang(argv, envs, stdouts=[subprocess.PIPE if s else f for s, f in zip(shown, files)],
                          stderrs=[subprocess.PIPE if s else f for s, f in zip(shown, files)],
                          cwd=os.getcwd())
    except OSError as exc:
        console.print(f"[red]cannot start {argv[0]!r}: {exc}[/]")
        for f in files:
            f.close()
        return (procs.Outcome(exit_code=127, failed_index=0),
                failures.RankFailure(rank=0, exit_code=127, error=str(exc), collateral=False))
    view = _ProgressView(console, workdir, log_dir=output.log_dir)
    echoes = [threading.Thread(target=_echo, args=(stream, files[r], view, r, bool(output.tee & bit)),
                               daemon=True)
              for r, p in enumerate(gang.procs) if shown[r]
              for stream, bit in ((p.stdout, 1), (p.stderr, 2))]
    try:  # the ranks run from here: a Ctrl-C from now on is forwarded, never a KeyboardInterrupt
        with procs.forwarding_signals(gang, as_sigterm=True), view:  # a preemption's stop
            if planned is not None:  # run.json: ranks[].pid, so a user (or a test) can kill one
                _write_ranks(workdir, gang, planned)
            for echo in echoes:
                echo.start()

            def start_again(r: int, extra: dict[str, str]) -> None:  # an elastic rank rejoins
                files[r].write(f"--- rank {r} started again to join the running job ---\n".encode())
                files[r].flush()
                gang.restart(r, argv, {**envs[r], **extra}, stdout=files[r], stderr=files[r],
                             cwd=os.getcwd())
                if planned is not None:
                    _write_ranks(workdir, gang, planned)

            regrow = elastic.regrow(start_again) if elastic else None
            outcome = gang.wait(on_tick=(lambda: (regrow(), view.tick())) if regrow else view.tick,
                                grace_s=grace_s, deadline_s=deadline_s, signal_grace_s=grace_s,
                                on_failure=elastic.on_failure(gang) if elastic else None)
        for echo in echoes:
            echo.join(timeout=5)
    finally:
        for f in files:
            f.close()
    if outcome.failed_index is None or outcome.signal_received is not None:
        return outcome, None
    cause, collateral = _cause(gang, outcome.failed_index, logs)
    r = cause.rank
    others = (f"; rank{'s' if len(collateral) > 1 else ''} {', '.join(map(str, collateral))} "
              "failed after it (a peer left the collective: collateral, not the cause)"
              if collateral else "")
    console.print(f"[red]{_escape(cause.sentence())}[/] first; stopped the other ranks{others}. "
                  f"Last lines of {logs[r]}:", highlight=False)
    console.print(procs.tail(logs[r]), markup=False, highlight=False)
    return dataclasses.replace(outcome, failed_index=r, exit_code=cause.exit_code), cause


def _write_ranks(workdir: Path, gang: procs.Gang, planned: Planned) -> None:
    """run.json's ``ranks[]``: each rank's pid (the process running now), GPU product and node."""
    rundirs.write_ranks(workdir, [
        {"rank": r, "pid": p.pid, "gpu_product": placed.product, "node": placed.node}
        for r, (p, placed) in enumerate(zip(gang.procs, planned.plan.ranks))])


def _cause(gang: procs.Gang, first_seen: int,
           logs: Sequence[Path]) -> tuple[failures.RankFailure, list[int]]:
    """The failure that started it, and the other ranks that failed by themselves (collateral).

    Ranks seen exiting non-zero before the gang was stopped failed by themselves, and so did
    those that exited non-zero while being stopped, unless by our SIGTERM or SIGKILL (a rank
    raising its own error just then must not lose the blame to the peer that noticed first);
    their errors are read from this attempt's part of their logs.
    """
    stopped = (-signal.SIGTERM, -signal.SIGKILL, 128 + signal.SIGTERM, 128 + signal.SIGKILL)
    seen = [i for i in gang.exit_order if gang.procs[i].returncode not in (0, None)
            and i not in gang.absorbed]  # an elastic job's earlier losses are not this failure
    seen += [i for i, p in enumerate(gang.procs)
             if i not in seen and i not in gang.absorbed
             and p.returncode not in (0, None, *stopped)]
    if first_seen not in seen:
        seen.insert(0, first_seen)
    found = [failures.rank_failure(i, procs.exit_code_of(gang.procs[i].returncode or 0),
                                   _this_attempt(logs[i])) for i in seen]
    cause = failures.cause(found, first_seen)
    assert cause is not None  # found is never empty
    return cause, [f.rank for f in found if f.rank != cause.rank]


def _this_attempt(log: Path) -> str:
    """The part of ``rank-<r>.log`` the last attempt wrote."""
    text = procs.tail(log, lines=400)
    return text.rsplit(ATTEMPT_MARK, 1)[-1].partition("\n")[2]


def _echo(stream: IO[bytes] | None, log: IO[bytes], view: _ProgressView, rank: int,
          show: bool) -> None:
    """Copy one stream of a rank to its log and, when ``show``, to the console, line by line."""
    if stream is None:
        return
    for line in iter(stream.readline, b""):
        log.write(line)
        if show:
            view.print(line.decode(errors="replace").rstrip("\n"), rank)
    stream.close()


class _ProgressView:
    """A rich progress bar fed by rank 0's ``rank-0.json``; prints lines above it."""

    def __init__(self, console: Any, workdir: Path, *, log_dir: Path | None = None) -> None:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        self.workdir, self.log_dir = workdir, log_dir or workdir
        self.progress = Progress(TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("steps  loss {task.fields[loss]}"),
                                 TimeElapsedColumn(), console=console, transient=False)
        self.task = self.progress.add_task("train", total=None, loss="-")
        self._lock = threading.Lock()
        self._last_steps, self._last_change_s, self._warned = -1, time.monotonic(), False

    def __enter__(self) -> _ProgressView:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.tick()
        self.progress.stop()

    def tick(self) -> None:
        """Refresh from rank 0's statistics file; warn once when training seems stuck."""
        stats = rundir.read_json(rundir.rank_stats_path(self.workdir, 0)) or {}
        self._watch_stall(int(stats.get("steps") or 0))
        if not stats:
            return
        loss = stats.get("loss")
        job_step = int(stats.get("resumed_step") or 0) + int(stats.get("steps") or 0)
        with self._lock:
            self.progress.update(self.task, completed=job_step,
                                 total=stats.get("total_steps"),
                                 loss="-" if loss is None else f"{float(loss):.4f}")

    def _watch_stall(self, steps: int) -> None:
        now = time.monotonic()
        if steps != self._last_steps:
            self._last_steps, self._last_change_s, self._warned = steps, now, False
        elif not self._warned and now - self._last_change_s > STALL_WARN_S:
            self._warned = True
            with self._lock:
                self.progress.console.print(
                    f"[yellow]No step finished for {STALL_WARN_S:.0f} s[/] (ranks may be waiting "
                    f"for each other in a collective); see {self.log_dir}/rank-*.log, Ctrl-C stops.")

    def print(self, line: str, rank: int = 0) -> None:
        """Print a line of a rank's output above the bar, prefixed ``rank <r> |``."""
        with self._lock:
            self.progress.console.print(f"[dim]rank {rank} |[/] {_escape(line)}")


def _escape(text: str) -> str:
    from rich.markup import escape
    return escape(text)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_range(count: int, *, attempts: int = 50) -> int:
    """A base port such that ``base .. base + count - 1`` are all free on 127.0.0.1 now.

    Raises:
        OSError: none found in ``attempts`` tries.
    """
    for _ in range(attempts):
        base = _free_port()
        if base + count > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise OSError(f"no {count} consecutive free ports found")
