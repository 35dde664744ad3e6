"""Operator error types and how kopf sees them.

:class:`SpecError` is permanent: the job fails with reason
``InvalidSpec`` and the field path.  :class:`InsufficientCapacity` is temporary: the job stays
``Pending`` and is retried.  Unexpected API errors propagate to kopf's own retry.
"""

from __future__ import annotations

__all__ = ["SpecError", "InsufficientCapacity", "ConfigError"]


class InsufficientCapacity(RuntimeError):
    """The minimum ranks cannot be placed now; retry after ``retry_s`` seconds.

    Attributes:
        message: the planner's one-line shortfall, e.g. ``"Tesla-T4: need 2, free 1"``.
        retry_s: seconds until the next attempt.
    """

    def __init__(self, message: str, retry_s: float) -> None:
        super().__init__(message)
        self.message = message
        self.retry_s = retry_s


class ConfigError(ValueError):
    """An operator setting (``HTJ_*`` variable or flag) is invalid; names the setting."""


class SpecError(ValueError):
    """A manifest field is missing or invalid.

    Attributes:
        path: dotted field path, e.g. ``"spec.training.globalBatchSize"``.
    """

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
