"""fp16 with a loss scaler, rebalancing and compression under Group and Full sharding (issue 29,
items 1, 3 and 4), on four real Gloo rank processes (A100 / V100 / T4 / T4; Group: groups {0},
{1}, {2, 3}).

The model is float64 (tests/worker/full_ranks.py's ``Net``) under ``HTJ_PRECISION=fp16``: autocast
leaves float64 ops alone, so the scaler path runs whole (the one agreed loss scale, the sharded
gradients unscaled and checked for inf on every rank, the step skipped together) and the result
is exact: an update equals one process on the whole global batch of every applied step.  The
feature matrix (tests/worker/test_feature_matrix.py) runs the same combinations with a float32
model under real fp16 autocast.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from rankproc import assert_ok, mixed_cluster_envs, read_rank_json, run_ranks
from torch import nn

from hetero_worker.memory import group as sharding
from hetero_worker.speed.codec import ring_allreduce_bytes
from hetero_worker.speed.codecs import CompressionConfig, theoretical_bytes
from hetero_worker.speed.powersgd import powersgd_payload_elems
from heterotrain_common import contract as c
from heterotrain_common import envnames

sys.path.insert(0, str(Path(__file__).parent))
from full_ranks import make_data, make_net, make_opt  # noqa: E402

RANKS = Path(__file__).parent / "sharded_features_ranks.py"
BATCHES = [2, 5, 8, 4]
SHARES = "500000,250000,125000,125000"
CAPS = {"group": [6000, 6000, 4500, 4500], "full": [3500, 2300, 2300, 2300]}
"""Simulated caps, bytes. Measured peaks (state + saved activations) with rebalancing: Group
5324 / 5196 / 3756 / 3052, Full 2988 / 1764 / 1668 / 1244.  Without micro-batches
(``HTJ_MICRO_BATCH_SIZE`` 100, tried by hand) the T4 rank with 8 samples fails its first step with
the simulated OOM under both modes, and the A100 rank's batch, grown from 2 to 7-9 samples, would
hold about 8.1 KB (Group, 9 samples) and 3.8 KB (Full, 7 samples; measured with the caps off)."""
MICRO = ["2", "2", "3", "3"]
TOL = 1e-9


def reference(splits: list[list[int]], skipped: list[bool]) -> dict[str, torch.Tensor]:
    """One process, float64, the whole global batch of every applied step (skipped steps' samples
    are not learned from); the rank scripts' data layout (step s = samples s*B .. (s+1)*B)."""
    model = make_net()
    opt = make_opt(model.parameters())
    big = sum(splits[0])
    x, y = make_data(big * len(splits))
    for s, skip in enumerate(skipped):
        if skip:
            continue
        opt.zero_grad()
        nn.functional.mse_loss(model(x[s * big:(s + 1) * big]), y[s * big:(s + 1) * big]).backward()
        opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def envs_for(sharding_mode: str, *, rebalance: bool = False, compression: str = "none",
             slow_rank: int | None = None) -> list[dict[str, str]]:
    envs = mixed_cluster_envs(BATCHES, precision="fp16")
    for r, env in enumerate(envs):
        env.update({envnames.SHARDING: sharding_mode, envnames.MICRO_BATCH_SIZE: MICRO[r],
                    envnames.MEMORY_CAP_BYTES: str(CAPS[sharding_mode][r])})
        if sharding_mode == "full":
            env[envnames.SHARD_PPM] = SHARES
        if rebalance:
            env[envnames.REBALANCE_INTERVAL_STEPS] = "2"
        if compression != "none":
            env.update({envnames.COMPRESSION: compression, envnames.POWERSGD_RANK: "2"})
        if r == slow_rank:  # really four times slower than its table speed
            prof = c.DeviceProfile.from_json(env[envnames.DEVICE_PROFILE])
            env[envnames.DEVICE_PROFILE] = replace(
                prof, relative_speed=prof.relative_speed / 4).to_json()
    return envs


