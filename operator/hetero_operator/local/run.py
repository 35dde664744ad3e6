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
table, the job's result (e.g. accuracy) and the speed-up over an equal split.

Exit codes: 0 succeeded; :data:`EXIT_RANK_FAILED` (3) a rank failed (the last line names the rank,
its own exit code and the first line of its error); 1 bad input; 2 unschedulable; 124 deadline;
128 + N when ``heterotrain run`` got signal N (Ctrl-C: 130; the ranks get SIGTERM and stop at an
agreed step with one checkpoint, and it says how to resume); 64 usage. ``--resume`` of a run that
succeeded starts nothing and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hetero_operator.api import labels, prices
from hetero_operator.api.types import Plan, to_dict
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.local import nodes as localnodes
from hetero_operator.local import elastic, report, rundirs, runstate, valueview
from hetero_operator.local.invocation import EXIT_USAGE, invoked_as
from hetero_operator.local.plan import (DEFAULT_NODES, InputError, default_nodes_file,
                                        embedded_template_notes, load_job, load_objects,
                                        make_console, plan_notes, print_result,
                                        with_default_images)
from hetero_operator.local.supervise import (Ended, Planned, RankOutput, free_port_range,
                                             has_checkpoint, supervise)
from hetero_operator.planning.plan import plan_job
from heterotrain_common import envnames, envread, nvml, procs, rundir

EXIT_BAD_INPUT, EXIT_UNSCHEDULABLE = 1, 2
EXIT_RANK_FAILED = 3
"""A rank failed (its own exit code is in the last line): never 1 (bad input), 2 (unschedulable) or
64 (usage), whatever the rank's code, so a wrapper can tell "does not fit" from "my script
crashed"."""
RUNS_DIR = rundirs.RUNS_DIR
_NOT_RESUMED = ("job", "workdir", "resume", "keep_runs", "command")
"""Options ``--resume`` does not take from the interrupted run."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``run`` arguments."""
    parser.add_argument("job", metavar="JOB.yaml", nargs="?", default=None,
                        help="a HeteroTrainingJob manifest (left out with --resume)")
    parser.add_argument("--resume", metavar="RUNDIR", default=None,
                        help="continue an interrupted or failed run in RUNDIR from its last "
                             "checkpoint, with the manifest and options it was started with (a "
                             "run that already succeeded is not run again: exit 0)")
    parser.add_argument("--nodes", metavar="NODES.yaml", default=None,
                        help="node list to plan onto (kubectl get nodes -o yaml format); default: "
                             "this machine's GPUs when NVML finds enough for the job, else "
                             f"{DEFAULT_NODES} (simulated)")
    parser.add_argument("--simulate", action="store_true",
                        help="simulate the node file's GPUs even where real GPUs exist")
    parser.add_argument("--workdir", metavar="DIR", default=None,
                        help="logs, statistics, checkpoints (default runs/<job>-<time>)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs to train: HTJ_EPOCHS on every rank (Trainer.epochs); replaces "
                             "the value of an --epochs the worker args already hold")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="stop after this many steps: HTJ_MAX_STEPS on every rank (the "
                             "Trainer's loader stops there); replaces the value of a --max-steps "
                             "the worker args already hold, never added to them")
    parser.add_argument("--log-dir", metavar="DIR", default=None,
                        help="where rank-<r>.log go (torchrun's --log-dir; default: the run "
                             "directory)")
    parser.add_argument("--tee", type=int, choices=(0, 1, 2, 3), default=3,
                        help="which streams of the shown ranks also reach the console, as "
                             "torchrun's --tee: 0 none, 1 stdout, 2 stderr, 3 both (default); the "
                             "log files always get both")
    parser.add_argument("--local-ranks-filter", type=_rank_list, default=frozenset({0}),
                        metavar="RANKS",
                        help="ranks whose output the console shows, prefixed 'rank <r> |' "
                             "(torchrun's flag): e.g. 0,2, or 'all'; default 0")
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
                             f"{labels.ANNOTATION_PROFILE_STEPS} annotation)")
    parser.add_argument("--keep-runs", type=_run_count, default=None, metavar="N",
                        help="after the run, delete all but the newest N run directories under "
                             "runs/, of every job (default: keep all); only directories made by "
                             "heterotrain run")


