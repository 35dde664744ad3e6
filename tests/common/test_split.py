"""The one batch splitter (heterotrain_common/split.py): exact splits, caps, the minimum batch, the
tie rule, and the properties every caller relies on (exact sum, bounds, within 1 of the continuous
share, deterministic, a faster rank never gets fewer samples)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from heterotrain_common import split
from heterotrain_common.split import continuous_shares, split_batch


@pytest.mark.parametrize(("batch", "speeds", "caps", "expected"), [
    (128, [1.0, 0.4, 0.2, 0.2], [128] * 4, [71, 29, 14, 14]),
    (64, [2, 2, 1, 1, 1, 1], [64] * 6, [16, 16, 8, 8, 8, 8]),
    (128, [7, 1, 1], [128] * 3, [100, 14, 14]),
    (18, [1, 1], [13, 6], [12, 6]),
    (10, [1, 1, 1], [10] * 3, [4, 3, 3]),
    (5, [100, 1, 1, 1, 1], [5] * 5, [1, 1, 1, 1, 1]),
    (100, [1000, 1], [100, 100], [99, 1]),
    (100, [1, 1, 1], [10, 50, 50], [10, 45, 45]),
    (20, [3, 1], [20, 20], [15, 5]),
], ids=["mixed cluster", "MIG 2g/1g", "A100 and two 1g slices", "a cap binds",
        "ties go to the lower rank", "one sample each", "the slow rank keeps one sample",
        "capped rank's excess is re-shared", "exact proportion"])
def test_known_splits(batch: int, speeds: list[float], caps: list[int], expected: list[int]) -> None:
    assert split_batch(batch, speeds, caps) == expected


@pytest.mark.parametrize(("global_batch", "speeds", "caps", "expected"), [
    (64, [1, 1, 2, 4], None, [8, 8, 16, 32]),
    (18, [15360, 7168], None, [12, 6]),
    (64, [1, 1, 2, 4], [64, 64, 64, 20], [11, 11, 22, 20]),
    (10, [1, 1, 1], None, [4, 3, 3]),
    (4, [1, 1000], None, [1, 3]),
], ids=["speeds 1,1,2,4 split 64 exactly", "case 15 memory ratio gives 12 and 6",
        "a cap binds and the rest is re-split", "largest remainder breaks ties by rank",
        "every rank keeps at least one sample"])
def test_rebalancer_splits(global_batch, speeds, caps, expected):
    """The worker's re-split (speed/rebalance.py) calls the same function: no caps is None."""
    assert split_batch(global_batch, speeds, caps) == expected


