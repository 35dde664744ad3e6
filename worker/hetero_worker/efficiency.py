"""The job-efficiency window of a rank: samples and compute seconds of every rank over the last
:data:`EFFICIENCY_WINDOW_STEPS` steps, reduced to rank 0 asynchronously and exported there
(``htj_job_efficiency_ratio``, ``htj_job_prediction_ratio``)."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

EFFICIENCY_WINDOW_STEPS = 10
"""Every this many steps rank 0 learns each rank's samples and compute time of the window (one
reduce of ``2 * world_size`` float64 on the CPU/gloo group) and exports
``htj_job_efficiency_ratio`` (docs/metrics.md)."""


class EfficiencyWindow:
    """The Trainer's job-efficiency window, a part with its own state: every rank's samples and
    compute seconds reduced to rank 0 asynchronously.

    Args:
        rank: this rank.
        metrics: the rank's metrics (``set_job_efficiency``, ``set_job_prediction``).
        predicted_samples_per_s: the plan's prediction for the job (0: none).

    Attributes:
        ratio: rank 0: the last exported ``htj_job_efficiency_ratio`` (None before one).
    """

    def __init__(self, rank: int, metrics: Any, predicted_samples_per_s: float = 0.0) -> None:
        self.rank, self.metrics = rank, metrics
        self.predicted_samples_per_s = predicted_samples_per_s
        self.ratio: float | None = None
        self._window: dict[str, Any] = {"start": None, "samples": 0, "compute_s": 0.0}
        self._pending: tuple[Any, torch.Tensor, float] | None = None  # async reduce

    def begin_step(self, now_s: float) -> None:
        """A step starts at ``now_s`` (``perf_counter``): the first one opens the window."""
        if self._window["start"] is None:
            self._window["start"] = now_s

    def end_step(self, global_step: int, samples: int, compute_s: float) -> None:
        """Count a finished step (collective every :data:`EFFICIENCY_WINDOW_STEPS` steps, when
        ``global_step`` closes the window)."""
        self._window["samples"] += samples
        self._window["compute_s"] += compute_s
        if self._pending is not None:
            self.finish(wait=False)
        if global_step % EFFICIENCY_WINDOW_STEPS == 0:
            self.publish()

    def publish(self) -> None:
        """Close the efficiency window (collective: every rank calls it at the same step).

        Rank 0 gets every rank's samples and compute seconds of the window and exports
        ``samples of all ranks / rank 0's window wall time`` over ``sum_r samples_r / compute_r``
        (:func:`hetero_worker.metrics.job_efficiency_ratio`). The next window starts at this
        window's end, so anything between steps counts against the job. The reduce runs
        asynchronously (a blocking one stalled every rank for a collective's latency every 10
        steps); rank 0 exports at the first step boundary after it completed
        (:meth:`finish`), i.e. typically one step later.
        """
        end = time.perf_counter()
        window, self._window = self._window, {"start": end, "samples": 0, "compute_s": 0.0}
        if not dist.is_initialized() or window["start"] is None:
            return
        self.finish(wait=True)  # the previous window's (long done)
        world = dist.get_world_size()
        buf = torch.zeros(2 * world, dtype=torch.float64)  # CPU: the gloo side of the group
        buf[2 * self.rank] = window["samples"]
        buf[2 * self.rank + 1] = window["compute_s"]
        self._pending = (dist.reduce(buf, dst=0, async_op=True), buf, end - window["start"])

    def restart(self, rank: int) -> None:
        """Start a new window as ``rank`` (an elastic job's new generation): the window and a
        reduce in flight belonged to the old group."""
        self.rank = rank
        self._pending, self._window = None, {"start": None, "samples": 0, "compute_s": 0.0}

    def finish(self, *, wait: bool) -> None:
        """Export the pending window's ratio on rank 0 once its reduce completed (``wait``: block
        until it has); every rank drops its handle then."""
        if self._pending is None:
            return
        work, buf, wall_s = self._pending
        if not wait and not work.is_completed():
            return
        work.wait()
        self._pending = None
        if self.rank != 0:
            return
        try:
            from hetero_worker.metrics import job_efficiency_ratio
        except ImportError:  # no prometheus_client: no metrics at all
            return
        ratio = job_efficiency_ratio(wall_s, buf[0::2].tolist(), buf[1::2].tolist())
        if ratio is not None:
            self.ratio = ratio
            self.metrics.set_job_efficiency(ratio)
        if self.predicted_samples_per_s > 0 and wall_s > 0:  # htj_job_prediction_ratio
            self.metrics.set_job_prediction(self.predicted_samples_per_s,
                                            float(buf[0::2].sum()) / wall_s)
