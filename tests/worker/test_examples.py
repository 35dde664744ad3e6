"""The built-in examples run end to end on a simulated mixed cluster (4 and 2 CPU ranks)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rankproc import assert_ok, mixed_cluster_envs, run_ranks


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_digits_reaches_95_percent_on_a100_v100_2xt4(tmp_path: Path) -> None:
    """Batches 32/16/8/8 (speeds 1, 0.5, 0.25, 0.25), 12 epochs of 1437 // 64 = 22 steps."""
    result_path = tmp_path / "result.json"
    runs = run_ranks([sys.executable, "-m", "hetero_worker.examples.digits",
                      "--result-json", str(result_path)],
                     mixed_cluster_envs([32, 16, 8, 8], precision="fp32"), timeout_s=200,
                     HTJ_RUN_DIR=str(tmp_path / "run"))
    assert_ok(runs)
    result = json.loads(result_path.read_text())
    assert result["accuracy"] >= 0.95
    assert result["steps"] == 12 * 22 and result["global_batch"] == 64
    assert [r["local_batch"] for r in result["per_rank"]] == [32, 16, 8, 8]
    assert [r["steps"] for r in result["per_rank"]] == [264] * 4
    assert [r["gpu_product"] for r in result["per_rank"]][2:] == ["Tesla-T4"] * 2
    assert all(r["samples_per_s"] > 0 and 0 <= r["wait_share"] < 1 for r in result["per_rank"])
    assert "held-out accuracy" in runs[0].stdout
    assert json.loads((tmp_path / "run" / "result.json").read_text())["accuracy"] >= 0.95


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_lm_on_stdlib_text_learns_with_bf16_and_fp16_ranks(tmp_path: Path) -> None:
    """Two ranks, 12 steps on 200 kB of stdlib source: held-out loss drops well below the
    uniform-byte loss ln(256) = 5.55 nats."""
    result_path = tmp_path / "lm.json"
    envs = mixed_cluster_envs([8, 4], precision="bf16")
    envs[1]["HTJ_PRECISION"] = "fp16"
    runs = run_ranks([sys.executable, "-m", "hetero_worker.examples.lm", "--max-steps", "12",
                      "--text-bytes", "200000", "--result-json", str(result_path)], envs,
                     timeout_s=150)
    assert_ok(runs)
    result = json.loads(result_path.read_text())
    assert result["steps"] == 12
    assert result["first_loss"] > 5.0 and result["val_loss"] < 4.0
