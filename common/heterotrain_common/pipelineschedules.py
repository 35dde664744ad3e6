"""Pipeline schedule names (issue 30): ``spec.training.pipeline.schedule`` values, shared by the
spec parser, the stage planner and the worker's stage runner, and the forward's share of a block's
compute (defined once here)."""

from __future__ import annotations

SCHEDULES: tuple[str, ...] = ("1F1B", "GPipe")
"""The schedules; the first is the default (1F1B holds fewer micro-batches' activations than
GPipe at the same bubble, ``(m + s - 1)`` slots per step for both)."""
FORWARD_SHARE = 1.0 / 3.0
"""Share of a block's forward + backward compute spent in its forward (the backward costs about
twice the forward: Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"). The stage
planner splits a block's modelled compute so, a simulated device sleeps so
(``hetero_worker.stages.simdelay``), and the step-time model's recomputation counts one extra
forward of this share."""
