"""Checkpoints that survive preemption, corruption and slow storage (issue 20), with real rank
processes on the Gloo backend (tests/worker/resilience_ranks.py):

* SIGTERM to one rank mid-step: every rank stops after the same step, one checkpoint is written,
  every rank exits 75 within the grace period; the restart resumes at that step and every sample
  is seen exactly once;
* the newest checkpoint truncated: every rank resumes from the previous one and rank 0 says so;
* a save slower than the training collectives' timeout: the run completes (the checkpoint has
  its own process group and timeout); with the checkpoint timeout as short, it fails (control).
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from rankproc import assert_ok, mixed_cluster_envs, run_ranks, start_rank, wait_all

from hetero_worker.ckpt import store
from heterotrain_common.envnames import PREEMPTED_EXIT_CODE

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SCRIPT = Path(__file__).with_name("resilience_ranks.py")
BATCHES = [8, 6, 4]
SAMPLES = 360  # 20 steps of 18
GRACE_S = 30.0


def cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(SCRIPT), "--out", str(out), "--samples", str(SAMPLES), *extra]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for r in range(len(BATCHES))
            for line in (out / f"steps-rank{r}.jsonl").read_text().splitlines()]


def reports(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(len(BATCHES))]


def each_sample_once(*phases: list[dict]) -> None:
    counts = Counter(i for phase in phases for r in phase for i in r["idx"])
    assert sorted(counts) == list(range(SAMPLES)), "samples missing from the epoch"
    assert set(counts.values()) == {1}, {i: c for i, c in counts.items() if c != 1}


def test_sigterm_to_one_rank_mid_step_stops_all_with_one_checkpoint_and_resumes_there(tmp_path: Path) -> None:
    ckpt, out1, out2 = tmp_path / "ckpt", tmp_path / "phase1", tmp_path / "phase2"
    envs = mixed_cluster_envs(BATCHES, checkpoint_dir=str(ckpt))
    procs = [start_rank(cmd(out1, "--step-s", "0.2"), env) for env in envs]
    log = out1 / "steps-rank1.jsonl"
    deadline = time.monotonic() + 120
    while not (log.exists() and len(log.read_text().splitlines()) >= 6):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "no training"
        time.sleep(0.05)  # sync-ok: the poll interval of the wait for 6 logged steps
    time.sleep(0.1)  # sync-ok: aims the signal inside step 6 or 7 (0.2 s of it is the sleep before the step)
    sent = time.monotonic()
    procs[1].send_signal(signal.SIGTERM)  # one rank: its pod is preempted
    runs = wait_all(procs, timeout_s=GRACE_S + 30)
    took = time.monotonic() - sent
    assert [r.returncode for r in runs] == [PREEMPTED_EXIT_CODE] * 3, [r.stderr[-2000:] for r in runs]
    assert took < GRACE_S, f"the ranks took {took:.1f} s to stop"
    assert "SIGTERM at step" in runs[1].stderr and "SIGTERM" not in runs[0].stderr
    steps = {int(re.search(r"stopped after step (\d+) as every rank agreed", r.stderr).group(1)) for r in runs}
    assert len(steps) == 1, steps
    (stopped,) = steps
    assert 6 <= stopped < 20
    # one checkpoint, the stop's (no periodic ones in this run)
    assert [c.step for c in store.candidates(ckpt)] == [stopped]
    phase1 = records(out1)
    assert max(r["step"] for r in phase1) == stopped, "a rank began a step after the agreed one"

    assert_ok(run_ranks(cmd(out2), mixed_cluster_envs(BATCHES, checkpoint_dir=str(ckpt)), timeout_s=120))
    got = reports(out2)
    assert [r["resumed_step"] for r in got] == [stopped] * 3
    assert [(r["step"], r["epoch"]) for r in got] == [(20, 1)] * 3
    assert all(r["params"] == got[0]["params"] for r in got), "replicas diverged"
    # steps of milliseconds agree on a stop every floor(1 s / step) steps, not every step (the
    # first agreement after the start proposes 1 step; the next ones many), the same on every rank
    agreements = {r["stop_agreements"] for r in got}
    assert len(agreements) == 1 and 2 <= min(agreements) <= max(2, (20 - stopped) // 3), agreements
    each_sample_once(phase1, records(out2))


def test_truncated_newest_checkpoint_resumes_from_the_previous_on_every_rank(tmp_path: Path) -> None:
    ckpt, out1, out2 = tmp_path / "ckpt", tmp_path / "phase1", tmp_path / "phase2"
    assert_ok(run_ranks(cmd(out1, "--checkpoint-every", "2", "--stop-after", "6"),
                        mixed_cluster_envs(BATCHES, checkpoint_dir=str(ckpt)), timeout_s=120))
    kept = store.candidates(ckpt)
    assert [c.step for c in kept] == [6, 4], "keep 2 (the default): the newest two stay"
    assert all(not store.verify(c) for c in kept), "saved checkpoints verify against their manifests"
    newest = kept[0].file
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a copy cut short

    runs = run_ranks(cmd(out2, "--checkpoint-every", "2"),
                     mixed_cluster_envs(BATCHES, checkpoint_dir=str(ckpt)), timeout_s=120)
    assert_ok(runs)
    got = reports(out2)
    assert [r["resumed_step"] for r in got] == [4] * 3, "every rank falls back to the same checkpoint"
    assert f"checkpoint_fallback: resuming from step 4" in runs[0].stderr
    assert "step 6" in got[0]["fallback"] and "truncated" in got[0]["fallback"]
    each_sample_once([r for r in records(out1) if r["step"] <= 4], records(out2))
    assert [c.step for c in store.candidates(ckpt)] == [20, 18]


def test_a_save_slower_than_the_training_timeout_does_not_fail_the_run(tmp_path: Path) -> None:
    envs = mixed_cluster_envs(BATCHES, checkpoint_dir=str(tmp_path / "ckpt"))
    slow = cmd(tmp_path / "out", "--checkpoint-every", "3", "--stop-after", "6", "--slow-save-s", "10")
    runs = run_ranks(slow, envs, timeout_s=150, HTJ_COLLECTIVE_TIMEOUT_S="5", HTJ_CHECKPOINT_TIMEOUT_S="120")
    assert_ok(runs)
    assert [r["step"] for r in reports(tmp_path / "out")] == [6] * 3
    assert [c.step for c in store.candidates(tmp_path / "ckpt")] == [6, 3]
    # control: the same save with a checkpoint timeout as short as the training one fails
    envs = mixed_cluster_envs(BATCHES, checkpoint_dir=str(tmp_path / "ckpt2"))
    slow = cmd(tmp_path / "out2", "--checkpoint-every", "3", "--stop-after", "6", "--slow-save-s", "10")
    runs = run_ranks(slow, envs, timeout_s=150, HTJ_COLLECTIVE_TIMEOUT_S="5", HTJ_CHECKPOINT_TIMEOUT_S="5")
    assert any(r.returncode != 0 for r in runs)
    assert any("Timed out" in r.stderr or "timeout" in r.stderr.lower() for r in runs), \
        [r.stderr[-1500:] for r in runs]
