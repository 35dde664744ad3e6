"""Dynamic rebalancing: re-solve the per-rank split of a constant global batch from measured speeds.

Pure Python (no torch), so the solver is tested without processes.  Every rank measures its compute
time per step (forward + backward + simulated delay, *not* the wait in the gradient collective) and
its samples; :func:`pack_stats` lays them out as ``2 * world`` floats that ride in a collective the
step already does (the rank writes its own slot, zeros elsewhere, SUM gives everyone everything).
Each rank then runs the same deterministic :class:`Rebalancer` on the same numbers, so all ranks
agree on the new split without another round trip.

The solver (:meth:`Rebalancer.observe`):

1. time per sample per rank, smoothed with an exponential moving average;
2. re-solve every ``interval_steps`` steps, or early (at least ``interval_steps // 2`` steps after
   the last re-solve) when the predicted step time of the current split exceeds that of the best
   integer split by more than ``imbalance_threshold``. Both guards are hysteresis against noise:
   measured against the fractional ideal, a split of a few samples per rank is "imbalanced" by its
   rounding alone, and re-solving on every step lets per-step timing noise flip a sample back and
   forth (the LM example on a 2-core CPU: 8 changes in 40 steps at 20 % noise, up to 16; with the
   guards 4, at most 6; tests/worker/test_rebalance_hysteresis.py);
3. target = split proportional to speed (1 / time per sample), memory caps respected, largest
   remainder rounding, sum = global batch: :func:`heterotrain_common.split.split_batch`, the
   planner's own splitter;
4. move towards the target by at most ``max_change_fraction * global_batch`` samples per rank;
5. hysteresis: apply only if the predicted step time drops by more than ``min_gain``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from heterotrain_common.split import split_batch


@dataclass(frozen=True, kw_only=True, slots=True)
class RebalanceConfig:
    """Knobs of the rebalancer.

    Attributes:
        interval_steps: re-solve at least every this many steps (spec
            ``training.rebalance.intervalSteps``); 0 disables rebalancing.
        imbalance_threshold: re-solve early (see ``interval_steps // 2`` above) when the predicted
            step time / the best integer split's step time - 1 exceeds this (0.15 = 15 %).
        max_change_fraction: largest change of one rank's batch per re-solve, as a fraction of the
            global batch (bounded change).
        min_gain: hysteresis; a new split must cut the predicted step time by more than this
            fraction (0.05 = 5 %).
        ema_alpha: weight of the newest measurement in the moving average of time per sample.
        min_batch: smallest local batch a rank keeps (>= 1, so every rank stays in the step).
        warmup_steps: measurements of steps before this index are ignored (the first DDP
            iterations rebuild buckets with a collective inside forward, which the compute timer
            would charge to the fastest ranks).
    """

    interval_steps: int = 10
    imbalance_threshold: float = 0.15
    max_change_fraction: float = 0.25
    min_gain: float = 0.05
    ema_alpha: float = 0.5
    min_batch: int = 1
    warmup_steps: int = 2

    def __post_init__(self) -> None:
        if self.interval_steps < 0:
            raise ValueError(f"rebalance.interval_steps must be >= 0, got {self.interval_steps}")
        if not 0 < self.ema_alpha <= 1:
            raise ValueError(f"rebalance.ema_alpha must be in (0, 1], got {self.ema_alpha}")
        if not 0 < self.max_change_fraction <= 1:
            raise ValueError("rebalance.max_change_fraction must be in (0, 1], "
                             f"got {self.max_change_fraction}")
        if self.min_batch < 1:
            raise ValueError(f"rebalance.min_batch must be >= 1, got {self.min_batch}")


def bounded_step(current: Sequence[int], target: Sequence[int], max_change: int) -> list[int]:
    """Move from ``current`` towards ``target`` by at most ``max_change`` per rank, sum unchanged.

    Both splits must have the same sum.  Increases and decreases are clipped to ``max_change`` and
    then the larger side is trimmed (largest moves first) to match the smaller, so the result stays
    between ``current`` and ``target`` rank by rank and keeps the global batch.

    Raises:
        ValueError: the sums differ or ``max_change < 1``.
    """
    if sum(current) != sum(target):
        raise ValueError(f"splits must have equal sums: {list(current)} vs {list(target)}")
    if max_change < 1:
        raise ValueError(f"max_change must be >= 1, got {max_change}")
    delta = [max(-max_change, min(max_change, t - c)) for c, t in zip(current, target)]
    excess = sum(delta)
    sign = 1 if excess > 0 else -1
    while excess != 0:
        i = max(range(len(delta)), key=lambda j: (sign * delta[j], -j))
        delta[i] -= sign
        excess -= sign
    return [c + d for c, d in zip(current, delta)]


def step_time_s(split: Sequence[int], time_per_sample_s: Sequence[float]) -> float:
    """Predicted compute time of a step: the slowest rank's ``batch * time per sample``."""
    return max(b * t for b, t in zip(split, time_per_sample_s))


def pack_stats(rank: int, world: int, compute_s: float, samples: int) -> list[float]:
    """This rank's slot of the ``2 * world`` stats vector (zeros elsewhere; SUM-reduce to merge)."""
    out = [0.0] * (2 * world)
    out[2 * rank] = compute_s
    out[2 * rank + 1] = float(samples)
    return out


def unpack_stats(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """Inverse of the SUM of :func:`pack_stats` vectors: (compute seconds, samples) per rank."""
    return [float(v) for v in values[0::2]], [round(v) for v in values[1::2]]


@dataclass(kw_only=True)
class Rebalancer:
    """Deterministic split controller; every rank runs one on the same merged stats.

    Attributes:
        config: knobs.
        split: current local batch per rank (sum = global batch).
        caps: largest local batch per rank (memory), or None.
        time_per_sample_s: smoothed seconds per sample per rank (None until measured).
        last_solve_step: step of the last re-solve.
        history: ``(step, split)`` for every applied change.
    """

    config: RebalanceConfig
    split: list[int]
    caps: list[int] | None = None
    time_per_sample_s: list[float] | None = None
    last_solve_step: int = 0
    history: list[tuple[int, list[int]]] = field(default_factory=list)

    @property
    def global_batch(self) -> int:
        """Samples per step over all ranks (constant)."""
        return sum(self.split)

    def measure(self, compute_s: Sequence[float], samples: Sequence[int]) -> None:
        """Fold one step's per-rank compute seconds and samples into the moving average."""
        alpha = self.config.ema_alpha
        fresh = [c / s if s > 0 else None for c, s in zip(compute_s, samples)]
        if self.time_per_sample_s is None:
            if any(f is None or f <= 0 for f in fresh):
                return
            self.time_per_sample_s = [float(f) for f in fresh]  # type: ignore[arg-type]
            return
        self.time_per_sample_s = [old if f is None or f <= 0 else (1 - alpha) * old + alpha * f
                                  for old, f in zip(self.time_per_sample_s, fresh)]

    def imbalance(self) -> float:
        """Predicted step time of the current split over that of the best integer split (the
        speed-proportional target, caps respected), minus 1 (0 = as balanced as whole samples allow)."""
        if self.time_per_sample_s is None:
            return 0.0
        t = self.time_per_sample_s
        best = split_batch(self.global_batch, [1.0 / x for x in t], self.caps,
                           min_batch=self.config.min_batch)
        return step_time_s(self.split, t) / step_time_s(best, t) - 1.0

    def observe(self, step: int, compute_s: Sequence[float], samples: Sequence[int]) -> list[int] | None:
        """Measure one step and maybe re-solve.

        Args:
            step: index of the step just finished (increasing).
            compute_s: compute seconds per rank for that step (comm wait excluded).
            samples: samples each rank processed in that step.

        Returns:
            The new split when it changed (applies from the next step), else None.
        """
        if self.config.interval_steps == 0 or step < self.config.warmup_steps:
            return None
        self.measure(compute_s, samples)
        if self.time_per_sample_s is None:
            return None
        since = step - self.last_solve_step
        due = since >= self.config.interval_steps
        early = (since >= max(1, self.config.interval_steps // 2)
                 and self.imbalance() > self.config.imbalance_threshold)
        if not (due or early):
            return None
        self.last_solve_step = step
        candidate = self.propose()
        t = self.time_per_sample_s
        if candidate == self.split or step_time_s(candidate, t) >= (1 - self.config.min_gain) * step_time_s(self.split, t):
            return None
        self.split = candidate
        self.history.append((step, list(candidate)))
        return list(candidate)

    def propose(self) -> list[int]:
        """The bounded move towards the speed-proportional target (not applied)."""
        assert self.time_per_sample_s is not None
        speeds = [1.0 / t for t in self.time_per_sample_s]
        target = split_batch(self.global_batch, speeds, self.caps, min_batch=self.config.min_batch)
        max_change = max(1, round(self.config.max_change_fraction * self.global_batch))
        return bounded_step(self.split, target, max_change)

    def throughput_by_class(self, classes: Sequence[str]) -> dict[str, float]:
        """Measured samples/s of one device of each class (mean over its ranks), e.g. for status.

        Args:
            classes: device class per rank (GPU product), len == world size.
        """
        if self.time_per_sample_s is None:
            return {}
        per: dict[str, list[float]] = {}
        for cls, t in zip(classes, self.time_per_sample_s):
            per.setdefault(cls, []).append(1.0 / t)
        return {cls: sum(v) / len(v) for cls, v in per.items()}
