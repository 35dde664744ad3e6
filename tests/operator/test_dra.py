"""DRA as an inventory and request path (issue 15): ResourceSlices of NVIDIA's driver read into the
planner's inventory, the same plan as on the GFD-labelled twin, and ResourceClaimTemplates with CEL
selectors that validate strictly for Kubernetes 1.34.

Fixtures: tests/fixtures/dra/gfd-cluster.yaml (GFD labels + device plugin, a notebook pod holding
one T4) and its twin dra-cluster.yaml (the same GPUs as ResourceSlices, the notebook's GPU as a
ResourceClaim allocation, plus an outdated pool generation that must be ignored).
"""

from __future__ import annotations

import copy
from dataclasses import replace
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from builders import CATALOG_118_124_128, make_job

from hetero_operator.api import labels
from hetero_operator.api import types as model
from hetero_operator.cluster import dra
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.plan import plan_job
from hetero_operator.render import pods as rendering
from hetero_operator.render.claims import add_claims
from hetero_operator.render.env import render_rank_envs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dra"
K8S_VERSION = "1.34.0"
"""resource.k8s.io/v1 is GA (served by default) from 1.34; kubernetes-validate 1.37.0 ships
schemas for 1.34.0 (and up to 1.37.0)."""
A100 = "NVIDIA A100-SXM4-80GB"


def gfd_cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    nodes, pods = yaml.safe_load_all((FIXTURES / "gfd-cluster.yaml").read_text())
    return nodes["items"], pods["items"]


def dra_cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    nodes, slices, claims = yaml.safe_load_all((FIXTURES / "dra-cluster.yaml").read_text())
    return nodes["items"], slices["items"], claims["items"]


def dra_inventory() -> dra.DraInventory:
    nodes, slices, claims = dra_cluster()
    return dra.build_dra_inventory(nodes, (), slices, claims)


def job(ranks: int = 6):
    return make_job(name="mixed", ranks=ranks, global_batch=256, images=CATALOG_118_124_128)


def test_slices_read_as_devices_with_the_drivers_attributes() -> None:
    _nodes, slices, _claims = dra_cluster()
    read = dra.read_slices(slices)
    assert [(d.node, d.name, d.gpu_type) for d in read] == [
        ("a100-0", "gpu-0", "NVIDIA-A100-SXM4-80GB"), ("a100-0", "gpu-1", "NVIDIA-A100-SXM4-80GB"),
        ("a100-mig-0", "gpu-0-mig-9-0-4", "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"),
        ("a100-mig-0", "gpu-0-mig-9-4-4", "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"),
        ("t4-0", "gpu-0", "Tesla-T4"), ("t4-0", "gpu-1", "Tesla-T4"), ("t4-0", "gpu-2", "Tesla-T4"),
        ("t4-cordoned", "gpu-0", "Tesla-T4")]  # t4-0's generation-0 slice (gpu-9) is outdated
    assert read[2] == dra.DraDevice(
        node="a100-mig-0", pool="a100-mig-0", name="gpu-0-mig-9-0-4", product_name=A100,
        mig_profile="3g.40gb", compute_capability="8.0", driver_version="550.127.5",
        cuda_driver=(12, 4), memory_mib=40192, multiprocessors=42,
        uuid="MIG-a2000000-0000-0000-0000-000000000000",
        parent_uuid="GPU-a2000000-0000-0000-0000-0000000000ff")


def test_dra_inventory_equals_the_gfd_twins() -> None:
    nodes, pods = gfd_cluster()
    gfd = build_inventory(nodes, pods)
    twin = dra_inventory()
    assert twin.dra_nodes == {"a100-0", "a100-mig-0", "t4-0"}
    # the T4 a pod uses on the GFD twin is allocated to a ResourceClaim on the DRA one
    assert [(d.node, d.claimed) for d in twin.inventory.devices() if d.claimed] == [("t4-0", 1)]
    assert [replace(d, claimed=0) for d in twin.inventory.devices()] == gfd.devices()
    assert [(n.name, n.max_cuda, n.driver_cuda) for n in twin.inventory.nodes] == [
        (n.name, n.max_cuda, n.driver_cuda) for n in gfd.nodes]
    assert [(e.node, e.reason) for e in twin.inventory.excluded] == [
        (e.node, e.reason) for e in gfd.excluded] == [("t4-cordoned", model.UNSCHEDULABLE)]
    t4 = next(d for d in twin.inventory.devices() if d.node == "t4-0")
    assert (t4.total, t4.free) == (3, 2)  # the notebook's claim holds gpu-1


