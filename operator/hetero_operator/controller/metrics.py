"""Operator metrics (prometheus-client), names fixed in docs/internal-api.md.

Label sets are bounded: ``phase`` takes the seven phases, ``result`` two values.  Each
:class:`OperatorMetrics` owns its registry, so tests and two operators in one process do not clash.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from hetero_operator.api.conditions import PHASES

RESULTS = ("planned", "unschedulable")


class OperatorMetrics:
    """The operator's series.

    Attributes:
        registry: the prometheus-client registry the series live in.
        jobs: ``htj_operator_jobs{phase}``, jobs per phase (gauge).
        reconcile_duration: ``htj_operator_reconcile_duration_seconds`` (histogram).
        plans: ``htj_operator_plans_total{result}``.
        restarts: ``htj_operator_restarts_total``.
        pods_created: ``htj_operator_pods_created_total``.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.jobs = Gauge("htj_operator_jobs", "HeteroTrainingJobs by phase.", ["phase"],
                          registry=self.registry)
        self.reconcile_duration = Histogram(
            "htj_operator_reconcile_duration_seconds", "Time of one job reconcile.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=self.registry)
        self.plans = Counter("htj_operator_plans", "Placement attempts by result.", ["result"],
                             registry=self.registry)
        self.restarts = Counter("htj_operator_restarts", "Whole-job restarts after a rank failed.",
                                registry=self.registry)
        self.pods_created = Counter("htj_operator_pods_created", "Rank pods created.",
                                    registry=self.registry)
        for phase in PHASES:
            self.jobs.labels(phase=phase).set(0)
        for result in RESULTS:
            self.plans.labels(result=result)

    def set_phases(self, phases: Iterable[str]) -> None:
        """Set ``htj_operator_jobs`` from the phases of all known jobs (unknown ones ignored)."""
        counts = dict.fromkeys(PHASES, 0)
        for phase in phases:
            if phase in counts:
                counts[phase] += 1
        for phase, n in counts.items():
            self.jobs.labels(phase=phase).set(n)

    def record_plan(self, result: str) -> None:
        """Count one placement; ``result`` is ``planned`` or ``unschedulable``.

        Raises:
            ValueError: any other result (keeps the label set bounded).
        """
        if result not in RESULTS:
            raise ValueError(f"result must be one of {RESULTS}, got {result!r}")
        self.plans.labels(result=result).inc()

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Expose ``/metrics`` on ``port`` (0 = off)."""
        if port:
            start_http_server(port, addr=addr, registry=self.registry)
