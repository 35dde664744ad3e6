"""Inter-group codecs and work stealing on 4 real gloo processes (2 simulated nodes of 2)."""

from __future__ import annotations

import pytest
import torch

from speed_ranks import spawn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("codecs")
    return spawn("codecs", out, speeds=[1, 1, 1, 1], batches=[16] * 4, nodes=["a", "a", "b", "b"])


def test_uncompressed_ranks_agree(runs):
    assert all(r["none"]["param0"] == runs[0]["none"]["param0"] for r in runs)


@pytest.mark.parametrize("mode", ["int8", "powersgd"])
def test_compressed_loss_within_2_percent_of_uncompressed(runs, mode):
    base = runs[0]["none"]["loss"]
    assert abs(runs[0][mode]["loss"] - base) <= 0.02 * base, (mode, runs[0][mode]["loss"], base)


@pytest.mark.parametrize("mode", ["fp16", "bf16", "int8", "powersgd"])
def test_compressed_ranks_end_identical(runs, mode):
    """Leaders broadcast the same decoded sum, so every rank applies the same update."""
    assert all(r[mode]["param0"] == runs[0][mode]["param0"] for r in runs)


@pytest.mark.parametrize("mode", ["none", "fp16", "bf16", "int8", "powersgd"])
def test_bytes_on_leaders_link_match_theory(runs, mode):
    for rank, r in enumerate(runs):
        counted, theory = r[mode]["bytes_counted"], r[mode]["bytes_theory"]
        if rank in (0, 2):  # the leaders
            assert theory > 0 and abs(counted - theory) <= 0.05 * theory, (mode, counted, theory)
        else:
            assert counted == 0


def test_compression_ratios(runs):
    b = {m: runs[0][m]["bytes_counted"] for m in ("none", "fp16", "int8", "powersgd")}
    assert b["fp16"] * 2 == b["none"]
    assert 3.9 < b["none"] / b["int8"] < 4.0
    assert b["none"] / b["powersgd"] > 8  # 32x128, 128x128 at rank 4; 128x4 and biases plain


@pytest.mark.parametrize("mode", ["none", "fp16", "int8", "powersgd"])
def test_stats_ride_through_every_codec_exactly(runs, mode):
    for r in runs:
        assert r[mode]["stats"] == [0.25, 1.25, 2.25, 3.25]


def test_int8_pipelined_pieces_equal_one_piece(runs):
    for rank in (0, 2):
        r = runs[rank]["int8_pieces"]
        assert r["pieces_equal"]
        assert r["sum_of_decoded"] < 1e-6  # the result is exactly the sum of what was sent
        assert r["exact"] == [2.0, 2.0]  # leaders 0 and 2 sent [rank, 1]
    assert runs[1]["int8_pieces"] == {}


def _reference_steal(steps: int = 3) -> list[list[torch.Tensor]]:
    torch.manual_seed(3)
    model = torch.nn.Linear(5, 2).double()
    g = torch.Generator().manual_seed(9)
    x = torch.randn(3 * 32, 5, generator=g, dtype=torch.float64)
    y = torch.randn(3 * 32, 2, generator=g, dtype=torch.float64)
    grads = []
    for step in range(steps):
        model.zero_grad()
        sl = slice(step * 32, step * 32 + 32)
        (((model(x[sl]) - y[sl]) ** 2).sum() / 32).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
    return grads


def test_stealing_absorbs_a_rank_stalled_for_a_whole_step(runs):
    steps = [r["stealing"]["steps"] for r in runs]
    for s in range(3):
        taken = sorted(i for r in range(4) for i in steps[r][s]["taken"])
        assert taken == list(range(8)), f"step {s}: micro-batches {taken}"
        assert all(steps[r][s]["total"] == 32 for r in range(4))
    assert steps[1][1]["taken"] == []  # the stalled rank did nothing in step 1


def test_stealing_update_equals_full_batch_gradient(runs):
    ref = _reference_steal()
    for r in runs:
        for s, step in enumerate(r["stealing"]["steps"]):
            got = torch.tensor([v for g in step["grad"] for v in g], dtype=torch.float64)
            want = torch.cat([g.reshape(-1) for g in ref[s]])
            assert torch.allclose(got, want, atol=1e-10, rtol=0), (s, (got - want).abs().max())


def test_trainer_work_stealing_follows_the_sampler_and_matches_one_process(runs):
    from hetero_worker.sampler import HeteroBatchSampler
    for s in range(2):
        assert sorted(i for r in runs for i in r["trainer_stealing"]["taken"][s]) == list(range(13))
    order = HeteroBatchSampler(80, [16] * 4, 0, seed=0).permutation(0)
    torch.manual_seed(3)
    model = torch.nn.Linear(5, 2).double()
    g = torch.Generator().manual_seed(9)
    x = torch.randn(80, 5, generator=g, dtype=torch.float64)
    y = torch.randn(80, 2, generator=g, dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for s in range(2):
        idx = order[64 * s:64 * s + 64] if s == 0 else HeteroBatchSampler(80, [16] * 4, 0, seed=0).permutation(1)[:64]
        opt.zero_grad()
        (((model(x[idx]) - y[idx]) ** 2).sum() / 64).backward()
        opt.step()
    want = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    for r in runs:
        got = torch.tensor([v for p in r["trainer_stealing"]["params"] for v in p], dtype=torch.float64)
        assert torch.allclose(got, want, atol=1e-12, rtol=0), (got - want).abs().max()
        assert r["trainer_stealing"]["cursor"] == 64