@pytest.mark.parametrize("ranks", [2, 5, 6])
def test_same_plan_on_gfd_and_dra_clusters(ranks: int) -> None:
    nodes, pods = gfd_cluster()
    from_gfd = plan_job(job(ranks), build_inventory(nodes, pods))
    from_dra = plan_job(job(ranks), dra_inventory().inventory)
    assert isinstance(from_gfd, model.Plan), from_gfd
    assert from_dra == from_gfd


def test_same_unschedulable_answer_on_both() -> None:
    nodes, pods = gfd_cluster()
    from_gfd = plan_job(job(7), build_inventory(nodes, pods))
    from_dra = plan_job(job(7), dra_inventory().inventory)
    assert isinstance(from_gfd, model.Unschedulable)
    # the same, except that the DRA twin says why its busy T4 is not free (issue 21)
    assert "t4-0: 1 of 3 in use," in from_gfd.message
    assert from_dra.message == from_gfd.message.replace(
        "t4-0: 1 of 3 in use,", "t4-0: 1 of 3 in use (1 allocated to DRA ResourceClaims),")


def rendered(ranks: int = 6) -> tuple[model.Plan, list[dict[str, Any]], list[dict[str, Any]]]:
    spec = job(ranks)
    inv = dra_inventory()
    plan = plan_job(spec, inv.inventory)
    assert isinstance(plan, model.Plan), plan
    addr = rendering.master_addr(spec.name, spec.namespace, plan)
    envs = render_rank_envs(plan, spec, master_addr=addr, master_port=29500, simulated=False)
    before = rendering.PodInputs()
    inputs, templates = add_claims(before, spec.name, spec.namespace, plan, inv,
                                   labels=labels.selector(spec.name))
    assert before == rendering.PodInputs(), "add_claims must not modify its input"
    out = rendering.render_pods(spec, plan, envs, launcher=("heterotrain", "launch", "--"), inputs=inputs)
    return plan, out, templates


def test_claim_templates_pin_the_planned_gpu_type_with_cel() -> None:
    plan, pods, templates = rendered()
    assert [(g.node, g.gpu_type, len(g.ranks)) for g in plan.groups] == [
        ("a100-0", "NVIDIA-A100-SXM4-80GB", 2), ("a100-mig-0", "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", 1),
        ("a100-mig-0", "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", 1), ("t4-0", "Tesla-T4", 2)]
    assert [t["metadata"]["name"] for t in templates] == ["mixed-a1-g0", "mixed-a1-g1", "mixed-a1-g2", "mixed-a1-g3"]
    whole = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-80GB"'
    mig = whole + ' && device.attributes["gpu.nvidia.com"].profile == "3g.40gb"'
    t4 = 'device.attributes["gpu.nvidia.com"].productName == "Tesla T4"'
    assert [t["spec"]["spec"]["devices"]["requests"] for t in templates] == [
        [{"name": "gpus", "exactly": {"deviceClassName": cls, "allocationMode": "ExactCount",
                                      "count": count, "selectors": [{"cel": {"expression": expr}}]}}]
        for cls, count, expr in [("gpu.nvidia.com", 2, whole), ("mig.nvidia.com", 1, mig),
                                 ("mig.nvidia.com", 1, mig), ("gpu.nvidia.com", 2, t4)]]


def test_pods_reference_their_groups_template_instead_of_extended_resources() -> None:
    _plan, pods, _templates = rendered()
    assert [(p["metadata"]["name"], p["spec"]["resourceClaims"]) for p in pods] == [
        (f"mixed-g{i}", [{"name": "gpus", "resourceClaimTemplateName": f"mixed-a1-g{i}"}])
        for i in range(4)]
    for pod in pods:
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["claims"] == [{"name": "gpus"}]
        assert not any(k.startswith("nvidia.com/") for section in ("requests", "limits")
                       for k in container["resources"].get(section, {}))


