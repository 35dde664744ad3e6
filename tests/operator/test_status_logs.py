"""``heterotrain status`` and ``heterotrain logs`` on local runs (real ``heterotrain run``
processes) and the cluster side's reading of a job's status and its rank pods."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from builders import local_job
from waiting import wait_until

from hetero_operator.jobview import cluster
from hetero_operator.local import runstate, runview

CLI = [sys.executable, "-m", "hetero_operator.cli"]

# Rank program: 3 steps (WorkerMetrics, total 3, loss 0.25), a line per step; waits for $GO when
# set; rank 1 exits $FAIL when set; rank 0 writes the result.
PROGRAM = textwrap.dedent("""
    import os, sys, time
    from heterotrain_common.contract import parse_contract
    from hetero_worker.metrics import WorkerMetrics
    ct = parse_contract(os.environ)
    m = WorkerMetrics(ct)
    m.set_total_steps(3)
    for i in range(3):
        m.observe_step(0.01, 0.01, 0.0, ct.local_batch, 0.25)
        print(f"rank {ct.dist.rank} step {i + 1}", flush=True)
    m.flush()
    go = os.environ.get("GO")
    while go and not os.path.exists(go):
        time.sleep(0.05)  # sync-ok: the workload waits for the test's go file
    if ct.dist.rank == 1 and os.environ.get("FAIL"):
        print("rank 1: no such file: data/train.csv", file=sys.stderr, flush=True)
        sys.exit(int(os.environ["FAIL"]))
    print(f"rank {ct.dist.rank} done", flush=True)
    if ct.dist.rank == 0:
        from heterotrain_common.rundir import write_result
        write_result({"accuracy": 0.875})
