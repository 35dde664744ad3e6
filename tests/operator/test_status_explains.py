"""Status that explains (issue 33, item 4), from pod objects as the kubelet and the scheduler
write them, through the pure lifecycle: a failing rank's last log lines in the job's message,
a deterministic start-up failure fails the job without using its restarts, the scheduler's
reason in a waiting job's message, rank 0's result and final progress in a succeeded job's status.
"""

from __future__ import annotations

from typing import Any

from hetero_operator.api.spec import RunPolicy
from hetero_operator.lifecycle import decisions as lc
from hetero_operator.lifecycle import startup
from hetero_operator.lifecycle import status as st
from heterotrain_common import rundir, termination

NOW = 1_800_000_000.0
TIMING = lc.RestartSettings(pending_timeout_s=300, backoff_base_s=10, backoff_max_s=300)
PODS = ("job-g0", "job-g1")
NOT_FOUND = ("python: can't open file '/workspace/trian.py': [Errno 2] No such file or directory\n"
             "heterotrain launch: local rank 0 exited 2; stopping the others\n")
CRASH = "\n".join(["Traceback (most recent call last):", '  File "/workspace/train.py", line 40',
                   "    loss = model(x)", "RuntimeError: CUDA error: an illegal memory access",
                   "heterotrain launch: local rank 0 exited 1; stopping the others", ""])


