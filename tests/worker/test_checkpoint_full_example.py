"""examples/lm-large-full.yaml with checkpoints under Full sharding (issue 29, acceptance).

The example plans under Full on the scaled-down node list with precision Auto (bf16 on the A100,
fp16 on the T4s) and a checkpoint every 5 steps; ``heterotrain run`` trains it and writes sharded
checkpoints (every rank its uneven slices, DCP); a run killed mid-way (a T4 rank SIGKILLed after the
step-5 checkpoint) restarts its gang from its last checkpoint and ends equal, to the last bit, to a
run never interrupted (the same plan: learned speeds off, so both runs plan alike).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hetero_operator.api import types as model
from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.plan import plan_job
from hetero_worker.ckpt import files, store

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "lm-large-full.yaml"
NODES = ROOT / "examples" / "clusters" / "scaled-memory.yaml"
STEPS = 12  # checkpoints at 5 and 10; the kill lands after the one of step 5
RUN = [sys.executable, "-m", "hetero_operator.cli", "run"]


def test_it_plans_full_with_precision_auto_and_checkpoints() -> None:
    body = yaml.safe_load(JOB.read_text())
    training = body["spec"]["training"]
    assert training["precision"] == "Auto" and training["checkpoint"]["intervalSteps"] == 5
    plan = plan_job(parse_job(body), build_inventory(yaml.safe_load(NODES.read_text())["items"]))
    assert isinstance(plan, model.Plan), plan.message
    assert plan.memory.mode == "Full"
    assert [r.precision for r in plan.ranks] == ["bf16", "fp16", "fp16"]


def _options(work: Path) -> list[str]:
    return [str(JOB), "--nodes", str(NODES), "--workdir", str(work), "--max-steps", str(STEPS),
            "--learned-speeds", "", "--metrics-port-base", "0"]


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_run_killed_midway_resumes_and_ends_bit_identical(tmp_path: Path) -> None:
    whole = tmp_path / "whole"
    done = subprocess.run([*RUN, *_options(whole)], capture_output=True, text=True, timeout=150,
                          cwd=ROOT, env=_env(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [c.step for c in store.candidates(whole / "checkpoints")] == [10, 5]
    newest = files.load_file(store.newest_file(whole / "checkpoints"))
    assert (newest["sharded"]["sharding"], newest["sharded"]["writers"]) == ("full", [0, 1, 2])

    work = tmp_path / "killed"
    proc = subprocess.Popen([*RUN, *_options(work)], cwd=ROOT, env=_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not list((work / "checkpoints").glob("step-00000005-*")) and proc.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.02)  # sync-ok: waits for the thing asserted (the step-5 checkpoint published)
    victim = _rank_pid(proc.pid, rank=2)
    os.kill(victim, signal.SIGKILL)  # a T4's process dies mid-run, as with a lost node
    out = proc.communicate(timeout=240)[0]
    assert proc.returncode == 0, out[-3000:]
    log = (work / "rank-0.log").read_text()
    assert "--- attempt 1 ---" in log, "the gang was not restarted after the kill"
    resumed = re.search(r"resumed at step (\d+), epoch", log)
    assert resumed is not None and int(resumed.group(1)) in (5, 10), log[-3000:]
    got = json.loads((work / "result.json").read_text())
    want = json.loads((whole / "result.json").read_text())
    assert got["steps"] == want["steps"] == STEPS
    assert got["val_loss"] == want["val_loss"], "not bit-identical to the run never interrupted"


def _rank_pid(supervisor: int, *, rank: int) -> int:
    """The pid of the supervisor's child process that runs ``rank`` (its ``RANK`` variable)."""
    for task in Path(f"/proc/{supervisor}/task").iterdir():
        for child in (task / "children").read_text().split():
            environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
            if f"RANK={rank}".encode() in environ:
                return int(child)
    raise AssertionError(f"no child of {supervisor} runs rank {rank}")
