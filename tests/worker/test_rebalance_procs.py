"""Rebalancing end to end: 4 real gloo ranks through Trainer + speed.attach, one slow rank.

The split changes during the run; every step's update must still equal one process training on
the union of that step's samples, and each epoch must cover every sample exactly once.
"""

from __future__ import annotations

import pytest
import torch

from speed_ranks import spawn

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
SPEEDS = [1.0, 1.0, 1.0, 0.25]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("rebalance")
    return spawn("rebalance", out, speeds=SPEEDS, batches=[8, 8, 8, 8], nodes=["a", "a", "b", "b"],
                 delay_per_sample_s=0.004)


def _reference(runs, *, naive: bool = False) -> list[torch.Tensor]:
    """One process on the union of each step's samples; ``naive`` averages per-rank means instead."""
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3)).double()
    g = torch.Generator().manual_seed(11)
    x = torch.randn(160, 6, generator=g, dtype=torch.float64)
    y = torch.randn(160, 3, generator=g, dtype=torch.float64)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for s in range(len(runs[0]["steps"])):
        idx = [i for r in runs for i in r["steps"][s]["indices"]]
        opt.zero_grad()
        if naive:  # plain DDP averaging: weight 1/world per rank whatever its batch
            sum(torch.nn.functional.mse_loss(model(x[r["steps"][s]["indices"]]),
                                             y[r["steps"][s]["indices"]]) for r in runs).div(len(runs)).backward()
        else:
            torch.nn.functional.mse_loss(model(x[idx]), y[idx]).backward()
        opt.step()
    return [p.detach().reshape(-1) for p in model.parameters()]


def test_split_changed_and_slow_rank_got_less(runs):
    splits = [tuple(s["split"]) for s in runs[0]["steps"]]
    assert splits[0] == (8, 8, 8, 8)
    assert len(set(splits)) > 1, "the split never changed"
    assert splits[-1][3] < 8 and sum(splits[-1]) == 32
    assert all(r["steps"][s]["split"] == runs[0]["steps"][s]["split"]
               for r in runs for s in range(len(splits))), "ranks disagree on the split"
    assert runs[0]["history"], "no rebalance recorded"


def test_slow_rank_shrinks_within_the_interval(runs):
    """Stats lag one step, so the first change lands by step interval (3) + 2."""
    first_change = next(i for i, s in enumerate(runs[0]["steps"]) if s["split"] != [8, 8, 8, 8])
    assert first_change <= 5
    assert runs[0]["steps"][first_change]["split"][3] < 8


def test_each_epoch_covers_every_sample_exactly_once(runs):
    for epoch in (0, 1):
        seen = sorted(i for r in runs for s in r["steps"] if s["epoch"] == epoch for i in s["indices"])
        assert seen == list(range(160))


def test_batches_follow_the_split(runs):
    for rank, r in enumerate(runs):
        assert all(len(s["indices"]) == s["split"][rank] for s in r["steps"])


def test_update_equals_single_process_on_the_union(runs):
    want = torch.cat(_reference(runs))
    for r in runs:
        got = torch.tensor([v for p in r["params"] for v in p], dtype=torch.float64)
        assert torch.allclose(got, want, atol=1e-12, rtol=0), (got - want).abs().max()


def test_measured_throughput_per_class(runs):
    tp = runs[0]["throughput"]
    assert set(tp) == {"NVIDIA-A100-SXM4-40GB", "Tesla-T4"}
    assert tp["NVIDIA-A100-SXM4-40GB"] > 2 * tp["Tesla-T4"]


def test_negative_control_naive_averaging_differs(runs):
    """The comparison can fail: per-rank averaging on the uneven splits moves the parameters."""
    got = torch.tensor([v for p in runs[0]["params"] for v in p], dtype=torch.float64)
    assert (got - torch.cat(_reference(runs, naive=True))).abs().max() > 1e-6
