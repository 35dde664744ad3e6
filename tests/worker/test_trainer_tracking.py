"""Experiment tracking chosen on the Trainer (issue 33, item 6): ``ht.init(tracking=...)`` with no
``spec.training.tracking`` writes MLflow runs per GPU type from two real Gloo ranks (A100 + V100):
rank 0 creates the experiment and its run once and broadcasts them, the V100's run is its child,
and the batch shares read back with MLflow's own client equal the split."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rankproc import assert_ok, mixed_cluster_envs, run_ranks

mlflow_client = pytest.importorskip("mlflow.tracking")

RANK_SCRIPT = """
import sys, torch
from hetero_worker import trainer as ht
t = ht.init(tracking={"mlflow": {"trackingUri": sys.argv[1], "experiment": "on-the-trainer"}})
model = t.wrap(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    x = torch.randn(t.local_batch, 4)
    t.step(opt, lambda m: m(x).pow(2).mean())
t.close()
"""


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_trainer_argument_writes_mlflow_runs_per_gpu_type(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    uri = (tmp_path / "mlruns").as_uri()
    envs = mixed_cluster_envs([6, 2])
    assert all("HTJ_TRACKING" not in e for e in envs)  # nothing in the contract: the Trainer's own
    runs = run_ranks([sys.executable, "-c", RANK_SCRIPT, uri], envs, timeout_s=150)
    assert_ok(runs)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # this reader's opt-in to the file store
    client = mlflow_client.MlflowClient(tracking_uri=uri)
    experiments = [e for e in client.search_experiments() if e.name == "on-the-trainer"]
    assert len(experiments) == 1  # created once, by rank 0
    by_rank = {r.data.tags["heterotrain.rank"]: r for r in
               client.search_runs([experiments[0].experiment_id])}
    assert set(by_rank) == {"0", "1"}
    assert by_rank["1"].data.tags["mlflow.parentRunId"] == by_rank["0"].info.run_id
    assert "mlflow.parentRunId" not in by_rank["0"].data.tags
    for rank, share in (("0", 6 / 8), ("1", 2 / 8)):
        run = by_rank[rank]
        tag = run.data.tags["heterotrain.gpu_tag"]
        history = client.get_metric_history(run.info.run_id, f"gpu_type/{tag}/batch_share")
        assert [(m.step, m.value) for m in history] == [(1, share), (2, share), (3, share)]
        assert run.info.status == "FINISHED"
    assert [m.value for m in client.get_metric_history(by_rank["0"].info.run_id,
                                                       "job/global_batch")] == [8.0] * 3
