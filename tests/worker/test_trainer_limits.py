"""``heterotrain run --max-steps/--epochs`` reach a Trainer script through the contract
(``HTJ_MAX_STEPS``, ``HTJ_EPOCHS``), and the progress display gets its total from the loader
(issue 22, points 3 and 8)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_worker.runtime.simulation import free_port, local_rank_envs, simulated_cluster

# A Trainer script without argparse: 64 samples, batch 8 -> 8 steps per epoch; it asks for 3
# epochs (24 steps) in its own code and never reads argv.
SCRIPT = """
import json, sys, torch, torch.nn.functional as F
from hetero_worker import trainer as ht
t = ht.init(seed=0)
model = t.wrap(torch.nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
epochs = t.epochs(3)
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 2))
loader = t.loader(data, epochs=epochs)
while t.epoch < epochs:
    for x, y in loader:
        t.step(opt, lambda m: F.mse_loss(m(x), y))
t.metrics.flush()
print(json.dumps({"steps": t.global_step, "epoch": t.epoch, "epochs": epochs, "argv": sys.argv[1:]}))
t.close()
"""


def _run_one_rank(tmp_path: Path, **knobs: str) -> tuple[dict[str, object], dict[str, object]]:
    entries, profiles = simulated_cluster(products=[("NVIDIA-A100-SXM4-40GB", "8.0", 1.0)],
                                          nodes=["localhost"], local_batches=[8])
    env = local_rank_envs(entries=entries, profiles=profiles, hierarchy="flat",
                          master_port=free_port(), job_name="limits")[0]
    full = {**os.environ, **env, "OMP_NUM_THREADS": "1", "HTJ_SIM_DELAY_PER_SAMPLE_S": "0",
            "HTJ_RUN_DIR": str(tmp_path), **knobs}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=full, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    stats = json.loads((tmp_path / "rank-0.json").read_text())
    return json.loads(done.stdout.strip().splitlines()[-1]), stats


@pytest.mark.timeout(150)
def test_max_steps_and_epochs_reach_a_trainer_script_through_the_environment(tmp_path):
    out, stats = _run_one_rank(tmp_path, HTJ_MAX_STEPS="5")
    # the loader stopped at step 5 and the script's own `while t.epoch < 3` loop ended
    assert out == {"steps": 5, "epoch": 3, "epochs": 3, "argv": []}
    assert stats["steps"] == 5 and stats["total_steps"] == 5
    out, stats = _run_one_rank(tmp_path, HTJ_EPOCHS="2")
    # HTJ_EPOCHS replaces the script's 3; the total is known from the sampler and the epochs
    assert out == {"steps": 16, "epoch": 2, "epochs": 2, "argv": []}
    assert stats["steps"] == 16 and stats["total_steps"] == 16
