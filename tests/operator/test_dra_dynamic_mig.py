"""Issue 32, item 8 (the held-out DRA case): DynamicMIG, partitionable GPUs with shared counters,
on a node where one GPU is partly used by MIG devices and the other is free.

Fixture tests/fixtures/dra/dynamic-mig-partly-used.yaml: node-m with 2 x A100-SXM4-80GB as
kubernetes-sigs/dra-driver-nvidia-gpu publishes them with DynamicMIG on Kubernetes 1.35 (one slice
of counter sets, one slice of devices per GPU: each GPU whole beside every MIG profile x placement,
all drawing on the GPU's counter set), and two ResourceClaims of another namespace holding a
3g.40gb (memory slices 0-3) and a 1g.10gb (slice 4) of gpu-0.  The free gpu-1 is offered whole and
only whole; gpu-0 only as the partitions that still fit (1g.20gb at 6-7 and 1g.10gb at 5), never
whole; the claims of each class are pinned to the GPU that offered it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from builders import make_job

from hetero_operator.api import labels
from hetero_operator.api import types as model
from hetero_operator.cluster import dra
from hetero_operator.planning.plan import plan_job
from hetero_operator.render import pods as rendering
from hetero_operator.render.claims import add_claims

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dra" / "dynamic-mig-partly-used.yaml"
A100 = "NVIDIA-A100-SXM4-80GB"
GPU0 = "GPU-4e5a0f0c-0000-0000-0000-000000000000"
GPU1 = "GPU-4e5a0f0c-1111-1111-1111-111111111111"
IMAGES = [{"image": "reg/w:cu130", "cudaVersion": "13.0", "computeCapabilities": ["8.0"]}]


def fixture() -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    slices, claims, expected = yaml.safe_load_all(FIXTURE.read_text())
    return slices["items"], claims["items"], expected["expected"]


def node() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "node-m", "labels": {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"}},
            "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                   "allocatable": {"cpu": "64"}, "capacity": {"cpu": "64"}}}


def inventory(slices: list[dict[str, Any]], claims: list[dict[str, Any]]) -> dra.DraInventory:
    return dra.build_dra_inventory([node()], (), slices, claims)


def offered(inv: dra.DraInventory) -> dict[str, tuple[int, int]]:
    (n,) = inv.inventory.nodes
    return {d.gpu_type: (d.total, d.free) for d in n.devices}


def combined_134(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same pool as the driver publishes it on Kubernetes 1.34: each GPU's slice holds its
    counter set and its devices (generateCombinedResourceSlices)."""
    counters, *per_gpu = copy.deepcopy(slices)
    for i, s in enumerate(per_gpu):
        s["spec"]["sharedCounters"] = [counters["spec"]["sharedCounters"][i]]
        s["spec"]["pool"]["resourceSliceCount"] = len(per_gpu)
    return per_gpu


