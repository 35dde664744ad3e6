"""Pure tests of the rebalance solver (no processes)."""

from __future__ import annotations

import random

import pytest

from hetero_worker.speed.rebalance import (RebalanceConfig, Rebalancer, bounded_step, pack_stats,
                                           unpack_stats)


@pytest.mark.parametrize(("current", "target", "max_change", "expected"), [
    ([16, 16, 16, 16], [8, 8, 16, 32], 4, [14, 14, 16, 20]),
    ([16, 16, 16, 16], [8, 8, 16, 32], 16, [8, 8, 16, 32]),
    ([10, 10, 10], [4, 13, 13], 3, [7, 11, 12]),
], ids=["increase clipped, decreases trimmed to match", "large bound reaches the target",
        "odd totals stay exact"])
def test_bounded_step(current, target, max_change, expected):
    out = bounded_step(current, target, max_change)
    assert out == expected
    assert sum(out) == sum(current)
    assert all(abs(o - c) <= max_change for o, c in zip(out, current))


def test_stats_round_trip():
    world = 3
    summed = [sum(v) for v in zip(*(pack_stats(r, world, 0.5 * (r + 1), 10 * r + 1)
                                    for r in range(world)))]
    assert unpack_stats(summed) == ([0.5, 1.0, 1.5], [1, 11, 21])


def _simulate(reb: Rebalancer, speeds, steps, noise=0.0, seed=0, start=0):
    rng = random.Random(seed)
    for step in range(start, start + steps):
        compute = [b / s * (1 + rng.uniform(-noise, noise)) for b, s in zip(reb.split, speeds(step))]
        reb.observe(step, compute, list(reb.split))


def test_converges_from_equal_split_to_proportional():
    reb = Rebalancer(config=RebalanceConfig(interval_steps=5), split=[16, 16, 16, 16])
    _simulate(reb, lambda s: [1, 1, 2, 4], 20)
    assert reb.split == [8, 8, 16, 32]


def test_slowed_rank_gets_smaller_batch_within_interval():
    interval = 5
    reb = Rebalancer(config=RebalanceConfig(interval_steps=interval), split=[8, 8, 16, 32])
    _simulate(reb, lambda s: [1, 1, 2, 4], 10)
    assert reb.split == [8, 8, 16, 32]
    _simulate(reb, lambda s: [1, 1, 2, 1], interval, start=10)
    assert reb.split[3] < 32
    first_change = reb.history[0][0]
    assert 10 <= first_change < 10 + interval
    _simulate(reb, lambda s: [1, 1, 2, 1], 20, start=10 + interval)
    assert reb.split == [13, 13, 25, 13]


def test_no_oscillation_on_steady_speeds_with_noise():
    """100 noisy steps (+-10 % per measurement) on steady speeds: only the initial moves."""
    cfg = RebalanceConfig(interval_steps=5, max_change_fraction=0.125)
    reb = Rebalancer(config=cfg, split=[16, 16, 16, 16])
    _simulate(reb, lambda s: [1, 1, 2, 4], 100, noise=0.10, seed=3)
    max_change = round(cfg.max_change_fraction * 64)
    splits = [[16, 16, 16, 16]] + [s for _, s in reb.history]
    for before, after in zip(splits, splits[1:]):
        assert max(abs(a - b) for a, b in zip(after, before)) <= max_change
        assert sum(after) == 64
    late = [step for step, _ in reb.history if step >= 30]
    assert late == [], f"split kept changing on steady speeds: {reb.history}"
    assert all(abs(b - t) <= 2 for b, t in zip(reb.split, [8, 8, 16, 32]))


def test_caps_respected_during_rebalance():
    reb = Rebalancer(config=RebalanceConfig(interval_steps=2), split=[16, 16, 16, 16],
                     caps=[40, 40, 40, 20])
    _simulate(reb, lambda s: [1, 1, 2, 8], 30)
    assert reb.split[3] == 20
    assert sum(reb.split) == 64


def test_disabled_never_changes():
    reb = Rebalancer(config=RebalanceConfig(interval_steps=0), split=[16, 16, 16, 16])
    _simulate(reb, lambda s: [1, 1, 2, 4], 20)
    assert reb.split == [16, 16, 16, 16] and reb.history == []


def test_throughput_by_class():
    reb = Rebalancer(config=RebalanceConfig(interval_steps=5), split=[10, 10, 10])
    reb.observe(0, [9.0, 9.0, 9.0], [10, 10, 10])  # warm-up step: ignored
    assert reb.throughput_by_class(["A100", "T4", "T4"]) == {}
    reb.observe(2, [1.0, 2.0, 4.0], [10, 10, 10])
    assert reb.throughput_by_class(["A100", "T4", "T4"]) == pytest.approx({"A100": 10.0, "T4": 3.75})
