"""``heterotrain run`` in a new user's second hour (issue 22): runs that never share a directory,
one exit code for "a rank failed", a verdict naming the rank and its error, ``--max-steps`` through
the environment, and ``--resume RUNDIR``.

The worker is a tiny ``python -c`` program, so each run takes seconds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from hetero_operator.local import failure, rundirs
from hetero_operator.local import run as embedded

ROOT = Path(__file__).parents[2]
RUN = [sys.executable, "-m", "hetero_operator.cli", "run"]

# MODE=figures: every rank reports steps = 1 + (its parent's pid % 5), rank 0 an accuracy from
# it: each run's figures are its own. MODE=argv: record argv and HTJ_MAX_STEPS. MODE=usage:
# rank 1 dies as argparse does (exit 2). MODE=collateral: rank 1 raises after the others have
# died of a peer's "Connection closed by peer" (it ignores our SIGTERM, so the others are seen
# first). MODE=sleep: mark up-<rank>, then sleep. MODE=print: a line on stdout and one on stderr. MODE=resume: fail (exit 5) unless $HTJ_CHECKPOINT_DIR/saved exists; rank 0 saves it first and the others fail only once it exists (else the supervisor could stop rank 0 before it saved: a flaky resume).
WORKER = textwrap.dedent("""
    import json, os, signal, sys, time
    from heterotrain_common.contract import parse_contract
    ct = parse_contract(os.environ)
    mode, out = os.environ["MODE"], os.environ.get("OUT", "")
    if mode == "figures":
        from hetero_worker.metrics import WorkerMetrics
        m = WorkerMetrics(ct)
        for _ in range(1 + os.getppid() % 5):
            m.observe_step(0.01, 0.01, 0.0, ct.local_batch, 1.0)
        m.flush()
        if ct.dist.rank == 0:
            from heterotrain_common.rundir import write_result
            write_result({"accuracy": (os.getppid() % 1000) / 1000})
    elif mode == "argv":
        with open(os.path.join(out, f"rank-{ct.dist.rank}.json"), "w") as f:
            json.dump({"argv": sys.argv[1:], "max_steps": os.environ.get("HTJ_MAX_STEPS")}, f)
    elif mode == "usage" and ct.dist.rank == 1:
        print("usage: train.py [-h] [--lr LR]", file=sys.stderr)
        print("train.py: error: unrecognized arguments: --batch 3", file=sys.stderr)
        sys.exit(2)
    elif mode == "collateral":
        flag = os.path.join(out, "raising")
        if ct.dist.rank == 1:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            open(flag, "w").close()
            time.sleep(1.0)  # sync-ok: the others die of the peer first
            raise ValueError("boom in rank 1")
        while not os.path.exists(flag):
            time.sleep(0.02)  # sync-ok: the workload waits for its peer
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection "
                           "closed by peer [127.0.0.1]:29500")
    elif mode == "print":
        print(f"out {ct.dist.rank}", flush=True)
        print(f"err {ct.dist.rank}", file=sys.stderr, flush=True)
    elif mode == "sleep":
        open(os.path.join(out, f"up-{ct.dist.rank}"), "w").close()
        time.sleep(120)  # sync-ok: the workload; Ctrl-C stops it
    elif mode == "resume":
        saved = os.path.join(os.environ["HTJ_CHECKPOINT_DIR"], "saved")
        if not os.path.exists(saved):
            if ct.dist.rank == 0:
                os.makedirs(os.path.dirname(saved), exist_ok=True)
                open(saved, "w").close()
            while not os.path.exists(saved):  # no rank fails (and has rank 0 stopped) before it saved
                time.sleep(0.01)  # sync-ok: the workload waits for rank 0's file
            sys.exit(5)
