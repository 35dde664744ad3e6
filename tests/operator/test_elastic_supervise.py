"""The supervisor's elastic rule (issue 31, items 2 and 4): a lost rank is absorbed while at least
``spec.elastic.minRanks`` live (the next generation is announced in the store); below it, or on a
graceful stop, the gang stops as without ``spec.elastic``. Once the survivors completed a step, the
lost rank is started again to join (a generation that adds it), up to ``maxRanks`` and
``backoffLimit`` restarts; a rank still waiting to join when the others ended well is told the job
is done."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from types import SimpleNamespace

from hetero_operator.local.elastic import ElasticWatch, report_lines
from heterotrain_common import membership, procs

SLEEPER = [sys.executable, "-c", "import os, sys, time; code = int(os.environ['CODE']); "
           "time.sleep(0 if code >= 0 else 60); sys.exit(max(code, 0))"]  # sync-ok: the workload


class _Console:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str, **_: object) -> None:
        self.lines.append(text)


def _plan(world: int) -> SimpleNamespace:
    return SimpleNamespace(world_size=world, ranks=[
        SimpleNamespace(product="Tesla-T4" if r else "NVIDIA-A100-SXM4-40GB",
                        node=f"node-{r}") for r in range(world)])


def _start(codes: list[int]) -> procs.Gang:
    """One process per code: >= 0 exits with it at once, -1 runs until stopped."""
    return procs.Gang(SLEEPER, [{**os.environ, "CODE": str(code)} for code in codes])


def test_a_loss_is_absorbed_down_to_min_ranks_then_the_gang_stops(tmp_path: Path) -> None:
    console = _Console()
    watch = ElasticWatch(_plan(3), min_ranks=2, max_ranks=3, restart_limit=0, console=console,
                         workdir=tmp_path)
    envs: list[dict[str, str]] = [{} for _ in range(3)]
    watch.add_env(envs)
    assert [e["HTJ_ELASTIC_MEMBER"] for e in envs] == ["0", "1", "2"]
    gang = _start([-1, 1, -1])
    try:
        gang.procs[1].wait(timeout=30)
        lost = watch.on_failure(gang)
        assert lost(1) is True
        announced = membership.Generation.from_json(
            1, watch.host.store.get(membership.GENERATION_KEY.format(generation=1)))
        assert announced.members == (0, 2) and announced.lost[0]["gpu_product"] == "Tesla-T4"
        assert "shrinking from 3 to 2 ranks (generation 1)" in console.lines[-1]
        gang.procs[2].send_signal(signal.SIGKILL)
        gang.procs[2].wait(timeout=30)
        assert lost(2) is False  # one rank left, below minRanks 2
        assert "below spec.elastic.minRanks 2" in console.lines[-1]
    finally:
        gang.stop(grace_s=0)
    events = watch.finish()
    assert [(e["from"], e["to"], e["rank"]) for e in events] == [(3, 2, 1)]
    assert json.loads((tmp_path / "membership.json").read_text())["events"][0]["step"] is None
    assert report_lines(tmp_path) == [
        "Elastic: shrank from 3 to 2 ranks (Tesla-T4 on node-1 lost); no step completed after "
        "it; no checkpoint was read"]


def test_a_graceful_stop_is_no_loss(tmp_path: Path) -> None:
    watch = ElasticWatch(_plan(3), min_ranks=1, max_ranks=3, restart_limit=0, console=_Console(),
                         workdir=tmp_path)
    gang = _start([75, -1, -1])
    try:
        gang.procs[0].wait(timeout=30)
        assert watch.on_failure(gang)(0) is False
    finally:
        gang.stop(grace_s=0)


def test_the_gang_goes_on_without_an_absorbed_process() -> None:
    gang = _start([3, 0])
    outcome = gang.wait(on_failure=lambda i: i == 0, poll_s=0.01)
    assert outcome.exit_code == 0 and outcome.failed_index is None and gang.absorbed == {0}


def _settle(watch: ElasticWatch, generation: int, step: int) -> None:
    """What the new generation's rank 0 writes once it completed a step."""
    watch.host.store.set(membership.RESUMED_KEY.format(generation=generation),
                         json.dumps({"step": step, "redone": 1, "recovery_s": 0.2, "reform_s": 0.05}))


