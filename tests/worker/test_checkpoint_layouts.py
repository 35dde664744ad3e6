"""Checkpoints resume across sharding layouts (issue 29, item 2; case 62).

Real Gloo rank processes (tests/worker/fullckpt_ranks.py, the product's env contract, Trainer and
checkpoints) train the case-62 model in float64 with AdamW. A phase that checkpoints at step 4 and
goes on to step 5 stands for a job lost after its checkpoint; the next phase resumes under another
layout (another sharding mode, a rank fewer or more, other Full shares) and trains to the end of
the epoch. The reference is one process's AdamW over the same global batches (the steps' logged
sample indices), at the resume (step 4) and at the end (step 8); the samples of the epoch are the
first phase's up to step 4 plus the second's, each exactly once.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from epoch_checks import assert_every_sample_once
from rankproc import RankRun, assert_ok, run_ranks

import fullckpt_ranks as job
from hetero_worker.ckpt import files, store
from hetero_worker.runtime.simulation import free_port, local_rank_envs, simulated_cluster

HERE = Path(__file__).parent
CASE = HERE.parent / "fixtures" / "cases" / "62-replicated-checkpoint-into-sharded-replan.yaml"
SAMPLES = 96  # 8 steps of a global batch of 12
SAVED_STEP, LOST_STEP, LAST_STEP = 4, 5, 8
A100 = ("NVIDIA-A100-SXM4-40GB", "8.0", 1.0)
V100 = ("Tesla-V100-SXM2-16GB", "7.0", 0.5)
T4 = ("Tesla-T4", "7.5", 0.25)
LAYOUTS = {  # ranks: (products, nodes, split, Full shares in ppm)
    2: ([A100, T4], ["node-a", "node-b"], [8, 4], "700000,300000"),
    3: ([A100, T4, T4], ["node-a", "node-b", "node-b"], [6, 3, 3], "500000,250000,250000"),
    4: ([A100, V100, T4, T4], ["node-a", "node-a", "node-b", "node-b"], [6, 2, 2, 2],
        "450000,250000,150000,150000"),
}


def envs(world: int, sharding: str, ckpt: Path) -> list[dict[str, str]]:
    products, nodes, split, shares = LAYOUTS[world]
    entries, profiles = simulated_cluster(products=products, nodes=nodes, local_batches=split)
    made = local_rank_envs(entries=entries, profiles=profiles, master_port=free_port(),
                           checkpoint_dir=str(ckpt))
    for env in made:
        env.update({"HTJ_SHARDING": sharding, "HTJ_SHARD_PPM": shares})
    return made


def phase(out: Path, world: int, sharding: str, ckpt: Path, *extra: str) -> list[RankRun]:
    cmd = [sys.executable, str(HERE / "fullckpt_ranks.py"), "--out", str(out), "--samples",
           str(SAMPLES), "--checkpoint-every", str(SAVED_STEP), *extra]
    return run_ranks(cmd, envs(world, sharding, ckpt), timeout_s=240)


def records(out: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(out.glob("steps-rank*.jsonl"))
            for line in f.read_text().splitlines()]


def reports(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def reference(steps: list[dict]) -> dict[int, dict[str, torch.Tensor]]:
    """One process, AdamW over each step's global batch (all ranks' samples): params by step."""
    batches: dict[int, list[int]] = {}
    for r in steps:
        batches.setdefault(r["step"], []).extend(r["idx"])
    model, data = job.make_model(62), job.make_data(SAMPLES)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.01)
    out = {}
    for step in sorted(batches):
        _, x, y = data[batches[step]]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        out[step] = {n: p.detach().reshape(-1).clone() for n, p in model.named_parameters()}
    return out


def max_diff(got: dict[str, list[float]], want: dict[str, torch.Tensor]) -> float:
    assert sorted(got) == sorted(want)
    return max(float((torch.tensor(got[n], dtype=torch.float64) - want[n]).abs().max())
               for n in want)


_SAVED: dict[tuple[Path, str], tuple[Path, Path]] = {}


def saved_phase(root: Path, sharding: str) -> tuple[Path, Path]:
    """3 ranks under ``sharding`` to step 5, a checkpoint at step 4: (its output, checkpoints);
    run once per module."""
    if (root, sharding) not in _SAVED:
        out, ckpt = root / f"saved-{sharding}", root / f"ckpt-{sharding}"
        assert_ok(phase(out, 3, sharding, ckpt, "--until-step", str(LOST_STEP)))
        assert [c.step for c in store.candidates(ckpt)] == [SAVED_STEP]
        _SAVED[(root, sharding)] = (out, ckpt)
    return _SAVED[(root, sharding)]


def resume_phase(root: Path, saved: tuple[Path, Path], world: int, sharding: str,
                 ) -> list[dict]:
    """Resume a copy of ``saved``'s checkpoints on ``world`` ranks under ``sharding`` to the end
    of the epoch; checks the resume, the epoch's samples and the reference; returns the reports."""
    out1, ckpt1 = saved
    name = f"{ckpt1.name}-to-{world}-{sharding}"
    ckpt, out = root / f"resume-{name}", root / f"resumed-{name}"
    shutil.copytree(ckpt1, ckpt)
    assert_ok(phase(out, world, sharding, ckpt))
    got = reports(out, world)
    assert [(r["resumed_step"], r["step"], r["epoch"]) for r in got] == [
        (SAVED_STEP, LAST_STEP, 1)] * world
    assert_every_sample_once(records(out1), records(out), SAVED_STEP, SAMPLES)
    steps = [r for r in records(out1) if r["step"] <= SAVED_STEP] + records(out)
    want = reference(steps)
    for r in got:
        assert max_diff(r["at_resume"], want[SAVED_STEP]) <= 1e-9, "not the step-4 state"
        assert max_diff(r["params"], want[LAST_STEP]) <= 1e-9
        assert r["optim_steps"] == [float(LAST_STEP)]  # AdamW's step counts carried
    return got


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("layouts")


