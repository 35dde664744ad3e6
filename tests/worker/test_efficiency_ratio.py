"""``htj_job_efficiency_ratio``: the formula, and a real 2-rank run scraped by a real Prometheus."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_worker.metrics import job_efficiency_ratio
from hetero_worker.runtime.simulation import free_port, local_rank_envs, simulated_cluster

RANK = """
import os, sys, torch, torch.nn.functional as F
import torch.distributed as dist
from hetero_worker import trainer as ht
t = ht.init(seed=0)
model = t.wrap(torch.nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(t.local_batch, 4), torch.randn(t.local_batch, 2)
while True:
    t.step(opt, lambda m: F.mse_loss(m(x), y))
    stop = torch.tensor([float(os.path.exists(sys.argv[1]) or t.global_step >= 600)])
    dist.all_reduce(stop, op=dist.ReduceOp.MAX)
    if stop.item():
        break
print("steps", t.global_step, "efficiency", t.efficiency_ratio, flush=True)
t.close()
"""


def test_ratio_is_job_samples_per_second_over_summed_compute_only_throughput() -> None:
    # 100 samples in 1 s; rank 0 alone would do 30 / 0.25 = 120/s, rank 1 70 / 0.875 = 80/s.
    assert job_efficiency_ratio(1.0, [30, 70], [0.25, 0.875]) == pytest.approx(100 / 200)
    # A perfectly balanced job that never waits: compute time == wall time on every rank.
    assert job_efficiency_ratio(2.0, [10, 30], [2.0, 2.0]) == pytest.approx(1.0)
    assert job_efficiency_ratio(0.0, [10], [1.0]) is None
    assert job_efficiency_ratio(1.0, [0, 0], [1.0, 1.0]) is None
    assert job_efficiency_ratio(1.0, [5, 5], [1.0, 0.0]) is None


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_rank0_exports_the_efficiency_of_a_real_unbalanced_run(prometheus, tmp_path: Path) -> None:
    # Equal batches of 8 on speeds 1 and 0.5 at 10 ms/sample: rank 0 computes ~80 ms and then
    # waits for rank 1's ~160 ms, so well under 1 (2/3 without fixed costs). The gauge must agree
    # with the same ratio computed by Prometheus from the ranks' own counters over 10 s.
    entries, profiles = simulated_cluster(products=[("NVIDIA-A100-SXM4-40GB", "8.0", 1.0),
                                                    ("Tesla-T4", "7.5", 0.5)],
                                          nodes=["localhost"] * 2, local_batches=[8, 8])
    envs = local_rank_envs(entries=entries, profiles=profiles, hierarchy="flat",
                           master_port=free_port(), job_name="eff")
    ports = [free_port(), free_port()]
    stop = tmp_path / "stop"
    procs = []
    for env, port in zip(envs, ports, strict=True):
        full = {**os.environ, **env, "HTJ_METRICS_PORT": str(port), "OMP_NUM_THREADS": "1",
                "HTJ_SIM_DELAY_PER_SAMPLE_S": "0.01"}
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(stop)], env=full, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        prometheus.set_targets([f"127.0.0.1:{p}" for p in ports], {"namespace": "default"}, wait_s=90)
        series = prometheus.wait_for('htj_job_efficiency_ratio{job="eff"}',
                                     lambda r: len(r) == 1, timeout_s=60)
        # a 10 s window of scrapes that all lie after step 20 (past the start-up and DDP's
        # first-iteration bucket rebuild, which the counters would otherwise average in)
        prometheus.wait_for('min_over_time(htj_steps_total{job="eff"}[10s]) >= 20 and '
                            'count_over_time(htj_steps_total{job="eff"}[10s]) >= 9',
                            lambda r: len(r) == 2, timeout_s=60)
        series = prometheus.query('htj_job_efficiency_ratio{job="eff"}')
        # the gauge's 10-step windows averaged over the same 10 s as the counters' rates
        averaged = prometheus.query('avg_over_time(htj_job_efficiency_ratio{job="eff"}[10s])')
        rates = prometheus.query(
            'sum(rate(htj_samples_total{job="eff"}[10s])) / sum(rate(htj_samples_total{job="eff"}[10s])'
            ' / rate(htj_compute_seconds_total{job="eff"}[10s]))')
    finally:
        stop.touch()
        outs = [p.communicate(timeout=60)[0] for p in procs]
        prometheus.set_targets([])
    assert [p.returncode for p in procs] == [0, 0], outs
    assert series[0]["metric"]["rank"] == "0" and series[0]["metric"]["gpu_product"] == "NVIDIA-A100-SXM4-40GB"
    value = float(averaged[0]["value"][1])
    from_counters = float(rates[0]["value"][1])
    assert 0.4 < value < 0.9 and value == pytest.approx(from_counters, abs=0.08), (value, from_counters)
    assert "efficiency None" in outs[1]  # rank 1 never computes it