""")


def _job(tmp_path: Path, mode: str, *, checkpoint: bool = False, args: list[str] | None = None) -> Path:
    doc = yaml.safe_load((ROOT / "examples" / "digits.yaml").read_text())
    doc["metadata"]["name"] = "second"
    (tmp_path / "out").mkdir(exist_ok=True)
    doc["spec"]["worker"] = {"command": ["python", "-c", WORKER], "args": args or [],
                             "env": [{"name": "MODE", "value": mode},
                                     {"name": "OUT", "value": str(tmp_path / "out")}]}
    doc["spec"]["training"]["precision"] = "FP32"
    if not checkpoint:
        del doc["spec"]["training"]["checkpoint"]
    doc["spec"]["runPolicy"]["backoffLimit"] = 0
    path = tmp_path / f"{mode}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _run(cwd: Path, *argv: str, **popen: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RUN, *argv, "--grace-s", "3", "--metrics-port-base", "0"], cwd=cwd,
                          capture_output=True, text=True, timeout=120, **popen)


def _last_line(text: str) -> str:
    return text.rstrip().splitlines()[-1]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_runs_of_one_job_in_the_same_second_get_their_own_directories(tmp_path):
    now_s = 1_764_620_801.0
    first = rundirs.new_run_dir(tmp_path, "digits", now_s=now_s)
    second = rundirs.new_run_dir(tmp_path, "digits", now_s=now_s)
    assert first != second
    assert second.name == first.name + "-2"
    assert (first / rundirs.RUN_MARKER).is_file() and (second / rundirs.RUN_MARKER).is_file()


@pytest.mark.timeout(200)
def test_two_runs_started_together_keep_their_own_logs_and_figures(tmp_path):
    job = _job(tmp_path, "figures")
    runs = [subprocess.Popen([*RUN, str(job), "--grace-s", "3", "--metrics-port-base", "0"],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True) for _ in range(2)]
    outs = [p.communicate(timeout=180)[0] for p in runs]
    assert [p.returncode for p in runs] == [0, 0], outs
    dirs = [Path(tmp_path, re.search(r"Logs and statistics: (\S+)", o).group(1)) for o in outs]
    assert dirs[0] != dirs[1]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(d.name for d in dirs)
    for out, directory, proc in zip(outs, dirs, runs, strict=True):
        steps = 1 + proc.pid % 5  # the ranks' parent is this run's heterotrain process
        assert (directory / "rank-0.log").read_text().count("--- attempt ") == 1
        assert [json.loads((directory / f"rank-{r}.json").read_text())["steps"]
                for r in range(4)] == [steps] * 4
        assert f"Result: accuracy {(proc.pid % 1000) / 1000:.2%}" in out


@pytest.mark.timeout(120)
def test_a_rank_exiting_2_is_a_rank_failure_named_with_its_code_and_error(tmp_path):
    done = _run(tmp_path, str(_job(tmp_path, "usage")), "--workdir", str(tmp_path / "w"))
    assert done.returncode == embedded.EXIT_RANK_FAILED == 3, done.stdout + done.stderr
    assert _last_line(done.stdout) == ("Job failed: rank 1 exited with code 2: train.py: error: "
                                       "unrecognized arguments: --batch 3")
    assert "plain DDP" not in done.stdout  # point 4: a failure never claims that
    assert ("No rank reported statistics (4 ranks): the job ended (failed (exit code 2)) before "
            "any rank reached hetero_worker's Trainer") in _flat(done.stdout)


@pytest.mark.timeout(120)
def test_the_rank_that_raised_is_named_not_the_peers_that_lost_it(tmp_path):
    done = _run(tmp_path, str(_job(tmp_path, "collateral")), "--workdir", str(tmp_path / "w"))
    out = _flat(done.stdout)
    assert done.returncode == 3, done.stdout + done.stderr
    assert _last_line(done.stdout) == "Job failed: rank 1 exited with code 1: ValueError: boom in rank 1"
    # rank 1 comes first, before its log's lines; the peers that died of it (those seen before the
    # SIGTERM: one to three of them) are called collateral
    assert re.search(r"rank 1 exited with code 1: ValueError: boom in rank 1 first; stopped the "
                     r"other ranks; ranks? [023](, [023])* failed after it \(a peer left the "
                     r"collective: collateral, not the cause\)\. Last lines of ", out), out


@pytest.mark.timeout(120)
def test_max_steps_reaches_a_plain_script_only_through_the_environment(tmp_path):
    done = _run(tmp_path, str(_job(tmp_path, "argv", args=["--lr", "0.1"])), "--max-steps", "7",
                "--workdir", str(tmp_path / "w"))
    assert done.returncode == 0, done.stdout + done.stderr
    seen = [json.loads((tmp_path / "out" / f"rank-{r}.json").read_text()) for r in range(4)]
    assert seen == [{"argv": ["--lr", "0.1"], "max_steps": "7"}] * 4


@pytest.mark.timeout(200)
def test_an_interrupted_or_failed_run_says_how_to_resume_and_resume_continues_in_its_directory(tmp_path):
    job = _job(tmp_path, "resume", checkpoint=True)
    first = _run(tmp_path, str(job))
    assert first.returncode == 3, first.stdout + first.stderr
    rundir = re.search(r"Logs and statistics: (\S+)", first.stdout).group(1)
    assert f"Resume from the last checkpoint: heterotrain run --resume {rundir}" in _flat(first.stdout)
    job.unlink()  # --resume plans the run's own copy of the manifest
    again = _run(tmp_path, "--resume", rundir)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"Logs and statistics: {rundir}" in again.stdout
    assert os.listdir(tmp_path / "runs") == [Path(rundir).name]
    assert (tmp_path / rundir / "rank-0.log").read_text().count("--- attempt 0 ---") == 2


@pytest.mark.timeout(200)
def test_the_resume_command_runs_as_printed_and_a_finished_run_is_not_run_again(tmp_path):
    """Invoked as ``.venv/bin/heterotrain`` (a relative path), the printed command says so
    (before: ``heterotrain run --resume``, command not found); a ``--resume`` of the run that
    then succeeded says it finished and starts no rank (before: it ran its last steps again)."""
    script = Path(sys.executable).parent / "heterotrain"
    if not script.is_file():
        pytest.skip(f"no console script beside {sys.executable}")
    typed = os.path.relpath(script, tmp_path)
    job = _job(tmp_path, "resume", checkpoint=True)
    first = subprocess.run([typed, "run", str(job), "--grace-s", "3", "--metrics-port-base", "0"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert first.returncode == 3, first.stdout + first.stderr
    rundir = re.search(r"Logs and statistics: (\S+)", first.stdout).group(1)
    assert f"Resume from the last checkpoint: {typed} run --resume {rundir}" in _flat(first.stdout)
    again = _run(tmp_path, "--resume", rundir)
    assert again.returncode == 0, again.stdout + again.stderr
    done = subprocess.run([*RUN, "--resume", rundir], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == (f"heterotrain run: {rundir} already finished: the job succeeded; "
                           "nothing to resume (to train again, start a new run: heterotrain run "
                           f"{rundir}/job.yaml)\n")
    assert (tmp_path / rundir / "rank-0.log").read_text().count("--- attempt") == 2


def test_resume_refuses_options_that_differ_from_the_runs_naming_them(tmp_path):
    """Flags given with ``--resume`` were replaced by ``run.json``'s without a word (issue 22
    leftover): a changed one is refused, exit 64, naming each flag, both values and the fix;
    the same values as the run's, or defaults, continue."""
    job = _job(tmp_path, "resume", checkpoint=True)
    first = _run(tmp_path, str(job), "--max-steps", "40")
    assert first.returncode == 3, first.stdout + first.stderr
    rundir = re.search(r"Logs and statistics: (\S+)", first.stdout).group(1)
    refused = _run(tmp_path, "--resume", rundir, "--max-steps", "80", "--tee", "0")
    assert refused.returncode == 64, refused.stdout + refused.stderr
    assert _flat(refused.stderr) == _flat(
        f"heterotrain run: error: --resume {rundir} continues with the options the run was "
        "started with, and --max-steps 80 (the run's: 40), --tee 0 (the run's: 3) differ from "
        "them: leave them out to continue the run, or start a new run with them (heterotrain run "
        f"{rundir}/job.yaml ...)")
    assert (tmp_path / rundir / "rank-0.log").read_text().count("--- attempt") == 1
    again = _run(tmp_path, "--resume", rundir, "--max-steps", "40")
    assert again.returncode == 0, again.stdout + again.stderr


