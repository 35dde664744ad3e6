"""Kill a job mid-run, resume it on one rank fewer / one rank more: exact epoch coverage.

Real Gloo rank processes (tests/worker/resume_ranks.py). Every rank records the dataset indices of
every step it trained; the killed phase's steps after the checkpoint are lost work (the resumed
job redoes them), so the epoch's samples are the killed phase's records up to the checkpoint step
plus everything the resumed phase recorded, and that multiset must be each index exactly once.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from epoch_checks import assert_every_sample_once
from rankproc import assert_ok, mixed_cluster_envs, run_ranks

from hetero_worker.ckpt import checkpoint, files, store

HERE = Path(__file__).parent
SAMPLES = 108  # 6 steps of a global batch of 18, no remainder


def cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(HERE / "resume_ranks.py"), "--scenario", "coverage",
            "--out", str(out), "--samples", str(SAMPLES), *extra]


def records(out: Path, world: int) -> list[dict]:
    lines = []
    for rank in range(world):
        for line in (out / f"steps-rank{rank}.jsonl").read_text().splitlines():
            lines.append({"rank": rank, **json.loads(line)})
    return lines


def kill_and_resume(tmp_path: Path, before: list[int], after: list[int], *,
                    compression: str = "none") -> tuple[list, list, list]:
    """Phase 1 on ``before`` (checkpoint every 2, last rank killed after step 3), phase 2 on
    ``after`` from that checkpoint. Returns (phase-1 records, phase-2 records, phase-2 runs)."""
    ckpt, out1, out2 = tmp_path / "ckpt", tmp_path / "phase1", tmp_path / "phase2"
    killed = len(before) - 1
    runs1 = run_ranks(cmd(out1, "--checkpoint-every", "2", "--kill-after", "3", "--kill-rank",
                          str(killed), "--compression", compression),
                      mixed_cluster_envs(before, checkpoint_dir=str(ckpt)), timeout_s=120)
    assert runs1[killed].returncode == -9, "the last rank was not killed"
    assert all(r.returncode != 0 for r in runs1), "a rank finished although a peer was killed"
    assert files.load_file(store.newest_file(ckpt))["step"] == 2
    runs2 = run_ranks(cmd(out2, "--checkpoint-every", "2", "--compression", compression),
                      mixed_cluster_envs(after, checkpoint_dir=str(ckpt)), timeout_s=120)
    assert_ok(runs2)
    return records(out1, len(before)), records(out2, len(after)), runs2


def assert_exact_epoch(phase1: list[dict], phase2: list[dict], out2: Path, world2: int,
                       saved_step: int = 2) -> None:
    assert_every_sample_once(phase1, phase2, saved_step, SAMPLES)
    reports = [json.loads((out2 / f"rank{r}.json").read_text()) for r in range(world2)]
    assert [r["resumed_step"] for r in reports] == [saved_step] * world2
    assert [(r["step"], r["epoch"]) for r in reports] == [(6, 1)] * world2
    params = [r["params"] for r in reports]
    assert all(p == params[0] for p in params), "replicas diverged after the resume"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_resume_with_one_rank_fewer_sees_every_sample_once(tmp_path: Path) -> None:
    phase1, phase2, runs2 = kill_and_resume(tmp_path, [8, 6, 4], [10, 8], compression="int8")
    assert {r["rank"] for r in phase1} == {0, 1, 2} and {r["rank"] for r in phase2} == {0, 1}
    assert [len(r["idx"]) for r in phase2 if r["step"] == 3] == [10, 8]
    assert_exact_epoch(phase1, phase2, tmp_path / "phase2", 2)
    assert "resume_replanned: step 2, world 3 -> 2, split [8, 6, 4] -> [10, 8]" in runs2[0].stderr
    # The int8 error buffers belonged to the old leaders' group: discarded, said so.
    assert "compression_state_reset: plan changed" in runs2[0].stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_resume_with_one_rank_more_sees_every_sample_once(tmp_path: Path) -> None:
    # The checkpoint has RNG states for 2 ranks; rank 2 of the new plan gets fresh RNG.
    phase1, phase2, _ = kill_and_resume(tmp_path, [10, 8], [8, 6, 4])
    assert {r["rank"] for r in phase2} == {0, 1, 2}
    assert_exact_epoch(phase1, phase2, tmp_path / "phase2", 3)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_rank_that_cannot_read_the_checkpoint_stops_every_rank(tmp_path: Path) -> None:
    shared, empty, broken = tmp_path / "shared", tmp_path / "empty", tmp_path / "broken"
    model = torch.nn.Linear(4, 1).double()
    checkpoint.save_checkpoint(shared, step=4, model=model,
                               optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                               plan={"world_size": 3})
    saved = store.newest_file(shared)
    saved_id = files.load_file(saved)["checkpoint_id"]
    empty.mkdir()
    broken.mkdir()
    (broken / "checkpoint.pt").write_bytes(b"not a checkpoint")
    envs = mixed_cluster_envs([8, 6, 4])
    for env, directory in zip(envs, (shared, empty, broken)):
        env["HTJ_CHECKPOINT_DIR"] = str(directory)
    out = tmp_path / "out"
    runs = run_ranks(cmd(out), envs, timeout_s=120)
    assert [r.returncode for r in runs] == [1, 1, 1]
    assert not (out / "steps-rank0.jsonl").exists(), "a rank trained without agreement"
    for run in runs:  # every rank says the same: the decision and each disagreeing rank
        assert "ResumeDisagreement: resume not agreed: rank 0 resumes from step 4 " \
               f"(checkpoint {saved_id} at {saved})" in run.stderr
        assert f"rank 1 found no checkpoint at {empty / 'checkpoint.pt'}" in run.stderr
        assert f"rank 2 could not read {broken / 'checkpoint.pt'}: UnpicklingError" in run.stderr
