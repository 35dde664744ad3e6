"""What a batch split costs: the step time of per-rank local batches at given speeds (pure).

The split itself (proportional to speed, within memory caps, at least one sample each, exact
integers) is :func:`heterotrain_common.split.split_batch`, the one splitter the planner, the
worker's rebalancer and the memory planner share.
"""

from __future__ import annotations

from collections.abc import Sequence


def step_time(local_batches: Sequence[int], speeds: Sequence[float]) -> float:
    """Time of one synchronous step in units of "samples per unit speed": ``max(b_i / s_i)``."""
    return max(b / s for b, s in zip(local_batches, speeds))
