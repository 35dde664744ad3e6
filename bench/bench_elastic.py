#!/usr/bin/env python
"""Elastic shrink vs gang restart, and growing back (issue 31): seconds from losing a rank to the next completed
step, and to being back at the step the job was at, ``spec.elastic`` against today's gang restart
from the checkpoint, on the same job.

Run from the repository root::

    .venv/bin/python bench/bench_elastic.py          # about 2 minutes on 2 cores

The job is ``examples/digits.yaml`` under ``heterotrain run`` (4 simulated ranks: A100, V100 and
two T4s; 3 epochs, 33 steps; a checkpoint every 20 steps; ``collectiveTimeoutSeconds: 10``), once
with ``spec.elastic: {minRanks: 2}`` and once without. In each repeat the second T4 rank is
SIGKILLed (its pid from ``run.json``) once rank 0 has completed step 25, five steps after the
step-20 checkpoint. The times are read by polling ``rank-0.json`` every 20 ms (the job's step is
``resumed_step + steps``); the restart backoff is 0 (``HTJ_BACKOFF_BASE_S``), the restart's most
favourable setting. The elastic runs' own figure (``membership.json``: the supervisor's loss time
to the first step rank 0 completed after it) and every run's held-out accuracy are kept in the
details. A third set of runs (``grow``: 6 epochs, the T4 rank SIGKILLed after step 10) measures
growing back: the supervisor starts the lost rank again once the survivors stepped, and it joins
at a step boundary; ``membership.json`` gives the running ranks' pause at the switch
(``reform_s``) and the seconds from the announcement to the first step with 4 ranks. Figures are
CPU ones on a shared machine: they say how the two compare, not what a GPU
cluster takes.

Writes ``bench/results/elastic.json`` in the shape of :mod:`benchlib` (all figures ``info``; the
issue asks for them side by side, with no target).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

KILL_AFTER_STEP = 25
GROW_KILL_AFTER_STEP = 10  # the grow runs: 6 epochs (66 steps), time for the rank to rejoin
POLL_S = 0.02


def _job(work: Path, elastic: bool, epochs: int = 3) -> Path:
    import yaml

    body = yaml.safe_load((ROOT / "examples" / "digits.yaml").read_text())
    if elastic:
        body["spec"]["elastic"] = {"minRanks": 2}
    body["spec"]["training"]["collectiveTimeoutSeconds"] = 10
    body["spec"]["training"]["checkpoint"]["path"] = str(work / "ckpt")
    body["spec"]["worker"]["args"] = ["--epochs", str(epochs)]
    job = work / "job.yaml"
    job.write_text(yaml.safe_dump(body))
    return job


def _progress(run_dir: Path) -> tuple[int, int]:
    """Rank 0's ``(resumed_step, steps)`` (``rank-0.json``; a restarted attempt's resumed_step is
    its checkpoint's step, the job's step is their sum)."""
    try:
        stats = json.loads((run_dir / "rank-0.json").read_text())
    except (OSError, ValueError):
        return 0, 0
    return int(stats.get("resumed_step") or 0), int(stats.get("steps") or 0)


def one_run(work: Path, *, elastic: bool, timeout_s: float, epochs: int = 3,
            kill_after: int = KILL_AFTER_STEP) -> dict[str, Any]:
    """One ``heterotrain run`` with a T4 rank SIGKILLed after step ``kill_after``; its figures
    (with the growing back's when the lost rank rejoined before the end)."""
    import benchlib

    work.mkdir(parents=True)
    run_dir = work / "run"
    env = {**os.environ, "XDG_CACHE_HOME": str(work / "xdg"), "HTJ_BACKOFF_BASE_S": "0",
           "HTJ_BACKOFF_MAX_S": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "hetero_operator.cli", "run",
                             str(_job(work, elastic, epochs)), "--workdir", str(run_dir),
                             "--metrics-port-base", "0"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = benchlib.Deadline(timeout_s)
    try:
        while sum(_progress(run_dir)) < kill_after:
            deadline.left_s(f"rank 0's step {kill_after}")
            time.sleep(POLL_S)  # sync-ok: polls the run file the measurement starts from
        lost_step = sum(_progress(run_dir))
        ranks = json.loads((run_dir / "run.json").read_text())["ranks"]
        victim = [r for r in ranks if r["gpu_product"] == "Tesla-T4"][-1]
        lost_at = time.monotonic()
        os.kill(victim["pid"], signal.SIGKILL)
        next_s = back_s = None
        while proc.poll() is None and back_s is None:
            deadline.left_s("the step after the loss")
            resumed, steps = _progress(run_dir)
            # elastic: the job's step moves on; gang: the restarted attempt (resumed from the
            # checkpoint) completes its first step
            moved = resumed + steps > lost_step if elastic else (resumed > 0 and steps >= 1)
            if next_s is None and moved:
                next_s = time.monotonic() - lost_at
            if resumed + steps > lost_step and (elastic or resumed > 0):
                back_s = time.monotonic() - lost_at
            time.sleep(POLL_S)  # sync-ok: polls the run file the measurement reads
        out = proc.communicate(timeout=deadline.left_s("the end of the run"))[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0 or next_s is None or back_s is None:
        raise ValueError(f"run in {work} ended {proc.returncode} (next step {next_s}, back at "
                         f"the lost step {back_s}):\n{out[-3000:]}")
    accuracy = re.search(r"held-out accuracy ([0-9.]+) after (\d+) steps", out)
    membership = run_dir / "membership.json"
    events = json.loads(membership.read_text())["events"] if membership.exists() else []
    return {"lost_step": lost_step, "next_step_s": next_s, "back_at_lost_step_s": back_s,
            "accuracy": float(accuracy.group(1)) if accuracy else None,
            "steps": int(accuracy.group(2)) if accuracy else None,
            "attempts": (run_dir / "rank-0.log").read_text().count("--- attempt "),
            "reported_recovery_s": events[0]["recovery_s"] if events else None,
            "grow": next((e for e in events if e.get("kind") == "grow"), None)}


def main() -> int:
    """Run the repeats, write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results", type=Path, default=ROOT / "bench/results/elastic.json")
    args = parser.parse_args()

    import benchlib

    run_meta = benchlib.meta()
    started = time.monotonic()
    runs: dict[str, list[dict[str, Any]]] = {"elastic": [], "gang": [], "grow": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for mode in runs:
                longer = {"epochs": 6, "kill_after": GROW_KILL_AFTER_STEP} if mode == "grow" else {}
                runs[mode].append(one_run(Path(tmp) / f"{mode}-{repeat}", elastic=mode != "gang",
                                          timeout_s=240, **longer))
                print(mode, runs[mode][-1], flush=True)
    grown = [r["grow"] for r in runs["grow"]]
    if any(g is None or g.get("step") is None for g in grown):
        raise ValueError(f"a grow run ended before the lost rank rejoined: {grown}")
    run_meta["wall_s"] = time.monotonic() - started
    how = "polled from rank-0.json every 20 ms; T4 rank SIGKILLed after step 25"
    targets = [
        benchlib.Target("loss -> next completed step, spec.elastic (shrink 4 -> 3)", "info", 0.0,
                        " s", [r["next_step_s"] for r in runs["elastic"]], how),
        benchlib.Target("loss -> next completed step, gang restart from the step-20 checkpoint",
                        "info", 0.0, " s", [r["next_step_s"] for r in runs["gang"]], how),
        benchlib.Target("loss -> back at the lost step, spec.elastic", "info", 0.0, " s",
                        [r["back_at_lost_step_s"] for r in runs["elastic"]], how),
        benchlib.Target("loss -> back at the lost step, gang restart", "info", 0.0, " s",
                        [r["back_at_lost_step_s"] for r in runs["gang"]], how),
        benchlib.Target("gang restart / elastic, loss -> back at the lost step", "info", 0.0, "x",
                        [g["back_at_lost_step_s"] / e["back_at_lost_step_s"]
                         for g, e in zip(runs["gang"], runs["elastic"], strict=True)],
                        "per repeat"),
        benchlib.Target("growing back 3 -> 4, the running ranks' pause to let the rank in", "info",
                        0.0, " s", [g["reform_s"] for g in grown],
                        "rank 0's re-forming at the agreed step (membership.json reform_s)"),
        benchlib.Target("growing back 3 -> 4, announcement -> first step with 4 ranks", "info",
                        0.0, " s", [g["recovery_s"] for g in grown],
                        "the restarted rank's start-up (Python, torch, its Trainer, the data) "
                        "included; the other ranks train meanwhile"),
    ]
    doc = benchlib.write_results(args.results, benchmark="elastic", run_meta=run_meta,
                                 targets=targets, details=runs)
    benchlib.print_targets(doc)
    return 0


if __name__ == "__main__":
    sys.exit(__import__("benchlib").main_guard(main))
