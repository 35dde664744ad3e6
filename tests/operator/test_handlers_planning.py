"""The operator's side of issues 9 and 14: a plan mixing PyTorch releases is a condition on the job;
learned speeds from the namespace's ConfigMap and the plan's decision aid reach ``status.plan``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_handlers import FakeApi, _job, _reconciler, _status

from hetero_operator.planning import profiles

pytestmark = pytest.mark.asyncio


async def test_two_torch_versions_are_a_condition_naming_variants_and_nodes() -> None:
    body = _job()
    body["spec"]["images"][1]["torchVersion"] = "2.12.1"  # cu128: the T4 node's variant
    api = FakeApi(body)
    requeue = await _reconciler(api).reconcile("team-x", "digits")
    assert requeue == 30 and api.pods == {}
    st = _status(api)
    created = next(c for c in st["conditions"] if c["type"] == "Created")
    assert (st["phase"], created["status"], created["reason"]) == ("Pending", "False",
                                                                   "TorchVersionMismatch")
    assert ("ghcr.io/heterotrain/worker:0.1.0-cu128 (torchVersion 2.12.1) on node-t4; "
            "ghcr.io/heterotrain/worker:0.1.0-cu126 (torchVersion 2.13.0) on node-a100, "
            "node-v100") in created["message"]


class ProfilesApi(FakeApi):
    """A FakeApi whose namespace holds the learned-speeds ConfigMap."""

    def __init__(self, job: dict[str, Any], configmap: dict[str, Any]) -> None:
        super().__init__(job)
        self.configmap = configmap
        self.configmap_reads: list[tuple[str, str]] = []

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.configmap_reads.append((namespace, name))
        return self.configmap


async def test_learned_speeds_from_the_configmap_steer_the_plan_and_the_status_says_so() -> None:
    now = 1_800_000_000.0  # test_handlers' clock
    entries = profiles.merge({}, [
        profiles.Observation(gpu_type="NVIDIA-A100-SXM4-40GB", precision="bf16", samples_per_s=500.0, unix_s=now - 60),
        profiles.Observation(gpu_type="Tesla-T4", precision="fp16", samples_per_s=250.0, unix_s=now - 60)],
        now_s=now)
    api = ProfilesApi(_job(), {"data": profiles.configmap_data("digits", entries)})
    await _reconciler(api).reconcile("team-x", "digits")
    assert api.configmap_reads == [("team-x", "heterotrain-profiles")]
    plan = _status(api)["plan"]
    sources = {t["gpuType"]: (t["speedSource"], t["relativeSpeed"]) for t in plan["gpuTypeValues"]}
    assert sources == {"NVIDIA-A100-SXM4-40GB": ("learned", "1.000"),
                       "Tesla-V100-SXM2-16GB": ("table", "0.401"),
                       "Tesla-T4": ("learned", "0.500")}
    assert plan["prediction"]["unit"] == "samples/s"
    batches = {g["gpuType"]: g["localBatches"] for g in plan["groups"]}
    # 128 split 1 : 0.5 : 0.5 : 0.401 (the T4 at 0.5 of an A100 as measured, not the table's 0.21)
    assert batches == {"NVIDIA-A100-SXM4-40GB": [53], "Tesla-T4": [27, 27], "Tesla-V100-SXM2-16GB": [21]}
    assert plan["leftOut"] == []
    json.dumps(plan)  # plain JSON for the API object
