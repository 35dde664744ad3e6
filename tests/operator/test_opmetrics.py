"""Operator metrics: names from docs/internal-api.md, bounded labels."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from hetero_operator.controller.metrics import OperatorMetrics


def _value(m: OperatorMetrics, name: str, labels: dict[str, str] | None = None) -> float | None:
    return m.registry.get_sample_value(name, labels or {})


def test_series_names_and_values() -> None:
    m = OperatorMetrics()
    m.set_phases(["Running", "Running", "Pending", "Bogus"])
    m.record_plan("planned")
    m.record_plan("unschedulable")
    m.record_plan("unschedulable")
    m.restarts.inc()
    m.pods_created.inc(3)
    m.reconcile_duration.observe(0.02)
    assert _value(m, "htj_operator_jobs", {"phase": "Running"}) == 2
    assert _value(m, "htj_operator_jobs", {"phase": "Pending"}) == 1
    assert _value(m, "htj_operator_jobs", {"phase": "Failed"}) == 0
    assert _value(m, "htj_operator_plans_total", {"result": "planned"}) == 1
    assert _value(m, "htj_operator_plans_total", {"result": "unschedulable"}) == 2
    assert _value(m, "htj_operator_restarts_total") == 1
    assert _value(m, "htj_operator_pods_created_total") == 3
    assert _value(m, "htj_operator_reconcile_duration_seconds_count") == 1


def test_label_sets_are_bounded() -> None:
    m = OperatorMetrics()
    with pytest.raises(ValueError, match="result must be one of"):
        m.record_plan("maybe")
    text = generate_latest(m.registry).decode()
    phases = {line.split('phase="')[1].split('"')[0] for line in text.splitlines()
              if line.startswith("htj_operator_jobs{")}
    assert phases == {"Pending", "Created", "Running", "Restarting", "Succeeded", "Failed", "Suspended"}


def test_two_operators_in_one_process_do_not_clash() -> None:
    a, b = OperatorMetrics(), OperatorMetrics()
    a.restarts.inc()
    assert _value(b, "htj_operator_restarts_total") == 0
