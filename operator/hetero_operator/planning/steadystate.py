"""A rank's figures over the steps after its first: what the planner learns from (pure; issue 30).

A run's first step holds its warm-up: the first collectives connect, the allocator grows, FSDP2
lays out its shards (0.46-0.86 s against about 0.19 s for a later step of ``lm-large`` under
``Group`` in bench_memory's runs of 7 Dec, their ``rank-<R>.json``). The throughput a prediction is checked against leaves it out
(``prediction.json``'s ``measured_steady_samples_per_s``), so what the next prediction is made
from leaves it out too: the learned speeds (:func:`hetero_operator.planning.profiles.
observations_from_stats`) and link rates (:mod:`hetero_operator.planning.linklearning`).

The worker keeps the first step apart in ``rank-<R>.json`` (``first_step_<figure>`` beside each
total, :class:`hetero_worker.metrics.WorkerMetrics`); statistics without it (an older worker)
give the whole run's figures.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from heterotrain_common.rundir import FIRST_STEP_KEYS


def steady(stats: Mapping[str, Any], key: str) -> tuple[float, float, int]:
    """``(samples, stats[key], steps)`` over the steps after the first, all three on one basis.

    Args:
        stats: one rank's statistics (``steps``, ``samples``, ``key`` and their first-step
            shares, :data:`FIRST_STEP_KEYS`).
        key: a total of :data:`FIRST_STEP_KEYS` (``compute_seconds``, ...).

    Returns:
        The figures less the first step's where the rank ran at least 2 steps and wrote the first
        step's samples and ``key``; else the whole run's.

    Raises:
        KeyError: ``key`` is not one of :data:`FIRST_STEP_KEYS`.
    """
    first_key = FIRST_STEP_KEYS[key]
    samples = float(stats.get("samples") or 0)
    value = float(stats.get(key) or 0)
    steps = int(stats.get("steps") or 0)
    first_samples = stats.get(FIRST_STEP_KEYS["samples"])
    first_value = stats.get(first_key)
    if steps < 2 or first_samples is None or first_value is None:
        return samples, value, steps
    return samples - float(first_samples), value - float(first_value), steps - 1