def test_the_command_is_printed_as_it_was_typed(tmp_path):
    from hetero_operator.local import invocation
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "heterotrain").write_text("#!/bin/sh\n")
    (bin_dir / "heterotrain").chmod(0o755)
    assert invocation.invoked_as(".venv/bin/heterotrain", path="") == ".venv/bin/heterotrain"
    assert invocation.invoked_as("/opt/my env/heterotrain", path="") == "'/opt/my env/heterotrain'"
    assert invocation.invoked_as(str(bin_dir / "heterotrain"), path=str(bin_dir)) == "heterotrain"
    assert invocation.invoked_as("heterotrain", path="") == "heterotrain"
    assert invocation.invoked_as("/src/hetero_operator/cli.py", path="") == "heterotrain"  # -m


def test_resume_refuses_a_directory_that_is_no_run(tmp_path):
    done = subprocess.run([*RUN, "--resume", str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip() == (f"heterotrain run: error: --resume {tmp_path}: not a run "
                                   "directory of heterotrain run (no run.json and job.yaml; runs "
                                   "before this version cannot be resumed this way: pass JOB.yaml "
                                   "--workdir DIR instead)")


@pytest.mark.parametrize(("output", "expected"), [
    ("Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'lr'\n\nDuring "
     "handling of the above exception, another exception occurred:\n\nTraceback (most recent "
     "call last):\n  File \"y\"\nRuntimeError: wrapped\n", "KeyError: 'lr'"),
    ("usage: t.py [-h]\nt.py: error: the following arguments are required: --data\n",
     "t.py: error: the following arguments are required: --data"),
    ("loading\nKilled\n", "Killed"), ("", ""),
    ("[rank0]: Traceback (most recent call last):\n[rank0]:   File \"x\"\n[rank0]: ImportError: "
     "cannot import name 'f'\n", "ImportError: cannot import name 'f'")],
    ids=["the root exception of a chained traceback", "argparse's error line",
         "the last line otherwise", "no output", "torch's [rank0]: prefix dropped"])
def test_the_first_line_of_a_ranks_error(output, expected):
    assert failure.error_line(output) == expected


def test_the_progress_bar_counts_job_steps_after_a_resume(tmp_path):
    import io

    from rich.console import Console

    from hetero_operator.local import supervise
    from heterotrain_common import rundir
    rundir.write_json_atomic(rundir.rank_stats_path(tmp_path, 0),
                             {"rank": 0, "steps": 92, "resumed_step": 40, "total_steps": 132,
                              "loss": 0.5})
    view = supervise._ProgressView(Console(file=io.StringIO()), tmp_path)
    view.tick()
    task = view.progress.tasks[0]
    assert (task.completed, task.total) == (132, 132)  # not 92/132


@pytest.mark.timeout(120)
def test_tee_and_local_ranks_filter_show_every_ranks_stderr_prefixed_and_log_dir_keeps_both(tmp_path):
    done = _run(tmp_path, str(_job(tmp_path, "print")), "--workdir", str(tmp_path / "w"),
                "--log-dir", str(tmp_path / "logs"), "--tee", "2", "--local-ranks-filter", "all")
    assert done.returncode == 0, done.stdout + done.stderr
    shown = [line for line in done.stdout.splitlines() if line.startswith("rank ")]
    assert sorted(shown) == [f"rank {r} | err {r}" for r in range(4)]
    for r in range(4):
        log = (tmp_path / "logs" / f"rank-{r}.log").read_text().splitlines()
        assert log[0] == "--- attempt 0 ---" and sorted(log[1:]) == [f"err {r}", f"out {r}"]
    assert not list((tmp_path / "w").glob("rank-*.log"))


@pytest.mark.timeout(120)
def test_ctrl_c_exits_130_and_says_how_to_resume(tmp_path):
    import signal
    import time

    job = _job(tmp_path, "sleep", checkpoint=True)
    proc = subprocess.Popen([*RUN, str(job), "--grace-s", "3", "--metrics-port-base", "0"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 90
    while len(list((tmp_path / "out").glob("up-*"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)  # sync-ok: waits for the thing asserted (every rank up)
    proc.send_signal(signal.SIGINT)
    out = _flat(proc.communicate(timeout=60)[0])
    assert proc.returncode == 130, out
    rundir = re.search(r"Logs and statistics: (\S+)", out).group(1)
    assert (f"No checkpoint was saved ({rundir}/checkpoints is empty or the job does "
            f"not checkpoint: spec.training.checkpoint.path); heterotrain run --resume {rundir} "
            "starts the job again from step 0") in out
    assert out.endswith("Job interrupted (Ctrl-C, SIGINT)")


def test_a_mistyped_script_path_is_bad_input_naming_it(tmp_path):
    doc = yaml.safe_load(_job(tmp_path, "argv").read_text())
    doc["spec"]["worker"] = {"command": ["python", "trian.py"]}
    job = tmp_path / "typo.yaml"
    job.write_text(yaml.safe_dump(doc))
    done = subprocess.run([*RUN, str(job), "--workdir", str(tmp_path / "w")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip() == (f"heterotrain run: error: {job}: spec.worker.command: script "
                                   "'trian.py' not found (paths are relative to the directory "
                                   f"heterotrain run starts in, {tmp_path})")
    assert not (tmp_path / "w").exists()


def test_job_and_resume_together_or_neither_are_usage_errors(tmp_path):
    for argv in ([], [str(tmp_path / "job.yaml"), "--resume", str(tmp_path)]):
        done = subprocess.run([*RUN, *argv], capture_output=True, text=True, timeout=60)
        assert done.returncode == 64, argv