def _rank_list(text: str) -> frozenset[int] | None:
    """``--local-ranks-filter``: ``"0,2"`` -> ``{0, 2}``; ``"all"`` -> None (a usage error if bad)."""
    if text.strip() == "all":
        return None
    try:
        ranks = frozenset(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be ranks like 0,2 or 'all', got {text!r}") from None
    if not ranks or min(ranks) < 0:
        raise argparse.ArgumentTypeError(f"must be ranks >= 0 like 0,2 or 'all', got {text!r}")
    return ranks


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

def worker_argv(command: Sequence[str], args: Sequence[str], *,
                overrides: Mapping[str, int | None]) -> list[str]:
    """``command + args`` with the value of each ``--flag VALUE`` the args already hold replaced
    by its override; a flag the args do not hold is never added (the script did not ask for it:
    it gets the value through the environment, e.g. ``HTJ_MAX_STEPS``).

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
        elif f"{flag}=" in " ".join(argv[len(command):]):
            i = next(j for j in range(len(command), len(argv)) if argv[j].startswith(f"{flag}="))
            argv[i] = f"{flag}={value}"
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def _program_exists(program: str) -> bool:
    """True when ``program`` is a path to an executable or found on PATH (plus our bin dir)."""
    import shutil
    path = os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", "")))
    return shutil.which(program, path=path) is not None


def _missing_script(argv: Sequence[str]) -> str | None:
    """The ``X.py`` of ``python X.py ...`` when no such file exists (every rank would fail the same
    way, exit 2); None otherwise."""
    if len(argv) < 2 or Path(argv[0]).name not in ("python", "python3", Path(sys.executable).name):
        return None
    script = argv[1]
    if script.startswith("-") or not script.endswith(".py"):
        return None
    return None if Path(script).is_file() else script


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
            inputs = valueview.plan_inputs(args, local_job)
            plan = plan_job(local_job, build_inventory(gpu_nodes[0]), inputs=inputs)
            if isinstance(plan, Plan):
                print_result(plan, local_job, console, notes=plan_notes(plan, local_job))
                uuids = gpu_nodes[1]
                gpu_ids = [uuids[plan.groups[r.group].node][r.group_rank] for r in plan.ranks]
                return Planned(local_job, plan, False, gpu_ids, learned=inputs.learned)
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
    print_result(plan, job, console, notes=[*notes, *plan_notes(plan, job), *embedded_template_notes(job)])
    if not isinstance(plan, Plan):
        return EXIT_UNSCHEDULABLE
    planned = Planned(job, plan, True, None, learned=inputs.learned)
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
    """Plan, start, supervise, report; returns the exit code (see the module docstring)."""

    bad = _resolve_job(args)
    if bad is not None:
        message, usage = bad
        print(f"heterotrain run: error: {message}", file=sys.stderr)
        return EXIT_USAGE if usage else EXIT_BAD_INPUT
    if args.resume is not None:
        done, final_step = rundirs.finished_step(Path(args.resume))
        if done:  # nothing to continue: no ranks, no second speed observation
            at = "" if final_step is None else f" at step {final_step}"
            print(f"heterotrain run: {args.resume} already finished: the job succeeded{at}; "
                  f"nothing to resume (to train again, start a new run: {invoked_as()} run "
                  f"{Path(args.resume) / rundirs.JOB_COPY})")
            return 0
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
    script = _missing_script(argv)
    if script is not None:
        print(f"heterotrain run: error: {args.job}: spec.worker.command: script {script!r} not "
              f"found (paths are relative to the directory heterotrain run starts in, "
              f"{os.getcwd()})", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        port_base = free_port_range(world) if args.metrics_port_base is None else args.metrics_port_base
    except OSError as exc:
        print(f"heterotrain run: error: metrics ports: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    planned.extra_env = {name: str(value) for name, value in
                         ((envnames.MAX_STEPS, args.max_steps), (envnames.EPOCHS, args.epochs))
                         if value is not None}
    try:
        workdir = _make_workdir(args, job.name)
    except OSError as exc:
        print(f"heterotrain run: error: run directory: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    rundirs.clear_finished(workdir)
    run_uid = rundirs.read_run_uid(workdir)  # a checkpoint belongs to its run (issue 33)
    if run_uid:
        planned.extra_env[envnames.JOB_UID] = run_uid
    fresh = run_uid and not args.resume and not job.training.checkpoint_resume_from
    note = rundirs.earlier_checkpoints_note(workdir, invoked_as=invoked_as()) if (
        fresh and job.training.checkpoint_path) else ""
    _announce(console, planned, workdir, port_base, argv)
    if note:
        console.print(note, highlight=False, soft_wrap=True)
    _write_targets(workdir, port_base, world, job.name)
    runstate.write_started(workdir, to_dict(planned.plan))  # heterotrain status / logs -f
    start = time.monotonic()
    output = RankOutput(log_dir=Path(args.log_dir) if args.log_dir else workdir,
                        shown_ranks=args.local_ranks_filter, tee=args.tee)
    ended = supervise(planned, argv, workdir=workdir, port_base=port_base, console=console,
                      grace_s=args.grace_s, output=output)
    outcome = ended.outcome
    resumed_step, job_step = _rank0_steps(workdir)
    if resumed_step:
        console.print(f"Resumed at step {resumed_step} from the last checkpoint in "
                      f"{workdir / 'checkpoints'}", highlight=False)
    if exit_code(ended) == 0:
        rundirs.mark_finished(workdir, final_step=job_step)
    runstate.write_ended(workdir, exit_code=exit_code(ended), interrupted=outcome.signal_received is not None,
                         deadline=outcome.deadline_exceeded,
                         reason=ended.failure.sentence() if ended.failure is not None else "")
    verdict = report.print_report(console, rows=report.read_rows(workdir, world),
                        result=report.read_result(workdir),
                        planned_speedup=planned.plan.expected_speedup_over_equal,
                        elapsed_s=time.monotonic() - start, exit_code=outcome.exit_code,
                        initial_batches=[r.local_batch for r in planned.plan.ranks],
                        rebalance_interval_steps=job.training.rebalance_interval_steps,
                        profile_traces=sorted((workdir / "profiles").glob("*.trace.json")),
                        verdict=False)
    for line in elastic.report_lines(workdir):  # spec.elastic: each shrink, its step and time
        console.print(line, highlight=False)
    if job.profile_steps is not None and not any((workdir / "profiles").glob("*.trace.json")):
        console.print(f"[yellow]No profiler trace was written[/]: steps {job.profile_steps[0]}-"
                      f"{job.profile_steps[1]} were not reached, or the worker does not use "
                      "hetero_worker's Trainer", highlight=False)
    valueview.after_run(console, args=args, job=job, plan=planned.plan, workdir=workdir,
                        exit_code=outcome.exit_code, learned=planned.learned)
    console.print(f"Logs and statistics: {workdir}")
    if outcome.signal_received is not None or ended.failure is not None:
        console.print(_resume_hint(workdir, workdir / "checkpoints"), highlight=False)
    if args.keep_runs is not None:
        removed = rundirs.prune_runs(Path(RUNS_DIR), keep=args.keep_runs, current=workdir)
        if removed:
            console.print(f"Removed {len(removed)} older run director"
                          f"{'y' if len(removed) == 1 else 'ies'} under {RUNS_DIR}/ (--keep-runs "
                          f"{args.keep_runs})")
    console.print(_verdict(ended, verdict), soft_wrap=True)  # the last line: how the job ended
    return exit_code(ended)


def _rank0_steps(workdir: Path) -> tuple[int, int | None]:
    """(the step rank 0 resumed at, 0 when none; the job step it reached, None without
    statistics) from ``rank-0.json``."""
    stats = rundir.read_json(rundir.rank_stats_path(workdir, 0))
    if not stats:
        return 0, None
    resumed = int(stats.get("resumed_step") or 0)
    return resumed, resumed + int(stats.get("steps") or 0)


def exit_code(ended: Ended) -> int:
    """``heterotrain run``'s exit code: :data:`EXIT_RANK_FAILED` for any rank failure (the rank's
    own code is in the verdict), the gang's code otherwise (0, 124 deadline, 128 + N signal)."""
    outcome = ended.outcome
    if outcome.exit_code != 0 and outcome.signal_received is None and not outcome.deadline_exceeded:
        return EXIT_RANK_FAILED
    return outcome.exit_code


