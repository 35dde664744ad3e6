"""Pipeline schedule names (issue 30): ``spec.training.pipeline.schedule`` values, shared by the
spec parser, the stage planner and the worker's stage runner (defined once here)."""

from __future__ import annotations

SCHEDULES: tuple[str, ...] = ("1F1B", "GPipe")
"""The schedules; the first is the default (1F1B holds fewer micro-batches' activations than
GPipe at the same bubble, ``(m + s - 1)`` slots per step for both)."""
