"""Issue 32, F8: a checkpoint path on no volume that outlives the pods gets a Warning naming the path
and the fix, and the restart Events say where a restart continues
(:mod:`hetero_operator.lifecycle.ckptplace`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from hetero_operator.api.spec import RunPolicy, parse_job
from hetero_operator.lifecycle import ckptplace
from hetero_operator.lifecycle import decisions as lc

REPO = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000.0


def _job(checkpoint: dict[str, Any] | None, template: dict[str, Any] | None = None) -> Any:
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    if checkpoint is None:
        body["spec"]["training"].pop("checkpoint")
    else:
        body["spec"]["training"]["checkpoint"] = checkpoint
    if template is not None:
        body["spec"]["worker"]["template"] = template
    return parse_job(body)


def _mounted(volume: dict[str, Any], mount_path: str = "/ckpt") -> dict[str, Any]:
    return {"spec": {"volumes": [{"name": "store", **volume}],
                     "containers": [{"name": "worker", "volumeMounts": [{"name": "store", "mountPath": mount_path}]}]}}


def test_a_path_on_no_volume_gets_a_warning_naming_the_path_and_the_fix() -> None:
    job = _job({"path": "/ckpt/run1"})
    assert ckptplace.checkpoint_volume(job) == ""
    assert ckptplace.checkpoint_warning(job) == (
        "spec.training.checkpoint.path /ckpt/run1 is on no volume that outlives the pods (no "
        "spec.training.checkpoint.persistentVolumeClaim, and no PersistentVolumeClaim or CSI volume of "
        "spec.worker.template mounted there): the checkpoints are lost when the pods are deleted, so a "
        "restart starts again from step 0; set spec.training.checkpoint.persistentVolumeClaim, or mount "
        "one at /ckpt/run1.")
    assert ckptplace.restart_source(job).startswith("step 0 unless a checkpoint in /ckpt/run1 survived")


@pytest.mark.parametrize("job,where", [
    (lambda: _job({"path": "/ckpt", "persistentVolumeClaim": "ckpt"}), "PersistentVolumeClaim ckpt"),
    (lambda: _job({"path": "/ckpt/run1"}, _mounted({"persistentVolumeClaim": {"claimName": "shared"}})),
     "PersistentVolumeClaim shared (volume store at /ckpt)"),
    (lambda: _job({"path": "/ckpt"}, _mounted({"csi": {"driver": "s3.csi.aws.com"}})),
     "CSI volume store (s3.csi.aws.com) at /ckpt"),
], ids=["checkpoint claim", "template claim mounted above the path", "CSI volume"])
def test_a_path_on_a_volume_that_outlives_the_pods_gets_no_warning(job: Any, where: str) -> None:
    spec = job()
    assert ckptplace.checkpoint_volume(spec) == where and ckptplace.checkpoint_warning(spec) == ""
    assert ckptplace.restart_source(spec) == f"the last checkpoint in {spec.training.checkpoint_path} on {where}"


@pytest.mark.parametrize("template", [
    _mounted({"emptyDir": {}}), _mounted({"persistentVolumeClaim": {"claimName": "x"}}, "/ckpt-other")],
    ids=["emptyDir goes with the pod", "a mount beside the path, not above it"])
def test_a_volume_that_does_not_keep_the_path_still_warns(template: dict[str, Any]) -> None:
    assert ckptplace.checkpoint_warning(_job({"path": "/ckpt/run1"}, template)) != ""


def test_no_checkpoint_path_no_warning_and_restarts_say_step_0() -> None:
    job = _job(None)
    assert ckptplace.checkpoint_volume(job) is None and ckptplace.checkpoint_warning(job) == ""
    assert ckptplace.restart_source(job).startswith("step 0 (the job does not checkpoint")


def test_the_restart_messages_say_where_the_restart_continues() -> None:
    spec = _job({"path": "/ckpt", "persistentVolumeClaim": "ckpt"})
    source = ckptplace.restart_source(spec)
    failed = [lc.PodState(name="job-g0", first_rank=0, phase="Failed", node="node-a", attempt=1,
                          created_s=NOW - 50, failure="Error exit 1")]
    job = lc.JobState(phase="Running", attempt=1, start_s=NOW - 100, planned_pods=("job-g0",))
    d = lc.decide(job, RunPolicy(), failed, nodes=None, now_s=NOW, restart_from=source)
    assert d.reason == "RankFailed"
    assert "restarting all ranks from the last checkpoint in /ckpt on PersistentVolumeClaim ckpt (restart 1" in d.message
    evicted = [lc.PodState(name="job-g0", first_rank=0, phase="Failed", node="node-a", attempt=1,
                           created_s=NOW - 50, disruption="Evicted")]
    d = lc.decide(job, RunPolicy(), evicted, nodes=None, now_s=NOW, restart_from=source)
    assert d.reason == "PodEvicted"
    assert d.message.endswith("restart(s) used), continuing from the last checkpoint in /ckpt on "
                              "PersistentVolumeClaim ckpt.")
