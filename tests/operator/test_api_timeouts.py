"""shared/cases/25 (our part): every API call of the operator is bounded and retried.

The report: on a pooled connection that a proxy dropped silently, an API call without a request
timeout blocks for ever, and the per-job lock then blocks every later reconcile of that job.
Here the fake API server (over real HTTP, through the official client) holds chosen requests
without ever answering; the calls must time out, retry on a fresh connection and go on.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from k8s.fakeapi import HTJ  # noqa: E402
from k8s.harness import PODS, Cluster, load_nodes  # noqa: E402

from hetero_operator.api.settings import OperatorConfig  # noqa: E402
from hetero_operator.controller.k8s import Api, CallLimits, load_configuration  # noqa: E402
from hetero_operator.controller.metrics import OperatorMetrics  # noqa: E402
from hetero_operator.controller.reconcile import Reconciler  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CASE = REPO / "tests" / "fixtures" / "cases" / "25-kopf-watch-silently-stalls.yaml"
LIMITS = CallLimits(connect_timeout_s=1.0, read_timeout_s=0.5, retries=2, backoff_s=0.05)
CONFIG = OperatorConfig().with_({"peering.name": "", "ports.metrics": 0, "ports.health": 0,
                                 "intervals.resync_s": 1.0})

pytestmark = [pytest.mark.timeout(60)]


def _job(name: str = "job-b") -> dict[str, Any]:
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"]["name"] = name
    return body


def test_the_case_is_copied_and_defaults_bound_every_call() -> None:
    scenario = next(yaml.safe_load_all(CASE.read_text()))
    assert scenario["expect"]["job-b_pods_created_within_s"] == 330
    config = OperatorConfig()
    assert (config.api.connect_timeout_s, config.api.read_timeout_s, config.api.retries) == (5.0, 30.0, 3)
    # worst case of one call with its retries: 4 tries x (5 + 30 + 1) s + backoff 1.4 s
    assert CallLimits().worst_case_s == pytest.approx(145.4)


async def test_a_silently_stalled_request_times_out_and_the_retry_answers(tmp_path: Path) -> None:
    async with Cluster(tmp_path, kubelet=False) as cluster:
        await cluster.apply(_job(), namespace="team-x")
        api = Api(load_configuration(), LIMITS)
        try:
            cluster.api.stall("get", HTJ[2])
            started = time.monotonic()
            job = await api.get_job("team-x", "job-b")
            took_s = time.monotonic() - started
        finally:
            api.close()
        assert job is not None and job["metadata"]["name"] == "job-b"
        assert (cluster.api.stalled, api.retried) == (1, 1)
        assert LIMITS.read_timeout_s <= took_s < LIMITS.read_timeout_s + 2.0


async def test_a_call_that_never_answers_gives_up_after_its_retries(tmp_path: Path) -> None:
    async with Cluster(tmp_path, kubelet=False) as cluster:
        api = Api(load_configuration(), LIMITS)
        try:
            cluster.api.stall("list", PODS[2], count=10)
            started = time.monotonic()
            with pytest.raises(Exception) as err:
                await api.list_pods("team-x", {"a": "b"})
            took_s = time.monotonic() - started
        finally:
            api.close()
        assert "timed out" in str(err.value).lower() or isinstance(err.value, asyncio.TimeoutError)
        assert (cluster.api.stalled, api.retried) == (3, 2)
        assert took_s < LIMITS.worst_case_s


async def test_a_reconcile_on_a_dead_connection_releases_the_job_and_the_next_one_creates_the_pods(
        tmp_path: Path) -> None:
    """The per-job lock is never held for ever: a stalled pod list ends in a logged failure, and
    the job's next reconcile (the resync kick) plans and creates its pods."""
    async with Cluster(tmp_path, kubelet=False) as cluster:
        await cluster.add_nodes(load_nodes())
        await cluster.apply(_job(), namespace="team-x")
        api = Api(load_configuration(), LIMITS)
        nodes = load_nodes()
        rec = Reconciler(config=CONFIG, api=api, metrics=OperatorMetrics(), nodes=lambda: nodes,
                         gpu_pods=lambda: [])
        try:
            cluster.api.stall("list", PODS[2], count=LIMITS.retries + 1)  # the whole first reconcile
            started = time.monotonic()
            rec.kick("team-x", "job-b")
            await cluster.wait_for(lambda: len(cluster.pods("team-x")) == 3, 30, "the job's pods")
            took_s = time.monotonic() - started
        finally:
            await rec.stop()
            api.close()
        assert cluster.api.stalled == LIMITS.retries + 1
        # first reconcile: 3 timed-out lists (+ backoff), then one resync period, then the start
        assert took_s < LIMITS.worst_case_s + CONFIG.intervals.resync_s + 5.0
        assert cluster.job("job-b", "team-x")["status"]["phase"] == "Created"
