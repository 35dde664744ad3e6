"""The one batch splitter: a whole number of samples over ranks by speed, within bounds (pure).

Every split of a total into per-rank integers in the project goes through :func:`split_batch`: the
planner's split of ``spec.training.globalBatchSize`` (``hetero_operator.planning``), the worker's
re-split from measured speeds (``hetero_worker.speed.rebalance``), the memory planner's state
shares (a million parts per million by usable memory), the worker's slices of a flat parameter
under Full sharding (``hetero_worker.memory.full``) and its micro-batches
(``hetero_worker.memory.microbatch``).  Change how batches are split here.

The continuous split gives rank i ``x_i = clamp(lam * speed_i, min_batch, cap_i)`` with the single
``lam`` that makes the shares sum to the total (water-filling with both bounds: a rank that would
exceed its cap is held at the cap and the rest is re-shared by speed; a rank whose share would
fall below ``min_batch`` is held there).  Integers come from largest-remainder rounding (Hamilton's
method) of the ``x_i``: every rank gets ``floor(x_i)``, and the samples left over go one each to
the largest remainders.  So every integer share is within 1 of its continuous share, within
``[min_batch, cap_i]``, and the sum is exact.

The arithmetic is exact: the speeds are read as the rationals they are (a float is ``m * 2**e``),
the held ranks are found in floating point and then checked in integers (exact rationals where
the check fails), and the remainders are compared as integers.  So equal remainders are real
ties, never an artefact of rounding.  The tie rule: of equal remainders the faster rank takes the
sample first, then the lower rank.  Nothing is ever taken back (each rank starts at the floor of
its share, at or above ``min_batch``), so the slower rank of a tie is the one left without.
Together: a faster rank never gets fewer samples than a slower one (within the bounds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

__all__ = ["continuous_shares", "split_batch"]

_MIN, _FREE, _CAP = -1, 0, 1
"""Where a rank's continuous share sits: held at ``min_batch``, between the bounds, at its cap."""


def split_batch(total: int, speeds: Sequence[float], caps: Sequence[int] | None = None, *,
                min_batch: int = 1) -> list[int]:
    """Integer shares of ``total``: proportional to ``speeds``, within ``[min_batch, caps]``, exact sum.

    Args:
        total: samples to split (the global batch), >= ``len(speeds) * min_batch``.
        speeds: relative speed (or any weight) per rank, all > 0; with ``min_batch == 0`` a
            weight may be 0 (that rank gets nothing) as long as one is > 0.  Equal speeds give an
            equal split (the extra samples to the lowest ranks).
        caps: largest share per rank (memory), each >= ``min_batch``; None for no cap.
        min_batch: smallest share of every rank, >= 0 (1: every rank stays in the step).

    Returns:
        ``len(speeds)`` integers summing to ``total``, each in ``[min_batch, cap_i]`` and within 1
        of its continuous share (:func:`continuous_shares`); e.g. ``split_batch(128, [1.0, 0.4,
        0.2, 0.2]) == [71, 29, 14, 14]``.

    Raises:
        ValueError: empty input, mismatched lengths, a speed <= 0 (or < 0, or all 0, with
            ``min_batch == 0``), a cap below ``min_batch``, ``min_batch < 0``, a total below
            ``len(speeds) * min_batch``, or caps summing below the total.
    """
    bounds = _bounds(total, speeds, caps)
    _validate(total, speeds, caps, bounds, min_batch)
    n = len(speeds)
    if total == n * min_batch:
        return [min_batch] * n
    if sum(bounds) == total:
        return list(bounds)
    if caps is None and len(set(speeds)) == 1:  # equal shares, the same rule in one division
        base, extra = divmod(total, n)
        return [base + (i < extra) for i in range(n)]
    weights = _integer_weights(speeds)
    where = _classify(total, speeds, weights, bounds, min_batch)
    held = {_MIN: lambda i: min_batch, _CAP: lambda i: bounds[i]}
    rest = total - sum(held[w](i) for i, w in enumerate(where) if w != _FREE)
    free_weight = sum(w for w, at in zip(weights, where) if at == _FREE)
    out, remainder = [0] * n, [0] * n
    for i, at in enumerate(where):  # a free share is rest * w_i / free_weight: floor and remainder
        out[i], remainder[i] = (divmod(rest * weights[i], free_weight) if at == _FREE
                                else (held[at](i), 0))
    left = total - sum(out)  # 0 <= left < number of ranks with a remainder > 0
    order = sorted(range(n), key=lambda i: (-remainder[i], -weights[i], i))
    for i in order[:left]:
        out[i] += 1
    return out


def continuous_shares(total: int, speeds: Sequence[float], caps: Sequence[int] | None = None, *,
                      min_batch: int = 1) -> list[float]:
    """The real-valued split before rounding (arguments and errors as :func:`split_batch`).

    Returns:
        ``x_i`` per rank, ``min_batch <= x_i <= cap_i``, summing to ``total`` (up to the float
        conversion of the exact values).
    """
    bounds = _bounds(total, speeds, caps)
    _validate(total, speeds, caps, bounds, min_batch)
    return [float(x) for x in _exact_shares(total, speeds, bounds, min_batch)]


def _bounds(total: int, speeds: Sequence[float], caps: Sequence[int] | None) -> list[int]:
    """Each rank's cap, at most the total (no cap: the total)."""
    return [total] * len(speeds) if caps is None else [min(int(c), total) for c in caps]