def test_pods_and_templates_validate_strictly_for_kubernetes_134() -> None:
    _plan, pods, templates = rendered()
    for obj in [*pods, *templates]:
        kubernetes_validate.validate(json.loads(json.dumps(obj)), K8S_VERSION, strict=True)


def test_fixture_slices_and_claims_validate_strictly_for_kubernetes_134() -> None:
    _nodes, slices, claims = dra_cluster()
    for obj in [*slices, *claims]:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_gfd_nodes_keep_extended_resources_beside_dra_nodes() -> None:
    """A cluster with both: GFD nodes request nvidia.com/gpu, DRA nodes claim."""
    gfd_nodes, _pods = gfd_cluster()
    nodes, slices, claims = dra_cluster()
    a100_gfd = next(n for n in gfd_nodes if n["metadata"]["name"] == "a100-0")
    mixed_nodes = [a100_gfd, *(n for n in nodes if n["metadata"]["name"] != "a100-0")]
    inv = dra.build_dra_inventory(mixed_nodes, (), [s for s in slices if s["spec"]["nodeName"] != "a100-0"],
                                  claims)
    assert inv.dra_nodes == {"a100-mig-0", "t4-0"}
    spec = job(6)
    plan = plan_job(spec, inv.inventory)
    envs = render_rank_envs(plan, spec, master_addr="x", master_port=29500, simulated=False)
    inputs, templates = add_claims(rendering.PodInputs(), spec.name, spec.namespace, plan, inv, labels={})
    out = rendering.render_pods(spec, plan, envs, launcher=("heterotrain", "launch", "--"), inputs=inputs)
    assert [t["metadata"]["name"] for t in templates] == ["mixed-a1-g1", "mixed-a1-g2", "mixed-a1-g3"]
    assert "resourceClaims" not in out[0]["spec"]
    assert out[0]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"


def test_v1beta1_device_shape_reads_the_same() -> None:
    _nodes, slices, _claims = dra_cluster()
    beta = copy.deepcopy(slices)
    for s in beta:
        s["apiVersion"] = "resource.k8s.io/v1beta1"
        s["spec"]["devices"] = [{"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}}
                                for d in s["spec"]["devices"]]
    assert dra.read_slices(beta) == dra.read_slices(slices)


def test_a_device_without_product_name_excludes_its_node_naming_the_attribute() -> None:
    nodes, slices, claims = dra_cluster()
    broken = copy.deepcopy(slices)
    del broken[2]["spec"]["devices"][0]["attributes"]["productName"]   # t4-0, gpu-0
    inv = dra.build_dra_inventory(nodes, (), broken, claims)
    (excluded,) = [e for e in inv.inventory.excluded if e.node == "t4-0"]
    assert excluded.reason == model.MALFORMED_LABELS
    assert "gpu.nvidia.com/productName (string) is missing" in excluded.message
    assert "t4-0" not in inv.dra_nodes


def test_other_drivers_are_ignored_and_partitionable_devices_carry_their_consumption() -> None:
    nodes, slices, _claims = dra_cluster()
    extra = copy.deepcopy(slices[0])
    extra["spec"]["driver"] = "gpu.example.com"
    partitionable = copy.deepcopy(slices[0])
    partitionable["spec"]["devices"][0]["consumesCounters"] = [
        {"counterSet": "gpu-0-counters", "counters": {"memory": {"value": "80Gi"}}}]
    assert dra.read_slices([extra]) == []
    assert [(d.name, d.consumes) for d in dra.read_slices([partitionable])] == [
        ("gpu-0", (("gpu-0-counters", (("memory", 80 * 2**30),)),)), ("gpu-1", ())]


def test_claims_of_the_job_itself_are_recognised() -> None:
    mine = {"metadata": {"namespace": "default", "ownerReferences": [
        {"kind": "Pod", "name": "mixed-g1-m0"}]}}
    other = {"metadata": {"namespace": "default", "ownerReferences": [
        {"kind": "Pod", "name": "mixed2-g0"}]}}
    assert dra.claim_owned_by_job(mine, "mixed", "default")
    assert not dra.claim_owned_by_job(other, "mixed", "default")
    assert not dra.claim_owned_by_job(mine, "mixed", "team-x")
