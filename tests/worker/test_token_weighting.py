"""Token-weighted steps (issue 29, item 6): shared/cases/59
(tests/fixtures/cases/59-token-weighted-loss-uneven-batches.*).

With ``t.step(..., num_tokens=...)`` a rank weighs ``n_r / N`` (its share of the job's valid
tokens, one all-reduce of the counts) and a micro-batch its share of the rank's tokens, so the
update equals one process's mean over every valid token of the global batch, with uneven batches,
micro-batches and sharding (:mod:`hetero_worker.comm.tokens`).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import case59_ranks  # the rank script's model and data, for the reference
import pytest
import torch
from case_runs import case_envs, load
from rankproc import read_rank_json, run_ranks

from hetero_worker.comm import tokens
from hetero_worker.memory import microbatch
from heterotrain_common import envnames

RANKS = Path(case59_ranks.__file__)
TOL = 1e-6


def case() -> dict:
    return load("59-token-weighted-loss-uneven-batches")


def split() -> list[int]:
    return [r["local_batch"] for r in case()["ranks"]]


def flat_grad(model: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    model.zero_grad()
    case59_ranks.loss_fn(model, x, labels).backward()
    return torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()])


def reference(*, full_length: bool = False) -> dict[str, torch.Tensor]:
    """One process: the token mean over all valid tokens of the 12-sequence global batch, SGD."""
    model = case59_ranks.make_model()
    opt = torch.optim.SGD(model.parameters(), lr=case()["optimizer"]["lr"])
    for s in range(1, case()["steps"] + 1):
        opt.zero_grad()
        case59_ranks.loss_fn(model, *case59_ranks.step_data(s, full_length=full_length)).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def micro_envs(sharding: str, micro_rank0: int) -> list[dict[str, str]]:
    """The case's 3 ranks: A100 on node-a (7 sequences), T4, T4 on node-b (3 and 2); rank 0 in
    micro-batches of ``micro_rank0`` (0: none)."""
    envs = case_envs(case(), sharding=sharding)
    if micro_rank0:
        envs[0][envnames.MICRO_BATCH_SIZE] = str(micro_rank0)
    return envs


@pytest.mark.parametrize("micro_rank0", [0, 3])
def test_the_case_is_off_when_weighted_by_samples(micro_rank0: int) -> None:
    """The fixture's step 1 has 41 / 12 / 9 valid tokens; the sample-weighted update (the rank by
    ``b_r / B``, a micro-batch by its samples) is 17 % (27 % with rank 0 in micro-batches of 3)
    off the token mean: the comparison of the multi-process runs below can fail."""
    x, labels = case59_ranks.step_data(1)
    bounds = [0, 7, 10, 12]
    counts = [int((labels[lo:hi] != case59_ranks.PAD).sum()) for lo, hi in zip(bounds, bounds[1:])]
    assert counts == case()["expected"]["valid_tokens_step1"] == [41, 12, 9]
    model = case59_ranks.make_model()
    want = flat_grad(model, x, labels)
    by_samples = torch.zeros_like(want)
    for rank, (lo, b) in enumerate(zip(bounds, split())):
        for a, h in microbatch.micro_slices(b, micro_rank0 if rank == 0 else 0):
            by_samples += (h - a) / sum(split()) * flat_grad(model, x[lo + a:lo + h], labels[lo + a:lo + h])
    off = ((by_samples - want).norm() / want.norm()).item()
    assert off > (0.2 if micro_rank0 else 0.1), off


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize(("scenario", "sharding", "micro_rank0"), [
    ("tokens", "none", 0),     # the case's "ranks" scenario
    ("tokens", "none", 3),     # the case's "micro" scenario: rank 0 in pieces of 3, 2, 2
    ("tokens", "group", 3),    # Group sharding (FSDP2 in the T4s' group), rank 0 in pieces
    ("tokens", "full", 3),     # Full sharding: every rank runs 3 pieces (rank 2 one empty)
    ("control", "none", 0),    # full-length sequences, sample-weighted step: already exact
])
def test_token_weighted_steps_equal_one_process_token_mean(tmp_path: Path, scenario: str,
                                                           sharding: str, micro_rank0: int) -> None:
    """Case 59: 3 ranks, split [7, 3, 2], 3 SGD steps (lr 0.5) in float64: the parameters equal one
    process's token-mean update on the whole global batch (<= 1e-6); each step's loss is the rank's
    own token mean (step 1: from the initial model)."""
    runs = run_ranks([sys.executable, str(RANKS), scenario, str(tmp_path)],
                     micro_envs(sharding, micro_rank0), timeout_s=180)
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    facts = read_rank_json(tmp_path, 3)
    control = scenario == "control"
    want = reference(full_length=control)
    x, labels = case59_ranks.step_data(1, full_length=control)
    model, lo = case59_ranks.make_model(), 0
    for rank, (f, b) in enumerate(zip(facts, split(), strict=True)):
        if not control:
            assert f["tokens"][0] == case()["expected"]["valid_tokens_step1"][rank]
        with torch.no_grad():
            own = case59_ranks.loss_fn(model, x[lo:lo + b], labels[lo:lo + b]).item()
        assert f["losses"][0] == pytest.approx(own, rel=1e-6), rank  # a float32 report
        lo += b
        got = {k: torch.tensor(v, dtype=torch.float64) for k, v in f["params"].items()}
        assert sorted(got) == sorted(want)
        assert max((got[k] - want[k]).abs().max().item() for k in want) <= TOL, rank


# --- one process: the weights themselves -----------------------------------------------------

def test_the_rank_factor_turns_the_sample_weight_into_the_token_share() -> None:
    """Without a process group the job's count is the rank's own; the factor times ``b_r / B``
    is ``n_r / N``."""
    w = tokens.agree_tokens(41, local_batches=[7, 3, 2], rank=0)
    assert (w.rank_tokens, w.total_tokens, w.sample_weight) == (41.0, 41.0, 7 / 12)
    assert w.loss_factor * w.sample_weight == pytest.approx(1.0, rel=1e-15)
    w = tokens.TokenWeights(rank_tokens=9, total_tokens=62, sample_weight=2 / 12)
    assert w.loss_factor * w.sample_weight == pytest.approx(9 / 62, rel=1e-15)
    with pytest.raises(ValueError, match="no rank has a valid token"):
        tokens.agree_tokens(0, local_batches=[7, 3, 2], rank=1)


def test_counts_must_be_one_per_sample_and_not_negative() -> None:
    batch = (torch.zeros(3, 8, 6), torch.zeros(3, 8))
    assert tokens.per_sample_counts([2, 0, 5], batch).tolist() == [2.0, 0.0, 5.0]
    with pytest.raises(ValueError, match=r"one count per sample of the batch \(3\).*labels != -100"):
        tokens.per_sample_counts(7, batch)
    with pytest.raises(ValueError, match=r"one count per sample of the batch \(3\), got shape \(2,\)"):
        tokens.per_sample_counts([1, 2], batch)
    with pytest.raises(ValueError, match="negative count"):
        tokens.per_sample_counts([1, -2, 3], batch)


def test_micro_batches_weigh_their_share_of_the_tokens() -> None:
    """Through :func:`~hetero_worker.memory.microbatch.accumulate` (pieces 3, 2, 2 of 7 samples)
    each piece's token mean weighs ``n_m / n_r``: the accumulated loss and gradient are the rank's
    token mean's (float64, <= 1e-12)."""
    x, labels = case59_ranks.step_data(1)
    x, labels = x[:7], labels[:7]
    counts = tokens.per_sample_counts((labels != case59_ranks.PAD).sum(dim=1), (x, labels))
    model = case59_ranks.make_model()
    want_grad = flat_grad(model, x, labels)
    want_loss = case59_ranks.loss_fn(model, x, labels).item()
    model.zero_grad()
    loss_fn, batch = tokens.micro_token_weighted(case59_ranks.loss_fn, (x, labels), counts)
    loss = microbatch.accumulate(model, loss_fn, batch, 3, autocast=contextlib.nullcontext,
                                 backward=lambda t: t.backward())
    got = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert loss.item() == pytest.approx(want_loss, rel=1e-12)
    assert (got - want_grad).abs().max().item() <= 1e-12

