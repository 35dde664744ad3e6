"""Rank 0 leaves the job's result in its termination message when it ends well (issue 33, item
4), with real Gloo rank processes (tests/worker/resume_ranks.py): the last step, planned steps and
loss that the operator writes into ``status.result`` and the final ``status.progress``; the other
ranks write nothing; no file, nothing written (outside a pod)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rankproc import assert_ok, mixed_cluster_envs, run_ranks

from heterotrain_common import termination

HERE = Path(__file__).parent


@pytest.mark.timeout(300)
def test_rank_0_records_its_last_step_and_loss_in_the_termination_message(tmp_path: Path) -> None:
    envs = mixed_cluster_envs([10, 8])
    logs = [tmp_path / f"termination-log-{r}" for r in range(2)]
    logs[0].write_text("")  # the kubelet creates the file; rank 1's pod has none here
    for env, log in zip(envs, logs, strict=True):
        env[termination.TERMINATION_LOG_ENV] = str(log)
    runs = run_ranks([sys.executable, str(HERE / "resume_ranks.py"), "--scenario", "coverage",
                      "--out", str(tmp_path / "out"), "--samples", "108", "--steps", "3"],
                     envs, timeout_s=120)
    assert_ok(runs)
    message = logs[0].read_text()
    written = json.loads(message)
    assert sorted(written) == [termination.MARKER, "loss", "step", "totalSteps"]
    assert written["step"] == 3 and isinstance(written["loss"], float)
    assert not logs[1].exists()
    assert termination.parse_result(message) == {k: written[k] for k in ("loss", "step", "totalSteps")}
