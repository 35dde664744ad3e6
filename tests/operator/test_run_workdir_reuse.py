"""A new ``heterotrain run`` in a reused ``--workdir`` never resumes another run's checkpoints
(issue 33 item 1, docs/embedded.md): every run gets a run UID (``run.json``, given to the ranks as
``HTJ_JOB_UID``), so a renamed job, or the same job started again, starts at step 0 beside the
earlier run's checkpoints and says why; ``--resume`` keeps the run's UID and continues from its own.

Before: ``heterotrain run other.yaml --workdir runs/digits`` printed ``resumed at step 120 ... from
runs/digits/checkpoints/...`` (a finished run of another job), trained 12 steps, reported success.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hetero_operator.local import rundirs

RUN = [sys.executable, "-m", "hetero_operator.cli", "run"]


def _files(tmp_path: Path, repo_root: Path, name: str) -> Path:
    """digits renamed ``name``, a checkpoint every step, and a one-GPU cluster (one rank: fast)."""
    job = yaml.safe_load((repo_root / "examples" / "digits.yaml").read_text())
    job["metadata"]["name"] = name
    job["spec"]["training"]["checkpoint"]["intervalSteps"] = 1
    job["spec"]["gpus"]["minRanks"] = 1
    cluster = yaml.safe_load((repo_root / "examples" / "clusters" / "mixed.yaml").read_text())
    cluster["items"] = [n for n in cluster["items"] if n["metadata"]["name"] == "node-a100"]
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump(cluster))
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _run(repo_root: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*RUN, *args], cwd=repo_root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.timeout(240)
def test_a_new_run_in_a_reused_workdir_starts_at_step_0_and_resume_keeps_its_own(repo_root, tmp_path):
    work = tmp_path / "work"
    common = ("--nodes", str(tmp_path / "nodes.yaml"), "--metrics-port-base", "0", "--max-steps")
    first = _run(repo_root, tmp_path, str(_files(tmp_path, repo_root, "digits")), "--workdir",
                 str(work), *common, "2")
    assert "checkpoint_not_resumed" not in first.stdout  # an empty workdir: nothing to say
    first_uid = rundirs.read_run_uid(work)
    assert len(first_uid) == 36
    assert [p.name[:13] for p in sorted((work / "checkpoints").glob("step-*"))] == [
        "step-00000001", "step-00000002"]
    manifest = json.loads(next((work / "checkpoints").glob("step-00000002-*/MANIFEST.json"))
                          .read_text())
    assert manifest["job_uid"] == first_uid and manifest["job_name"] == "digits"

    # another job, same --workdir, no --resume: a new run, from step 0, and the run says why
    other = _run(repo_root, tmp_path, str(_files(tmp_path, repo_root, "other")), "--workdir",
                 str(work), *common, "3")
    said = " ".join(other.stdout.split())
    assert (f"checkpoint_not_resumed: {work}/checkpoints holds checkpoints of an earlier run; this "
            "is a new run (a new run UID), so it starts at step 0") in said
    assert "heterotrain run --resume RUNDIR" in said and "a fresh --workdir" in said
    assert "spec.training.checkpoint.resumeFrom" in said
    log = (work / "rank-0.log").read_text().rsplit("--- attempt", 1)[-1]
    assert "resumed at step" not in (other.stdout + log).lower()
    assert ("checkpoint_not_resumed: " in log and 'the newest (step 2) by job "digits"' in log
            and "set spec.training.checkpoint.resumeFrom: digits" in log)  # the worker's, too
    assert "Result: accuracy" in other.stdout and "steps 3" in other.stdout  # 3 steps, from 0
    other_uid = rundirs.read_run_uid(work)
    assert other_uid not in ("", first_uid)
    owners = {json.loads(m.read_text())["job_uid"]
              for m in (work / "checkpoints").glob("step-00000003-*/MANIFEST.json")}
    assert owners == {other_uid}  # its own step 3, beside digits' steps 1 and 2

    # --resume of that run continues from its own step 3. Made as after a failure on its second
    # attempt (restart generation 1) with one more step to go: no success recorded, run.json and
    # the manifest at generation 1, --max-steps 4 (a resume keeps the run's options)
    (work / rundirs.FINISHED_FILE).unlink()
    run_file = json.loads((work / rundirs.RUN_FILE).read_text())
    assert run_file[rundirs.GENERATION_KEY] == 0
    run_file["options"]["max_steps"], run_file[rundirs.GENERATION_KEY] = 4, 1
    (work / rundirs.RUN_FILE).write_text(json.dumps(run_file))
    step3 = next((work / "checkpoints").glob("step-00000003-*/MANIFEST.json"))
    step3.write_text(json.dumps({**json.loads(step3.read_text()), "restart_generation": 1}))
    again = _run(repo_root, tmp_path, "--resume", str(work))
    assert rundirs.read_run_uid(work) == other_uid
    assert f"Resumed at step 3 from the last checkpoint in {work}/checkpoints" in again.stdout
    assert "checkpoint_not_resumed" not in again.stdout and "superseded" not in again.stdout
    step4 = json.loads(next((work / "checkpoints").glob("step-00000004-*/MANIFEST.json"))
                       .read_text())  # the resumed attempt went on above generation 1
    assert (step4["job_uid"], step4["restart_generation"]) == (other_uid, 2)
    assert json.loads((work / rundirs.RUN_FILE).read_text())[rundirs.GENERATION_KEY] == 2
