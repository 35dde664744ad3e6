"""Two operator replicas at once (shared/cases/26), end to end: kopf peering against the fake API
server, jobs run by the local kubelet.

* Rolling upgrade: the old replica (priority 10) runs, a job is created, the new replica (20)
  starts at once and the old one exits: the job's pods are created exactly once, it runs.
* Crash restart: a replica killed with SIGKILL leaves its keep-alive behind; a new replica waits
  for it to expire (not for ever), then serves a job created in the gap.

The Deployment's own strategy is Recreate (tests/chart), so in a cluster the overlap of the first
scenario happens only with ``replicaCount > 1``; the operator must be safe either way.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from k8s.fakeapi import HTJ, PEERINGS  # noqa: E402
from k8s.harness import Cluster, load_nodes  # noqa: E402
from inprocess import OperatorThread  # noqa: E402
from builders import script_job  # noqa: E402

from hetero_operator.api.settings import OperatorConfig  # noqa: E402

PODS = ("", "v1", "pods")
BASE = {"ports.metrics": 0, "ports.health": 0, "pods.simulate_devices": True,
        "intervals.resync_s": 1.0, "intervals.progress_s": 0.3, "restart.unschedulable_retry_s": 1.0}
RUNS = "import time; time.sleep(120)"  # sync-ok: the workload; ranks stay up (deleted with the job)

pytestmark = [pytest.mark.asyncio, pytest.mark.slow, pytest.mark.timeout(200)]


class Replica:
    """One operator process (kopf in its own thread and event loop), as one pod of the Deployment."""

    def __init__(self, cluster: Cluster, priority: int) -> None:
        self.config = OperatorConfig().with_({**BASE, "peering.priority": priority})
        self._operator = OperatorThread(self.config, metrics_url=cluster.kubelet.metrics_url,
                                        name=f"operator-{priority}")
        self.memo = self._operator.memo
        self.identity = self.memo.identity

    async def started(self) -> Replica:
        await asyncio.to_thread(self._operator.wait_ready, 30)
        return self

    @property
    def pods_created(self) -> float:
        return self.memo.metrics.pods_created._value.get()

    async def stop(self) -> None:
        await asyncio.to_thread(self._operator.stop)


def peers(cluster: Cluster) -> dict[str, Any]:
    return (cluster.api.get(PEERINGS, None, "heterotrain") or {}).get("status") or {}


def job_pods(cluster: Cluster, job: str, ns: str) -> list[dict[str, Any]]:
    return cluster.pods(ns, job=job)


def creations(cluster: Cluster, job: str, ns: str) -> list[str]:
    """Every successful pod create of the job, in order (a recreated pod would appear twice)."""
    return [name for res, namespace, name, _, labels in cluster.api.created
            if res == PODS and namespace == ns and labels.get("heterotrain.io/job-name") == job]


async def test_rolling_upgrade_and_crash_restart_never_double_act(tmp_path: Path) -> None:
    async with Cluster(tmp_path) as cluster:
        await cluster.add_nodes(load_nodes())
        await cluster.api.create(PEERINGS, None, {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering",
                                                  "metadata": {"name": "heterotrain"}})
        old = await Replica(cluster, priority=10).started()
        await cluster.wait_for(lambda: old.identity in peers(cluster), 30, "the old replica's keep-alive")

        # --- rolling upgrade: create job-upg, start the new replica at once, the old one exits
        await cluster.apply(script_job("job-upg", RUNS), namespace="team-x")
        new = await Replica(cluster, priority=20).started()
        await cluster.wait_for(lambda: new.identity in peers(cluster), 30, "the new replica's keep-alive")
        await old.stop()
        assert old.identity not in peers(cluster)  # kopf removes its keep-alive on a clean exit
        await cluster.wait_for(lambda: cluster.phase("job-upg", "team-x") == "Running", 90,
                               "job-upg to run")
        pods = job_pods(cluster, "job-upg", "team-x")
        assert sorted(p["metadata"]["name"] for p in pods) == ["job-upg-g0", "job-upg-g1", "job-upg-g2"]
        assert sorted(p["metadata"]["labels"]["heterotrain.io/rank"] for p in pods) == ["0", "1", "2"]
        assert sorted(creations(cluster, "job-upg", "team-x")) == ["job-upg-g0", "job-upg-g1", "job-upg-g2"]
        assert {p["metadata"]["labels"]["heterotrain.io/attempt"] for p in pods} == {"1"}
        await cluster.wait_for(lambda: old.pods_created + new.pods_created == 3, 30,
                               "the replicas' pods_created")
        assert cluster.job("job-upg", "team-x")["status"].get("restarts", 0) == 0

        await cluster.api.delete(HTJ, "team-x", "job-upg")  # its pods go with it: GPUs free again
        await cluster.idle()

        # --- crash restart: the new replica dies without cleaning up (SIGKILL): its keep-alive
        # stays, live for 8 more seconds; a lower-priority replacement waits for it, then serves
        await new.stop()
        lifetime_s = 8
        deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=lifetime_s)
        await cluster.api.patch(PEERINGS, None, "heterotrain", {"status": {new.identity: {
            "priority": 20, "lifetime": lifetime_s, "lastseen": dt.datetime.now(dt.UTC).isoformat()}}})
        gap = await Replica(cluster, priority=5).started()
        await cluster.apply(script_job("job-gap", RUNS), namespace="team-y")
        await cluster.wait_for(lambda: len(job_pods(cluster, "job-gap", "team-y")) == 3, 60,
                               "job-gap's pods (the dead replica's keep-alive expires)")
        first = min(dt.datetime.fromisoformat(p["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
                    for p in job_pods(cluster, "job-gap", "team-y"))
        assert first >= deadline - dt.timedelta(seconds=1)  # not while the dead peer outranked it
        # the counter moves once every create has returned, after the pods are in the store
        await cluster.wait_for(lambda: gap.pods_created == 3, 30, "the gap replica's pods_created")
        assert sorted(creations(cluster, "job-gap", "team-y")) == ["job-gap-g0", "job-gap-g1", "job-gap-g2"]
        await gap.stop()