@pytest.mark.parametrize(("batch", "speeds", "caps", "fragment"), [
    (2, [1, 1, 1], [2, 2, 2], "smaller than the 3 ranks"),
    (18, [1, 1], [11, 5], "exceeds the sum of the memory caps"),
    (8, [1, 0], [8, 8], "speeds must all be > 0"),
    (8, [1, 1], [8, 0], "caps must all be >= 1"),
    (8, [], [], "non-empty"),
    (8, [1], [8, 8], "equal length"),
])
def test_invalid_inputs_raise_with_a_reason(batch: int, speeds: list, caps: list, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        split_batch(batch, speeds, caps)


def test_caps_too_small_for_the_batch_are_refused():
    with pytest.raises(ValueError, match="global batch 20 exceeds the sum of the memory caps 18"):
        split_batch(20, [1, 1], [9, 9])


# --- the minimum batch ----------------------------------------------------------------------------

@pytest.mark.parametrize(("batch", "speeds", "caps", "min_batch", "expected"), [
    (12, [1, 10, 10], None, 3, [3, 5, 4]),
    (12, [1, 10, 10], None, 1, [1, 6, 5]),
    (9, [1, 100, 100], None, 3, [3, 3, 3]),
    (20, [1, 10, 10], [20, 6, 20], 4, [4, 6, 10]),
    (10**6, [80, 13, 13], None, 0, [754717, 122642, 122641]),
    (3, [10**6 - 2, 1, 1], None, 0, [3, 0, 0]),
    (5, [2, 0, 1], None, 0, [3, 0, 2]),
    (0, [1, 1], None, 0, [0, 0]),
], ids=["the slow rank is held at the minimum", "the same at minimum 1",
        "exactly the minimum each", "a cap and the minimum bind at once",
        "parts per million by usable memory", "a share below one element gets none",
        "a weight of 0 gets nothing at minimum 0", "nothing to split"])
def test_the_minimum_batch_holds(batch, speeds, caps, min_batch, expected):
    out = split_batch(batch, speeds, caps, min_batch=min_batch)
    assert out == expected
    assert min(out) >= min_batch and sum(out) == batch


@pytest.mark.parametrize(("batch", "speeds", "min_batch", "fragment"), [
    (8, [1, 1, 1], 3, "global batch 8 is smaller than the 3 ranks x 3"),
    (8, [1, -1], 0, "speeds must all be >= 0 and one > 0"),
    (8, [0, 0], 0, "speeds must all be >= 0 and one > 0"),
    (8, [1, 1], -1, "min_batch must be >= 0"),
])
def test_an_impossible_minimum_is_refused(batch, speeds, min_batch, fragment):
    with pytest.raises(ValueError, match=fragment):
        split_batch(batch, speeds, min_batch=min_batch)


def test_a_cap_below_the_minimum_is_refused():
    with pytest.raises(ValueError, match=r"caps must all be >= 2, got \[8, 1\]"):
        split_batch(8, [1, 1], [8, 1], min_batch=2)


# --- the tie rule -----------------------------------------------------------------------------------

# CI, 2 Dec 2026: speeds 5.0 and 4.999999999999999 have equal shares in floating point, and the
# remainder's tie went to the lower index, the slower rank (258 against 257)
TIED_SHARES = ([1.25, 1.75, 1.25390625, 1.232421875, 1.0157737872798864, 2.21875, 4.75,
                4.999999999999999, 5.0, 1.5, 1.96875], 1387)


def test_the_faster_rank_takes_the_extra_sample_of_a_near_tie() -> None:
    """The plan's split and the worker's re-split are one function; on the CI case the faster
    rank (5.0) takes the extra sample over 4.999999999999999, with or without caps."""
    speeds, batch = TIED_SHARES
    planned = split_batch(batch, speeds, [batch] * len(speeds))
    assert split_batch(batch, speeds) == planned
    assert (planned[7], planned[8]) == (257, 258)
    assert planned == [64, 90, 65, 64, 52, 114, 245, 257, 258, 77, 101]


@pytest.mark.parametrize(("batch", "speeds", "expected"), [
    (4, [1.0, 3.0, 1.0, 3.0], [0, 2, 0, 2]),
    (7, [1.0, 1.0, 1.0], [3, 2, 2]),
    (2, [1.0, 3.0], [0, 2]),
], ids=["equal remainders (.5 of 0.5 and 1.5): the faster ranks first",
        "equal speeds: the lower rank first", "the slower of a tie is left without"])
def test_ties_go_to_the_faster_rank_then_the_lower(batch, speeds, expected):
    assert split_batch(batch, speeds, min_batch=0) == expected


# --- properties -------------------------------------------------------------------------------------

@st.composite
def inventories(draw: st.DrawFn) -> tuple[int, list[float], list[int]]:
    n = draw(st.integers(1, 40))
    speeds = draw(st.lists(st.floats(0.01, 10.0, allow_nan=False), min_size=n, max_size=n))
    batch = draw(st.integers(n, 5000))
    caps = draw(st.lists(st.integers(1, 5000), min_size=n, max_size=n))
    if sum(min(c, batch) for c in caps) < batch:  # make it feasible: raise caps in order
        deficit = batch - sum(min(c, batch) for c in caps)
        caps = [c + deficit if i == 0 else c for i, c in enumerate(caps)]
    return batch, speeds, caps


@settings(max_examples=300, deadline=None)
@given(inventories())
def test_split_properties(case: tuple[int, list[float], list[int]]) -> None:
    batch, speeds, caps = case
    out = split_batch(batch, speeds, caps)
    shares = continuous_shares(batch, speeds, caps)
    assert sum(out) == batch
    assert all(1 <= b <= c for b, c in zip(out, caps))
    assert all(abs(b - x) < 1 + 1e-6 for b, x in zip(out, shares))  # proportional within rounding
    assert out == split_batch(batch, list(speeds), list(caps))  # deterministic


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.05, 5.0), min_size=2, max_size=30), st.integers(0, 10_000))
def test_uncapped_split_is_proportional_to_speed(speeds: list[float], extra: int) -> None:
    batch = len(speeds) * 50 + extra  # large enough that no rank is held at 1 sample
    shares = continuous_shares(batch, speeds, [batch] * len(speeds))
    if min(shares) > 1:
        ratios = {round(x / s, 6) for x, s in zip(shares, speeds)}
        assert max(ratios) - min(ratios) < 1e-3 * max(ratios)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.05, 5.0), min_size=1, max_size=30), st.integers(1, 2000))
