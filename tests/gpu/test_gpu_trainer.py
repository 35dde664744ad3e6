"""The real Trainer on a CUDA GPU with NCCL (skipped without CUDA; ``bench/gpu_check.sh`` runs them).

Several rank processes share the machine's one GPU, each in its own topology group: NCCL groups
of one, Gloo between the leaders and for the default group (the heterogeneous path on a single
card). One spawn per scenario (tests/gpu/gpu_ranks.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from hetero_worker.runtime.simulation import free_port, local_rank_envs  # noqa: E402
from heterotrain_common import contract as c  # noqa: E402

HERE = Path(__file__).parent
SCRIPT = HERE / "gpu_ranks.py"
PRODUCT = "GPU-under-test"


def rank_envs(batches: list[int], *, precision: str = "fp32", hierarchy: str = "group",
              checkpoint_dir: str = "", **extra: str) -> list[dict[str, str]]:
    """One topology group per rank on one node and one real (not simulated) GPU type."""
    entries = [c.RankEntry(rank=r, group=r, node="gpu-node", gpu_product=PRODUCT,
                           compute_capability="8.0", local_batch=b) for r, b in enumerate(batches)]
    profiles = [c.DeviceProfile(product=PRODUCT, compute_capability="8.0")] * len(batches)
    envs = local_rank_envs(entries=entries, profiles=profiles, precision=precision,
                           hierarchy=hierarchy, master_port=free_port(),
                           checkpoint_dir=checkpoint_dir)
    for env in envs:
        env.update(extra)
    return envs


def spawn(name: str, out: Path, envs: list[dict[str, str]], *, kill_at: int | None = None,
          timeout_s: float = 240, script: Path = SCRIPT) -> list[subprocess.CompletedProcess]:
    """Start one process per env running ``script`` (default gpu_ranks.py) and wait for all."""
    cmd = [sys.executable, str(script), name, str(out)]
    if kill_at is not None:
        cmd += ["--kill-at", str(kill_at)]
    base = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1",
            "HTJ_SIM_DELAY_PER_SAMPLE_S": "0"}
    procs = [subprocess.Popen(cmd, env={**base, **env}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for env in envs]
    deadline = time.monotonic() + timeout_s
    done = []
    for proc in procs:
        try:
            out_text, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            out_text, err = proc.communicate()
        done.append(subprocess.CompletedProcess(cmd, proc.returncode, out_text, err))
    return done


def run_ok(name: str, out: Path, envs: list[dict[str, str]], **kwargs) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    for rank, proc in enumerate(spawn(name, out, envs, **kwargs)):
        assert proc.returncode == 0, f"rank {rank} exit {proc.returncode}:\n{proc.stderr[-4000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(len(envs))]


def assert_rule_on_one_gpu(f: dict, world: int) -> None:
    """Default group Gloo, one NCCL group of one per rank, Gloo leaders; nothing else NCCL."""
    assert f["created"][0] == ["gloo", None]
    nccl = [ranks for backend, ranks in f["created"] if "nccl" in backend]
    assert sorted(nccl) == [[r] for r in range(world)]
    assert f["trainer_groups"] == [["nccl", [r]] for r in range(world)] + [["gloo", list(range(world))]]
    assert f["ddp_backend"] == "gloo"


def test_ranks_sharing_one_gpu_nccl_groups_of_one_match_one_process(tmp_path: Path) -> None:
    facts = run_ok("groups", tmp_path, rank_envs([5, 3, 8]))
    for f in facts:
        assert f["device"] == "cuda:0"
        assert_rule_on_one_gpu(f, 3)
        assert max(abs(a - b) for a, b in zip(f["params"], f["reference"])) <= 1e-5
        assert f["allocated"] > 0  # allocator metrics from the CUDA caching allocator
        assert all(r[2] for r in f["comm_ranks"]) and len({r[3] for r in f["comm_ranks"]}) == 1


def test_bf16_ranks_end_identical_and_learn(tmp_path: Path) -> None:
    facts = run_ok("bf16", tmp_path, rank_envs([4, 6], precision="bf16"))
    assert facts[0]["params"] == facts[1]["params"]
    assert facts[0]["losses"][-1] < facts[0]["losses"][0]
    assert "scale" not in facts[0]  # no scaler without an fp16 rank


def test_fp16_scaler_skips_on_every_rank_when_one_overflows(tmp_path: Path) -> None:
    facts = run_ok("fp16", tmp_path, rank_envs([4, 6], precision="fp16"))
    for f in facts:
        assert f["skipped"] == [False, False, True, False, False, False]
    assert facts[0]["params"] == facts[1]["params"] and facts[0]["scale"] == facts[1]["scale"]


def test_work_stealing_on_cuda_under_fp16_autocast_and_scaler(tmp_path: Path) -> None:
    facts = run_ok("steal", tmp_path, rank_envs([4, 8], precision="fp16"))
    for f in facts:
        assert f["total"] == [12, 12, 12]
    assert facts[0]["params"] == facts[1]["params"]
    taken = [sorted(facts[0]["taken"][s] + facts[1]["taken"][s]) for s in range(3)]
    assert taken == [[0, 1, 2, 3]] * 3  # every micro-batch exactly once per step


@pytest.mark.parametrize("mode", ["int8", "powersgd"])
def test_compression_on_cuda_tensors(tmp_path: Path, mode: str) -> None:
    facts = run_ok(mode, tmp_path, rank_envs([4, 6], HTJ_COMPRESSION=mode))
    assert facts[0]["params"] == facts[1]["params"]
    assert facts[0]["losses"][-1] < facts[0]["losses"][0]
    for f in facts:
        assert_rule_on_one_gpu(f, 2)
        assert f["codec_cuda_vs_cpu"] <= 1e-5


def test_kill_and_resume_equals_uninterrupted(tmp_path: Path) -> None:
    """Killed after step 3 (checkpoint at step 2), restarted: ends where an unbroken run ends."""
    ckpt, ref = tmp_path / "ckpt", tmp_path / "ref"
    ckpt.mkdir()
    ref.mkdir()
    killed = spawn("resume", tmp_path / "a", rank_envs([4, 6], checkpoint_dir=str(ckpt)), kill_at=3)
    assert [p.returncode for p in killed] == [17, 17]
    resumed = run_ok("resume", tmp_path / "b", rank_envs([4, 6], checkpoint_dir=str(ckpt)))
    unbroken = run_ok("resume", tmp_path / "c", rank_envs([4, 6], checkpoint_dir=str(ref)))
    assert resumed[0]["global_step"] == unbroken[0]["global_step"] == 6
    assert len(resumed[0]["losses"]) == 4  # steps 3..6 only
    for got, want in zip(resumed, unbroken):
        assert max(abs(a - b) for a, b in zip(got["params"], want["params"])) <= 1e-9
