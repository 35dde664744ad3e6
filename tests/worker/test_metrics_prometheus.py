"""A real Prometheus server scrapes a real 2-rank run and answers PromQL for samples/s per rank."""

from __future__ import annotations

import pytest

from prom.workload import MetricsRun, rank_envs


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_prometheus_answers_samples_per_second_per_rank_of_a_real_two_rank_run(prometheus, tmp_path):
    envs = rank_envs(job="prom-e2e", batches=[3, 5], products=["Tesla-T4", "NVIDIA-A100-SXM4-40GB"],
                     speeds=[0.25, 1.0], groups=[0, 1])
    with MetricsRun(envs, tmp_path) as run:
        try:
            prometheus.set_targets(run.targets, {"namespace": "default"}, wait_s=90)
            # Wait until the 5 s window holds 5 scrapes of each rank, then ask for samples/s.
            prometheus.wait_for('count_over_time(htj_samples_total{job="prom-e2e"}[5s]) >= 5',
                                lambda r: len(r) == 2, timeout_s=45)
            per_rank = prometheus.wait_for(
                'sum by (rank, gpu_product) (rate(htj_samples_total{job="prom-e2e"}[5s]))',
                lambda r: len(r) == 2 and all(float(s["value"][1]) > 0 for s in r), timeout_s=10)
            batches = prometheus.query('htj_local_batch_size{job="prom-e2e"}')
            steps = prometheus.wait_for(
                'min(htj_steps_total{job="prom-e2e"}) > 0', timeout_s=10)
        except Exception as exc:
            raise AssertionError(f"{exc}\n{run.log_tails()}") from exc
        finally:
            outcome = run.finish()
        prometheus.set_targets([])
    assert outcome.exit_code == 0, run.log_tails()
    assert {(s["metric"]["rank"], s["metric"]["gpu_product"]) for s in per_rank} == {
        ("0", "Tesla-T4"), ("1", "NVIDIA-A100-SXM4-40GB")}
    # Both ranks take the same steps, so samples/s are in the ratio of their local batches (3:5).
    rates = prometheus.series_by(per_rank, "rank")
    assert rates["1"] / rates["0"] == pytest.approx(5 / 3, rel=0.25)
    assert prometheus.series_by(batches, "rank") == {"0": 3.0, "1": 5.0}
    # honor_labels keeps the worker's own job label (not renamed to exported_job).
    assert {s["metric"]["job"] for s in batches} == {"prom-e2e"}
    assert {s["metric"]["namespace"] for s in batches} == {"default"}
    assert float(steps[0]["value"][1]) > 0