def pod(name: str, rank: int, phase: str, *, terminated: dict[str, Any] | None = None,
        conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A rank pod as the API returns it."""
    status: dict[str, Any] = {"phase": phase, "conditions": conditions or []}
    if terminated is not None:
        status["containerStatuses"] = [{"name": "worker", "state": {"terminated": terminated}}]
    return {"metadata": {"name": name, "creationTimestamp": "2027-01-15T08:00:00Z",
                         "labels": {"heterotrain.io/rank": str(rank), "heterotrain.io/attempt": "1"},
                         "annotations": {"heterotrain.io/gpu-type": "Tesla-T4"}},
            "spec": {"nodeName": "node-t4"}, "status": status}


def decide(pods: list[dict[str, Any]], phase: str = "Running", restarts: int = 0) -> lc.Decision:
    job = lc.JobState(phase=phase, attempt=1, start_s=NOW - 100, planned_pods=PODS, restarts=restarts)
    return lc.decide(job, RunPolicy(backoff_limit=3), [st.pod_state(p) for p in pods], nodes=None,
                     now_s=NOW, timing=TIMING)


def test_a_script_that_is_not_there_fails_the_job_at_once_naming_it_and_its_log() -> None:
    d = decide([pod("job-g0", 0, "Failed", terminated={"exitCode": 2, "reason": "Error", "message": NOT_FOUND}),
                pod("job-g1", 1, "Running")])
    assert (d.action, d.phase, d.reason, d.count_restart) == (lc.FAIL, "Failed", "StartupError", False)
    assert d.message == (
        "job-g0 (Tesla-T4) failed at start-up: the script /workspace/trian.py does not exist in the "
        "image; a restart would run the same command in the same image, so the job fails without "
        "using its restarts (spec.runPolicy.backoffLimit 3): fix spec.worker.command/args or the "
        "image, then re-create the job. Last log lines: python: can't open file "
        "'/workspace/trian.py': [Errno 2] No such file or directory | heterotrain launch: local "
        "rank 0 exited 2; stopping the others")
    status = st.decided_status({"restarts": 0}, d, [], generation=1, now_s=NOW)
    assert status["restarts"] == 0 and status["conditions"][-1]["reason"] == "StartupError"


def test_deterministic_start_up_errors_are_told_from_crashes() -> None:
    cases = {
        "/usr/bin/python: No module named hetero_worker.examples.digitz": 1,
        "Traceback ...\nModuleNotFoundError: No module named 'transformers'": 1,
        "Traceback ...\nImportError: cannot import name 'Trainer' from 'hetero_worker'": 1,
        '  File "train.py", line 3\n    def f(:\nSyntaxError: invalid syntax': 1,
        "heterotrain worker: invalid contract: HTJ_TOPOLOGY: not JSON": 2,
        "exec: trainer: not found": 127,
        CRASH: 1, "": 137, "Killed": 137,
        "ImportError: no C extension, using the Python fallback\n" + "step 1\n" * 6 + "Killed": 1,
    }
    said = [startup.startup_error({"exitCode": code, "message": m}) for m, code in cases.items()]
    assert said == [
        "module hetero_worker.examples.digitz is not in the image",
        "module transformers is not in the image",
        "an import fails: cannot import name 'Trainer' from 'hetero_worker'",
        "the script does not parse: SyntaxError: invalid syntax",
        "the worker refuses its environment: HTJ_TOPOLOGY: not JSON",
        "the command is not found in the image (exit 127)",
        "", "", "", ""]  # a crash; a kill; a kill; a crash after an early ImportError warning
    assert startup.startup_error({"exitCode": 128, "reason": "StartError",
                                  "message": "exec: \"trainer\": executable file not found"}) == (
        "the container runtime cannot start the command (StartError: exec: \"trainer\": "
        "executable file not found)")


def test_a_crash_restarts_the_gang_and_its_message_and_event_carry_the_last_log_lines() -> None:
    d = decide([pod("job-g0", 0, "Failed", terminated={"exitCode": 1, "reason": "Error", "message": CRASH}),
                pod("job-g1", 1, "Running")])
    assert (d.action, d.reason, d.count_restart) == (lc.RESTART, "RankFailed", True)
    assert d.message.endswith(
        " Last log lines of job-g0: Traceback (most recent call last): | File \"/workspace/train.py\", "
        "line 40 | loss = model(x) | RuntimeError: CUDA error: an illegal memory access | "
        "heterotrain launch: local rank 0 exited 1; stopping the others")
    assert d.message.startswith("job-g0 (Tesla-T4) failed: Error exit 1; ")
    status = st.decided_status({}, d, [], generation=1, now_s=NOW)
    assert status["lastFailure"] == "job-g0 (Tesla-T4) failed: Error exit 1"


def test_the_schedulers_reason_is_in_the_waiting_jobs_message() -> None:
    unschedulable = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                     "message": "0/3 nodes are available: persistentvolumeclaim \"ckpt\" not found. "
                                "preemption: 0/3 nodes are available: 3 Preemption is not helpful "
                                "for scheduling."}
    d = decide([pod("job-g0", 0, "Running"), pod("job-g1", 1, "Pending", conditions=[unschedulable])],
               phase="Created")
    assert (d.action, d.reason) == (lc.WAIT, "PodsPending")
    assert d.message == (
        "1 of 2 pod(s) are not running yet. The scheduler cannot place job-g1: 0/3 nodes are "
        "available: persistentvolumeclaim \"ckpt\" not found. preemption: 0/3 nodes are available: "
        "3 Preemption is not helpful for scheduling.")


def test_a_succeeded_job_writes_rank_0s_result_and_its_final_progress(tmp_path) -> None:
    log = tmp_path / "termination-log"
    log.write_text("")
    env = {termination.TERMINATION_LOG_ENV: str(log)}
    assert rundir.write_result({"accuracy": 0.9722, "steps": 132}, env) == log  # the script
    termination.record({"step": 132, "totalSteps": 132, "loss": 0.051234}, env)  # Trainer.close
    message = log.read_text()
    d = decide([pod("job-g0", 0, "Succeeded", terminated={"exitCode": 0, "reason": "Completed",
                                                        "message": message}),
                pod("job-g1", 1, "Succeeded", terminated={"exitCode": 0, "reason": "Completed"})])
    assert (d.action, d.reason) == (lc.SUCCEED, "JobSucceeded")
    assert d.message == "Rank 0 completed successfully at step 132 (loss 0.051234, accuracy 0.9722, steps 132)."
    before = {"progress": {"step": 37, "totalSteps": 132, "eta": "1m10s", "loss": "0.4100",
                           "samplesPerSecond": "812.0", "updateTime": "2027-01-15T08:01:00Z"}}
    states = [st.pod_state(p) for p in [pod("job-g0", 0, "Succeeded", terminated={
        "exitCode": 0, "reason": "Completed", "message": message})]]
    status = st.decided_status(before, d, states, generation=1, now_s=NOW)
    assert status["result"] == {"step": 132, "totalSteps": 132, "loss": "0.051234",
                                "metrics": {"accuracy": "0.9722", "steps": "132"}}
    assert status["progress"] == {"step": 132, "totalSteps": 132, "loss": "0.051234",
                                  "samplesPerSecond": "812.0", "updateTime": "2027-01-15T08:00:00Z"}


def test_nothing_is_written_outside_a_pod_and_a_log_tail_is_no_result(tmp_path) -> None:
    env = {termination.TERMINATION_LOG_ENV: str(tmp_path / "absent")}
    assert termination.record({"step": 1}, env) is None and not (tmp_path / "absent").exists()
    assert rundir.write_result({"accuracy": 1.0}, env) is None
    assert termination.parse_result(CRASH) is None and startup.result({"exitCode": 0}) is None


def test_a_job_where_no_rank_steps_shows_no_rate_and_a_finished_one_no_eta() -> None:
    """A queued, evicted or restarting job showed its last rate as if it ran (``kubectl get htj``:
    SAMPLES/S); a finished one its last eta."""
    progress = {"step": 37, "totalSteps": 132, "eta": "1m10s", "loss": "0.4100",
                "samplesPerSecond": "812.0", "updateTime": "2027-01-15T08:01:00Z"}
    shown = {}
    for phase, action in (("Suspended", lc.SUSPEND), ("Restarting", lc.RESTART), ("Pending", lc.WAIT),
                          ("Failed", lc.FAIL), ("Succeeded", lc.SUCCEED), ("Running", lc.RUNNING)):
        d = lc.Decision(action=action, phase=phase, reason="R", message="m.")
        shown[phase] = sorted(st.decided_status({"progress": dict(progress)}, d, [], generation=1,
                                                now_s=NOW)["progress"])
    kept = ["loss", "step", "totalSteps", "updateTime"]
    assert shown == {"Suspended": kept, "Restarting": kept, "Pending": kept,
                     "Failed": sorted([*kept, "samplesPerSecond"]),
                     "Succeeded": sorted([*kept, "samplesPerSecond"]),
                     "Running": sorted([*kept, "samplesPerSecond", "eta"])}
