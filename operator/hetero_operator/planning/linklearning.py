"""The learned cross-type rates of ``Full`` and ``Group`` sharding: what a run's exchanges really
moved per second (pure; issue 30).

The step-time model (:mod:`hetero_operator.planning.steptime`) counts each mode's cross-type bytes
per step (``Full``: two all-gathers and Gloo's reduce-scatter of padded slices per micro-batch;
``Group``: one all-reduce of the gradients among the groups per step) and divides them by the
configured link. What a link delivers to Gloo is less: each collective has a cost of its own (a few
milliseconds each on a loaded host), an all-gather reaches about 71 % of a ``tc``-shaped veth's
rate (measured, docs/memory.md), a default of 10 Gbit/s says nothing of the real link. A run of
either mode therefore measures its rate: the model's bytes per step times the steps, over the
seconds its ranks spent inside the exchange, taking the rank that waited least (the last to arrive
at each collective waits only for the transfer; the others wait for it too).

* ``Full``: the wait is inside the per-block collectives the model counts.
* ``Group``: the wait is :class:`hetero_worker.memory.group.GroupShardSync`'s step-end exchange:
  the gather of each group's gradient sum inside the group (one collective per parameter), the
  leaders' all-reduce across types, the broadcast back. Only the middle one is the model's cross-
  type bytes, so the learned figure is an *effective* rate of the whole exchange (on
  bench_memory's lm-large, 3 ranks, 7 Dec: the least wait 24-43 ms a step after the first against
  1.5 ms for the bytes at 10 Gbit/s, the runs' ``rank-<R>.json``): right for the next plan of the same job, which is what it
  is kept for. FSDP2's gathers inside forward and backward are in the ranks' compute seconds,
  hence in their learned speeds. Where the run compressed (``spec.training.compression``), the
  leaders' codec work is in the wait, and in the rate, as it will be in the next run's.

The figure is a learned entry of the job's profile, ``gpu_type`` :data:`LEARNED_LINK` and
``precision`` the mode (``link/Full``, ``link/Group``), its ``samples_per_s`` field holding bytes
per second (as ``layout/<mode>`` holds a ratio): outliers are held as candidates and figures age
out like every learned speed (:mod:`hetero_operator.planning.profiles`). The next plan of the job
uses it for the mode's cross-type seconds (:func:`learned_rates`).

``None`` is not learned: its ranks reduce while backward still runs (DDP's communication hooks,
bucket by bucket), so the wait after backward is only the part of the exchange that backward did
not hide, not a figure the bytes per step can be divided by.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from hetero_operator.planning.profiles import LearnedSpeed, MIN_STEPS, Observation
from hetero_operator.planning.steadystate import steady

LEARNED_LINK = "link"
"""``gpu_type`` of the learned entries that hold a mode's cross-type rate, bytes/s."""
LEARNED_MODES = ("Full", "Group")
"""The modes whose rate is learned (see the module docstring)."""


def observation(mode: str, *, step_cross_type_bytes: int | None,
                stats: Sequence[Mapping[str, Any]], unix_s: float | None = None, job: str = "",
                namespace: str = "") -> Observation | None:
    """The run's measured cross-type rate of ``mode``, bytes/s, or None where nothing fits to
    measure.

    Args:
        mode: the run's sharding mode; only :data:`LEARNED_MODES` are learned.
        step_cross_type_bytes: the plan's modelled cross-type bytes per step of ``mode``
            (``ModeOption.step_cross_type_bytes``).
        stats: every rank's statistics (``steps``, ``comm_wait_seconds``; the steps after the
            first where the rank kept its first step apart, :mod:`.steadystate`).
        unix_s / job / namespace: when and by whom it was measured.

    Returns:
        ``bytes per step / the least comm_wait_seconds per step over the ranks``; None for another
        mode, no cross-type bytes, a rank with fewer than ``profiles.MIN_STEPS`` steps or no
        wait recorded.
    """
    if mode not in LEARNED_MODES or not step_cross_type_bytes or not stats:
        return None
    if min(int(s.get("steps") or 0) for s in stats) < MIN_STEPS:
        return None
    per_step_s = []
    for s in stats:
        _, wait_s, steps = steady(s, "comm_wait_seconds")
        per_step_s.append(wait_s / steps if wait_s > 0 else 0.0)
    if min(per_step_s) <= 0:
        return None
    rate = step_cross_type_bytes / min(per_step_s)
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
