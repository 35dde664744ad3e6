"""The planner's step time per sharding mode (issue 23) against a hand computation for a
two-type cluster, and Auto taking the best predicted throughput that fits."""

from __future__ import annotations

import pytest

from hetero_operator.api.memoryplan import ModelMemory, RankMemory, RankSlot
from hetero_operator.planning.memory import plan_memory
from hetero_operator.planning.steptime import mode_step_time

# 2x A100 (group 0, node a, 6 samples each) + 2x T4 (group 1, node b, 2 samples each)
SLOTS = [RankSlot(rank=r, group=r // 2, node="ab"[r // 2], gpu_type=t, memory_mib=mib,
                  precision="fp32", local_batch=b)
         for r, (t, mib, b) in enumerate([("A100", 40960, 6), ("A100", 40960, 6),
                                          ("T4", 15360, 2), ("T4", 15360, 2)])]
SAMPLE_S = {"A100": 0.01, "T4": 0.03}
P = 4_000_000  # fp32 parameter bytes (1 M parameters)


def _ranks(shares: list[int], micro: list[int], ckpt: bool = False) -> list[RankMemory]:
    return [RankMemory(rank=s.rank, gpu_type=s.gpu_type, usable_bytes=1, state_share_ppm=sh,
                       state_bytes=1, micro_batch_size=1, micro_batches=m,
                       activation_checkpointing=ckpt, peak_bytes=1)
            for s, sh, m in zip(SLOTS, shares, micro)]


def _step(mode: str, ranks: list[RankMemory]):
    return mode_step_time(SLOTS, ranks, mode, sample_s=SAMPLE_S, param_bytes=P, cross_gbps=10.0,
                          intra_gbps=100.0)


def test_none_by_hand() -> None:
    t = _step("None", _ranks([10**6] * 4, [1] * 4))
    # compute max(6 x 0.01, 2 x 0.03) = 0.06 s; one ring all-reduce between 2 groups:
    # 2 (2-1)/2 x 4 MB = 4 MB -> 4e6 x 8 / 10e9 = 3.2 ms
    assert t.cross_type_bytes == 4_000_000 and t.in_group_s == 0.0
    assert t.compute_s == pytest.approx(0.06, rel=1e-12)
    assert t.step_s == pytest.approx(0.0632, rel=1e-12)
    assert t.samples_per_s == pytest.approx(16 / 0.0632, rel=1e-12)


def test_group_by_hand_counts_in_group_traffic_per_micro_batch() -> None:
    t = _step("Group", _ranks([500_000] * 4, [1, 1, 2, 2]))
    # cross as None (3.2 ms); in group of 2, per micro-batch (2): 3 x (2-1)/2 x 4 MB = 6 MB,
    # 12 MB at 100 Gbit/s = 0.96 ms
    assert t.micro_batches == 2 and t.cross_type_bytes == 4_000_000
    assert t.in_group_s == pytest.approx(12e6 * 8 / 100e9, rel=1e-12)
    assert t.step_s == pytest.approx(0.06 + 0.0032 + 0.00096, rel=1e-12)


def test_full_by_hand_counts_padded_gathers_per_micro_batch_and_recomputation() -> None:
    t = _step("Full", _ranks([350_000, 350_000, 150_000, 150_000], [1] * 4))
    # recompute: max(6 x 0.01, 2 x 0.03) x 4/3 = 0.08 s; per micro-batch 2 all-gathers and a
    # reduce-scatter that Gloo runs as an all-reduce (2 all-gathers' bytes) of (4-1) slices
    # padded to the largest share: 4 x 3 x 0.35 x 4 MB = 16.8 MB -> 13.44 ms
    assert t.cross_type_bytes == 16_800_000
    assert t.compute_s == pytest.approx(0.08, rel=1e-12)
    assert t.step_s == pytest.approx(0.08 + 0.01344, rel=1e-12)
    assert _step("Full", _ranks([350_000, 350_000, 150_000, 150_000], [2] * 4)).cross_type_bytes \
        == 33_600_000


def test_activation_checkpointing_recomputes() -> None:
    t = _step("None", _ranks([10**6] * 4, [1] * 4, ckpt=True))
    assert t.compute_s == pytest.approx(0.08, rel=1e-12)


def test_auto_takes_the_best_predicted_throughput_that_fits() -> None:
    """1e9 parameters with Adam (16 GB of state): None does not fit the T4s; Group moves the least
    across types, but on a 1 Gbit/s intra-node link its in-group gathers cost more than Full's."""
    m = ModelMemory(parameters=10**9, optimizer="Adam", activation_bytes_per_sample=0,
                    checkpointed_activation_bytes_per_sample=0)
    by_traffic = plan_memory(SLOTS, m, "Auto", reserve_mib=1024, cross_gbps=10.0)
    by_step = plan_memory(SLOTS, m, "Auto", reserve_mib=1024, cross_gbps=10.0,
                          sample_s=SAMPLE_S, intra_gbps=1.0)
    assert by_traffic.mode == "Group"
    assert by_step.mode == "Full"
    options = {o.mode: o for o in by_step.options}
    assert not options["None"].fits and options["None"].predicted_step_s is None
    assert options["Group"].predicted_step_s == pytest.approx(
        0.06 + 2 * (2 - 1) / 2 * 4e9 * 8 / 10e9 + 3 * (2 - 1) / 2 * 4e9 * 8 / 1e9, rel=1e-9)
    assert options["Full"].predicted_samples_per_s > options["Group"].predicted_samples_per_s