def _verdict(ended: Ended, report_line: str) -> str:
    """The last line: the report's, or for a failed rank ``Job failed: rank R exited with code C:
    <first line of its error>`` (rich markup)."""
    if ended.failure is None:
        return report_line
    from rich.markup import escape
    return f"Job [red]failed[/]: {escape(ended.failure.sentence())}"


def _resolve_job(args: argparse.Namespace) -> tuple[str, bool] | None:
    """Fill ``args`` from ``--resume RUNDIR`` (its manifest copy, options and directory).

    Returns:
        None, or (the error message, True for a usage error: JOB.yaml and --resume both or
        neither given; False for bad input: RUNDIR is no run directory).
    """
    if args.resume is None:
        return None if args.job else (
            "the following arguments are required: JOB.yaml (or --resume RUNDIR)", True)
    if args.job:
        return (f"--resume {args.resume} takes the manifest the run was started with; leave "
                f"{args.job} out (or run it as a new job without --resume)", True)
    run_dir = Path(args.resume)
    try:
        options = rundirs.read_run_file(run_dir)
    except ValueError as exc:
        return str(exc), False
    changed = _changed_options(args, options)
    if changed:
        return (f"--resume {run_dir} continues with the options the run was started with, and "
                f"{', '.join(changed)} differ from them: leave them out to continue the run, or "
                f"start a new run with them (heterotrain run {run_dir / rundirs.JOB_COPY} ...)",
                True)
    for name, value in options.items():
        if name not in _NOT_RESUMED and hasattr(args, name):
            setattr(args, name, tuple(value) if isinstance(value, list) else value)
    args.job, args.workdir = str(run_dir / rundirs.JOB_COPY), str(run_dir)
    return None