def claim(device: str) -> dict[str, Any]:
    """A ResourceClaim of another namespace holding ``device`` of node-m."""
    return {"metadata": {"name": f"other-{device}", "namespace": "other"}, "status": {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": dra.DRIVER, "pool": "node-m", "device": device}]}}}}


EXPECTED = {A100: (1, 1), f"{A100}-MIG-3g.40gb": (1, 0), f"{A100}-MIG-1g.20gb": (1, 1),
            f"{A100}-MIG-1g.10gb": (2, 1)}


def test_the_fixture_is_the_drivers_v1_shape_for_kubernetes_135() -> None:
    slices, claims, _ = fixture()
    for obj in [*slices, *claims]:
        kubernetes_validate.validate(json.loads(json.dumps(obj)), "1.35.0", strict=True)
    counters, gpu0, gpu1 = slices
    assert "devices" not in counters["spec"] and "sharedCounters" not in gpu0["spec"]  # 1.35: apart
    assert [d["name"] for d in gpu0["spec"]["devices"]][:3] == [
        "gpu-0", "gpu-0-mig-1g10gb-19-0", "gpu-0-mig-1g10gb-19-1"]
    assert len(gpu1["spec"]["devices"]) == 1 + 7 + 7 + 4 + 3 + 2 + 1 + 1  # whole + every placement
    assert {d["consumesCounters"][0]["counterSet"] for d in gpu1["spec"]["devices"]} == {"gpu-1-counter-set"}


def test_the_free_gpu_is_offered_whole_and_the_partly_used_one_only_as_its_free_partitions() -> None:
    slices, claims, expected = fixture()
    inv = inventory(slices, claims)
    assert offered(inv) == EXPECTED
    assert offered(inv) == {t: (v["total"], v["free"]) for t, v in expected["node-m"].items()}
    assert inv.gpu_uuids == {("node-m", A100): (GPU1,), ("node-m", f"{A100}-MIG-1g.20gb"): (GPU0,),
                             ("node-m", f"{A100}-MIG-1g.10gb"): (GPU0,)}
    assert not inv.inventory.warnings and not inv.inventory.excluded
    (n,) = inv.inventory.nodes
    assert {d.gpu_type: d.memory_mib for d in n.devices} == {
        A100: 80384, f"{A100}-MIG-3g.40gb": 40192, f"{A100}-MIG-1g.20gb": 19968, f"{A100}-MIG-1g.10gb": 9856}


def test_the_same_pool_published_for_kubernetes_134_reads_the_same() -> None:
    slices, claims, _ = fixture()
    assert offered(inventory(combined_134(slices), claims)) == EXPECTED


def test_a_counter_slice_that_states_no_node_still_counts_for_its_pool() -> None:
    slices, claims, _ = fixture()
    counters = copy.deepcopy(slices[0])
    del counters["spec"]["nodeName"]
    counters["spec"]["allNodes"] = True
    assert offered(inventory([counters, *slices[1:]], claims)) == EXPECTED


def test_nothing_allocated_two_whole_gpus_and_no_partition_counted_beside_them() -> None:
    slices, _, _ = fixture()
    inv = inventory(slices, [])
    assert offered(inv) == {A100: (2, 2)}
    assert inv.gpu_uuids == {("node-m", A100): (GPU0, GPU1)}


@pytest.mark.parametrize(("allocated", "want"), [
    (["gpu-1", "gpu-0-mig-3g40gb-9-0", "gpu-0-mig-1g10gb-19-4"],
     {A100: (1, 0), f"{A100}-MIG-3g.40gb": (1, 0), f"{A100}-MIG-1g.20gb": (1, 1), f"{A100}-MIG-1g.10gb": (2, 1)}),
    (["gpu-0-mig-1g10gb-me-20-0"],  # a +me partition takes the GPU's only OFA and JPEG engine
     {A100: (1, 1), f"{A100}-MIG-1g.10gb+me": (1, 0), f"{A100}-MIG-3g.40gb": (1, 1),
      f"{A100}-MIG-2g.20gb": (1, 1), f"{A100}-MIG-1g.10gb": (1, 1)}),
    (["gpu-0-mig-7g80gb-0-0"], {A100: (1, 1), f"{A100}-MIG-7g.80gb": (1, 0)}),
], ids=["gpu-1 taken whole as well: gpu-0's partitions only", "one 1g.10gb+me at slice 0: "
        "3g.40gb at 4-7, 2g.20gb at 2-3, 1g.10gb at 1 (98 SMs)", "a 7g.80gb partition takes all of gpu-0"])
def test_what_is_allocated_from_a_counter_set_is_subtracted(allocated: list[str], want: dict[str, Any]) -> None:
    slices, _, _ = fixture()
    assert offered(inventory(slices, [claim(d) for d in allocated])) == want


def test_a_missing_counter_slice_offers_nothing_of_its_gpus_and_says_why() -> None:
    slices, claims, _ = fixture()
    inv = inventory(slices[1:], claims)
    assert offered(inv) == {f"{A100}-MIG-3g.40gb": (1, 0), f"{A100}-MIG-1g.10gb": (1, 0)}
    assert [(w.reason, w.message) for w in inv.inventory.warnings] == [
        (dra.COUNTERS_MISSING, "node-m: devices draw on counter set(s) node-m/gpu-0-counter-set, "
         "node-m/gpu-1-counter-set that no ResourceSlice of the pool publishes: they are not offered (the "
         "driver may be re-publishing its slices; if it stays, check the DRA driver's kubelet plugin)"),
        (dra.POOL_INCOMPLETE, "node-m: 2 of the 3 ResourceSlices of pool node-m (gpu.nvidia.com) are listed: "
         "the driver is publishing a new generation, so its devices may be incomplete until it finishes "
         "(the next plan reads them again)")]


def test_whole_gpu_ranks_get_only_the_free_gpu() -> None:
    slices, claims, _ = fixture()
    result = plan_job(make_job(name="whole", ranks=2, global_batch=64, images=IMAGES, gpus={"allowMig": False}),
                      inventory(slices, claims).inventory)
    assert isinstance(result, model.Unschedulable) and result.reason == "InsufficientGPUs"
    assert "need 2, free 1" in result.message


def test_a_job_on_the_node_takes_gpu_1_whole_and_gpu_0s_partitions_and_its_claims_are_pinned() -> None:
    slices, claims, _ = fixture()
    inv = inventory(slices, claims)
    spec = make_job(name="mix", ranks=3, global_batch=48, images=IMAGES, gpus={"selection": "All"})
    plan = plan_job(spec, inv.inventory)
    assert isinstance(plan, model.Plan), getattr(plan, "message", plan)
    assert sorted((g.gpu_type, len(g.ranks)) for g in plan.groups) == [
        (A100, 1), (f"{A100}-MIG-1g.10gb", 1), (f"{A100}-MIG-1g.20gb", 1)]
    _inputs, templates = add_claims(rendering.PodInputs(), spec.name, "team", plan, inv,
                                    labels=labels.selector(spec.name))
    attrs = 'device.attributes["gpu.nvidia.com"]'
    product = f'{attrs}.productName == "NVIDIA A100-SXM4-80GB"'
    by_type = {g.gpu_type: t["spec"]["spec"]["devices"]["requests"][0]["exactly"]
               for g, t in zip(sorted(plan.groups, key=lambda g: g.index), templates)}
    assert {k: (v["deviceClassName"], v["selectors"][0]["cel"]["expression"]) for k, v in by_type.items()} == {
        A100: ("gpu.nvidia.com", f'{product} && {attrs}.uuid in ["{GPU1}"]'),
        f"{A100}-MIG-1g.20gb": ("mig.nvidia.com", f'{product} && {attrs}.profile == "1g.20gb" && '
                                                  f'{attrs}.parentUUID in ["{GPU0}"]'),
        f"{A100}-MIG-1g.10gb": ("mig.nvidia.com", f'{product} && {attrs}.profile == "1g.10gb" && '
                                                  f'{attrs}.parentUUID in ["{GPU0}"]')}
    for t in templates:
        kubernetes_validate.validate(json.loads(json.dumps(t)), "1.35.0", strict=True)


def test_heterotrain_plan_reads_the_slices_and_claims_given_with_dra(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hetero_operator.cli import main

    body = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "digits.yaml").read_text())
    body["spec"]["gpus"] = {"ranks": 4, "minRanks": 1, "selection": "All"}
    body["spec"]["images"] = IMAGES
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(body))
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "NodeList", "items": [node()]}))
    assert main(["plan", str(tmp_path / "job.yaml"), "--nodes", str(tmp_path / "nodes.yaml"),
                 "--dra", str(FIXTURE), "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted((r["product"], r["mig_profile"]) for r in out["ranks"]) == [
        (A100, ""), (A100, "1g.10gb"), (A100, "1g.20gb")]  # 4 asked, 3 free: gpu-1 whole, gpu-0's two
    (tmp_path / "empty.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": []}))
    assert main(["plan", str(tmp_path / "job.yaml"), "--nodes", str(tmp_path / "nodes.yaml"),
                 "--dra", str(tmp_path / "empty.yaml")]) == 1
    assert "no ResourceSlice or ResourceClaim objects" in capsys.readouterr().err
