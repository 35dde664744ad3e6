"""The operator writes learned speeds: a rank's metrics -> observations -> the ConfigMap's data,
merged under optimistic concurrency (hetero_operator.controller.learning, profiles.configmap_update)."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

import pytest
from prometheus_client import generate_latest

from hetero_operator.controller import learning
from hetero_operator.planning import profiles as p
from heterotrain_common import contract as c

DAY = 86400.0


def _obs(sps: float, t: float, gpu: str = "Tesla-T4", precision: str = "fp16") -> p.Observation:
    return p.Observation(gpu_type=gpu, precision=precision, samples_per_s=sps, unix_s=t)


def test_configmap_update_merges_the_key_and_drops_only_stale_keys() -> None:
    old = p.merge({}, [_obs(100, 0.0)], now_s=0.0)
    stale = p.merge({}, [_obs(50, 0.0, gpu="A100", precision="bf16")], now_s=0.0)
    cm = {"data": {**p.configmap_data("digits", old), **p.configmap_data("old-model", stale),
                   "hand-edited": "{not json"}}
    patch, merged = p.configmap_update(cm, "digits", [_obs(120, 10.0)], now_s=10.0)
    assert merged["Tesla-T4/fp16"].observations == 2
    assert merged["Tesla-T4/fp16"].samples_per_s == pytest.approx(110.0)
    assert patch == {**p.configmap_data("digits", merged)}  # old-model is 10 s old: kept

    patch, merged = p.configmap_update(cm, "digits", [_obs(120, 31 * DAY)], now_s=31 * DAY)
    assert patch["old-model"] is None and "hand-edited" not in patch
    assert merged["Tesla-T4/fp16"].observations == 1  # the 31-day-old figure aged out too
    assert json.loads(patch["digits"])["Tesla-T4/fp16"]["samples_per_s"] == 120


def test_rank_stats_reads_the_workers_own_counters() -> None:
    """Names from the real WorkerMetrics, so a renamed metric fails here."""
    from hetero_worker.metrics import WorkerMetrics

    topo = (c.RankEntry(rank=0, group=0, node="n", gpu_product="Tesla-T4", compute_capability="7.5",
                        local_batch=4),)
    contract = c.Contract(
        dist=c.RankInfo(rank=0, world_size=1, local_rank=0, local_world_size=1, master_addr="a",
                        master_port=1, job_name="j", group=0, group_rank=0, group_size=1),
        precision="fp16",
        comm=c.CommSettings(hierarchy="group"), device=c.DeviceProfile(product="Tesla-T4"),
        topology=topo)
    metrics = WorkerMetrics(contract)
    text = generate_latest(metrics.registry).decode()
    assert learning.rank_stats(text) == {"steps": 0, "samples": 0.0, "compute_seconds": 0.0}
    for _ in range(3):
        metrics.observe_step(step_s=0.5, compute_s=0.25, comm_wait_s=0.25, samples=4, loss=1.0)
    stats = learning.rank_stats(generate_latest(metrics.registry).decode())
    assert stats == {"steps": 3, "samples": 12.0, "compute_seconds": 0.75}
    (obs,) = p.observations_from_stats([{**stats, "gpu_product": "Tesla-T4", "precision": "fp16"}],
                                       unix_s=1.0, min_steps=1, min_compute_s=0.0, min_samples=1)
    assert obs.samples_per_s == pytest.approx(16.0)
    assert learning.rank_stats("# nothing\n") is None


def test_one_pod_per_gpu_type_and_precision_is_read() -> None:
    plan = {"groups": [
        {"gpuType": "A100", "precision": "bf16", "pod": "j-g0"},
        {"gpuType": "Tesla-T4", "precision": "fp16", "pod": "j-g1"},
        {"gpuType": "Tesla-T4", "precision": "fp16", "pod": "j-g2"},
        {"gpuType": "Tesla-T4", "precision": "fp32", "pod": "j-g3"}]}
    assert learning.reading_pods(plan) == {("A100", "bf16"): "j-g0", ("Tesla-T4", "fp16"): "j-g1",
                                           ("Tesla-T4", "fp32"): "j-g3"}
    assert learning.reading_pods(None) == {}
    # a pipelined plan: each rank's samples per compute second are its stage's, not its device's
    assert learning.reading_pods({**plan, "pipeline": {"stages": [{"stage": 0}]}}) == {}


class FakeConfigMaps:
    """An API holding ConfigMaps with resourceVersions; ``meddle`` writes between our get and
    our patch (another job finishing at the same moment)."""

    def __init__(self) -> None:
        self.cm: dict[str, Any] | None = None
        self.rv = 0
        self.calls: list[str] = []
        self.meddle: list[dict[str, str]] = []

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(f"get {namespace}/{name}")
        got = copy.deepcopy(self.cm)
        if self.meddle:  # someone else writes right after our read
            self.cm["data"].update(self.meddle.pop(0))  # type: ignore[index]
            self.rv += 1
            self.cm["metadata"]["resourceVersion"] = str(self.rv)  # type: ignore[index]
        return got

    async def create_configmap(self, namespace: str, body: Mapping[str, Any]) -> bool:
        self.calls.append("create")
        if self.cm is not None:
            return False
        self.rv += 1
        self.cm = {**copy.deepcopy(dict(body))}
        self.cm["metadata"]["resourceVersion"] = str(self.rv)
        return True

    async def patch_configmap(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        self.calls.append("patch")
        assert self.cm is not None
        if patch["metadata"]["resourceVersion"] != self.cm["metadata"]["resourceVersion"]:
            return False
        for k, v in patch["data"].items():
            if v is None:
                self.cm["data"].pop(k, None)
            else:
                self.cm["data"][k] = v
        self.rv += 1
        self.cm["metadata"]["resourceVersion"] = str(self.rv)
        return True


@pytest.mark.asyncio
async def test_record_creates_then_merges_and_survives_a_concurrent_writer() -> None:
    api = FakeConfigMaps()
    first = await learning.record(api, "team", "digits", [_obs(100, 1.0)], now_s=1.0)
    assert api.calls == ["get team/heterotrain-profiles", "create"]
    assert api.cm is not None and api.cm["metadata"]["name"] == "heterotrain-profiles"
    assert "ownerReferences" not in api.cm["metadata"]  # outlives the jobs
    assert first is not None and first["Tesla-T4/fp16"].observations == 1

    other = p.configmap_data("lm", p.merge({}, [_obs(40, 2.0, gpu="A100", precision="bf16")], now_s=2.0))
    api.meddle.append(other)  # the lm job lands between our get and our patch
    api.calls.clear()
    second = await learning.record(api, "team", "digits", [_obs(120, 3.0)], now_s=3.0)
    assert api.calls == ["get team/heterotrain-profiles", "patch", "get team/heterotrain-profiles", "patch"]
    assert second is not None and second["Tesla-T4/fp16"].observations == 2
    assert set(api.cm["data"]) == {"digits", "lm"}  # nobody's observations lost
    assert p.configmap_entries(api.cm, "digits")["Tesla-T4/fp16"].samples_per_s == pytest.approx(110)

    assert await learning.record(api, "team", "digits", [], now_s=4.0) is None


@pytest.mark.asyncio
async def test_record_gives_up_after_the_attempts_without_writing() -> None:
    api = FakeConfigMaps()
    await learning.record(api, "team", "digits", [_obs(100, 1.0)], now_s=1.0)
    api.meddle.extend({"x": "{}"} for _ in range(learning.RECORD_ATTEMPTS))
    before = api.cm["data"]["digits"]  # type: ignore[index]
    assert await learning.record(api, "team", "digits", [_obs(120, 2.0)], now_s=2.0) is None
    assert api.cm["data"]["digits"] == before  # type: ignore[index]
