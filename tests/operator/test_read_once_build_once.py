"""A node read once and a pod built once (issue 28, items 4 and 5).

The inventory is read with the job's pod tolerations and keeps every node's labels; the filters
after it (DRA's merge, the template's nodeSelector and affinity, Kueue's admitted flavors) take
the inventory and never a Node.  Kueue's placement and DRA's claims are inputs of the pod renderer
(:class:`~hetero_operator.render.pods.PodInputs`); no step patches a rendered pod.

Before, a node whose GPUs DRA publishes and that is tainted with a taint the template tolerates
was excluded by the DRA merge (read with the default tolerations) and then read again by the
template filter through the GFD labels it does not have (``NoGPUs``): the job could not use it.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
from pathlib import Path
from typing import Any

from builders import CATALOG_118_124_128, make_job, make_node

from hetero_operator.api import labels
from hetero_operator.api import types as model
from hetero_operator.cluster import dra, nodeindex
from hetero_operator.cluster.inventory import DEFAULT_TOLERATED_TAINT_KEYS, build_inventory
from hetero_operator.cluster.nodeindex import trim_node
from hetero_operator.controller.planner import plan_on_indexes
from hetero_operator.planning.placement import restrict_to_template
from hetero_operator.render import pods as rendering
from hetero_operator.render import workload as kueue
from hetero_operator.render.claims import add_claims
from hetero_operator.render.env import render_rank_envs

SPOT = {"key": "pool", "value": "spot", "effect": "NoSchedule"}
TOLERATE_SPOT = {"key": "pool", "operator": "Equal", "value": "spot", "effect": "NoSchedule"}
A100 = "NVIDIA A100-SXM4-40GB"


def _dra_node(name: str, *, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A Node without GFD labels (its GPUs come from DRA), labelled ``pool=spot``."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"pool": "spot"}},
            "spec": {"taints": taints} if taints else {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "allocatable": {"cpu": "64"}, "capacity": {"cpu": "64"}}}


def _slice(node: str, gpus: int) -> dict[str, Any]:
    devices = [{"name": f"gpu-{i}", "attributes": {
        "type": {"string": "gpu"}, "uuid": {"string": f"GPU-{node}-{i}"},
        "productName": {"string": A100}, "cudaComputeCapability": {"version": "8.0.0"},
        "driverVersion": {"version": "550.54.15"}, "cudaDriverVersion": {"version": "12.4.0"}},
        "capacity": {"memory": {"value": "40Gi"}}} for i in range(gpus)]
    return {"apiVersion": dra.API_VERSION, "kind": "ResourceSlice", "metadata": {"name": f"{node}-gpu"},
            "spec": {"driver": dra.DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}


def _job(tolerations: list[dict[str, str]]) -> Any:
    template: dict[str, Any] = {"spec": {"nodeSelector": {"pool": "spot"}}}
    if tolerations:
        template["spec"]["tolerations"] = tolerations
    job = make_job(ranks=2, min_ranks=2, images=CATALOG_118_124_128)
    return replace(job, worker=replace(job.worker, template=template))


def test_a_dra_node_tainted_with_a_tolerated_taint_is_planned_from_its_slices() -> None:
    nodes = [trim_node(_dra_node("spot-0", taints=[SPOT]))]
    plan, drainv = plan_on_indexes(_job([TOLERATE_SPOT]), nodes, [], [],
                                   dra_source=([_slice("spot-0", 2)], []))
    assert isinstance(plan, model.Plan), plan
    assert [(g.node, g.product, len(g.ranks)) for g in plan.groups] == [
        ("spot-0", "NVIDIA-A100-SXM4-40GB", 2)]
    assert drainv.dra_nodes == frozenset({"spot-0"})
    # without the toleration the taint keeps the job off it, named as the taint
    refused, _ = plan_on_indexes(_job([]), nodes, [], [], dra_source=([_slice("spot-0", 2)], []))
    assert isinstance(refused, model.Unschedulable)
    assert [(e.node, e.reason) for e in refused.excluded] == [("spot-0", model.TAINTED)]


def test_the_filters_read_the_inventory_labels_not_nodes() -> None:
    """Labels given only to the inventory decide; the filters take no Node objects at all."""
    nodes = [make_node("a"), make_node("b")]
    inventory = build_inventory(nodes)
    assert inventory.labels["a"] == nodes[0]["metadata"]["labels"]
    relabelled = replace(inventory, labels={**inventory.labels, "b": {**inventory.labels["b"], "pool": "spot"}})
    kept = restrict_to_template(relabelled, {"spec": {"nodeSelector": {"pool": "spot"}}})
    assert [n.name for n in kept.nodes] == ["b"]
    assert [(e.node, e.reason) for e in kept.excluded] == [("a", "NodeSelectorMismatch")]
    place = kueue.FlavorPlacement(gpu_type="NVIDIA-A100-SXM4-40GB", flavor="spot",
                                  node_labels={"pool": "spot"}, tolerations=(), count=1)
    admitted = kueue.restrict_inventory(relabelled, {"NVIDIA-A100-SXM4-40GB": place})
    assert [(d.node, d.free) for d in admitted.devices()] == [("b", 1)]
    for fn in (dra.merge_dra, restrict_to_template, kueue.restrict_inventory):
        assert "nodes" not in inspect.signature(fn).parameters, fn


def test_tolerations_are_part_of_a_node_s_parse_and_untainted_nodes_share_it() -> None:
    nodes = [trim_node(make_node("plain")), trim_node(make_node("spot", taints=[SPOT]))]
    default = nodeindex.build_indexed_inventory(nodes)
    assert [n.name for n in default.nodes] == ["plain"]
    assert [(e.node, e.reason) for e in default.excluded] == [("spot", model.TAINTED)]
    parses = [n.parsed({}, DEFAULT_TOLERATED_TAINT_KEYS) for n in nodes]
    tolerant = nodeindex.build_indexed_inventory(nodes, tolerations=[TOLERATE_SPOT])
    assert [n.name for n in tolerant.nodes] == ["plain", "spot"]
    assert tolerant == build_inventory(nodes, tolerations=[TOLERATE_SPOT])
    # the untainted node's parse did not depend on the tolerations: the very same object
    assert nodes[0].parsed({}, DEFAULT_TOLERATED_TAINT_KEYS, [TOLERATE_SPOT]) is parses[0]
    assert nodes[1].parsed({}, DEFAULT_TOLERATED_TAINT_KEYS, [TOLERATE_SPOT]) is not parses[1]
    assert nodeindex.build_indexed_inventory(nodes) == default


# --- a pod built once (issue 28, item 5) --------------------------------------------------------

def test_kueue_and_dra_inputs_build_the_pod_once() -> None:
    """An admitted flavor and a DRA claim for the same group: the renderer builds the pod with
    both, and the template's own selector, tolerations and labels stay beside them."""
    job = _job([TOLERATE_SPOT])
    nodes = [trim_node(_dra_node("spot-0", taints=[SPOT]))]
    plan, drainv = plan_on_indexes(job, nodes, [], [], dra_source=([_slice("spot-0", 2)], []))
    assert isinstance(plan, model.Plan), plan
    place = kueue.FlavorPlacement(
        gpu_type="NVIDIA-A100-SXM4-40GB", flavor="spot", node_labels={"pool": "spot", "zone": "a"},
        tolerations=({"key": "zone", "operator": "Exists", "effect": "NoSchedule"}, TOLERATE_SPOT),
        count=2, labels={"example.com/check": "ok"}, annotations={"example.com/note": "checked"})
    empty = rendering.PodInputs()
    inputs = kueue.add_placements(empty, plan, {place.gpu_type: place})
    inputs, templates = add_claims(inputs, job.name, job.namespace, plan, drainv, labels={}, attempt=3)
    assert empty == rendering.PodInputs()  # each step returns new inputs
    envs = render_rank_envs(plan, job, master_addr="x", master_port=29500, simulated=False)
    (pod,) = rendering.render_pods(job, plan, envs, launcher=("l",), attempt=3, inputs=inputs)
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"pool": "spot", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
                                    "zone": "a"}
    assert spec["tolerations"] == [rendering.GPU_TOLERATION, TOLERATE_SPOT,
                                   {"key": "zone", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "job-a3-g0"}]
    assert spec["containers"][0]["resources"] == {"claims": [{"name": "gpus"}]}
    assert (pod["metadata"]["labels"]["example.com/check"], pod["metadata"]["annotations"]["example.com/note"]) == (
        "ok", "checked")
    assert [t["metadata"]["name"] for t in templates] == ["job-a3-g0"]
    assert templates[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
    # without inputs: the extended resource, no selector beyond the template's
    (plain,) = rendering.render_pods(job, plan, envs, launcher=("l",), attempt=3)
    assert plain["spec"]["nodeSelector"] == {"pool": "spot"} and "resourceClaims" not in plain["spec"]
    assert plain["spec"]["containers"][0]["resources"] == {"requests": {"nvidia.com/gpu": "2"},
                                                           "limits": {"nvidia.com/gpu": "2"}}


def test_pod_inputs_add_up_per_group() -> None:
    a = {"key": "a", "operator": "Exists"}
    inputs = rendering.PodInputs().add(1, rendering.GroupInputs(node_selector={"x": "1"}, tolerations=(a,)))
    inputs = inputs.add(1, rendering.GroupInputs(node_selector={"x": "2", "y": "3"}, tolerations=(a,),
                                                 claim_template="t"))
    assert inputs.group(1) == rendering.GroupInputs(node_selector={"x": "2", "y": "3"}, tolerations=(a,),
                                                    claim_template="t")
    assert inputs.group(0) == rendering.GroupInputs()


def test_every_heterotrain_key_is_defined_in_api_labels() -> None:
    """No ``heterotrain.io/`` literal in the operator outside :mod:`hetero_operator.api.labels`
    (a key read back through a literal elsewhere is how rendered pods used to be patched)."""
    package = Path(labels.__file__).resolve().parents[1]
    found = [f"{path.relative_to(package)}:{n}" for path in sorted(package.rglob("*.py"))
             if path.resolve() != Path(labels.__file__).resolve()
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if "heterotrain.io/" in line]
    assert found == []
    assert labels.OWN_PREFIX == "heterotrain.io/"
    assert all(v.startswith(labels.OWN_PREFIX) for k, v in vars(labels).items()
               if k.startswith(("LABEL_", "ANNOTATION_")) and k not in ("LABEL_MANAGED_BY", "ANNOTATION_LOCAL_PORTS",
                                                                          "ANNOTATION_LOCAL_NAMED_PORTS"))