def run(tmp: Path, envs: list[dict[str, str]], *, steps: int, inject: int,
        delay_s: str = "0", dtype: str = "float64") -> list[dict]:
    runs = run_ranks([sys.executable, str(RANKS), "--out", str(tmp), "--steps", str(steps),
                      "--inject", str(inject), "--dtype", dtype], envs, timeout_s=240,
                     HTJ_SIM_DELAY_PER_SAMPLE_S=delay_s)
    assert_ok(runs)
    return read_rank_json(tmp, 4)


def assert_exact_and_agreed(facts: list[dict], inject: int, tol: float = TOL) -> None:
    """Every rank skipped exactly the injected step, with one loss scale, and ends on the one
    process reference of the applied steps with the splits the run used."""
    steps = len(facts[0]["skipped"])
    want_skipped = [s == inject for s in range(steps)]
    for f in facts:
        assert f["skipped"] == want_skipped
        assert f["splits"] == facts[0]["splits"] and f["scales"] == facts[0]["scales"]
        # 2^16 halved once by the agreed skip, then no growth (interval 2000 steps)
        assert f["scales"] == [2.0 ** 16] * inject + [2.0 ** 15] * (steps - inject)
        assert f["params"] == facts[0]["params"]
        assert f["param_dtypes"] == ["torch.float64"] and f["state_dtypes"] == ["torch.float64"]
    want = reference(facts[0]["splits"], want_skipped)
    got = facts[0]["params"]
    diff = max((torch.tensor(got[n], dtype=torch.float64) - w).abs().max().item()
               for n, w in want.items())
    assert sorted(got) == sorted(want)
    assert diff <= tol, diff


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["group", "full"])
def test_fp16_scaler_and_rebalancing_under_sharding_equal_one_process(tmp_path: Path, mode: str) -> None:
    """fp16 ranks with the agreed loss scaler and rebalancing on, under Group and Full sharding.

    Rank 2's loss overflows at step 0: every rank skips that step and halves its scale (2^16 ->
    2^15).  Rank 2 (a T4 at a quarter of the A100's speed) starts with 8 of 19 samples: the
    rebalancer moves samples off it as it does without sharding (its stats ride in the shard
    syncs' exchange), and the micro-batches follow (``ceil(b / m)`` with the memory bound ``m``,
    every rank the most any rank of its collectives needs), so each rank stays within a simulated
    cap that the A100 rank's grown batch would pass without micro-batches (:data:`CAPS`).  Parameters equal one process on
    the global batch of the applied steps (float64, <= 1e-9), the optimizer state stays in the
    parameters' dtype."""
    facts = run(tmp_path, envs_for(mode, rebalance=True), steps=8, inject=0,
                delay_s="0.01")
    assert_exact_and_agreed(facts, inject=0)
    splits = facts[0]["splits"]
    assert splits[0] == BATCHES
    assert all(sum(s) == sum(BATCHES) for s in splits)
    assert splits[-1][2] < BATCHES[2], splits  # samples moved off the slow T4
    micro = [int(m) for m in MICRO]
    groups = {"full": [[0, 1, 2, 3]] * 4, "group": [[0], [1], [2, 3], [2, 3]]}[mode]
    for rank, f in enumerate(facts):  # the most any rank sharing its collectives needs
        assert f["micro_counts"] == [max(-(-split[r] // micro[r]) for r in groups[rank])
                                     for split in splits]
    if mode == "group":  # the T4 group's 8 samples by 3 ran as 3 micro-batches, then fewer
        assert facts[2]["micro_counts"][0] == 3 and facts[2]["micro_counts"][-1] < 3
    else:  # the A100 (micro-batches of 2) took samples: every rank runs more than the first 3
        assert facts[0]["micro_counts"][0] == 3 and facts[0]["micro_counts"][-1] > 3
    assert splits[-1][0] > BATCHES[0]  # the A100 took samples: its cap matters (CAPS)
    for f in facts:  # the meter raises the simulated OOM past the cap; the peak is counted
        assert 0 < f["peak"] <= f["cap"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("codec", ["int8", "powersgd"])
def test_compression_under_group_keeps_error_feedback_through_an_fp16_skip(tmp_path: Path,
                                                                          codec: str) -> None:
    """Int8 / PowerSGD on Group sharding's cross-group exchange (3 leaders: A100, V100, the T4
    group's first rank), fp16 scaler on: rank 2 overflows at step 2, after the codecs hold error
    feedback; every rank skips it, the leaders' error feedback after the skipped step is bit for
    bit the state before it times the new scale / the old (1/2: it holds residuals of scaled
    gradients), PowerSGD's Q factors are unchanged, the state stays finite, and training goes on: every rank ends with the same
    parameters, near one process on the applied steps (compression is lossy); each leader's codec
    puts exactly the closed-form payload on the link every step (PowerSGD: no ``Q`` after the
    non-finite ``P`` of the skipped step)."""
    facts = run(tmp_path, envs_for("group", compression=codec), steps=6, inject=2)
    leaders = [f for f in facts if f["leader"]]
    assert len(leaders) == 3
    shapes = [torch.Size(s) for s in facts[0]["shapes"]]
    per_step = theoretical_bytes(CompressionConfig(mode=codec, powersgd_rank=2), shapes, leaders=3)
    want_bytes = 6 * per_step  # every step's exchange, the skipped one included ...
    if codec == "powersgd":  # ... but PowerSGD sends no Q after a non-finite P (step 2)
        want_bytes -= ring_allreduce_bytes(4 * powersgd_payload_elems(shapes, 2)[1], 3)
    for f in leaders:
        assert f["codec_numel"] > 0 and f["codec_finite"]
        assert f["codec_same_after_skip"] is True
        assert f["codec_bytes"] == want_bytes > 0  # the codec's payload on the cross-group link
    assert_exact_and_agreed(facts, inject=2, tol=0.05)
    exact = reference(facts[0]["splits"], [s == 2 for s in range(6)])
    got = facts[0]["params"]
    assert any((torch.tensor(got[n], dtype=torch.float64) - w).abs().max().item() > TOL
               for n, w in exact.items())  # the codec really ran (lossy)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["group", "full"])
def test_real_fp16_autocast_under_sharding_keeps_fp32_shards_and_state(tmp_path: Path,
                                                                       mode: str) -> None:
    """A float32 model under real fp16 autocast on the V100 and T4 ranks (bf16 on the A100, by
    its cc 8.0; the planner's Auto per card): the shards and the optimizer's state stay fp32 (the
    master copy), the injected overflow is skipped on every rank with one scale, and every
    rank ends with the same parameters, near the float64 reference of the applied steps (fp16
    rounding)."""
    envs = envs_for(mode)
    envs[0][envnames.PRECISION] = "bf16"
    facts = run(tmp_path, envs, steps=6, inject=0, dtype="float32")
    for f in facts:
        assert f["skipped"][0] is True and f["skipped"] == facts[0]["skipped"]
        assert f["scales"] == facts[0]["scales"] and f["scales"][0] == 2.0 ** 15
        assert f["param_dtypes"] == ["torch.float32"] and f["state_dtypes"] == ["torch.float32"]
        assert f["params"] == facts[0]["params"]
    assert sum(facts[0]["skipped"][1:]) == 0  # no fp16 overflow of its own at these magnitudes
    want = reference(facts[0]["splits"], facts[0]["skipped"])
    got = facts[0]["params"]
    diff = max((torch.tensor(got[n], dtype=torch.float64) - w).abs().max().item()
               for n, w in want.items())
    assert diff <= 2e-2, diff


def test_full_refuses_compression_naming_the_reason_and_the_fix() -> None:
    for mode in ("int8", "powersgd"):
        with pytest.raises(RuntimeError, match="Full sharding with compression is not built: Full "
                           "reduce-scatters .* leave spec.training.compression out, or use "
                           "spec.training.sharding Group"):
            sharding.check_supported(checkpoint_dir="", sharding="full", compression=mode)
    # what is built passes: fp16 and rebalancing are not the check's business any more; Group compresses
    sharding.check_supported(checkpoint_dir="", sharding="group", compression="int8")
    sharding.check_supported(checkpoint_dir="", sharding="full", compression="none")
