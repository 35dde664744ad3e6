"""The learned cross-type link rate of ``Full`` sharding: what a run's collectives really moved
per second (pure; issue 30).

The step-time model (:mod:`hetero_operator.planning.steptime`) counts ``Full``'s cross-type bytes
per step exactly (two all-gathers and Gloo's reduce-scatter of padded slices per micro-batch) and
divides them by the configured link. What a link delivers to Gloo is less: each collective has a
cost of its own (a few milliseconds each on a loaded host), an all-gather reaches about 71 % of a
``tc``-shaped veth's rate (measured, docs/memory.md), a default of 10 Gbit/s says nothing of the
real link. A ``Full`` run therefore measures its rate: the model's bytes per step times the steps,
over the seconds its ranks spent inside the collectives, taking the rank that waited least (the
last to arrive at each collective waits only for the transfer; the others wait for it too).

The figure is a learned entry of the job's profile, ``gpu_type`` :data:`LEARNED_LINK` and
``precision`` the mode (``link/Full``), its ``samples_per_s`` field holding bytes per second
(as ``layout/<mode>`` holds a ratio): outliers are held as candidates and figures age out like
every learned speed (:mod:`hetero_operator.planning.profiles`). The next plan of the job uses it
for ``Full``'s cross-type seconds (:func:`learned_rates`).

Only ``Full`` is learned: its ranks spend their waiting inside the collectives the model counts.
Under ``None`` and ``Group`` the wait at the gradient reduction also holds the slower ranks'
compute and compression's own work, which the bytes do not describe.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from hetero_operator.planning.profiles import LearnedSpeed, MIN_STEPS, Observation

LEARNED_LINK = "link"
"""``gpu_type`` of the learned entries that hold a mode's cross-type rate, bytes/s."""
LEARNED_MODES = ("Full",)
"""The modes whose rate is learned (see the module docstring)."""


def observation(mode: str, *, step_cross_type_bytes: int | None,
                stats: Sequence[Mapping[str, Any]], unix_s: float | None = None, job: str = "",
                namespace: str = "") -> Observation | None:
    """The run's measured cross-type rate of ``mode``, or None where nothing fits to measure.

    Args:
        mode: the run's sharding mode; only :data:`LEARNED_MODES` are learned.
        step_cross_type_bytes: the plan's modelled cross-type bytes per step of ``mode``
            (``ModeOption.step_cross_type_bytes``).
        stats: every rank's statistics (``steps``, ``comm_wait_seconds``).
        unix_s / job / namespace: when and by whom it was measured.

    Returns:
        ``bytes per step x steps / the least comm_wait_seconds over the ranks``; None for another
        mode, no cross-type bytes, a rank with fewer than ``profiles.MIN_STEPS`` steps or no
        wait recorded.
    """
    if mode not in LEARNED_MODES or not step_cross_type_bytes or not stats:
        return None
    steps = [int(s.get("steps") or 0) for s in stats]
    waits = [float(s.get("comm_wait_seconds") or 0.0) for s in stats]
    if min(steps) < MIN_STEPS or min(waits) <= 0:
        return None
    rate = min(steps) * step_cross_type_bytes / min(waits)
    return Observation(gpu_type=LEARNED_LINK, precision=mode, samples_per_s=rate,
                       unix_s=time.time() if unix_s is None else unix_s, job=job,
                       namespace=namespace)


def learned_rates(learned: Mapping[tuple[str, str], Any]) -> dict[str, float]:
    """Mode -> its learned cross-type rate, bytes/s (the newest entry of each)."""
    out: dict[str, float] = {}
    for (gpu_type, mode), found in learned.items():
        if gpu_type != LEARNED_LINK or mode not in LEARNED_MODES or not found:
            continue
        entry = found if isinstance(found, LearnedSpeed) else found[-1]
        if entry.samples_per_s > 0:
            out[mode] = entry.samples_per_s
    return out
