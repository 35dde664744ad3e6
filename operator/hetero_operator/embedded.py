"""``heterotrain run JOB.yaml``: the embedded default, a HeteroTrainingJob on this machine.

Plans the job onto a node file (default ``examples/clusters/mixed.yaml``: 1x A100, 1x V100,
2x T4) with the operator's own planner, renders every rank's environment with the operator's own
:func:`hetero_operator.envrender.render_rank_envs`, and starts each rank as a local process running
``spec.worker.command + args``. On a CPU-only machine every rank imitates its planned GPU
(``DeviceProfile.simulated``: real CPU compute plus a delay proportional to batch / speed); where
NVML finds enough GPUs and no node file is given, the plan uses this machine's real GPUs instead.

Like the operator: one failing rank stops all; when the job checkpoints (``spec.training.checkpoint``)
all ranks restart from the last checkpoint, up to ``spec.runPolicy.backoffLimit`` times. Shows the
plan, a progress bar (from rank 0's statistics file), rank 0's output, and at the end a per-rank
table, the job's result (e.g. accuracy) and the speed-up over an equal split. Exit code: the job's.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from hetero_operator import report, valueview
from hetero_worker import contract as c
from hetero_worker import procs, rundir

DEFAULT_NODES = Path("examples") / "clusters" / "mixed.yaml"
STALL_WARN_S = 120.0
"""Warn when rank 0's step count has not moved for this many seconds."""
EXIT_BAD_INPUT, EXIT_UNSCHEDULABLE = 1, 2
RUNS_DIR = "runs"
"""Where run directories go unless ``--workdir`` is given."""
RUN_MARKER = ".heterotrain-run"
"""Empty file marking a directory made by ``heterotrain run`` (``--keep-runs`` prunes only those)."""
ATTEMPT_MARK = "--- attempt "
"""Each attempt's output in ``rank-<r>.log`` starts with ``--- attempt N ---``."""
_REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout this module lives in (operator/hetero_operator/embedded.py -> repo root)."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``run`` arguments."""
    parser.add_argument("job", metavar="JOB.yaml", help="a HeteroTrainingJob manifest")
    parser.add_argument("--nodes", metavar="NODES.yaml", default=None,
                        help="node list to plan onto (kubectl get nodes -o yaml format); default: "
                             "this machine's GPUs when NVML finds enough for the job, else "
                             f"{DEFAULT_NODES} (simulated)")
    parser.add_argument("--simulate", action="store_true",
                        help="simulate the node file's GPUs even where real GPUs exist")
    parser.add_argument("--workdir", metavar="DIR", default=None,
                        help="logs, statistics, checkpoints (default runs/<job>-<time>)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="override --epochs in the worker args (the built-in examples take it)")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="override --max-steps in the worker args (the built-in examples)")
    parser.add_argument("--metrics-port-base", type=int, default=None, metavar="PORT",
                        help="rank r serves Prometheus metrics on PORT + r (default: a free range; "
                             "0 turns metrics off)")
    valueview.add_arguments(parser, learn_help="run plans with it and adds this run's measured "
                                               "speeds (per profileKey)")
    parser.add_argument("--grace-s", type=float, default=procs.GRACE_S, metavar="SECONDS",
                        help="when stopping ranks, seconds between SIGTERM and SIGKILL")
    parser.add_argument("--profile-steps", type=_step_range, default=None, metavar="FIRST-LAST",
                        help="trace these steps (1-based, e.g. 20-25) on every rank with the PyTorch "
                             "Profiler; Chrome traces in <workdir>/profiles/ (overrides the job's "
                             "heterotrain.io/profile-steps annotation)")
    parser.add_argument("--keep-runs", type=_run_count, default=None, metavar="N",
                        help="after the run, delete all but the newest N run directories under "
                             "runs/, of every job (default: keep all); only directories made by "
                             "heterotrain run")


def _run_count(text: str) -> int:
    """``--keep-runs``: a whole number >= 0 (a usage error otherwise)."""
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {text!r}") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {count}")
    return count


def _step_range(text: str) -> tuple[int, int]:
    """argparse type of ``--profile-steps``: ``"20-25"`` -> ``(20, 25)`` (a usage error if bad)."""
    try:
        steps = c.parse_step_range(text, "--profile-steps")
    except c.ContractError as exc:
        raise argparse.ArgumentTypeError(str(exc).partition(": ")[2]) from None
    if steps is None:
        raise argparse.ArgumentTypeError("must be steps like 20-25")
    return steps