""")


def _job(tmp_path: Path, *, env: dict[str, str] | None = None) -> Path:
    (tmp_path / "prog.py").write_text(PROGRAM)
    return local_job(tmp_path / "job.yaml", "tiny", ["python", str(tmp_path / "prog.py")], env=env)


def _cli(tmp_path: Path, *argv: str, timeout_s: float = 100) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=timeout_s)


def _run_args(job: Path) -> list[str]:
    return ["run", str(job), "--grace-s", "2", "--metrics-port-base", "0"]


@pytest.mark.timeout(120)
def test_status_and_logs_of_a_finished_run_by_directory_by_job_name_and_latest(tmp_path: Path) -> None:
    done = _cli(tmp_path, *_run_args(_job(tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr
    (workdir,) = (tmp_path / "runs").iterdir()
    rel = f"runs/{workdir.name}"
    expected = [
        f"Run       {rel}",
        "Job       tiny",
        "Plan      4 ranks on 3 nodes: 2x Tesla-T4, 1x NVIDIA-A100-SXM4-40GB, 1x Tesla-V100-SXM2-16GB; "
        "global batch 128",
        "State     Succeeded",
        "Progress  step 3 of 3, loss 0.2500",
        "Result    accuracy 0.875",
        f"Logs      {rel}/rank-<r>.log (heterotrain logs {rel} --rank R)",
    ]
    for argv in ([], ["tiny"], [rel]):
        shown = _cli(tmp_path, "status", *argv)
        assert (shown.returncode, shown.stdout.splitlines()) == (0, expected), shown.stderr
    logs = _cli(tmp_path, "logs", rel, "--rank", "1")
    assert logs.stdout.splitlines() == ["--- attempt 0 ---", "rank 1 step 1", "rank 1 step 2",
                                        "rank 1 step 3", "rank 1 done"]
    beyond = _cli(tmp_path, "logs", "--rank", "4")
    assert beyond.returncode == 1 and f"rank 4: the run in {rel} has ranks 0..3" in beyond.stderr


@pytest.mark.timeout(120)
def test_logs_follow_a_running_rank_until_the_run_ends(tmp_path: Path) -> None:
    go = tmp_path / "go"
    run = subprocess.Popen([*CLI, *_run_args(_job(tmp_path, env={"GO": str(go)}))], cwd=tmp_path,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        workdir = wait_until(lambda: next((tmp_path / "runs").glob("tiny-*"), None)
                             if (tmp_path / "runs").is_dir() else None, timeout_s=60, what="the run directory")
        wait_until(lambda: "rank 0 step 3" in (workdir / "rank-0.log").read_text()
                   if (workdir / "rank-0.log").exists() else False, timeout_s=60, what="rank 0's third step")
        shown = _cli(tmp_path, "status")
        assert f"State     Running (pid {run.pid})" in shown.stdout.splitlines()
        follow = subprocess.Popen([*CLI, "logs", "-f"], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
        go.touch()
        out, _ = follow.communicate(timeout=60)
        assert follow.returncode == 0
        assert out.splitlines() == ["--- attempt 0 ---", "rank 0 step 1", "rank 0 step 2", "rank 0 step 3",
                                    "rank 0 done"]
        assert run.wait(timeout=60) == 0
        assert runstate.read_state(workdir).state == runstate.SUCCEEDED
    finally:
        go.touch()
        if run.poll() is None:
            run.kill()
            run.wait()


@pytest.mark.timeout(120)
def test_a_failed_run_says_which_rank_failed_and_why(tmp_path: Path) -> None:
    done = _cli(tmp_path, *_run_args(_job(tmp_path, env={"FAIL": "2"})))
    assert done.returncode == 3, done.stdout + done.stderr
    shown = _cli(tmp_path, "status", "tiny")
    state = next(line for line in shown.stdout.splitlines() if line.startswith("State"))
    assert state.startswith("State     Failed, exit code 3: rank 1 exited with code 2")
    assert "no such file: data/train.csv" in state
    assert _cli(tmp_path, "logs", "tiny", "--rank", "1").stdout.splitlines()[-1] == \
        "rank 1: no such file: data/train.csv"


def test_nothing_to_show_is_one_line_naming_where_it_looked(tmp_path: Path) -> None:
    for argv in (["status"], ["logs"], ["status", "nosuchjob", "--kubeconfig", str(tmp_path / "none")]):
        shown = _cli(tmp_path, *argv, timeout_s=60)
        assert shown.returncode == 1 and len(shown.stderr.splitlines()) == 1, shown.stderr
    assert "no run under runs/" in _cli(tmp_path, "status").stderr


def test_follow_waits_a_bounded_time_for_a_missing_log(tmp_path: Path) -> None:
    now = [0.0]

    def sleep(s: float) -> None:
        now[0] += s
    with pytest.raises(FileNotFoundError, match="after 2 s"):
        list(runview.follow(tmp_path / "rank-0.log", running=lambda: True, wait_s=2, sleep=sleep,
                            clock=lambda: now[0]))
    assert 2.0 <= now[0] < 2.0 + 2 * runview.POLL_S
    with pytest.raises(FileNotFoundError):  # a run that ended: no wait at all
        list(runview.follow(tmp_path / "rank-0.log", running=lambda: False, wait_s=60, sleep=sleep))


def test_a_running_record_whose_process_is_gone_reads_ended(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / runstate.STATE_FILE).write_text(json.dumps({"state": "Running", "pid": dead.pid}))
    state = runstate.read_state(tmp_path)
    assert (state.state, state.running) == (runstate.GONE, False)
    assert f"its process {dead.pid} is gone" in state.reason
    assert runstate.read_state(tmp_path / "none", finished=True).state == runstate.SUCCEEDED


JOB = {
    "metadata": {"name": "digits", "namespace": "ml"},
    "status": {
        "conditions": [{"type": "Created", "status": "True", "message": "4 pods created"},
                       {"type": "Running", "status": "False"},
                       {"type": "Succeeded", "status": "True", "message": "all 4 ranks exited 0"}],
        "plan": {"worldSize": 4, "groups": [{"gpuType": "NVIDIA-A100-SXM4-40GB", "ranks": 1},
                                            {"gpuType": "Tesla-T4", "ranks": 2},
                                            {"gpuType": "Tesla-V100-SXM2-16GB", "ranks": 1}]},
        "progress": {"step": 120, "totalSteps": 120, "loss": "0.0412", "samplesPerSecond": "812.5"},
        "lastFailure": "digits-g1 (Tesla-T4) Error exit 2",
        "result": {"step": 120, "totalSteps": 120, "loss": "0.0412", "metrics": {"accuracy": "0.972"}},
    },
}


def test_cluster_status_names_state_plan_progress_and_last_failure() -> None:
    assert cluster.status_lines(JOB) == [
        "Job       ml/digits (on the cluster)",
        "State     Succeeded: all 4 ranks exited 0",
        "Plan      4 ranks in 3 pods: 2x Tesla-T4, 1x NVIDIA-A100-SXM4-40GB, 1x Tesla-V100-SXM2-16GB",
        "Progress  step 120 of 120, loss 0.0412, samples/s 812.5",
        "Result    accuracy 0.972, final loss 0.0412 at step 120",
        "Failure   digits-g1 (Tesla-T4) Error exit 2",
        "Logs      heterotrain logs digits -n ml --rank R",
    ]
    assert cluster.state_of({"status": {}}) == ("Unknown", "")
    assert cluster.result_text({"step": 7}) == "step 7"
    assert cluster.result_text({"loss": "1.5", "step": 7}) == "final loss 1.5 at step 7"
    assert cluster.result_text({}) == "none reported"


@pytest.mark.parametrize(("annotation", "rank", "hosts"), [
    ("3", 3, True), ("3", 2, False), ("2-5", 2, True), ("2-5", 5, True), ("2-5", 6, False), ("", 0, False)])
def test_a_pod_hosts_the_ranks_of_its_annotation(annotation: str, rank: int, hosts: bool) -> None:
    assert cluster.hosts_rank(annotation, rank) is hosts


def test_the_rank_pod_of_the_newest_attempt_is_chosen() -> None:
    class Core:
        def list_namespaced_pod(self, namespace: str, label_selector: str, _preload_content: bool):
            assert (namespace, label_selector) == ("ml", "heterotrain.io/job-name=digits")

            class Answer:
                data = json.dumps({"items": [
                    {"metadata": {"name": f"digits-g{g}-a{a}", "annotations": {"heterotrain.io/ranks": r},
                                  "labels": {"heterotrain.io/attempt": str(a)}}}
                    for g, r in ((0, "0"), (1, "1-2")) for a in (0, 1)]}).encode()
            return Answer()
    assert cluster.rank_pod(Core(), "ml", "digits", 2)["metadata"]["name"] == "digits-g1-a1"
    with pytest.raises(cluster.ClusterError, match="no pod of ml/digits hosts rank 3"):
        cluster.rank_pod(Core(), "ml", "digits", 3)


def test_a_finished_jobs_rank_whose_pod_clean_pod_policy_removed_says_so() -> None:
    class Core:
        def list_namespaced_pod(self, namespace: str, label_selector: str, _preload_content: bool):
            class Answer:  # the Succeeded job's rank-0 pod stays (Completed); the others were deleted
                data = json.dumps({"items": [
                    {"metadata": {"name": f"digits-g{g}-a0", "annotations": {"heterotrain.io/ranks": r}}}
                    for g, r in ((0, "0"), (1, "1"))]}).encode()
            return Answer()

    def job(state: str, **run_policy: str) -> dict:
        return {"metadata": {"namespace": "default", "name": "digits"}, "spec": {"runPolicy": run_policy},
                "status": {"conditions": [{"type": state, "status": "True"}], "plan": {"worldSize": 4}}}

    class Custom:
        def __init__(self, obj: dict) -> None:
            self.obj = obj

        def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str):
            assert (namespace, plural, name) == ("default", "heterotrainingjobs", "digits")
            return self.obj
    with pytest.raises(cluster.ClusterError) as caught:
        cluster.rank_pod(Core(), "default", "digits", 2, Custom(job("Succeeded")))
    assert str(caught.value) == (
        "rank 2 of default/digits has no pod any more: the job Succeeded and its "
        "spec.runPolicy.cleanPodPolicy (Running, the default) deleted the pods still running when it "
        "finished; to keep a finished job's pods and their logs, set spec.runPolicy.cleanPodPolicy: None")
    assert cluster.cleaned_rank_text(job("Failed", cleanPodPolicy="All"), 3) == (
        "rank 3 of default/digits has no pod any more: the job Failed and its spec.runPolicy.cleanPodPolicy "
        "(All) deleted every pod; to keep a finished job's pods and their logs, set "
        "spec.runPolicy.cleanPodPolicy: None")
    # not that case: a rank the plan does not have, a running job, pods kept: the old message
    for custom, rank in ((Custom(job("Succeeded")), 4), (Custom(job("Running")), 2),
                         (Custom(job("Succeeded", cleanPodPolicy="None")), 2), (None, 2)):
        with pytest.raises(cluster.ClusterError, match=f"no pod of default/digits hosts rank {rank} "):
            cluster.rank_pod(Core(), "default", "digits", rank, custom)


def test_a_cluster_job_without_a_namespace_is_looked_up_in_the_contexts(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "team",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "team", "context": {"cluster": "c", "user": "u", "namespace": "vision"}},
                     {"name": "other", "context": {"cluster": "c", "user": "u"}}]}))
    assert cluster.context_namespace(str(config)) == "vision"
    config.write_text(config.read_text().replace("current-context: team", "current-context: other"))
    assert cluster.context_namespace(str(config)) == "default"
