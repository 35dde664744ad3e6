"""End to end (the operator in process, the fake API server, the local kubelet running the real
digits example): a checkpoint belongs to its job (issue 33, item 1).

A job re-applied under the same name (deleted and created again: a new UID) and a renamed copy
of the same manifest, with the same fixed checkpoint path, start at step 0 and say whose
checkpoints they passed over; a job that sets ``spec.training.checkpoint.resumeFrom`` resumes them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from k8s.fakeapi import HTJ  # noqa: E402
from k8s.harness import Cluster, load_nodes  # noqa: E402

from builders import digits_job, e2e_config  # noqa: E402

TRAIN_TIMEOUT_S = 150

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(600)]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    async with Cluster(tmp_path_factory.mktemp("cluster")) as cl:
        await cl.add_nodes(load_nodes())
        await cl.start_operator(e2e_config())
        yield cl


async def run_job(cluster: Cluster, tmp: Path, name: str, delay_s: str = "0",
                  **checkpoint: Any) -> tuple[dict[str, Any], str]:
    """Apply the digits job ``name`` (30 steps, checkpoints every 10 in ``tmp/shared``, simulated
    ``delay_s`` per sample), wait for it to finish; returns the job and rank 0's log."""
    body = digits_job(name, tmp, args=["--max-steps", "30", "--checkpoint-every", "10"],
                      gpus={"ranks": 4, "minRanks": 4},
                      training={"checkpoint": {"path": str(tmp / "shared"), "intervalSteps": 10,
                                               **checkpoint}})
    body["spec"]["worker"]["env"] = [{"name": "HTJ_SIM_DELAY_PER_SAMPLE_S", "value": delay_s}]
    await cluster.idle()
    await cluster.apply(body, namespace="owner")
    await cluster.wait_for(lambda: cluster.phase(name, "owner") in ("Succeeded", "Failed"),
                           TRAIN_TIMEOUT_S, f"owner/{name} to finish")
    job = cluster.job(name, "owner")
    assert cluster.kubelet is not None
    return job, cluster.kubelet.log("owner", f"{name}-g0")


async def delete_job(cluster: Cluster, name: str) -> None:
    await cluster.api.delete(HTJ, "owner", name)
    await cluster.wait_for(lambda: cluster.job(name, "owner") is None
                           and not [p for p in cluster.pods("owner")
                                    if p["metadata"]["name"].startswith(f"{name}-")],
                           60, f"owner/{name} and its pods gone")


async def test_reapplied_and_renamed_jobs_start_fresh_and_resume_from_resumes(
        cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("owner")
    first, log = await run_job(cluster, tmp, "digits")
    assert first["status"]["phase"] == "Succeeded", log[-3000:]
    first_uid = first["metadata"]["uid"]
    assert "resumed at step" not in log

    await delete_job(cluster, "digits")
    # the same manifest: a new job (running a few seconds, so that rank 0's metrics are read)
    again, log = await run_job(cluster, tmp, "digits", delay_s="0.004")
    assert again["status"]["phase"] == "Succeeded", log[-3000:]
    assert again["metadata"]["uid"] != first_uid
    said = log.rsplit("checkpoint_not_resumed: ", 1)[-1].splitlines()[0]
    assert said.startswith(f"{tmp / 'shared'} holds ")
    assert (f'the newest (step 30) by job "digits" (UID {first_uid}); this is job "digits" (UID '
            f'{again["metadata"]["uid"]}), a new job') in said
    assert said.endswith(f"set spec.training.checkpoint.resumeFrom: {first_uid}; to keep jobs "
                         "apart, give each its own spec.training.checkpoint.path")
    assert "resumed at step" not in log.rsplit("checkpoint_not_resumed", 1)[-1]
    await cluster.wait_for(lambda: any(e["reason"] == "CheckpointNotResumed"
                                       for e in cluster.events("digits", "owner")),
                           30, "the CheckpointNotResumed Event")
    event = next(e for e in cluster.events("digits", "owner") if e["reason"] == "CheckpointNotResumed")
    assert (event["type"], event["message"]) == ("Warning", (
        f"Started at step 0 beside 2 checkpoint(s) of another job in {tmp / 'shared'}: a job "
        "re-applied under its name or renamed is a new job and does not resume them. To continue "
        "from them, set spec.training.checkpoint.resumeFrom to that job's name or UID (rank 0's "
        "checkpoint_not_resumed log line names it); to keep jobs apart, give each its own "
        "spec.training.checkpoint.path."))

    renamed, log = await run_job(cluster, tmp, "digits-copy")
    assert renamed["status"]["phase"] == "Succeeded", log[-3000:]
    assert "checkpoint_not_resumed" in log and "resumed at step" not in log
    assert "set spec.training.checkpoint.resumeFrom: digits;" in log

    asked, log = await run_job(cluster, tmp, "digits-next", resumeFrom=first_uid)
    assert asked["status"]["phase"] == "Succeeded", log[-3000:]
    resumed = re.search(r"rank 0: resumed at step (\d+)", log)
    assert resumed and int(resumed.group(1)) == 30 and "checkpoint_not_resumed" not in log