@pytest.fixture(scope="module")
def saved_full(root: Path) -> tuple[Path, Path]:
    out, ckpt = saved_phase(root, "full")
    manifest = files.load_file(store.newest_file(ckpt))
    assert manifest["format"] == files.SHARDED_FORMAT and manifest["model"] is None
    assert (manifest["sharded"]["sharding"], manifest["sharded"]["layout"],
            manifest["sharded"]["writers"]) == ("full", "flat", [0, 1, 2])  # every rank writes
    return out, ckpt


# --- case 62: a replicated checkpoint resumes after a re-plan to Group ------------------------

@pytest.mark.slow
@pytest.mark.timeout(900)
def test_case62_replicated_checkpoint_resumes_under_group_and_back(root: Path) -> None:
    """The case's fixture: 3 ranks (A100 node-a; T4, T4 node-b), split [6, 3, 3], AdamW; a
    checkpoint taken under None resumes under Group (each rank cuts its dim-0 chunk of every
    parameter and moment from the full state dict) at step 4 with the step-4 parameters and ends
    step 8 within 1e-9 of one process; the control, a Group checkpoint resumed under None, too."""
    case = yaml.safe_load(CASE.read_text())
    assert [r["local_batch"] for r in case["ranks"]] == LAYOUTS[3][2]
    assert [r["node"] for r in case["ranks"]] == LAYOUTS[3][1] and case["seed"] == 62
    assert case["optimizer"] == {"type": "adamw", "lr": 0.05, "weight_decay": 0.01}
    saved = saved_phase(root, "none")
    assert files.load_file(store.newest_file(saved[1]))["format"] == files.FORMAT  # one full dict
    got = resume_phase(root, saved, 3, "group")
    assert [r["held_numel"] for r in got] == [286, 143, 143]  # the T4 pair shards it
    control = resume_phase(root, saved_phase(root, "group"), 3, "none")
    assert [r["held_numel"] for r in control] == [286] * 3


# --- Full: uneven shards, DCP, resumed onto any layout ----------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("world", "sharding"), [(2, "full"), (4, "full"), (3, "group"),
                                                 (3, "none")])
def test_full_checkpoint_resumes_onto_another_layout(root: Path, saved_full: tuple[Path, Path],
                                                     world: int, sharding: str) -> None:
    """A Full checkpoint (3 ranks, shares 50/25/25 %) resumes on a rank fewer or more with other
    shares, under Group and under None: the step-4 state exactly where it is held, exact epoch
    coverage, the end within 1e-9 of one process."""
    got = resume_phase(root, saved_full, world, sharding)
    if sharding == "full":  # each rank holds only its slices: 286 elements cut by the shares
        held = [r["held_numel"] for r in got]
        assert sum(held) == 286 and len(set(held)) > 1


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("saved_mode", ["none", "group"])
def test_other_checkpoints_resume_under_full(root: Path, saved_mode: str) -> None:
    """A replicated and a Group (FSDP2) checkpoint resume under Full on 4 ranks: each rank reads
    the element ranges of its slices (rows of the saved tensors, cut)."""
    got = resume_phase(root, saved_phase(root, f"{saved_mode}"), 4, "full")
    assert sum(r["held_numel"] for r in got) == 286


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_full_killed_after_its_checkpoint_resumes_bit_identical_on_the_same_plan(root: Path) -> None:
    """A T4 is SIGKILLed after step 5; the same plan resumes step 4 and ends bit-identical to the
    run never interrupted (parameters equal to the last bit)."""
    whole = root / "whole"
    assert_ok(phase(whole, 3, "full", root / "ckpt-whole"))
    ckpt, out1, out2 = root / "ckpt-killed", root / "killed", root / "killed-resumed"
    runs = phase(out1, 3, "full", ckpt, "--kill-after", str(LOST_STEP), "--kill-rank", "2")
    assert runs[2].returncode == -9 and all(r.returncode != 0 for r in runs)
    assert [c.step for c in store.candidates(ckpt)] == [SAVED_STEP]
    assert_ok(phase(out2, 3, "full", ckpt))
    got, want = reports(out2, 3), reports(whole, 3)
    assert [r["resumed_step"] for r in got] == [SAVED_STEP] * 3
    assert [r["params"] for r in got] == [r["params"] for r in want], "not bit-identical"
    assert_every_sample_once(records(out1), records(out2), SAVED_STEP, SAMPLES)
