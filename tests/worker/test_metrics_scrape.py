"""Worker metrics: the families a scrape returns, their labels and values, and the device gauges."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import types
import urllib.request
from pathlib import Path

import pytest
from prom.workload import rank_envs
from prometheus_client.parser import text_string_to_metric_families

from hetero_worker.metrics import METRIC_NAMES, WorkerMetrics
from heterotrain_common import contract as c
from heterotrain_common import envnames, nvml, rundir

LABELS = {"job", "rank", "group", "gpu_product"}
DEVICE_FAMILIES = {"htj_gpu_utilization_ratio", "htj_gpu_memory_used_bytes",
                   "htj_gpu_memory_total_bytes", "htj_torch_memory_allocated_bytes",
                   "htj_torch_memory_reserved_bytes", "htj_torch_memory_fragmentation_ratio"}

# A worker process that takes its contract from the environment, serves metrics and records
# three steps; it prints "ready" and serves until its stdin closes.
WORKER = textwrap.dedent("""
    import os, sys
    from heterotrain_common.contract import parse_contract
    from hetero_worker.metrics import WorkerMetrics
    m = WorkerMetrics(parse_contract(os.environ))
    assert m.start_server(addr="127.0.0.1") == int(os.environ["HTJ_METRICS_PORT"])
    for step_s, compute_s, wait_s, loss in [(0.5, 0.4, 0.1, 2.0), (0.25, 0.2, 0.05, 1.5), (0.2, 0.15, 0.05, 1.25)]:
        m.observe_step(step_s, compute_s, wait_s, 5, loss)
    m.record_rebalance(); m.record_skipped_step(); m.add_inter_group_bytes(4096)
    print("ready", flush=True)
    sys.stdin.read()
