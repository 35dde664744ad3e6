"""``heterotrain run JOB.yaml``: the embedded default, a HeteroTrainingJob on this machine.

Plans the job onto a node file (default ``examples/clusters/mixed.yaml``: 1x A100, 1x V100,
2x T4) with the operator's own planner, renders every rank's environment with the operator's own
:func:`hetero_operator.render.env.render_rank_envs`, and starts each rank as a local process running
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
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hetero_operator.api import prices
from hetero_operator.api.types import Plan
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.local import nodes as localnodes
from hetero_operator.local import report, valueview
from hetero_operator.local.plan import (InputError, load_job, load_objects, make_console,
                                        plan_notes, print_result, with_default_images)
from hetero_operator.local.supervise import Planned, free_port_range, supervise
from hetero_operator.planning.plan import plan_job
from heterotrain_common import envread, nvml, procs

DEFAULT_NODES = Path("examples") / "clusters" / "mixed.yaml"
EXIT_BAD_INPUT, EXIT_UNSCHEDULABLE = 1, 2
RUNS_DIR = "runs"
"""Where run directories go unless ``--workdir`` is given."""
RUN_MARKER = ".heterotrain-run"
"""Empty file marking a directory made by ``heterotrain run`` (``--keep-runs`` prunes only those)."""
_REPO_ROOT = Path(__file__).resolve().parents[3]
"""The checkout this module lives in (operator/hetero_operator/local/run.py -> repo root)."""


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
        steps = envread.parse_step_range(text, "--profile-steps")
    except envread.ContractError as exc:
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


# --- the run ---------------------------------------------------------------------------------


def _plan(args: argparse.Namespace, console: Any) -> Planned | int:
    """Load, plan, print the plan; an int is an exit code (bad input / unschedulable).

    Without ``--nodes``/``--simulate``, this machine's real GPUs are tried first; when they cannot
    host the job (e.g. one GPU for ``minRanks: 2``), the default node file is simulated instead.
    """

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
                return Planned(local_job, plan, False, gpu_ids)
            console.print(f"This machine's GPUs cannot host the job ({plan.message}); "
                          f"simulating {DEFAULT_NODES} instead.")
        nodes = load_objects(Path(args.nodes) if args.nodes else default_nodes_file(), "Node")
        inputs = valueview.plan_inputs(
            args, job, reference_samples_per_s=valueview.simulated_reference_samples_per_s(os.environ))
    except (InputError, prices.PriceError) as exc:
        print(f"heterotrain run: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    job, notes = with_default_images(job)  # named in the plan, as the operator would use them
    plan = plan_job(job, build_inventory(nodes), inputs=inputs)
    print_result(plan, job, console, notes=[*notes, *plan_notes(plan, job)])
    if not isinstance(plan, Plan):
        return EXIT_UNSCHEDULABLE
    planned = Planned(job, plan, True, None)
    planned.true_speeds = valueview.simulated_true_speeds(nodes)
    return planned


def _real_gpu_nodes() -> tuple[list[dict[str, Any]], dict[str, list[str]]] | None:
    """Node objects for this machine's visible GPUs (NVML), and per node its GPUs' UUIDs in
    order; None when there are none. A preset ``CUDA_VISIBLE_DEVICES`` limits the GPUs.

    Raises:
        InputError: a preset ``CUDA_VISIBLE_DEVICES`` that cannot be mapped (see
            :func:`localnodes.visible_gpus`).
    """

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
    outcome = supervise(planned, argv, workdir=workdir, port_base=port_base, console=console,
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


def _announce(console: Any, planned: Planned, workdir: Path, port_base: int, argv: list[str]) -> None:
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
