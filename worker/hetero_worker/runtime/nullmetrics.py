"""The worker's metrics, or a stand-in that records nothing where ``prometheus-client`` is absent."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from heterotrain_common.contract import Contract


class NullMetrics:
    """Stands in for :class:`hetero_worker.metrics.WorkerMetrics`: every method does nothing."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def make_metrics(contract: Contract) -> Any:
    """:class:`~hetero_worker.metrics.WorkerMetrics` for ``contract``, or :class:`NullMetrics`
    when ``prometheus_client`` cannot be imported."""
    try:
        from hetero_worker.metrics import WorkerMetrics  # prometheus-client absent: no metrics
    except ImportError:
        return NullMetrics()
    return WorkerMetrics(contract)
