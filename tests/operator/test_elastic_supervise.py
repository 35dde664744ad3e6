"""The supervisor's elastic rule (issue 31, item 4): a lost rank is absorbed while at least
``spec.elastic.minRanks`` live (the next generation is announced in the store); below it, or on a
graceful stop, the gang stops as without ``spec.elastic``."""

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
    watch = ElasticWatch(_plan(3), min_ranks=2, console=console, workdir=tmp_path)
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
    watch = ElasticWatch(_plan(3), min_ranks=1, console=_Console(), workdir=tmp_path)
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
