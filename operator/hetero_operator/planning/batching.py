"""Split a global batch into per-rank local batches: proportional to speed, capped, exact integers.

The continuous split gives rank i ``x_i = clamp(lam * speed_i, 1, cap_i)`` with the single ``lam``
that makes the shares sum to the global batch (water-filling with both bounds: a rank that would
exceed its memory cap is held at the cap and the rest is re-shared by speed; a rank whose share
would fall below one sample is held at 1).  Integers come from largest-remainder rounding of the
``x_i``, so every local batch is within 1 of its continuous share, within ``[1, cap_i]``, and the
sum is exact.  Ties are broken by rank, so the result is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def continuous_shares(global_batch: int, speeds: Sequence[float], caps: Sequence[int]) -> list[float]:
    """The real-valued split before rounding.

    Args:
        global_batch: samples per optimizer step over all ranks (>= number of ranks).
        speeds: relative speed per rank, all > 0.
        caps: maximum local batch per rank (memory), all >= 1; pass ``global_batch`` for none.

    Returns:
        ``x_i`` per rank, ``1 <= x_i <= cap_i``, summing to ``global_batch`` (up to float error).

    Raises:
        ValueError: empty input, mismatched lengths, a speed <= 0 or cap < 1, fewer samples than
            ranks, or caps summing below the global batch.
    """
    _validate(global_batch, speeds, caps)
    n = len(speeds)
    bounded = [min(int(c), global_batch) for c in caps]
    if global_batch == n:
        return [1.0] * n
    if sum(bounded) == global_batch:
        return [float(c) for c in bounded]
    lam = _water_level(global_batch, speeds, bounded)
    return [min(max(lam * s, 1.0), c) for s, c in zip(speeds, bounded)]


def split_global_batch(global_batch: int, speeds: Sequence[float], caps: Sequence[int]) -> list[int]:
    """Integer local batches: proportional to ``speeds``, within ``caps``, each >= 1, exact sum.

    Args:
        global_batch: samples per optimizer step over all ranks.
        speeds: relative speed per rank (> 0); equal speeds give an equal split.
        caps: maximum local batch per rank (>= 1); ``global_batch`` for uncapped.

    Returns:
        ``len(speeds)`` integers summing to ``global_batch``, each in ``[1, cap_i]`` and within 1 of
        the continuous share (:func:`continuous_shares`).

    Raises:
        ValueError: as :func:`continuous_shares`.
    """
    shares = continuous_shares(global_batch, speeds, caps)
    bounded = [min(int(c), global_batch) for c in caps]
    out = [min(max(int(math.floor(x + 1e-9)), 1), c) for x, c in zip(shares, bounded)]
    deficit = global_batch - sum(out)
    if deficit > 0:
        # equal remainders (shares equal in floating point, speeds 1 ulp apart): the faster first
        order = sorted(range(len(out)), key=lambda i: (-(shares[i] - out[i]), -speeds[i], i))
        while deficit > 0:
            for i in order:
                if deficit and out[i] < bounded[i]:
                    out[i] += 1
                    deficit -= 1
    elif deficit < 0:
        order = sorted(range(len(out)), key=lambda i: (-(out[i] - shares[i]), speeds[i], i))
        while deficit < 0:
            for i in order:
                if deficit and out[i] > 1:
                    out[i] -= 1
                    deficit += 1
    return out


def step_time(local_batches: Sequence[int], speeds: Sequence[float]) -> float:
    """Time of one synchronous step in units of "samples per unit speed": ``max(b_i / s_i)``."""
    return max(b / s for b, s in zip(local_batches, speeds))


def _water_level(global_batch: int, speeds: Sequence[float], caps: Sequence[int]) -> float:
    """The ``lam`` with ``sum(clamp(lam * s_i, 1, c_i)) == global_batch`` (piecewise-linear sweep)."""
    events = []
    for i, (s, c) in enumerate(zip(speeds, caps)):
        events.append((1.0 / s, 0, i))   # starts growing above 1
        events.append((c / s, 1, i))     # stops at its cap
    events.sort()
    base, slope = float(len(speeds)), 0.0  # f(lam) = base + lam * slope on the current segment
    for lam, kind, i in events:
        if slope > 0 and base + lam * slope >= global_batch:
            return (global_batch - base) / slope
        if kind == 0:
            base -= 1.0
            slope += speeds[i]
        else:
            base += caps[i]
            slope -= speeds[i]
    return events[-1][0]


def _validate(global_batch: int, speeds: Sequence[float], caps: Sequence[int]) -> None:
    if not speeds or len(speeds) != len(caps):
        raise ValueError(f"speeds and caps must be non-empty and of equal length, got "
                         f"{len(speeds)} and {len(caps)}")
    if any(not s > 0 for s in speeds):
        raise ValueError(f"speeds must all be > 0, got {list(speeds)}")
    if any(c < 1 for c in caps):
        raise ValueError(f"caps must all be >= 1, got {list(caps)}")
    if global_batch < len(speeds):
        raise ValueError(f"global batch {global_batch} is smaller than the {len(speeds)} ranks; "
                         "every rank needs at least 1 sample")
    if sum(min(int(c), global_batch) for c in caps) < global_batch:
        raise ValueError(f"global batch {global_batch} exceeds the sum of the memory caps "
                         f"{sum(caps)}")