@example(*TIED_SHARES)
def test_faster_rank_never_gets_fewer_samples_when_uncapped(speeds: list[float], batch: int) -> None:
    if batch < len(speeds):
        batch = len(speeds)
    out = split_batch(batch, speeds, [batch] * len(speeds))
    for i in range(len(speeds)):
        for j in range(len(speeds)):
            if speeds[i] > speeds[j]:
                assert out[i] >= out[j]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.05, 5.0), min_size=1, max_size=20), st.integers(0, 4),
       st.integers(0, 2000))
@example(*TIED_SHARES, 0)
def test_faster_rank_never_gets_fewer_at_any_minimum(speeds: list[float], min_batch: int,
                                                     extra: int) -> None:
    batch = len(speeds) * min_batch + extra
    out = split_batch(batch, speeds, min_batch=min_batch)
    assert sum(out) == batch and min(out) >= min_batch
    for i in range(len(speeds)):
        for j in range(len(speeds)):
            if speeds[i] > speeds[j]:
                assert out[i] >= out[j]


# --- exactness --------------------------------------------------------------------------------------

def _reference(batch: int, speeds: list[float], caps: list[int], min_batch: int) -> list[int]:
    """Largest remainders of the exact shares, by the tie rule, in rationals throughout."""
    from fractions import Fraction
    shares = [Fraction(x) for x in split._exact_shares(batch, speeds, [min(c, batch) for c in caps],
                                                       min_batch)]
    out = [int(x) for x in shares]
    order = sorted(range(len(out)), key=lambda i: (out[i] - shares[i], -Fraction(speeds[i]), i))
    for i in order[:batch - sum(out)]:
        out[i] += 1
    return out


@settings(max_examples=200, deadline=None)
@given(inventories(), st.integers(0, 3))
@example((TIED_SHARES[1], TIED_SHARES[0], [TIED_SHARES[1]] * 11), 1)
@example((20, [3.0, 1.0], [15, 20]), 1)
def test_the_integer_path_equals_exact_rationals(case, min_batch) -> None:
    """The held ranks are found in floating point and checked in integers: the result is the
    exact rational answer, near-ties and shares exactly at a cap included."""
    batch, speeds, caps = case
    n = len(speeds)
    batch, caps = max(batch, n * min_batch), [max(c, min_batch) for c in caps]
    caps[0] += max(0, batch - sum(min(c, batch) for c in caps))
    assert split_batch(batch, speeds, caps, min_batch=min_batch) == _reference(batch, speeds, caps,
                                                                               min_batch)


def test_a_rank_misplaced_by_rounding_is_placed_again_exactly(monkeypatch) -> None:
    """Where the floating-point water level puts a rank on the wrong side of a bound, the integer
    check refuses it and the exact rationals decide."""
    real = split._water_level

    def off(total, weights, bounds, min_batch):
        lam = real(total, weights, bounds, min_batch)
        return lam * 0.1 if isinstance(lam, float) else lam  # every rank looks free

    monkeypatch.setattr(split, "_water_level", off)
    assert split_batch(100, [1, 1, 3], [100, 100, 30]) == [35, 35, 30]
