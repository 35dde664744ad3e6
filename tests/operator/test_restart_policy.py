"""The one restart policy (:mod:`hetero_operator.lifecycle.restart`), one table of cases, held
against both entry points: the operator's :func:`~hetero_operator.lifecycle.decisions.decide` and
``heterotrain run``'s :func:`~hetero_operator.local.supervise.supervise`."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

import pytest
from builders import make_job
from rich.console import Console

from hetero_operator.api.spec import RunPolicy
from hetero_operator.lifecycle import decisions as lc
from hetero_operator.lifecycle import restart
from hetero_operator.local import supervise as sup
from heterotrain_common import procs

NOW = 1_800_000_000.0
BASE_S, MAX_S = 10.0, 300.0
STEP0 = "step 0 (the job does not checkpoint: spec.training.checkpoint.path is not set)"

# (restarts so far, backoffLimit, checkpointing, a checkpoint saved (run can look) ->
#  restart?, delay, where the operator restarts from, where `heterotrain run` restarts from)
CASES = [
    (0, 2, True, True, True, 10.0, "the last checkpoint", "the last checkpoint"),
    (1, 2, True, True, True, 20.0, "the last checkpoint", "the last checkpoint"),
    (0, 3, True, False, True, 10.0, "the last checkpoint", "the start (no checkpoint saved yet)"),
    (0, 2, False, False, True, 10.0, STEP0, STEP0),
    (1, 2, False, False, True, 20.0, STEP0, STEP0),
    (6, 9, True, True, True, 300.0, "the last checkpoint", "the last checkpoint"),
    (2, 2, True, True, False, 0.0, "", ""),
    (0, 0, False, False, False, 0.0, "", ""),
]
IDS = [
    "a first failure restarts from the last checkpoint after the base backoff",
    "the second restart waits twice as long",
    "checkpointing with nothing saved yet restarts from the start (run can tell, the operator cannot)",
    "a job that does not checkpoint restarts from step 0 and says so",
    "without checkpointing the backoff doubles too",
    "the backoff is capped",
    "past backoffLimit the job fails",
    "backoffLimit 0 fails at the first failure, checkpoint or not",
]


@pytest.mark.parametrize(("restarts", "limit", "ckpt", "saved", "again", "delay", "op_source", "run_source"),
                         CASES, ids=IDS)
def test_the_policy(restarts: int, limit: int, ckpt: bool, saved: bool, again: bool, delay: float,
                    op_source: str, run_source: str) -> None:
    verdict = restart.after_failure(restarts=restarts, backoff_limit=limit, checkpointing=ckpt,
                                    checkpoint_saved=saved, base_s=BASE_S, max_s=MAX_S)
    assert (verdict.restart, verdict.delay_s, verdict.source) == (again, delay, run_source)
    assert verdict.reason == ("RankFailed" if again else "BackoffLimitExceeded")


@pytest.mark.parametrize(("restarts", "limit", "ckpt", "saved", "again", "delay", "op_source", "run_source"),
                         CASES, ids=IDS)
def test_the_operator(restarts: int, limit: int, ckpt: bool, saved: bool, again: bool, delay: float,
                      op_source: str, run_source: str) -> None:
    pods = [lc.PodState(name=f"job-g{i}", first_rank=i, phase=ph, node=f"node-{i}", attempt=1,
                        created_s=NOW - 10, gpu_type="Tesla-T4")
            for i, ph in enumerate(("Running", "Failed"))]
    job = lc.JobState(phase="Running", attempt=1, start_s=NOW - 100, restarts=restarts,
                      planned_pods=("job-g0", "job-g1"))
    d = lc.decide(job, RunPolicy(backoff_limit=limit), pods, nodes=None, now_s=NOW,
                  timing=lc.RestartSettings(backoff_base_s=BASE_S, backoff_max_s=MAX_S), checkpointing=ckpt)
    if again:
        assert (d.action, d.reason, d.count_restart) == (lc.RESTART, "RankFailed", True)
        assert d.restart_not_before_s == NOW + delay
        assert f"restarting all ranks from {op_source} (restart {restarts + 1} of {limit})" in d.message
    else:
        assert (d.action, d.reason) == (lc.FAIL, "BackoffLimitExceeded")
        assert d.message.endswith(f"{restarts} restart(s) reached backoffLimit {limit}.")


@pytest.mark.parametrize(("restarts", "limit", "ckpt", "saved", "again", "delay", "op_source", "run_source"),
                         CASES, ids=IDS)
def test_heterotrain_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restarts: int, limit: int,
                         ckpt: bool, saved: bool, again: bool, delay: float, op_source: str,
                         run_source: str) -> None:
    """Every attempt fails: the run restarts as the table says, then stops at backoffLimit."""
    training: dict[str, Any] = {"checkpoint": {"path": "/ckpt"}} if ckpt else {}
    job = dataclasses.replace(make_job(training=training), run_policy=RunPolicy(backoff_limit=limit))
    if saved:
        (tmp_path / "checkpoints").mkdir()
        (tmp_path / "checkpoints" / "checkpoint.pt").write_bytes(b"x")
    waits: list[float] = []
    monkeypatch.setenv("HTJ_BACKOFF_BASE_S", str(BASE_S))
    monkeypatch.setenv("HTJ_BACKOFF_MAX_S", str(MAX_S))
    monkeypatch.setattr(sup, "render_envs", lambda *a, **k: [{}, {}])
    monkeypatch.setattr(sup, "_attempt", lambda *a, **k: (procs.Outcome(exit_code=5, failed_index=1), None))
    monkeypatch.setattr(sup, "_stepped_since", lambda *a, **k: True)  # progressed: no early stop
    monkeypatch.setattr(sup, "_wait_backoff", lambda delay_s, deadline_s: waits.append(delay_s))
    sink = io.StringIO()
    ended = sup.supervise(sup.Planned(job, None, True, None), ["python"], workdir=tmp_path, port_base=0,
                          console=Console(file=sink, width=300), grace_s=1)
    out = sink.getvalue()
    assert ended.outcome.exit_code == 5 and out.rstrip().endswith(f"backoffLimit {limit} reached")
    # the run starts with no restart counted: the table's row is restart number restarts + 1
    expected = [restart.backoff_s(n, base_s=BASE_S, max_s=MAX_S) for n in range(1, limit + 1)]
    assert waits == expected
    line = f"Restarting all ranks from {run_source} (restart {restarts + 1} of {limit}) in {delay:.0f} s"
    assert (line in out) == again
