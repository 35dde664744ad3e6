"""Case 17: ranks started before rank 0 wait for it; rank 0 never appearing ends in a clear
``RendezvousTimeout`` and a non-zero exit instead of a crash loop or a hang."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest
import yaml
from rankproc import (RANK_CHECKS, assert_ok, mixed_cluster_envs, read_rank_json, start_rank,
                      wait_all)

from hetero_worker.runtime.rendezvous import RendezvousTimeout, timeout_from_env, wait_for_master
from heterotrain_common.envread import ContractError

CASE = Path(__file__).parent.parent / "fixtures" / "cases" / "17-workers-start-before-rank0.yaml"


class FakeClock:
    """Monotonic clock advanced only by ``sleep``."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now_s += seconds


def resolver_down_until(clock: FakeClock, up_at_s: float):
    def resolve(host: str, port: int) -> list:
        if clock() < up_at_s:
            raise socket.gaierror(-2, "Name or service not known")
        return [("ok",)]
    return resolve


def test_waits_through_90s_of_dns_failures_then_returns() -> None:
    """The case's timeline: rank 0's Service resolves only at t = 90 s; timeout 600 s."""
    scenario = list(yaml.safe_load_all(CASE.read_text()))[0]
    timeout_s = float(scenario["worker_rendezvous_timeout_s"])
    clock = FakeClock()
    left_s = wait_for_master("job-rdzv-g0", 29500, timeout_s=timeout_s,
                             resolve=resolver_down_until(clock, 90.0),
                             probe=lambda host, port, t: None, clock=clock, sleep=clock.sleep)
    assert 90.0 <= clock.now_s < 96.0  # backoff capped at 5 s
    assert left_s == pytest.approx(timeout_s - clock.now_s)
    assert clock.sleeps[:4] == [0.1, 0.2, 0.4, 0.8] and max(clock.sleeps) == 5.0


def test_gives_up_with_rendezvous_timeout_naming_the_last_error() -> None:
    clock = FakeClock()
    with pytest.raises(RendezvousTimeout) as info:
        wait_for_master("job-rdzv-g0", 29500, timeout_s=30.0,
                        resolve=resolver_down_until(clock, float("inf")),
                        probe=lambda host, port, t: None, clock=clock, sleep=clock.sleep)
    assert clock.now_s == pytest.approx(30.0)
    assert "RendezvousTimeout" in str(info.value) and "Name or service not known" in str(info.value)


def test_connection_refused_is_retried_like_dns() -> None:
    clock = FakeClock()
    attempts = []

    def probe(host: str, port: int, timeout_s: float) -> None:
        attempts.append(clock())
        if len(attempts) < 4:
            raise ConnectionRefusedError(111, "Connection refused")

    wait_for_master("10.0.0.1", 29500, timeout_s=10.0, resolve=lambda h, p: [],
                    probe=probe, clock=clock, sleep=clock.sleep)
    assert len(attempts) == 4


@pytest.mark.parametrize("raw", ["soon", "0", "-5"], ids=["not a number", "zero", "negative"])
def test_bad_timeout_variable_is_a_contract_error(raw: str) -> None:
    with pytest.raises(ContractError, match="HTJ_RENDEZVOUS_TIMEOUT_S"):
        timeout_from_env({"HTJ_RENDEZVOUS_TIMEOUT_S": raw})


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_rank_started_before_rank0_still_joins(tmp_path: Path) -> None:
    envs = mixed_cluster_envs([8, 8])
    cmd = [sys.executable, str(RANK_CHECKS), "join", "--out", str(tmp_path)]
    early = start_rank(cmd, envs[1], HTJ_RENDEZVOUS_TIMEOUT_S="60")
    # wait for the very thing: rank 1 was refused by rank 0's port and is retrying
    waiting = f"heterotrain: waiting for rank 0 at 127.0.0.1:{envs[1]['MASTER_PORT']} (ConnectionRefused"
    seen = []
    for line in early.stderr:  # blocks until rank 1 reports (the test's timeout bounds it)
        seen.append(line)
        if line.startswith(waiting):
            break
    assert seen and seen[-1].startswith(waiting), seen
    assert early.poll() is None
    late = start_rank(cmd, envs[0])
    runs = wait_all([late, early], timeout_s=90)
    assert_ok(runs)
    assert [f["sum"] for f in read_rank_json(tmp_path, 2)] == [3.0, 3.0]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("master_addr", ["127.0.0.1", "htj-rank0-never.invalid"],
                         ids=["port never opens", "name never resolves"])
def test_rank0_never_appears_exits_nonzero_with_rendezvous_timeout(
        tmp_path: Path, master_addr: str) -> None:
    env = mixed_cluster_envs([8, 8])[1] | {"MASTER_ADDR": master_addr}
    start = time.monotonic()
    proc = start_rank([sys.executable, str(RANK_CHECKS), "join", "--out", str(tmp_path)], env,
                      HTJ_RENDEZVOUS_TIMEOUT_S="2")
    (run,) = wait_all([proc], timeout_s=60)
    assert run.returncode == 3, run.stderr
    assert "RendezvousTimeout" in run.stderr and master_addr in run.stderr
    assert "Traceback" not in run.stderr
    assert time.monotonic() - start < 45
