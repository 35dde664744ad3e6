"""Global-norm gradient clipping (issue 29, item 5): shared/cases/60
(tests/fixtures/cases/60-grad-clip-local-norm-under-sharding.*).

The norm is the full gradient's over every rank, shard and group, each element counted once, after
the fp16 unscale, in every sharding mode; every rank clips by the same factor, and the parameters
equal one process clipping the whole batch with ``torch.nn.utils.clip_grad_norm_``
(:mod:`hetero_worker.comm.clipping`, ``Trainer(max_grad_norm=...)``, ``t.clip_grad_norm_``).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import case60_ranks  # the rank script's model and data, for the reference
import pytest
import torch
from case_runs import case_envs, load
from rankproc import read_rank_json, run_ranks

from hetero_worker.comm import clipping

RANKS = Path(case60_ranks.__file__)
TOL = 1e-6
MIXED = ["bf16", "fp16", "fp16"]
"""The case's cards' precisions: every rank scales its loss (2**16), so a clip before the unscale
would see a norm 65536 times too large (autocast leaves the float64 model's arithmetic exact)."""


def case() -> dict:
    return load("60-grad-clip-local-norm-under-sharding")


def reference(max_norm: float | None) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process training the whole global batch of 12 (float64), clipped with torch's own
    ``clip_grad_norm_`` (None: not clipped): the parameters after the last step and each step's
    norm."""
    model = case60_ranks.make_net()
    opt = torch.optim.SGD(model.parameters(), lr=case()["optimizer"]["lr"])
    norms = []
    for s in range(case()["steps"]):
        x, y = case60_ranks.step_data(s)
        opt.zero_grad()
        case60_ranks.loss_fn(model, x, y).backward()
        if max_norm is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        opt.step()
    return {k: v.detach().clone() for k, v in model.named_parameters()}, norms


def test_the_case_clips_every_step_and_clipping_changes_the_result() -> None:
    """The fixture's max norm is below every step's norm, so each step clips; a run that ignored
    clipping would end far from the clipped reference (the comparison below can fail)."""
    max_norm = case()["clip"]["max_norm"]
    assert max_norm == case60_ranks.MAX_NORM and case()["optimizer"]["lr"] == case60_ranks.LR
    clipped, norms = reference(max_norm)
    plain, _ = reference(None)
    assert len(norms) == case()["steps"] == case60_ranks.STEPS
    assert min(norms) > 10 * max_norm
    assert max((clipped[k] - plain[k]).abs().max().item() for k in clipped) > 1e-2


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize(("sharding", "api", "precisions"), [
    ("none", "trainer", MIXED),
    ("group", "trainer", MIXED),
    ("full", "trainer", MIXED),
    ("full", "hook", ["fp32"] * 3),
])
def test_clipped_steps_equal_one_process_in_every_mode(tmp_path: Path, sharding: str, api: str,
                                                       precisions: list[str]) -> None:
    """Case 60: 3 ranks, split [6, 3, 3], Full shares 50/25/25 %, clip 0.05, 3 SGD steps in float64:
    every rank clips with the reference's global norm (rel 1e-6) and the gathered parameters equal
    the one-process clipped reference (<= 1e-6), through ``max_grad_norm`` and through
    ``t.clip_grad_norm_`` in an optimizer step pre-hook, under the case's bf16/fp16 loss scaling
    (the hook run: fp32). Under Full the rank's own gradients
    (what the stock function sees) have a smaller norm on every rank: the case's failure."""
    runs = run_ranks([sys.executable, str(RANKS), api, str(tmp_path)],
                     case_envs(case(), sharding=sharding, precisions=precisions), timeout_s=180)
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    facts = read_rank_json(tmp_path, 3)
    want, ref_norms = reference(case()["clip"]["max_norm"])
    for rank, f in enumerate(facts):
        assert f["sharding"] == sharding
        assert f["loss_scale"] == (2.0 ** 16 if precisions == MIXED else None)
        assert f["norms"] == pytest.approx(ref_norms, rel=TOL), rank
        got = {k: torch.tensor(v, dtype=torch.float64) for k, v in f["params"].items()}
        assert sorted(got) == sorted(want)
        assert max((got[k] - want[k]).abs().max().item() for k in want) <= TOL, rank
    if api == "hook":
        own = [f["own_norms"][0] for f in facts]
        assert all(o < ref_norms[0] * (1 - 1e-3) for o in own), (own, ref_norms[0])
        # each rank's slice holds part of the gradient: the squares add up to the global norm
        assert math.fsum(o * o for o in own) == pytest.approx(ref_norms[0] ** 2, rel=TOL)


# --- one process: the clip itself ------------------------------------------------------------

def _net_with_grads() -> torch.nn.Module:
    model = case60_ranks.make_net()
    x, y = case60_ranks.step_data(0)
    case60_ranks.loss_fn(model, x, y).backward()
    return model


@pytest.mark.parametrize("max_norm", [0.05, 1e3])
def test_the_clip_equals_torchs_own_on_one_process(max_norm: float) -> None:
    """Without a process group the norm and the factor are ``torch.nn.utils.clip_grad_norm_``'s
    (float64, <= 1e-15), clipping (0.05) or not (1000: factor 1)."""
    mine, theirs = _net_with_grads(), _net_with_grads()
    norm = clipping.clip_grad_norm_(mine.parameters(), max_norm, shard_ranks=(0,))
    want = float(torch.nn.utils.clip_grad_norm_(theirs.parameters(), max_norm))
    assert norm == pytest.approx(want, rel=1e-15) and norm > 0.05
    for a, b in zip(mine.parameters(), theirs.parameters(), strict=True):
        assert (a.grad - b.grad).abs().max().item() <= 1e-15


def test_a_rank_outside_rank0s_shard_group_counts_nothing() -> None:
    """A replicated copy held by another rank (another group's, or a rank other than 0 without
    sharding) adds 0: each element counts once, on rank 0's shard group."""
    model = _net_with_grads()
    assert clipping.global_grad_norm(model.parameters(), shard_ranks=(1, 2)) == 0.0
    assert clipping.global_grad_norm(model.parameters(), shard_ranks=(0, 1)) > 0.0


def test_a_bad_max_norm_is_refused_and_a_non_finite_norm_leaves_the_gradients() -> None:
    model = _net_with_grads()
    with pytest.raises(ValueError, match="max_grad_norm must be a positive number"):
        clipping.clip_grad_norm_(model.parameters(), 0.0, shard_ranks=(0,))
    next(model.parameters()).grad[0, 0] = math.inf
    before = [p.grad.clone() for p in model.parameters()]
    assert clipping.clip_grad_norm_(model.parameters(), 0.05, shard_ranks=(0,)) == math.inf
    assert all(torch.equal(a, p.grad) for a, p in zip(before, model.parameters(), strict=True))
