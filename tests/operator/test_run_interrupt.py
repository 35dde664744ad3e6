"""Ctrl-C of ``heterotrain run`` (issue 22, point 9 retried): the ranks stop as after a preemption,
at a step they all agree on, with one checkpoint of that step within the supervisor's grace, and
``--resume`` starts there; no ``KeyboardInterrupt`` traceback in any rank; a resume of a finished
run starts nothing.

Before: the terminal's SIGINT was forwarded as SIGINT (every rank printed a ``KeyboardInterrupt``
traceback) and then SIGTERM'd at once (a second SIGTERM: no stop checkpoint), while the ranks
announced the pod's 300 s grace.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from heterotrain_common import procs

RUN = [sys.executable, "-m", "hetero_operator.cli", "run"]

# Each process marks up-<i> once its handlers are set, records the signal it got, exits 75.
CHILD = textwrap.dedent("""
    import os, signal, sys, time
    out = sys.argv[1]
    def got(signum, _frame):
        open(os.path.join(out, f"{os.environ['I']}-{signal.Signals(signum).name}"), "w").close()
        sys.exit(75)
    signal.signal(signal.SIGTERM, got)
    signal.signal(signal.SIGINT, got)
    open(os.path.join(out, f"up-{os.environ['I']}"), "w").close()
    time.sleep(60)  # sync-ok: the workload; the signal ends it
""")


def test_a_sigint_reaches_the_ranks_as_one_sigterm_and_they_get_the_grace(tmp_path: Path) -> None:
    envs = [{**os.environ, "I": str(i)} for i in range(2)]
    gang = procs.Gang([sys.executable, "-c", CHILD, str(tmp_path)], envs)
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("up-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)  # sync-ok: waits for the thing asserted (both handlers set)
    with procs.forwarding_signals(gang, as_sigterm=True):
        os.kill(os.getpid(), signal.SIGINT)
        outcome = gang.wait(grace_s=30, signal_grace_s=30)
    assert outcome.signal_received == signal.SIGINT and outcome.exit_code == 130
    assert sorted(p.name for p in tmp_path.glob("[01]-*")) == ["0-SIGTERM", "1-SIGTERM"]
    assert [p.returncode for p in gang.procs] == [75, 75]  # finished on their own, not killed


def _workdir_line(pattern: str, text: str) -> re.Match[str]:
    found = re.search(pattern, text)
    assert found is not None, f"{pattern!r} not in:\n{text[-3000:]}"
    return found


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_ctrl_c_mid_run_checkpoints_the_agreed_step_and_resume_starts_there(repo_root, tmp_path):
    work = tmp_path / "w"
    proc = subprocess.Popen([*RUN, "examples/digits.yaml", "--workdir", str(work),
                             "--metrics-port-base", "0"], cwd=repo_root, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 180
    while not list((work / "checkpoints").glob("step-00000020-*")) and time.monotonic() < deadline:
        time.sleep(0.1)  # sync-ok: waits for the thing asserted (a step reached mid-run)
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, out[-3000:]
    logs = [(work / f"rank-{r}.log").read_text() for r in range(4)]
    assert not any("KeyboardInterrupt" in log or "Traceback" in log for log in logs), logs[0]
    stops = [_workdir_line(r"stopped after step (\d+) as every rank agreed", log) for log in logs]
    step = int(stops[0].group(1))
    assert [int(s.group(1)) for s in stops] == [step] * 4 and step >= 20
    assert "with one checkpoint (grace 10 s)" in logs[0]  # the supervisor's --grace-s, not 300 s
    saved = list((work / "checkpoints").glob(f"step-{step:08d}-*"))
    assert len(saved) == 1, sorted(p.name for p in (work / "checkpoints").iterdir())
    assert "Resume from the last checkpoint: heterotrain run --resume" in " ".join(out.split())

    again = subprocess.run([*RUN, "--resume", str(work)], cwd=repo_root, capture_output=True,
                           text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    resumed_log = (work / "rank-0.log").read_text().rsplit("--- attempt", 1)[-1]
    epoch = _workdir_line(rf"rank 0: resumed at step {step}, epoch (\d+) from ", resumed_log).group(1)
    assert (f"heterotrain: rank 0: resumed at step {step}, epoch {epoch} from {saved[0]}\n"
            in resumed_log)
    assert resumed_log.count("resumed at step") == 1  # the Trainer's line, not the example's too
    assert f"Resumed at step {step} from the last checkpoint in {work}/checkpoints" in again.stdout
    final = _workdir_line(r"(\d+)/(\d+) steps", again.stdout).group(2)

    attempts = (work / "rank-0.log").read_text().count("--- attempt")
    done = subprocess.run([*RUN, "--resume", str(work)], cwd=repo_root, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout == (f"heterotrain run: {work} already finished: the job succeeded at step "
                           f"{final}; nothing to resume (to train again, start a new run: "
                           f"heterotrain run {work}/job.yaml)\n")
    assert (work / "rank-0.log").read_text().count("--- attempt") == attempts  # no rank started