def _changed_options(args: argparse.Namespace, saved: dict[str, object]) -> list[str]:
    """The options given with ``--resume`` (not at their defaults) whose values differ from the
    run's saved ones (``run.json``), each as ``--flag VALUE (the run's: SAVED)``, sorted.  An
    option given at its default value cannot be told from one left out and is not listed."""
    defaults = argparse.ArgumentParser()
    configure(defaults)
    default = _saved_options(defaults.parse_args([]))
    given = _saved_options(args)
    return sorted(f"--{name.replace('_', '-')} {given[name]} (the run's: {saved[name]})"
                  for name in given if name in saved and given[name] != default.get(name)
                  and given[name] != saved[name])


def _make_workdir(args: argparse.Namespace, job_name: str) -> Path:
    """``--workdir`` (created when missing), else a new ``runs/<job>-<time>[-n]`` that no other
    run shares; ``run.json`` and the manifest's copy go in (for ``--resume``).

    Raises:
        OSError: the directory or its files cannot be written.
    """
    if args.workdir:
        workdir = Path(args.workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / rundirs.RUN_MARKER).touch()
    else:
        workdir = rundirs.new_run_dir(Path(RUNS_DIR), job_name)
    if not args.resume:
        rundirs.write_run_file(workdir, manifest_text=Path(args.job).read_text(),
                               options=_saved_options(args))
    return workdir


def _saved_options(args: argparse.Namespace) -> dict[str, object]:
    """The run's options as JSON values, paths absolute (``--resume`` may run elsewhere)."""
    saved: dict[str, object] = {}
    for name, value in vars(args).items():
        if name in _NOT_RESUMED:
            continue
        if name in ("nodes", "prices", "learned_speeds", "log_dir") and value:
            value = str(Path(value).resolve())
        if isinstance(value, tuple):
            value = list(value)
        try:
            json.dumps(value)
        except TypeError:
            continue
        saved[name] = value
    return saved


def _resume_hint(workdir: Path, checkpoint_dir: Path) -> str:
    """How to go on after Ctrl-C or a failure: the resume command and where it starts from."""
    command = f"{invoked_as()} run --resume {workdir}"
    if has_checkpoint(checkpoint_dir):
        return f"Resume from the last checkpoint: {command}"
    return (f"No checkpoint was saved ({checkpoint_dir} is empty or the job does not checkpoint: "
            f"spec.training.checkpoint.path); {command} starts the job again from step 0")


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
