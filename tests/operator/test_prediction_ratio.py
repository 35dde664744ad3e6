"""Predicted vs measured throughput: the plan's prediction reaches the ranks, rank 0's ratio
reaches the job's status."""

from __future__ import annotations

import pytest
from builders import make_job, make_node
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.controller.progress import parse_progress, progress_status
from hetero_operator.planning.plan import plan_job
from hetero_operator.render.env import render_rank_envs
from heterotrain_common import contract as c
from heterotrain_common import envnames

NODES = [make_node("node-a"), make_node("node-b", product="Tesla-T4", count=2, cc="7.5",
                                        memory_mib=15360, driver="570.124.06", runtime="12.8")]


def _envs(training: dict) -> list[dict[str, str]]:
    job = make_job(ranks=3, global_batch=64, training=training)
    plan = plan_job(job, build_inventory(NODES))
    return render_rank_envs(plan, job, master_addr="a", master_port=29500, simulated=True)


def test_an_absolute_prediction_reaches_every_rank() -> None:
    envs = _envs({"referenceSamplesPerSecond": 1000})
    assert {e[envnames.PREDICTED_SAMPLES_PER_S] for e in envs} == {"1333.333333"}  # rounded to 1e-6
    assert c.parse_contract(envs[0]).run.predicted_samples_per_s == pytest.approx(64 / 0.048)


def test_no_absolute_figure_no_prediction_variable() -> None:
    assert all(envnames.PREDICTED_SAMPLES_PER_S not in e for e in _envs({}))


def test_status_progress_carries_rank0s_prediction_ratio() -> None:
    reg = CollectorRegistry()
    labels = {"job": "j", "rank": "0", "group": "0", "gpu_product": "Tesla-T4"}
    for name, value in (("htj_steps_total", 40), ("htj_throughput_samples_per_second", 50.0),
                        ("htj_local_batch_size", 8), ("htj_job_prediction_ratio", 0.9137)):
        Gauge(name, name, list(labels), registry=reg).labels(**labels).set(value)
    progress = parse_progress(generate_latest(reg).decode(), global_batch=16)
    assert progress.prediction_ratio == 0.9137
    assert progress_status(progress, now_s=0.0)["predictionRatio"] == "0.914"


def test_rank0_exports_predicted_and_ratio() -> None:
    from hetero_worker.metrics import WorkerMetrics

    topo = (c.RankEntry(rank=0, group=0, node="n", gpu_product="Tesla-T4", compute_capability="7.5",
                        local_batch=4),)
    contract = c.Contract(
        dist=c.RankInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, master_addr="a",
                        master_port=1, job_name="j", group=0, group_rank=0, group_size=1),
        precision="fp16",
        comm=c.CommSettings(hierarchy="group"), device=c.DeviceProfile(product="Tesla-T4"),
        topology=topo, run=c.RunSettings(predicted_samples_per_s=800.0))
    metrics = WorkerMetrics(contract)
    metrics.set_job_prediction(800.0, 720.0)
    from prometheus_client import generate_latest as text
    values = {s.name: s.value for f in text_string_to_metric_families(text(metrics.registry).decode())
              for s in f.samples}
    assert values["htj_job_predicted_throughput_samples_per_second"] == 800.0
    assert values["htj_job_prediction_ratio"] == pytest.approx(0.9)
    assert metrics.stats()["job_prediction_ratio"] == pytest.approx(0.9)