def test_a_lost_rank_is_started_again_once_the_survivors_stepped(tmp_path: Path) -> None:
    console = _Console()
    watch = ElasticWatch(_plan(3), min_ranks=2, max_ranks=3, restart_limit=1, console=console,
                         workdir=tmp_path)
    started: list[tuple[int, dict[str, str]]] = []
    tick = watch.regrow(lambda i, extra: started.append((i, extra)))
    gang = _start([-1, 1, -1])
    try:
        gang.procs[1].wait(timeout=30)
        assert watch.on_failure(gang)(1) is True
        tick()
        assert started == []  # generation 1 completed no step yet: the change has not settled
        _settle(watch, 1, step=4)
        tick()
        assert started == [(1, {"HTJ_ELASTIC_JOIN_GENERATION": "2"})]
        grown = membership.Generation.from_json(
            2, watch.host.store.get(membership.GENERATION_KEY.format(generation=2)))
        assert grown.members == (0, 1, 2) and [j["member"] for j in grown.joined] == [1]
        assert "growing from 2 to 3 ranks at a step boundary (generation 2)" in console.lines[-1]
        tick()
        assert len(started) == 1  # at maxRanks
        _settle(watch, 2, step=7)
        assert watch.on_failure(gang)(1) is True  # lost again (generation 3)
        _settle(watch, 3, step=8)
        tick()
        tick()
        assert len(started) == 1  # backoffLimit 1: not started a second time
        assert [line for line in console.lines if "Not starting lost ranks again" in line] != []
        assert len([line for line in console.lines if "Not starting" in line]) == 1  # said once
    finally:
        gang.stop(grace_s=0)
    events = watch.finish()
    assert [(e["kind"], e["from"], e["to"], e["step"]) for e in events] == [
        ("shrink", 3, 2, 4), ("grow", 2, 3, 7), ("shrink", 3, 2, 8)]
    assert report_lines(tmp_path)[1] == (
        "Elastic: grew from 2 to 3 ranks at step 7 (Tesla-T4 on node-1 joined with a peer's "
        "state); the running ranks paused 0.05 s to let it in; no checkpoint was read")


def test_a_rank_waiting_to_join_is_told_when_the_others_ended_well(tmp_path: Path) -> None:
    go = tmp_path / "go"
    waiter = [sys.executable, "-c", "import os, sys, time\n"
              "while not os.path.exists(os.environ['GO']): time.sleep(0.01)\n"  # sync-ok: the workload
              "sys.exit(int(os.environ['CODE']))"]
    watch = ElasticWatch(_plan(3), min_ranks=2, max_ranks=3, restart_limit=1, console=_Console(),
                         workdir=tmp_path)
    gang = procs.Gang(waiter, [{**os.environ, "GO": str(go), "CODE": str(code)}
                               for code in (0, 1, 0)])
    tick = watch.regrow(lambda i, extra: None)  # the joiner "runs" as process 1 below
    try:
        gang.procs[1].send_signal(signal.SIGKILL)
        gang.procs[1].wait(timeout=30)
        assert watch.on_failure(gang)(1) is True
        _settle(watch, 1, step=4)
        tick()  # generation 2 announced: process 1 waits to join
        gang.restart(1, waiter, {**os.environ, "GO": str(tmp_path / "never"), "CODE": "0"})
        tick()
        assert not watch.host.store.check([membership.FINISHED_KEY])  # the others still run
        go.touch()
        gang.procs[0].wait(timeout=30)
        gang.procs[2].wait(timeout=30)
        tick()
        assert watch.host.store.check([membership.FINISHED_KEY])
    finally:
        gang.stop(grace_s=0)
