"""A real Prometheus server scrapes a real 2-rank run and answers PromQL for samples/s per rank."""

from __future__ import annotations

import pytest

from prom.workload import MetricsRun, rank_envs


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_prometheus_answers_samples_per_step_per_rank_of_a_real_two_rank_run(prometheus, tmp_path):
    """Instant counters, not rates: a ``rate()`` over a window a few scrapes wide is empty or
    noisy when a loaded machine delays scrapes (the old ``rate()[5s]`` over 1 s scrapes flaked).
    Within one scrape of one rank, ``htj_samples_total / htj_steps_total`` is exactly that rank's
    local batch, so the test waits for exactly that (a scrape that lands between the two
    increments of a step is simply followed by the next one)."""
    envs = rank_envs(job="prom-e2e", batches=[3, 5], products=["Tesla-T4", "NVIDIA-A100-SXM4-40GB"],
                     speeds=[0.25, 1.0], groups=[0, 1])
    per_step = ('sum by (rank, gpu_product) (htj_samples_total{job="prom-e2e"}) / '
                'sum by (rank, gpu_product) (htj_steps_total{job="prom-e2e"} > 0)')
    with MetricsRun(envs, tmp_path) as run:
        try:
            prometheus.set_targets(run.targets, {"namespace": "default"}, wait_s=90)
            per_rank = prometheus.wait_for(
                per_step, lambda r: prometheus.series_by(r, "rank") == {"0": 3.0, "1": 5.0}, timeout_s=60)
            steps = prometheus.wait_for('min(htj_steps_total{job="prom-e2e"}) >= 3', timeout_s=30)
            batches = prometheus.query('htj_local_batch_size{job="prom-e2e"}')
        except Exception as exc:
            raise AssertionError(f"{exc}\n{run.log_tails()}") from exc
        finally:
            outcome = run.finish()
        prometheus.set_targets([])
    assert outcome.exit_code == 0, run.log_tails()
    assert {(s["metric"]["rank"], s["metric"]["gpu_product"]) for s in per_rank} == {
        ("0", "Tesla-T4"), ("1", "NVIDIA-A100-SXM4-40GB")}
    # samples per step are in the ratio of the local batches (3:5), exactly
    per_step_by_rank = prometheus.series_by(per_rank, "rank")
    assert per_step_by_rank["1"] / per_step_by_rank["0"] == 5 / 3
    assert prometheus.series_by(batches, "rank") == {"0": 3.0, "1": 5.0}
    # honor_labels keeps the worker's own job label (not renamed to exported_job).
    assert {s["metric"]["job"] for s in batches} == {"prom-e2e"}
    assert {s["metric"]["namespace"] for s in batches} == {"default"}
    assert float(steps[0]["value"][1]) >= 3
