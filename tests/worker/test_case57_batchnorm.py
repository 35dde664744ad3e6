"""shared/cases/57 (tests/fixtures/cases/57-*): BatchNorm under uneven per-rank batches.

Micro-batches are cut balanced (7 with a bound of 3: 3, 2, 2, never a one-sample remainder), and
the BatchNorm policy (hetero_worker/memory/batchnorm.py, docs/memory.md) holds at wrap: a model
whose BatchNorm would see one sample is refused naming the rank and the layer; any other BatchNorm
gets a warning naming it and the alternatives; LayerNorm matches the full-batch reference.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from rankproc import run_ranks

from hetero_worker.memory import batchnorm, microbatch
from hetero_worker.runtime.simulation import free_port, local_rank_envs, simulated_cluster

HERE = Path(__file__).parent
RANKS = HERE / "case57_ranks.py"
CASE = HERE.parent / "fixtures" / "cases" / "57-batchnorm-uneven-and-one-sample-micro-batch.yaml"
sys.path.insert(0, str(HERE))
import case57_ranks  # noqa: E402 - the rank script's model and data, for the reference


def case() -> dict:
    return yaml.safe_load(CASE.read_text())


def case_envs() -> list[dict[str, str]]:
    """The case's 3 ranks: A100 on node-a (7 samples, micro-batch bound 3), T4, T4 on node-b."""
    ranks = case()["ranks"]
    products = [("NVIDIA-A100-SXM4-40GB", "8.0", 1.0), ("Tesla-T4", "7.5", 0.25),
                ("Tesla-T4", "7.5", 0.25)]
    entries, profiles = simulated_cluster(products=products, nodes=[r["node"] for r in ranks],
                                          local_batches=[r["local_batch"] for r in ranks])
    envs = local_rank_envs(entries=entries, profiles=profiles, precision="fp32",
                           hierarchy=case()["hierarchy"], master_port=free_port())
    for env, r in zip(envs, ranks, strict=True):
        if r.get("micro_batch_size"):
            env["HTJ_MICRO_BATCH_SIZE"] = str(r["micro_batch_size"])
    return envs


def run_case(norm: str, tmp_path: Path) -> tuple[list[dict], str]:
    runs = run_ranks([sys.executable, str(RANKS), norm, str(tmp_path)], case_envs(), timeout_s=150)
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)], \
        "\n".join(run.stderr for run in runs)


def reference(norm: str) -> dict[str, torch.Tensor]:
    """One process training the whole global batch of 12 (float64)."""
    model = case57_ranks.make_model(norm)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for s in range(case57_ranks.STEPS):
        x, y = case57_ranks.step_data(s)
        opt.zero_grad()
        case57_ranks.loss_fn(model, x, y).backward()
        opt.step()
    return {k: v for k, v in model.state_dict().items() if v.dtype == torch.float64}


def test_the_case_split_cuts_balanced_micro_batches() -> None:
    rank0 = case()["ranks"][0]
    pieces = [hi - lo for lo, hi in microbatch.micro_slices(rank0["local_batch"], rank0["micro_batch_size"])]
    assert pieces == case()["expected"]["micro_run"]["micro_pieces_rank0"] == [3, 2, 2]
    assert [hi - lo for lo, hi in microbatch.micro_slices(10, 4)] == [4, 3, 3]
    assert [hi - lo for lo, hi in microbatch.micro_slices(9, 3)] == [3, 3, 3]
    for n in range(1, 40):  # never more pieces than the bound needs, never a piece over it
        for m in range(1, n + 1):
            sizes = [hi - lo for lo, hi in microbatch.micro_slices(n, m)]
            assert sum(sizes) == n and max(sizes) <= m and len(sizes) == -(-n // m)
            assert max(sizes) - min(sizes) <= 1


def test_a_one_sample_piece_is_refused_at_wrap_naming_the_rank_and_the_layer() -> None:
    model = case57_ranks.make_model("batchnorm")
    with pytest.raises(ValueError,
                       match="Expected more than 1 value per channel"):
        model.train()(torch.zeros(1, 8, dtype=torch.float64))  # the crash the case reports
    with pytest.raises(ValueError, match=r"^rank 2: BatchNorm1d layer '1' would normalise one sample "
                       r"\(its local batch of 3 in micro-batches of at most 2 \(HTJ_MICRO_BATCH_SIZE\): "
                       r"\[2, 1\]\).*use GroupNorm or LayerNorm"):
        batchnorm.check_norm_layers(model, rank=2, local_batch=3, micro_batch_size=2)
    with pytest.raises(ValueError, match=r"^rank 1: BatchNorm1d layer '1' would normalise one sample "
                       r"\(its local batch of 1\)"):
        batchnorm.check_norm_layers(model, rank=1, local_batch=1, micro_batch_size=0)


def test_batchnorm_gets_a_warning_and_layernorm_none() -> None:
    with pytest.warns(batchnorm.BatchNormWarning, match=r"rank 0: BatchNorm layers '1' normalise per "
                      r"rank and per micro-batch \(its local batch of 7 in micro-batches of at most 3 "
                      r"\(HTJ_MICRO_BATCH_SIZE\): \[3, 2, 2\]\).*GroupNorm or LayerNorm"):
        batchnorm.check_norm_layers(case57_ranks.make_model("batchnorm"), rank=0, local_batch=7,
                                    micro_batch_size=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert batchnorm.check_norm_layers(case57_ranks.make_model("layernorm"), rank=0,
                                           local_batch=7, micro_batch_size=3) == ""
    sync = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.SyncBatchNorm(16))
    with pytest.raises(ValueError, match=r"^rank 0: SyncBatchNorm layer '1' synchronises on every "
                       r"forward, and this rank runs 3 micro-batches"):
        batchnorm.check_norm_layers(sync, rank=0, local_batch=7, micro_batch_size=3)
    assert batchnorm.check_norm_layers(sync, rank=0, local_batch=7, micro_batch_size=0) == ""


@pytest.mark.timeout(300)
def test_batchnorm_trains_every_step_and_is_named_at_wrap(tmp_path: Path) -> None:
    ranks, stderr = run_case("batchnorm", tmp_path)
    for r in ranks:
        assert r["error"] is None and r["steps"] == case()["expected"]["micro_run"]["steps_done_every_rank"]
    assert "BatchNormWarning: rank 0: BatchNorm layers '1' normalise per rank and per micro-batch" in stderr
    assert "BatchNormWarning: rank 1: BatchNorm layers '1' normalise per rank (its local batch of 3)" in stderr


@pytest.mark.timeout(300)
def test_layernorm_with_the_same_micro_batches_matches_the_full_batch_reference(tmp_path: Path) -> None:
    ranks, stderr = run_case("layernorm", tmp_path)
    assert "BatchNorm" not in stderr
    expected = reference("layernorm")
    for r in ranks:
        assert r["error"] is None and r["steps"] == 3
        for name, value in expected.items():
            got = torch.tensor(r["params"][name], dtype=torch.float64)
            assert (got - value).abs().max().item() <= 1e-6, name
