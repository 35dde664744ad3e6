"""The README's main command, end to end: ``heterotrain run examples/digits.yaml``.

Four ranks on the simulated mixed cluster (1x A100, 1x V100, 2x T4) train the digits classifier;
the job must succeed and reach at least 95% held-out accuracy, every rank must take the same
number of steps with the planner's proportional split.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_readme_main_command_trains_digits_to_95_percent(repo_root, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "hetero_operator.cli", "run", "examples/digits.yaml",
         "--workdir", str(tmp_path)],
        cwd=repo_root, capture_output=True, text=True, timeout=220)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["accuracy"] >= 0.95, result
    stats = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(4)]
    assert [s["gpu_product"] for s in stats] == ["NVIDIA-A100-SXM4-40GB", "Tesla-V100-SXM2-16GB",
                                                 "Tesla-T4", "Tesla-T4"]
    batches = [s["local_batch"] for s in stats]
    assert sum(batches) == 128 and batches[0] > batches[1] > batches[2] == batches[3]
    assert len({s["steps"] for s in stats}) == 1 and stats[0]["steps"] == stats[0]["total_steps"]
    out = done.stdout
    assert "Plan for digits: 4 ranks" in out and "Result: accuracy" in out
    assert "Speed-up over an equal split" in out
    assert out.strip().splitlines()[-1] == "Job succeeded"  # the verdict is the last line
