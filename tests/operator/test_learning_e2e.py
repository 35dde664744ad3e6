"""End to end: a job that succeeds leaves its measured per-type speeds in the namespace's
``heterotrain-profiles`` ConfigMap, and the next job of the same profileKey plans with them.

The operator (kopf, in process) against the fake API server with the local kubelet (tests/k8s),
on examples/clusters/mixed.yaml (A100, V100, 2x T4, simulated devices).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from k8s.harness import Cluster, load_nodes  # noqa: E402

from builders import e2e_config  # noqa: E402
from hetero_operator.planning import profiles  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
CONFIGMAPS = ("", "v1", "configmaps")
CONFIG = e2e_config()
NS = "learn"
TYPES = {"NVIDIA-A100-SXM4-40GB/bf16/64-127", "Tesla-V100-SXM2-16GB/fp16/16-31", "Tesla-T4/fp16/8-15"}
"""Entries per GPU type, precision and batch band (the digits plan's local batches 70, 28, 15)."""

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow, pytest.mark.timeout(240)]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    async with Cluster(tmp_path_factory.mktemp("cluster")) as cl:
        await cl.add_nodes(load_nodes())
        await cl.start_operator(CONFIG)
        yield cl


def digits(name: str, tmp: Path, *, args: list[str], delay_s: str) -> dict[str, Any]:
    """examples/digits.yaml renamed (profileKey by default: the name without ``-<digits>``)."""
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"]["name"] = name
    body["spec"]["worker"]["args"] = args
    body["spec"]["worker"]["env"] = [{"name": "HTJ_SIM_DELAY_PER_SAMPLE_S", "value": delay_s}]
    body["spec"]["training"]["checkpoint"]["path"] = str(tmp / name / "ckpt")
    return body


async def succeeded(cluster: Cluster, name: str) -> dict[str, Any]:
    await cluster.wait_for(lambda: cluster.phase(name, NS) in ("Succeeded", "Failed"), 150,
                           f"{NS}/{name} to finish (now {cluster.phase(name, NS)!r})")
    job = cluster.job(name, NS)
    assert job is not None and job["status"]["phase"] == "Succeeded", job and job["status"]
    return job


async def test_a_succeeded_job_records_per_type_speeds_and_the_next_job_plans_with_them(
        cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("learn")
    # 40 steps at 1 ms per sample of a speed-1.0 device (a T4, 0.21, takes ~70 ms for its 15
    # samples): a few seconds of training, several reads at the test's 0.3 s progress interval
    await cluster.apply(digits("learn-1", tmp, args=["--max-steps", "40"], delay_s="0.001"),
                        namespace=NS)
    first = await succeeded(cluster, "learn-1")
    assert {g["speedSource"] for g in first["status"]["plan"]["gpuTypeValues"]} == {"table"}

    cm = await cluster.wait_for(lambda: cluster.api.get(CONFIGMAPS, NS, profiles.CONFIGMAP_NAME),
                                30, "the learned-speeds ConfigMap")
    assert "ownerReferences" not in cm["metadata"]  # outlives the job
    assert list(cm["data"]) == ["learn"]
    entries = profiles.configmap_entries(cm, "learn")
    assert set(entries) == TYPES
    assert {e.observations for e in entries.values()} == {1}
    a100 = entries["NVIDIA-A100-SXM4-40GB/bf16/64-127"].samples_per_s
    t4 = entries["Tesla-T4/fp16/8-15"].samples_per_s
    assert {(e.job, e.namespace) for e in entries.values()} == {("learn-1", NS)}
    # simulated delay: the A100 sleeps 1 ms per sample, the T4 4.76 ms, plus the same CPU work
    assert 0 < t4 < a100 < 1000

    # Succeeded comes with rank 0; a last rank pod may still be running or terminating and hold its
    # GPU (a T4 once, in a clean-clone CI run): the second plan would leave that type out
    await cluster.idle()
    second_job = digits("learn-2", tmp, args=[], delay_s="0")  # planning is what is checked here
    second_job["spec"]["worker"]["command"] = ["python", "-c", "pass"]
    second_job["spec"]["gpus"]["selection"] = "All"  # the learned T4s may not pay: keep every type
    await cluster.apply(second_job, namespace=NS)
    second = await succeeded(cluster, "learn-2")
    values = {g["gpuType"]: g for g in second["status"]["plan"]["gpuTypeValues"]}
    assert {t: (g["speedSource"], g["observations"]) for t, g in values.items()} == {
        t.split("/")[0]: ("learned", 1) for t in TYPES}
    # the fastest learned type is the 1.0 anchor: the T4's relative speed is the measured ratio
    assert values["Tesla-T4"]["relativeSpeed"] == f"{t4 / a100:.3f}"
    assert second["status"]["plan"]["prediction"]["unit"] == "samples/s"