def _integer_weights(speeds: Sequence[float]) -> list[int]:
    """The speeds as integers in the same proportions, exactly (over their common denominator)."""
    ratios = [Fraction(s).as_integer_ratio() for s in speeds]
    common = math.lcm(*(q for _, q in ratios))
    return [p * (common // q) for p, q in ratios]


def _classify(total: int, speeds: Sequence[float], weights: Sequence[int], bounds: Sequence[int],
              min_batch: int) -> list[int]:
    """Which ranks the water level holds at ``min_batch`` or at their cap, and which are free.

    Found in floating point, then checked exactly in integers; where rounding misplaced a rank
    (a share within rounding of a bound), found again in exact rationals."""
    lam = _water_level(total, [float(s) for s in speeds], bounds, min_batch)
    where = [_place(lam * float(s), w, min_batch, cap) for s, w, cap in zip(speeds, weights, bounds)]
    if _consistent(total, where, weights, bounds, min_batch):
        return where
    exact = _water_level(total, [Fraction(s) for s in speeds], bounds, min_batch)
    return [_place(exact * Fraction(s), w, min_batch, cap) for s, w, cap in zip(speeds, weights, bounds)]


def _place(share: float | Fraction, weight: int, min_batch: int, cap: int) -> int:
    if weight == 0 or share <= min_batch:
        return _MIN
    return _CAP if share >= cap else _FREE


def _consistent(total: int, where: Sequence[int], weights: Sequence[int], bounds: Sequence[int],
                min_batch: int) -> bool:
    """True when ``where`` is the water level's exact placement: with the free ranks sharing the
    rest by weight, each free share lies within its bounds and no held rank would leave its bound."""
    held = [min_batch if at == _MIN else bounds[i] for i, at in enumerate(where) if at != _FREE]
    rest = total - sum(held)
    free_weight = sum(w for w, at in zip(weights, where) if at == _FREE)
    if free_weight == 0:
        return rest == 0
    for w, at, cap in zip(weights, where, bounds):
        share = rest * w  # the share times free_weight
        if (at == _FREE and not min_batch * free_weight <= share <= cap * free_weight
                or at == _MIN and share > min_batch * free_weight
                or at == _CAP and share < cap * free_weight):
            return False
    return True


def _exact_shares(total: int, speeds: Sequence[float], bounds: Sequence[int],
                  min_batch: int) -> list[Fraction]:
    """The exact continuous shares (validated inputs)."""
    n = len(speeds)
    if total == n * min_batch:
        return [Fraction(min_batch)] * n
    if sum(bounds) == total:
        return [Fraction(c) for c in bounds]
    weights = [Fraction(s) for s in speeds]
    lam = _water_level(total, weights, bounds, min_batch)
    return [min(max(lam * w, Fraction(min_batch)), Fraction(c)) for w, c in zip(weights, bounds)]


def _water_level(total: int, weights: Sequence[float] | Sequence[Fraction], bounds: Sequence[int],
                 min_batch: int) -> float | Fraction:
    """The ``lam`` with ``sum(clamp(lam * w_i, min_batch, c_i)) == total`` (piecewise-linear
    sweep over the points where a rank starts growing above ``min_batch`` and stops at its cap;
    ranks of weight 0 stay at ``min_batch == 0``); in the arithmetic of ``weights``."""
    events = sorted(e for i, w in enumerate(weights) if w > 0
                    for e in ((min_batch / w, 0, i), (bounds[i] / w, 1, i)))
    base, slope = len(weights) * min_batch, 0 * weights[0]  # f(lam) = base + lam * slope
    for lam, kind, i in events:
        if slope > 0 and base + lam * slope >= total:
            return (total - base) / slope
        if kind == 0:
            base -= min_batch
            slope += weights[i]
        else:
            base += bounds[i]
            slope -= weights[i]
    return events[-1][0]  # unreachable for valid inputs: the caps hold more than the total


def _validate(total: int, speeds: Sequence[float], caps: Sequence[int] | None,
              bounds: Sequence[int], min_batch: int) -> None:
    n = len(speeds)
    if not speeds or (caps is not None and len(caps) != n):
        raise ValueError(f"speeds and caps must be non-empty and of equal length, got {n} and "
                         f"{n if caps is None else len(caps)}")
    if min_batch < 0:
        raise ValueError(f"min_batch must be >= 0, got {min_batch}")
    if min_batch > 0 and any(not s > 0 for s in speeds):
        raise ValueError(f"speeds must all be > 0, got {list(speeds)}")
    if min_batch == 0 and (any(not s >= 0 for s in speeds) or not any(s > 0 for s in speeds)):
        raise ValueError(f"speeds must all be >= 0 and one > 0, got {list(speeds)}")
    if any(not math.isfinite(s) for s in speeds):
        raise ValueError(f"speeds must be finite, got {list(speeds)}")
    if caps is not None and any(c < min_batch for c in caps):
        raise ValueError(f"caps must all be >= {min_batch}, got {list(caps)}")
    if total < n * min_batch:
        raise ValueError(f"global batch {total} is smaller than the {n} ranks x {min_batch} "
                         f"(every rank needs at least {min_batch} sample{'s' * (min_batch != 1)})")
    if sum(bounds) < total:
        raise ValueError(f"global batch {total} exceeds the sum of the memory caps {sum(caps or ())}")
