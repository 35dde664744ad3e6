"""Status that explains (issue 33, item 4) with the operator against the REAL API server,
scheduler and the local kubelet (which now writes termination messages: the container's file,
else with ``FallbackToLogsOnError`` its log's tail): a typo in the script path fails the job at
once naming the script, without a restart; a failing rank's last log lines are in the job's
message; a job that succeeds has rank 0's result and final progress in its status."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from builders import digits_job, script_job
from realcluster import RealCluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def cond(job: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in (job.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def test_a_script_path_typo_fails_at_once_naming_the_script(cluster: RealCluster, tmp_path: Path) -> None:
    ns = cluster.namespace("typo")
    body = digits_job("typo", tmp_path, args=[])
    body["spec"]["worker"]["command"] = ["python", str(tmp_path / "trian.py")]
    cluster.apply(body, ns)
    job = cluster.finished("typo", ns, 120)
    failed = cond(job, "Failed")
    assert (job["status"]["phase"], failed.get("reason")) == ("Failed", "StartupError"), job["status"]
    assert job["status"].get("restarts", 0) == 0 and job["status"]["attempt"] == 1
    assert f"failed at start-up: the script {tmp_path / 'trian.py'} does not exist in the image" in failed["message"]
    assert "Last log lines: " in failed["message"] and "can't open file" in failed["message"]
    events = {e["reason"]: e for e in
              cluster.core.list_namespaced_event(ns, field_selector="involvedObject.name=typo").items
              for e in [cluster.client.sanitize_for_serialization(e)]}
    assert events["StartupError"]["type"] == "Warning" and "trian.py" in events["StartupError"]["message"]


def test_a_crash_names_the_ranks_last_log_lines(cluster: RealCluster) -> None:
    ns = cluster.namespace("crashlog")
    code = ("import os, sys\n"
            "if os.environ['RANK'] == '3':\n"
            "    print('loading shard 7 of the dataset', flush=True)\n"
            "    raise RuntimeError('shard 7 is corrupt')\n"
            "import time; time.sleep(60)  # sync-ok: the others wait to be stopped\n")
    cluster.apply(script_job("crashlog", code, runPolicy={"backoffLimit": 0}), ns)
    job = cluster.finished("crashlog", ns, 120)
    message = cond(job, "Failed")["message"]
    assert job["status"]["phase"] == "Failed" and cond(job, "Failed")["reason"] == "BackoffLimitExceeded"
    assert message.startswith("crashlog-g2 (Tesla-T4) failed: Error exit 1; "), message
    assert "Last log lines of crashlog-g2: " in message and "RuntimeError: shard 7 is corrupt" in message


def test_a_succeeded_job_has_rank_0s_result_and_final_progress(cluster: RealCluster, tmp_path: Path) -> None:
    ns = cluster.namespace("result")
    cluster.apply(digits_job("digits", tmp_path, args=["--max-steps", "12"]), ns)
    job = cluster.finished("digits", ns)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    result = status["result"]
    assert (result["step"], sorted(result)) == (12, ["loss", "metrics", "step", "totalSteps"])
    assert 0.0 <= float(result["metrics"]["accuracy"]) <= 1.0 and result["metrics"]["steps"] == "12"
    assert status["progress"]["step"] == 12 and status["progress"]["loss"] == result["loss"]
    assert "eta" not in status["progress"]
    assert cond(job, "Succeeded")["message"].startswith(
        f"Rank 0 completed successfully at step 12 (loss {result['loss']}, accuracy ")


def test_the_schedulers_reason_is_in_the_waiting_jobs_message(cluster: RealCluster, tmp_path: Path) -> None:
    """The issue's missing PVC: the real scheduler's FailedScheduling word was only on the pods'
    Events; the job said "3 of 3 pods are not running yet"."""
    ns = cluster.namespace("nopvc")
    body = digits_job("nopvc", tmp_path, args=[])
    body["spec"]["training"]["checkpoint"] = {"path": "/checkpoints", "persistentVolumeClaim": "digits-ckpt"}
    cluster.apply(body, ns)
    job = cluster.wait_for(lambda: (cluster.job("nopvc", ns) or {}).get("status", {}).get("message", "")
                           .count("The scheduler cannot place") and cluster.job("nopvc", ns), 90,
                           "the scheduler's reason in the job's message")
    message = job["status"]["message"]
    assert job["status"]["phase"] == "Created" and cond(job, "Created")["reason"] == "PodsPending"
    assert 'persistentvolumeclaim "digits-ckpt" not found' in message, message
    cluster.custom.delete_namespaced_custom_object("heterotrain.io", "v1alpha1", ns, "heterotrainingjobs", "nopvc")
    # the pods never scheduled: take them with the job, so the next test finds an idle cluster
    cluster.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
    cluster.wait_for(lambda: not cluster.core.list_namespaced_pod(ns).items, 60, f"the pods of {ns} gone")