# --- inputs ----------------------------------------------------------------------------------

def default_nodes_file() -> Path:
    """``examples/clusters/mixed.yaml`` of this checkout, else of the current directory."""
    for root in (_REPO_ROOT, Path.cwd()):
        if (root / DEFAULT_NODES).is_file():
            return root / DEFAULT_NODES
    return DEFAULT_NODES


def worker_argv(command: Sequence[str], args: Sequence[str], *,
                overrides: Mapping[str, int | None]) -> list[str]:
    """``command + args`` with ``--flag VALUE`` overrides applied (replaced or appended).

    A leading ``python``/``python3`` becomes this interpreter, so the job runs in the environment
    ``heterotrain`` is installed in even when it is not activated.
    """
    argv = [*command, *args]
    for flag, value in overrides.items():
        if value is None:
            continue
        if flag in argv[len(command):]:
            i = argv.index(flag, len(command))
            argv[i + 1:i + 2] = [str(value)]
        else:
            argv += [flag, str(value)]
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def _program_exists(program: str) -> bool:
    """True when ``program`` is a path to an executable or found on PATH (plus our bin dir)."""
    import shutil
    path = os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", "")))
    return shutil.which(program, path=path) is not None


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
    contract_vars = {*c.REQUIRED_VARS, *c.OPTIONAL_VARS, *c.MEMORY_VARS, c.FIRST_RANK,
                     "CUDA_VISIBLE_DEVICES"}
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


# --- the run ---------------------------------------------------------------------------------

class _Planned:
    """What planning produced: the job, plan, whether simulated, and real GPU UUIDs per rank."""

    def __init__(self, job: Any, plan: Any, simulated: bool, gpu_ids: list[str] | None) -> None:
        self.job, self.plan, self.simulated, self.gpu_ids = job, plan, simulated, gpu_ids
        self.true_speeds: dict[str, float] = {}  # simulated nodes' real speed (valueview)


