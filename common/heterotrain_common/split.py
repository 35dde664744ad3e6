"""The one batch splitter: a whole number of samples over ranks by speed, within bounds (pure).

Every split of a total into per-rank integers in the project goes through :func:`split_batch`: the
planner's split of ``spec.training.globalBatchSize`` (``hetero_operator.planning``), the worker's
re-split from measured speeds (``hetero_worker.speed.rebalance``), the memory planner's state
shares (a million parts per million by usable memory) and the worker's slices of a flat parameter
under Full sharding (``hetero_worker.memory.full``).  Change how batches are split here.

The continuous split gives rank i ``x_i = clamp(lam * speed_i, min_batch, cap_i)`` with the single
``lam`` that makes the shares sum to the total (water-filling with both bounds: a rank that would
exceed its cap is held at the cap and the rest is re-shared by speed; a rank whose share would
fall below ``min_batch`` is held there).  Integers come from largest-remainder rounding (Hamilton's
method) of the ``x_i``: every rank gets ``floor(x_i)``, and the samples left over go one each to
the largest remainders.  So every integer share is within 1 of its continuous share, within
``[min_batch, cap_i]``, and the sum is exact.

The arithmetic is exact (:class:`fractions.Fraction` of the given floats), so equal remainders
are real ties, never an artefact of rounding.  The tie rule: of equal remainders the faster rank
takes the sample first, then the lower rank.  Nothing is ever taken back (each rank starts at the
floor of its share, at or above ``min_batch``), so the slower rank of a tie is the one left
without.  Together: a faster rank never gets fewer samples than a slower one (within the bounds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

__all__ = ["continuous_shares", "split_batch"]


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
    shares = _shares(total, speeds, caps, min_batch)
    out = [math.floor(x) for x in shares]
    left = total - sum(out)  # 0 <= left < number of ranks with a remainder > 0
    weights = [Fraction(s) for s in speeds]
    order = sorted(range(len(out)), key=lambda i: (out[i] - shares[i], -weights[i], i))
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
    return [float(x) for x in _shares(total, speeds, caps, min_batch)]


def _shares(total: int, speeds: Sequence[float], caps: Sequence[int] | None,
            min_batch: int) -> list[Fraction]:
    """The exact continuous shares (validated inputs)."""
    bounds = [total] * len(speeds) if caps is None else [min(int(c), total) for c in caps]
    _validate(total, speeds, caps, bounds, min_batch)
    n = len(speeds)
    if total == n * min_batch:
        return [Fraction(min_batch)] * n
    if sum(bounds) == total:
        return [Fraction(c) for c in bounds]
    weights = [Fraction(s) for s in speeds]
    lam = _water_level(total, weights, bounds, min_batch)
    return [min(max(lam * w, Fraction(min_batch)), Fraction(c)) for w, c in zip(weights, bounds)]


def _water_level(total: int, weights: Sequence[Fraction], bounds: Sequence[int],
                 min_batch: int) -> Fraction:
    """The ``lam`` with ``sum(clamp(lam * w_i, min_batch, c_i)) == total`` (piecewise-linear
    sweep over the points where a rank starts growing above ``min_batch`` and stops at its cap;
    ranks of weight 0 stay at ``min_batch == 0``)."""
    events = sorted(e for i, w in enumerate(weights) if w > 0
                    for e in ((min_batch / w, 0, i), (bounds[i] / w, 1, i)))
    base, slope = Fraction(len(weights) * min_batch), Fraction(0)  # f(lam) = base + lam * slope
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
    if caps is not None and any(c < min_batch for c in caps):
        raise ValueError(f"caps must all be >= {min_batch}, got {list(caps)}")
    if total < n * min_batch:
        raise ValueError(f"global batch {total} is smaller than the {n} ranks x {min_batch} "
                         f"(every rank needs at least {min_batch} sample{'s' * (min_batch != 1)})")
    if sum(bounds) < total:
        raise ValueError(f"global batch {total} exceeds the sum of the memory caps {sum(caps or ())}")
