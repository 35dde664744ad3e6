"""Checkpoint/resume after killing a rank process mid-run is bit-identical to no interruption."""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from rankproc import assert_ok, mixed_cluster_envs, run_ranks, start_rank, wait_all

from hetero_worker.ckpt import checkpoint, files, store

STEPS = 30
BATCHES = [32, 16]


def digits_cmd(*extra: str) -> list[str]:
    return [sys.executable, "-m", "hetero_worker.examples.digits", "--max-steps", str(STEPS),
            *extra]


def kill_after_checkpoint(envs: list[dict[str, str]], min_step: int) -> int:
    """Start the job, SIGKILL rank 1 once rank 0 reports a checkpoint >= min_step, then rank 0."""
    procs = [start_rank(digits_cmd("--checkpoint-every", "5"), env,
                        HTJ_SIM_DELAY_PER_SAMPLE_S="0.002") for env in envs]
    seen = -1
    deadline = time.monotonic() + 180
    for line in procs[0].stdout:
        match = re.match(r"checkpoint step=(\d+)", line)
        if match:
            seen = int(match.group(1))
            if seen >= min_step:
                break
        if time.monotonic() > deadline:
            break
    procs[1].send_signal(signal.SIGKILL)
    try:
        procs[0].wait(timeout=15)  # its next collective fails once the peer is gone
    except Exception:
        procs[0].kill()
    wait_all(procs, timeout_s=15)
    return seen


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_resume_after_kill_is_bit_identical(tmp_path: Path) -> None:
    reference = tmp_path / "reference.pt"
    assert_ok(run_ranks(digits_cmd("--dump-params", str(reference)), mixed_cluster_envs(BATCHES),
                        timeout_s=180))

    ckpt_dir = tmp_path / "ckpt"
    killed_at = kill_after_checkpoint(mixed_cluster_envs(BATCHES, checkpoint_dir=str(ckpt_dir)),
                                      min_step=10)
    assert 10 <= killed_at < STEPS, f"the run was not killed mid-way (checkpoint {killed_at})"
    saved_step = files.load_file(store.newest_file(ckpt_dir))["step"]  # weights_only=True
    assert saved_step % 5 == 0 and 10 <= saved_step < STEPS

    resumed = tmp_path / "resumed.pt"
    runs = run_ranks(digits_cmd("--checkpoint-every", "5", "--dump-params", str(resumed)),
                     mixed_cluster_envs(BATCHES, checkpoint_dir=str(ckpt_dir)), timeout_s=180)
    assert_ok(runs)
    assert f"heterotrain: rank 0: resumed at step {saved_step}, epoch " in runs[0].stderr
    assert "resumed at step" not in runs[0].stdout  # said once, by the Trainer, not the example
    assert f"after {STEPS} steps" in runs[0].stdout
    expected, got = torch.load(reference), torch.load(resumed)
    assert len(expected) == len(got) == 4
    for a, b in zip(expected, got, strict=True):
        assert torch.equal(a, b), f"max abs diff {(a - b).abs().max().item()}"
