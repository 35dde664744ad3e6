"""htj_job_efficiency_ratio reaches the job's status and the embedded run's final table."""

from __future__ import annotations

import io

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from rich.console import Console

from hetero_operator.controller.progress import parse_progress, progress_status
from hetero_operator.local.report import print_report, row_from_stats


def rank0_metrics(efficiency: float | None) -> str:
    reg = CollectorRegistry()
    labels = {"job": "j", "rank": "0", "group": "0", "gpu_product": "Tesla-T4"}
    for name, value in (("htj_steps_total", 40), ("htj_throughput_samples_per_second", 50.0),
                        ("htj_local_batch_size", 8), ("htj_loss", 0.5), ("htj_job_efficiency_ratio", efficiency)):
        if value is not None:
            Gauge(name, name, list(labels), registry=reg).labels(**labels).set(value)
    return generate_latest(reg).decode()


def test_status_progress_carries_rank0s_efficiency_as_a_decimal_string() -> None:
    progress = parse_progress(rank0_metrics(0.6543), global_batch=16)
    assert progress is not None and progress.efficiency == 0.6543
    status = progress_status(progress, now_s=0.0)
    assert (status["efficiency"], status["samplesPerSecond"], status["step"]) == ("0.654", "100.0", 40)
    assert "efficiency" not in progress_status(parse_progress(rank0_metrics(None), 16), now_s=0.0)


def test_final_table_prints_rank0s_efficiency() -> None:
    base = {"steps": 40, "samples": 320, "step_seconds": 8.0, "compute_seconds": 4.0,
            "comm_wait_seconds": 4.0, "local_batch": 8, "gpu_product": "Tesla-T4"}
    rows = [row_from_stats({**base, "rank": 0, "job_efficiency_ratio": 0.6543}),
            row_from_stats({**base, "rank": 1})]
    out = io.StringIO()
    print_report(Console(file=out, width=200), rows=rows, result=None, planned_speedup=1.0,
                 elapsed_s=9.0, exit_code=0)
    assert "Efficiency: 65.4% of the devices' standalone capacity" in out.getvalue()