""")


def _families(text: str) -> dict[str, object]:
    # prometheus_client's parser names counter families without "_total"; key by sample names.
    out: dict[str, object] = {}
    for fam in text_string_to_metric_families(text):
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        out[name] = fam
    return out


def _contract(*, simulated: bool, product: str = "NVIDIA-A100-SXM4-40GB", port: int = 0,
              local_rank: int = 1) -> c.Contract:
    env = rank_envs(job="unit", batches=[3, 5], products=["Tesla-T4", product], groups=[0, 1],
                    metrics_ports=[0, port])[1]
    env[envnames.DEVICE_PROFILE] = c.DeviceProfile(product=product, compute_capability="8.0",
                                            simulated=simulated).to_json()
    env[envnames.LOCAL_RANK] = str(local_rank)
    return c.parse_contract(env)


def _samples(m: WorkerMetrics, name: str) -> dict[str, float]:
    fams = _families(_exposition(m))
    return {s.name: s.value for s in fams[name].samples if not s.name.endswith("_created")}


def _exposition(m: WorkerMetrics) -> str:
    from prometheus_client import generate_latest
    return generate_latest(m.registry).decode()


@pytest.mark.timeout(60)
def test_scraping_a_worker_process_returns_every_family_with_exactly_the_bounded_labels(free_port):
    env = {**os.environ, **rank_envs(job="digits", batches=[3, 5], products=["Tesla-T4", "NVIDIA-A100-SXM4-40GB"],
                                     groups=[0, 1], metrics_ports=[0, free_port])[1]}
    proc = subprocess.Popen([sys.executable, "-c", WORKER], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        with urllib.request.urlopen(f"http://127.0.0.1:{free_port}/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        proc.stdin.close()
        proc.wait(timeout=20)
    families = _families(text)
    assert set(METRIC_NAMES) <= set(families)
    labels_seen = set()
    for name in METRIC_NAMES:
        for s in families[name].samples:
            labels_seen.add(tuple(sorted(s.labels.items())))
            assert set(s.labels) - {"le"} == LABELS, (s.name, s.labels)
    assert labels_seen and {dict(l)["rank"] for l in labels_seen} == {"1"}
    value = {s.name: s.value for n in METRIC_NAMES for s in families[n].samples
             if "le" not in s.labels and not s.name.endswith("_created")}
    assert value["htj_steps_total"] == 3
    assert value["htj_samples_total"] == 15
    assert value["htj_local_batch_size"] == 5
    assert value["htj_loss"] == 1.25
    assert value["htj_throughput_samples_per_second"] == pytest.approx(25.0)   # 5 / 0.2 s
    assert value["htj_compute_throughput_samples_per_second"] == pytest.approx(5 / 0.15)
    assert value["htj_compute_seconds_total"] == pytest.approx(0.75)
    assert value["htj_communication_wait_seconds_total"] == pytest.approx(0.2)
    assert value["htj_step_duration_seconds_count"] == 3
    assert value["htj_step_duration_seconds_sum"] == pytest.approx(0.95)
    assert (value["htj_rebalances_total"], value["htj_skipped_steps_total"],
            value["htj_inter_group_bytes_total"]) == (1, 1, 4096)
    one = next(s for s in families["htj_steps_total"].samples if s.name == "htj_steps_total")
    assert one.labels == {"job": "digits", "rank": "1", "group": "1",
                          "gpu_product": "NVIDIA-A100-SXM4-40GB"}
    buckets = {s.labels["le"]: s.value for s in families["htj_step_duration_seconds"].samples
               if s.name.endswith("_bucket")}
    assert (buckets["0.1"], buckets["0.25"], buckets["0.5"], buckets["+Inf"]) == (0, 2, 3, 3)
    # CPU-only, simulated device: the GPU families are declared but have no series.
    assert all(not families[n].samples for n in DEVICE_FAMILIES)


def test_metrics_port_zero_serves_nothing():
    m = WorkerMetrics(_contract(simulated=True, port=0))
    assert m.start_server() == 0 and m._server is None


class FakeNvml(types.SimpleNamespace):
    """The few pynvml calls we use, for one whole GPU (index 0, GPU-aaa) and one MIG slice."""

    def __init__(self) -> None:
        super().__init__(calls=[])

    def nvmlDeviceGetHandleByIndex(self, i):
        self.calls.append(("index", i))
        return f"idx{i}"

    def nvmlDeviceGetHandleByUUID(self, u):
        self.calls.append(("uuid", u))
        return u

    def nvmlDeviceGetMemoryInfo(self, h):
        gib = 1024 ** 3
        return types.SimpleNamespace(used=3 * gib, total=(5 if h.startswith("MIG") else 40) * gib)

    def nvmlDeviceGetUtilizationRates(self, h):
        if h.startswith("MIG"):
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return types.SimpleNamespace(gpu=37, memory=10)


@pytest.fixture
def fake_nvml():
    fake = FakeNvml()
    nvml.use_module(fake)
    yield fake
    nvml.use_module(None)


@pytest.mark.parametrize(
    ("visible", "local_rank", "expected"),
    [(None, 2, 2), ("", 1, 1), ("3", 1, 3), ("0,1,2,3", 2, 2), ("4,5", 1, 5),
     ("GPU-aaa", 0, "GPU-aaa"), ("MIG-bbb", 0, "MIG-bbb")],
    ids=["unset: nvml index = local rank", "empty: local rank", "one visible device: it",
         "several: entry local_rank", "several remapped: entry local_rank", "gpu uuid", "mig uuid"])
def test_nvml_target_follows_cuda_visible_devices(visible, local_rank, expected):
    assert nvml.nvml_target(visible, local_rank) == expected


def test_real_device_exports_nvml_utilisation_and_memory(fake_nvml, monkeypatch):
    m = WorkerMetrics(_contract(simulated=False, local_rank=1), environ={"CUDA_VISIBLE_DEVICES": "0,1"})
    m.update_device()
    gib = 1024 ** 3
    assert _samples(m, "htj_gpu_utilization_ratio") == {"htj_gpu_utilization_ratio": 0.37}
    assert _samples(m, "htj_gpu_memory_used_bytes") == {"htj_gpu_memory_used_bytes": 3 * gib}
    assert _samples(m, "htj_gpu_memory_total_bytes") == {"htj_gpu_memory_total_bytes": 40 * gib}
    assert fake_nvml.calls == [("index", 1)]
    # No CUDA here: the allocator families stay empty.
    assert _samples(m, "htj_torch_memory_reserved_bytes") == {}


def test_mig_slice_exports_memory_but_no_utilisation(fake_nvml):
    m = WorkerMetrics(_contract(simulated=False, product="NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", local_rank=0),
                      environ={"CUDA_VISIBLE_DEVICES": "MIG-bbb"})
    m.update_device()
    assert fake_nvml.calls == [("uuid", "MIG-bbb")]
    assert _samples(m, "htj_gpu_utilization_ratio") == {}
    assert _samples(m, "htj_gpu_memory_total_bytes") == {"htj_gpu_memory_total_bytes": 5 * 1024 ** 3}


def test_simulated_device_and_absent_driver_export_no_gpu_series(fake_nvml):
    simulated = WorkerMetrics(_contract(simulated=True))
    simulated.update_device()
    assert fake_nvml.calls == [] and _samples(simulated, "htj_gpu_memory_used_bytes") == {}
    nvml.use_module(None)  # back to the real pynvml: no driver on this machine
    if nvml.available():
        pytest.skip("a real NVIDIA driver is present")
    real = WorkerMetrics(_contract(simulated=False))
    real.update_device()  # must not raise
    assert _samples(real, "htj_gpu_memory_used_bytes") == {}
    assert nvml.list_gpus() == []


def test_allocator_fragmentation_from_a_fake_cuda(monkeypatch):
    fake_cuda = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                                      memory_allocated=lambda: 300, memory_reserved=lambda: 400)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=fake_cuda))
    nvml.use_module(types.SimpleNamespace())  # an NVML whose every call fails
    try:
        m = WorkerMetrics(_contract(simulated=False))
        m.update_device()
    finally:
        nvml.use_module(None)
    assert _samples(m, "htj_torch_memory_allocated_bytes") == {"htj_torch_memory_allocated_bytes": 300}
    assert _samples(m, "htj_torch_memory_reserved_bytes") == {"htj_torch_memory_reserved_bytes": 400}
    assert _samples(m, "htj_torch_memory_fragmentation_ratio") == {
        "htj_torch_memory_fragmentation_ratio": 0.25}


def test_run_dir_statistics_accumulate_and_result_is_written(tmp_path: Path):
    environ = {rundir.RUN_DIR: str(tmp_path)}
    m = WorkerMetrics(_contract(simulated=True), environ=environ)
    m.set_total_steps(4)
    m.observe_step(0.7, 0.3, 0.4, 5, 2.0)
    m.observe_stage_compute(0.2, 0.3, 0.05, 16)  # the first step's: warm-up, not counted
    m.observe_step(0.5, 0.4, 0.1, 5, 1.0)
    m.observe_stage_compute(0.1, 0.2, 0.01, 16)
    m.observe_step(0.5, 0.4, 0.1, 5, 1.0)
    m.observe_stage_compute(0.1, 0.25, 0.02, 16)
    m.record_skipped_step()
    m.flush()
    stats = json.loads((tmp_path / "rank-1.json").read_text())
    assert {k: stats[k] for k in ("rank", "group", "gpu_product", "steps", "samples", "total_steps",
                                  "skipped_steps", "local_batch", "loss", "simulated")} == {
        "rank": 1, "group": 1, "gpu_product": "NVIDIA-A100-SXM4-40GB", "steps": 3, "samples": 15,
        "total_steps": 4, "skipped_steps": 1, "local_batch": 5, "loss": 1.0, "simulated": True}
    assert math.isclose(stats["step_seconds"], 1.7) and math.isclose(stats["comm_wait_seconds"], 0.6)
    assert {k: v for k, v in stats.items() if k.startswith("first_step_")} == {
        "first_step_seconds": 0.7, "first_step_samples": 5, "first_step_compute_seconds": 0.3,
        "first_step_comm_wait_seconds": 0.4}
    assert stats["recomputes"] is False  # no Full sharding, no activation checkpointing
    assert {k: round(v, 9) for k, v in stats.items() if k.startswith("stage_")} == {
        "stage_forward_seconds": 0.2, "stage_backward_seconds": 0.45,
        "stage_optimizer_seconds": 0.03, "stage_samples": 32, "stage_steps": 2}
    assert rundir.write_result({"accuracy": 0.97}, environ) == tmp_path / "result.json"
    assert json.loads((tmp_path / "result.json").read_text()) == {"accuracy": 0.97}
    assert rundir.write_result({"accuracy": 0.97}, {}) is None