def _plan(args: argparse.Namespace, console: Any) -> _Planned | int:
    """Load, plan, print the plan; an int is an exit code (bad input / unschedulable).

    Without ``--nodes``/``--simulate``, this machine's real GPUs are tried first; when they cannot
    host the job (e.g. one GPU for ``minRanks: 2``), the default node file is simulated instead.
    """
    from hetero_operator.inventory import build_inventory
    from hetero_operator.model import Plan
    from hetero_operator.planning import plan_job
    from hetero_operator.plancli import (InputError, load_job, load_objects, plan_notes,
                                         print_result, with_default_images)

    try:
        job = load_job(Path(args.job))
        gpu_nodes = None if (args.nodes or args.simulate) else _real_gpu_nodes()
        if gpu_nodes is not None:
            local_job = dataclasses.replace(job, images=())  # local processes use no image
            plan = plan_job(local_job, build_inventory(gpu_nodes[0]),
                            inputs=valueview.plan_inputs(args, local_job))
            if isinstance(plan, Plan):
                print_result(plan, local_job, console, notes=plan_notes(plan, local_job))
                uuids = gpu_nodes[1]
                gpu_ids = [uuids[plan.groups[r.group].node][r.group_rank] for r in plan.ranks]
                return _Planned(local_job, plan, False, gpu_ids)
            console.print(f"This machine's GPUs cannot host the job ({plan.message}); "
                          f"simulating {DEFAULT_NODES} instead.")
        nodes = load_objects(Path(args.nodes) if args.nodes else default_nodes_file(), "Node")
        inputs = valueview.plan_inputs(
            args, job, reference_samples_per_s=valueview.simulated_reference_samples_per_s(os.environ))
    except (InputError, valueview.PriceError) as exc:
        print(f"heterotrain run: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    job, notes = with_default_images(job)  # named in the plan, as the operator would use them
    plan = plan_job(job, build_inventory(nodes), inputs=inputs)
    print_result(plan, job, console, notes=[*notes, *plan_notes(plan, job)])
    if not isinstance(plan, Plan):
        return EXIT_UNSCHEDULABLE
    planned = _Planned(job, plan, True, None)
    planned.true_speeds = valueview.simulated_true_speeds(nodes)
    return planned


def _real_gpu_nodes() -> tuple[list[dict[str, Any]], dict[str, list[str]]] | None:
    """Node objects for this machine's visible GPUs (NVML), and per node its GPUs' UUIDs in
    order; None when there are none. A preset ``CUDA_VISIBLE_DEVICES`` limits the GPUs.

    Raises:
        InputError: a preset ``CUDA_VISIBLE_DEVICES`` that cannot be mapped (see
            :func:`localnodes.visible_gpus`).
    """
    from hetero_operator import localnodes
    from hetero_operator.plancli import InputError
    from hetero_worker import nvml

    try:
        gpus = localnodes.visible_gpus(nvml.list_gpus(),
                                       preset=os.environ.get("CUDA_VISIBLE_DEVICES"),
                                       device_order=os.environ.get("CUDA_DEVICE_ORDER"))
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    versions = nvml.driver_versions()
    if not gpus or versions is None:
        return None
    nodes, indices = localnodes.nodes_from_gpus(gpus, host=socket.gethostname(),
                                                driver_version=versions[0], cuda_version=versions[1])
    uuid_of = {g.index: g.uuid for g in gpus}
    uuids = {node: [uuid_of[i] for i in idx] for node, idx in indices.items()}
    return (nodes, uuids) if nodes else None


def run(args: argparse.Namespace) -> int:
    """Plan, start, supervise, report; returns the job's exit code."""
    from hetero_operator.plancli import make_console

    console = make_console(highlight=False)
    if not console.is_terminal:  # logs and CI: wide enough for the plan table
        console = make_console(highlight=False, width=140)
    planned = _plan(args, console)
    if isinstance(planned, int):
        return planned
    if args.profile_steps is not None:
        planned.job = dataclasses.replace(planned.job, profile_steps=args.profile_steps)
    job, world = planned.job, planned.plan.world_size
    argv = worker_argv(job.worker.command, job.worker.args,
                       overrides={"--epochs": args.epochs, "--max-steps": args.max_steps})
    if not _program_exists(argv[0]):
        print(f"heterotrain run: error: {args.job}: spec.worker.command: program {argv[0]!r} "
              "not found", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        port_base = free_port_range(world) if args.metrics_port_base is None else args.metrics_port_base
    except OSError as exc:
        print(f"heterotrain run: error: metrics ports: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    workdir = Path(args.workdir or Path(RUNS_DIR) / f"{job.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / RUN_MARKER).touch()
    _announce(console, planned, workdir, port_base, argv)
    _write_targets(workdir, port_base, world, job.name)
    start = time.monotonic()
    outcome = _supervise(planned, argv, workdir=workdir, port_base=port_base, console=console,
                         grace_s=args.grace_s)
    verdict = report.print_report(console, rows=report.read_rows(workdir, world),
                        result=report.read_result(workdir),
                        planned_speedup=planned.plan.expected_speedup_over_equal,
                        elapsed_s=time.monotonic() - start, exit_code=outcome.exit_code,
                        initial_batches=[r.local_batch for r in planned.plan.ranks],
                        rebalance_interval_steps=job.training.rebalance_interval_steps,
                        profile_traces=sorted((workdir / "profiles").glob("*.trace.json")),
                        verdict=False)
    if job.profile_steps is not None and not any((workdir / "profiles").glob("*.trace.json")):
        console.print(f"[yellow]No profiler trace was written[/]: steps {job.profile_steps[0]}-"
                      f"{job.profile_steps[1]} were not reached, or the worker does not use "
                      "hetero_worker's Trainer", highlight=False)
    valueview.after_run(console, args=args, job=job, plan=planned.plan, workdir=workdir,
                        exit_code=outcome.exit_code)
    console.print(f"Logs and statistics: {workdir}")
    if args.keep_runs is not None:
        removed = prune_runs(Path(RUNS_DIR), keep=args.keep_runs, current=workdir)
        if removed:
            console.print(f"Removed {len(removed)} older run director"
                          f"{'y' if len(removed) == 1 else 'ies'} under {RUNS_DIR}/ (--keep-runs "
                          f"{args.keep_runs})")
    console.print(verdict)  # the last line says how the job ended
    return outcome.exit_code


def prune_runs(runs: Path, *, keep: int, current: Path | None = None) -> list[Path]:
    """Delete all but the newest ``keep`` run directories under ``runs`` (by modification time).

    Only directories holding :data:`RUN_MARKER` (made by ``heterotrain run``) are considered, and
    ``current`` is never deleted.

    Returns:
        The directories removed.
    """
    import shutil

    if keep < 0 or not runs.is_dir():
        return []
    mine = [d for d in runs.iterdir() if d.is_dir() and (d / RUN_MARKER).is_file()]
    mine.sort(key=lambda d: d.stat().st_mtime, reverse=True)
    keep_set = set(mine[:keep]) | ({current.resolve()} if current is not None else set())
    removed = [d for d in mine[keep:] if d.resolve() not in keep_set]
    for d in removed:
        shutil.rmtree(d, ignore_errors=True)
    return removed


def _supervise(planned: _Planned, argv: list[str], *, workdir: Path, port_base: int, console: Any,
               grace_s: float) -> procs.Outcome:
    """Run attempts until success, a signal, the deadline, or no restart left (like the operator).

    A failure that repeats (same exit code and last log line of the failing rank) on two attempts in
    a row before any step completed is not retried further: the failure is deterministic (a wrong
    module name, a bad argument) and every restart up to ``backoffLimit`` would repeat it.
    """
    job = planned.job
    checkpoint_dir = str((workdir / "checkpoints").resolve()) if job.training.checkpoint_path else ""
    limit_s = job.run_policy.active_deadline_seconds
    deadline_s = None if limit_s is None else time.monotonic() + limit_s
    attempt = 0
    last_failure: tuple[int, str] | None = None
    while True:
        envs = _render(planned, port_base=port_base, checkpoint_dir=checkpoint_dir, workdir=workdir)
        for env in envs:  # one restart generation on every rank, as the operator does (case 34)
            env[c.RESTART_GENERATION] = env[c.TORCHELASTIC_RESTART_COUNT] = str(attempt)
        started_s = time.time()
        outcome = _attempt(argv, envs, workdir=workdir, console=console, attempt=attempt,
                           grace_s=grace_s, deadline_s=deadline_s)
        if outcome.deadline_exceeded:
            console.print(f"[red]Job failed[/]: DeadlineExceeded (spec.runPolicy."
                          f"activeDeadlineSeconds={limit_s})")
            return outcome
        if outcome.exit_code == 0 or outcome.signal_received is not None:
            return outcome
        progressed = _stepped_since(workdir, len(envs), started_s)
        failure = _failure_signature(workdir, outcome)
        if not progressed and failure is not None and failure == last_failure:
            console.print(f"[red]Job failed[/]: rank {outcome.failed_index} failed the same way twice "
                          f"before any step completed (exit code {failure[0]}: "
                          f"{failure[1] or 'no output'}); "
                          "a restart would fail again, so the run stops here instead of retrying up "
                          f"to backoffLimit {job.run_policy.backoff_limit}", highlight=False)
            return outcome
        last_failure = None if progressed else failure
        if not checkpoint_dir or attempt >= job.run_policy.backoff_limit:
            reason = ("no checkpointing (spec.training.checkpoint.path)" if not checkpoint_dir
                      else f"backoffLimit {job.run_policy.backoff_limit} reached")
            console.print(f"[red]Job failed[/]: {reason}")
            return outcome
        attempt += 1
        source = ("the last checkpoint" if _has_checkpoint(Path(checkpoint_dir))
                  else "the start (no checkpoint saved yet)")
        console.print(f"[yellow]Restarting all ranks from {source}[/] "
                      f"(restart {attempt} of {job.run_policy.backoff_limit})")


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


def _failure_signature(workdir: Path, outcome: procs.Outcome) -> tuple[int, str] | None:
    """(exit code, last non-empty line the failed rank printed in this attempt); None when no
    rank failed. The rank is left out: when every rank fails alike, which one is seen first varies."""
    r = outcome.failed_index
    if r is None:
        return None
    text = procs.tail(workdir / f"rank-{r}.log", lines=200)
    attempt_lines = text.rsplit(ATTEMPT_MARK, 1)[-1].splitlines()[1:]
    last = next((line.strip() for line in reversed(attempt_lines) if line.strip()), "")
    return (outcome.exit_code, last)


def _has_checkpoint(directory: Path) -> bool:
    """True when ``directory`` holds any file (a checkpoint was saved)."""
    return directory.is_dir() and any(p.is_file() for p in directory.rglob("*"))


def _render(planned: _Planned, *, port_base: int, checkpoint_dir: str, workdir: Path) -> list[dict[str, str]]:
    from hetero_operator.envrender import render_rank_envs

    rank_envs = render_rank_envs(
        planned.plan, planned.job, master_addr="127.0.0.1", master_port=_free_port(),
        simulated=planned.simulated, metrics_port_base=port_base or None,
        checkpoint_dir=checkpoint_dir)
    if not port_base:
        for env in rank_envs:
            env[c.METRICS_PORT] = "0"
    if planned.simulated:
        valueview.apply_simulated_speeds(rank_envs, planned.plan, planned.true_speeds)
    return process_envs(rank_envs, base_env=os.environ, run_dir=workdir.resolve(),
                        worker_env=planned.job.worker.env, gpu_ids=planned.gpu_ids)


def _announce(console: Any, planned: _Planned, workdir: Path, port_base: int, argv: list[str]) -> None:
    world = planned.plan.world_size
    where = ("simulated devices on this CPU (real compute plus a delay of batch / speed)"
             if planned.simulated else "this machine's GPUs")
    console.print(f"Running {world} ranks as local processes on {where}.")
    console.print(f"Command: {' '.join(argv)}")
    if port_base:
        console.print(f"Metrics: http://127.0.0.1:{port_base}/metrics .. port {port_base + world - 1} "
                      f"(Prometheus targets in {workdir / 'targets.json'})")


def _write_targets(workdir: Path, port_base: int, world: int, job_name: str) -> None:
    """A Prometheus ``file_sd`` file listing the ranks' metrics endpoints."""
    import json
    targets = [f"127.0.0.1:{port_base + r}" for r in range(world)] if port_base else []
    (workdir / "targets.json").write_text(json.dumps(
        [{"targets": targets, "labels": {"namespace": "embedded", "htj_job": job_name}}], indent=1))


def _attempt(argv: list[str], envs: list[dict[str, str]], *, workdir: Path, console: Any,
             attempt: int, grace_s: float, deadline_s: float | None) -> procs.Outcome:
    """Start every rank, show progress and rank 0's output, wait; returns the outcome."""
    import subprocess

    logs = [workdir / f"rank-{r}.log" for r in range(len(envs))]
    files = [procs.open_log(p) for p in logs]
    for f in files:
        f.write(f"{ATTEMPT_MARK}{attempt} ---\n".encode())
    try:
        gang = procs.Gang(argv, envs, stdouts=[subprocess.PIPE] + files[1:],
                          stderrs=[subprocess.STDOUT] + files[1:], cwd=os.getcwd())
    except OSError as exc:
        console.print(f"[red]cannot start {argv[0]!r}: {exc}[/]")
        for f in files:
            f.close()
        return procs.Outcome(exit_code=127, failed_index=0)
    view = _ProgressView(console, workdir)
    echo = threading.Thread(target=_echo, args=(gang.procs[0].stdout, files[0], view), daemon=True)
    echo.start()
    try:
        with view, procs.forwarding_signals(gang):
            outcome = gang.wait(on_tick=view.tick, grace_s=grace_s, deadline_s=deadline_s)
        echo.join(timeout=5)
    finally:
        for f in files:
            f.close()
    if outcome.failed_index is not None and outcome.signal_received is None:
        r = outcome.failed_index
        console.print(f"[red]rank {r} exited with code {outcome.exit_code}[/]; stopped the other "
                      f"ranks. Last lines of {logs[r]}:")
        console.print(procs.tail(logs[r]), markup=False)
    return outcome


def _echo(stream: IO[bytes] | None, log: IO[bytes], view: _ProgressView) -> None:
    """Copy rank 0's output to its log and to the console, line by line."""
    if stream is None:
        return
    for line in iter(stream.readline, b""):
        log.write(line)
        view.print(line.decode(errors="replace").rstrip("\n"))
    stream.close()


class _ProgressView:
    """A rich progress bar fed by rank 0's ``rank-0.json``; prints lines above it."""

    def __init__(self, console: Any, workdir: Path) -> None:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        self.workdir = workdir
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
        with self._lock:
            self.progress.update(self.task, completed=int(stats.get("steps") or 0),
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
                    f"for each other in a collective); see {self.workdir}/rank-*.log, Ctrl-C stops.")

    def print(self, line: str) -> None:
        """Print a line of rank 0's output above the bar."""
        with self._lock:
            self.progress.console.print(f"[dim]rank 0 |[/] {_escape(line)}")


def _escape(text: str) -> str:
    from rich.markup import escape
    return escape(text)
