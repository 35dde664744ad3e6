"""On a real GPU: NVML and the CUDA allocator fill the device gauges (skipped without CUDA)."""

from __future__ import annotations

import pytest
from prom.workload import rank_envs

from hetero_worker.metrics import WorkerMetrics
from heterotrain_common import contract as c
from heterotrain_common import envnames

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _value(m: WorkerMetrics, name: str) -> float | None:
    return m.registry.get_sample_value(name, m.labels)


def test_real_gpu_exports_nvml_and_allocator_gauges():
    env = rank_envs(job="gpu", batches=[4], products=["gpu"],
                    metrics_ports=[0])[0]
    env[envnames.DEVICE_PROFILE] = c.DeviceProfile(product="gpu", compute_capability="8.0").to_json()
    m = WorkerMetrics(c.parse_contract(env), environ={})
    torch.cuda.set_device(0)
    block = torch.ones(1024, 1024, device="cuda")  # 4 MiB held by a tensor
    m.update_device()
    total, used = _value(m, "htj_gpu_memory_total_bytes"), _value(m, "htj_gpu_memory_used_bytes")
    assert total is not None and used is not None and 0 < used <= total
    util = _value(m, "htj_gpu_utilization_ratio")
    assert util is None or 0.0 <= util <= 1.0  # None on a MIG slice
    allocated = _value(m, "htj_torch_memory_allocated_bytes")
    reserved = _value(m, "htj_torch_memory_reserved_bytes")
    assert allocated >= block.numel() * 4 and reserved >= allocated
    assert _value(m, "htj_torch_memory_fragmentation_ratio") == pytest.approx(1 - allocated / reserved)
