"""Group sharding over a Gloo group with CUDA tensors is refused on the real GPU; Full sharding,
which stages its collectives through the CPU, trains there (issue 21, pytorch/pytorch#132471).

Two ranks share the machine's one GPU inside one topology group of a time-sliced type, so they
report the same physical GPU and the communicator rule gives their group Gloo.  Skipped without
CUDA; ``bench/gpu_check.sh`` runs the gpu tests.  The plan-time refusal and the rule itself are
tested without a GPU (tests/operator/test_sharding_gloo_cuda.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from hetero_worker.runtime.simulation import free_port, local_rank_envs  # noqa: E402
from heterotrain_common import contract as c  # noqa: E402

HERE = Path(__file__).parent
PRODUCT = "GPU-under-test-SHARED"


def run(tmp: Path, sharding: str) -> list[dict]:
    entries = [c.RankEntry(rank=r, group=0, node="gpu-node", gpu_product=PRODUCT,
                           compute_capability="8.0", local_batch=b) for r, b in enumerate([4, 8])]
    profiles = [c.DeviceProfile(product=PRODUCT, compute_capability="8.0")] * 2
    envs = local_rank_envs(entries=entries, profiles=profiles, precision="fp32", hierarchy="group",
                           master_port=free_port())
    base = {**os.environ, "OMP_NUM_THREADS": "2", "HTJ_SIM_DELAY_PER_SAMPLE_S": "0",
            "HTJ_SHARDING": sharding, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0")}
    procs = [subprocess.Popen([sys.executable, str(HERE / "sharding_gloo_ranks.py"), str(tmp)],
                              env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for env in envs]
    for rank, proc in enumerate(procs):
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, f"rank {rank} exit {proc.returncode}:\n{err[-4000:]}"
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]


def test_group_sharding_over_gloo_on_cuda_is_refused_before_any_fsdp2_collective(tmp_path: Path) -> None:
    facts = run(tmp_path, "group")
    for f in facts:
        assert f["device"] == "cuda:0" and f["intra_backend"] == "gloo"
        assert "would run FSDP2 over a Gloo group on CUDA" in f["refused"]
        assert "spec.training.sharding Full" in f["refused"]


def test_full_sharding_of_the_same_ranks_trains_on_the_gpu(tmp_path: Path) -> None:
    facts = run(tmp_path, "full")
    for f in facts:
        assert "refused" not in f and f["param_device"] == "cuda:0"
        assert f["losses"][-1] < f["losses"][0]
