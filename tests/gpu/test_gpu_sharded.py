"""Group and Full sharding on a real CUDA GPU: fp16 with the agreed loss scaler, and a sharded
checkpoint round trip (issue 29, item 9). Skipped without CUDA; ``bench/gpu_check.sh`` runs them.

Two rank processes share the machine's one GPU, each in its own topology group (NCCL groups of
one, Gloo between the leaders; tests/gpu/test_gpu_trainer.py checks that rule): Group sharding is
FSDP2 inside each group and the one cross-group reduction, Full shards over every rank. One spawn
per run (tests/gpu/sharded_ranks.py). The same paths without a GPU: tests/worker/test_sharded_fp16.py,
tests/worker/test_sharded_checkpoint.py, tests/worker/test_feature_matrix.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300),
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from test_gpu_trainer import rank_envs, run_ok, spawn  # noqa: E402

SCRIPT = Path(__file__).parent / "sharded_ranks.py"


@pytest.mark.parametrize("sharding", ["group", "full"])
def test_sharded_fp16_skips_the_overflow_on_every_rank_and_learns(tmp_path: Path, sharding: str) -> None:
    facts = run_ok("fp16", tmp_path, rank_envs([4, 6], precision="fp16", HTJ_SHARDING=sharding),
                   script=SCRIPT)
    for f in facts:
        assert f["device"] == "cuda:0" and f["param_device"] == "cuda:0" and f["sharding"] == sharding
        assert f["skipped"] == [False, False, True, False, False, False]  # rank 1's inf, everywhere
        assert f["scale"] == 2.0 ** 15  # the default 2^16 halved once
        assert f["losses"][-1] < f["losses"][0]
    assert facts[0]["params"] == facts[1]["params"]


@pytest.mark.parametrize("sharding", ["group", "full"])
def test_sharded_checkpoint_round_trip_equals_uninterrupted(tmp_path: Path, sharding: str) -> None:
    """Killed after step 3 (sharded checkpoint at step 2), restarted: ends where an unbroken run ends."""
    ckpt, ref = tmp_path / "ckpt", tmp_path / "ref"
    ckpt.mkdir()
    ref.mkdir()

    def envs(directory: Path) -> list[dict[str, str]]:
        return rank_envs([4, 6], checkpoint_dir=str(directory), HTJ_SHARDING=sharding)

    killed = spawn("resume", tmp_path / "a", envs(ckpt), kill_at=3, script=SCRIPT)
    assert [p.returncode for p in killed] == [17, 17], [p.stderr[-2000:] for p in killed]
    resumed = run_ok("resume", tmp_path / "b", envs(ckpt), script=SCRIPT)
    unbroken = run_ok("resume", tmp_path / "c", envs(ref), script=SCRIPT)
    assert resumed[0]["global_step"] == unbroken[0]["global_step"] == 6
    assert len(resumed[0]["losses"]) == 4  # steps 3..6 only
    for got, want in zip(resumed, unbroken):
        assert max(abs(a - b) for a, b in zip(got["params"], want["params"])) <= 1e-9
