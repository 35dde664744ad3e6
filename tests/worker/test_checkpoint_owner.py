"""A checkpoint belongs to its job (issue 33, item 1), with real Gloo rank processes
(tests/worker/resume_ranks.py) sharing one checkpoint directory, as jobs with a fixed
``spec.training.checkpoint.path`` do.

Job A (UID uid-a, name ``digits``) saves steps 2 and 4.  The same manifest re-applied (a new UID,
the same name) starts at step 0 and says whose checkpoints it passed over and which field to set;
its own restart resumes its own step 2, not A's newer step 4; a renamed copy starts at step 0 too,
and its retention keeps its own newest two without deleting the other jobs' checkpoints; a job that sets ``HTJ_RESUME_FROM`` (``spec.training.checkpoint.resumeFrom``) to A's UID resumes
A's step 4.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from rankproc import assert_ok, mixed_cluster_envs, run_ranks

from hetero_worker.ckpt import store
from hetero_worker.ckpt.ownership import ANY_JOB, Owner, ResumeFilter
from heterotrain_common.envnames import JOB_NAME, JOB_UID, RESTART_GENERATION, RESUME_FROM

HERE = Path(__file__).parent
SAMPLES = 108  # 6 steps of a global batch of 18


def phase(tmp_path: Path, name: str, *, uid: str, job: str, steps: int, every: int,
          generation: int = 0, resume_from: str = "") -> tuple[list[dict], str]:
    """One job's run on 2 ranks in ``tmp_path/ckpt``: every rank's report and rank 0's stderr."""
    out = tmp_path / name
    envs = mixed_cluster_envs([10, 8], checkpoint_dir=str(tmp_path / "ckpt"))
    for env in envs:
        env.update({JOB_UID: uid, JOB_NAME: job, RESTART_GENERATION: str(generation)})
        if resume_from:
            env[RESUME_FROM] = resume_from
    runs = run_ranks([sys.executable, str(HERE / "resume_ranks.py"), "--scenario", "coverage",
                      "--out", str(out), "--samples", str(SAMPLES), "--steps", str(steps),
                      "--checkpoint-every", str(every)], envs, timeout_s=120)
    assert_ok(runs)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)], runs[0].stderr


def owners(tmp_path: Path) -> list[tuple[int, str]]:
    """(step, job UID) of every checkpoint in the directory, newest first."""
    return [(c.step, Owner.from_manifest(c.manifest).job_uid)
            for c in store.candidates(tmp_path / "ckpt") if c.manifest is not None]


@pytest.mark.timeout(600)
def test_a_reapplied_or_renamed_job_never_resumes_another_jobs_checkpoint(tmp_path: Path) -> None:
    first, _ = phase(tmp_path, "a", uid="uid-a", job="digits", steps=4, every=2)
    assert [r["resumed"] for r in first] == [False, False]
    assert owners(tmp_path) == [(4, "uid-a"), (2, "uid-a")]

    again, said = phase(tmp_path, "b", uid="uid-b", job="digits", steps=2, every=2)
    assert [(r["resumed"], r["step"]) for r in again] == [(False, 2), (False, 2)]
    line = next(x for x in said.splitlines() if "checkpoint_not_resumed" in x)
    assert line.endswith(
        f"checkpoint_not_resumed: {tmp_path / 'ckpt'} holds 2 checkpoint(s) of other jobs, the "
        "newest (step 4) by job \"digits\" (UID uid-a); this is job \"digits\" (UID uid-b), a new "
        "job (a job re-applied under the same name gets a new UID), so it starts at step 0. To "
        "continue from them, set spec.training.checkpoint.resumeFrom: uid-a; to keep jobs apart, "
        "give each its own spec.training.checkpoint.path")
    assert owners(tmp_path) == [(4, "uid-a"), (2, "uid-b"), (2, "uid-a")]

    restarted, said = phase(tmp_path, "b1", uid="uid-b", job="digits", steps=3, every=0,
                            generation=1)
    assert [(r["resumed_step"], r["step"]) for r in restarted] == [(2, 3), (2, 3)]  # its own
    assert "checkpoint_not_resumed" not in said

    renamed, said = phase(tmp_path, "c", uid="uid-c", job="digits-copy", steps=6, every=2)
    assert [(r["resumed"], r["step"]) for r in renamed] == [(False, 6), (False, 6)]
    # its retention (keep 2) removed its own step 2 and none of the other jobs' checkpoints
    assert owners(tmp_path) == [(6, "uid-c"), (4, "uid-c"), (4, "uid-a"), (2, "uid-b"), (2, "uid-a")]
    assert ('holds 3 checkpoint(s) of other jobs, the newest (step 4) by job "digits" (UID '
            'uid-a); this is job "digits-copy" (UID uid-c)') in said
    assert "set spec.training.checkpoint.resumeFrom: digits;" in said  # another name: the name

    asked, said = phase(tmp_path, "d", uid="uid-d", job="digits", steps=5, every=0,
                        resume_from="uid-a")
    assert [(r["resumed_step"], r["step"]) for r in asked] == [(4, 5), (4, 5)]
    assert "checkpoint_not_resumed" not in said


def _candidate(uid: str, name: str, step: int) -> store.Candidate:
    manifest = {"job_uid": uid, "job_name": name, "restart_generation": 0}
    return store.Candidate(path=Path(f"/c/step-{step}"), step=step, checkpoint_id="x",
                           manifest=manifest)


def test_resume_filter_takes_its_own_the_named_jobs_or_any_with_anyjob() -> None:
    mine = Owner(job_uid="uid-b", job_name="digits")
    own, old, other = (_candidate("uid-b", "digits", 2), _candidate("uid-a", "digits", 4),
                       _candidate("uid-x", "lm", 9))
    legacy = store.Candidate(path=Path("/c"), step=None, checkpoint_id="", legacy=True)
    unreadable = store.Candidate(path=Path("/c/step-7"), step=7, checkpoint_id="y", error="bad")
    pick = {label: [c.step for c in (own, old, other, legacy, unreadable) if f.accepts(c)]
            for label, f in (("own", ResumeFilter(mine=mine)),
                             ("by uid", ResumeFilter(mine=mine, resume_from="uid-a")),
                             ("by name", ResumeFilter(mine=mine, resume_from="lm")),
                             ("any", ResumeFilter(mine=mine, resume_from=ANY_JOB)),
                             ("no uid", ResumeFilter(mine=Owner())))}
    assert pick == {"own": [2, 7], "by uid": [2, 4, 7], "by name": [2, 9, 7],
                    "any": [2, 4, 9, None, 7], "no uid": [2, 4, 9, None, 7]}
    assert ResumeFilter.from_env({JOB_UID: "u", JOB_NAME: "j", RESUME_FROM: "k"}) == ResumeFilter(
        mine=Owner(job_uid="u", job_name="j"), resume_from="k")
