"""The node index's memoised parse: same inventory as a full parse, re-reads only what changed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hetero_operator.cluster import nodeindex
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.cluster.nodeindex import trim_node

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from bench_plan import synthetic_cluster  # noqa: E402


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the nodes read_node parsed through the index."""
    calls: list[str] = []
    real = nodeindex.read_node

    def read_node(node, used, **kw):  # type: ignore[no-untyped-def]
        calls.append(node["metadata"]["name"])
        return real(node, used, **kw)

    monkeypatch.setattr(nodeindex, "read_node", read_node)
    return calls


def test_indexed_inventory_equals_full_parse_and_rereads_only_changes(counted: list[str]) -> None:
    raw_nodes, pods = synthetic_cluster(300, seed=3)
    index = {n["metadata"]["name"]: trim_node(n) for n in raw_nodes}
    first = nodeindex.build_indexed_inventory(index.values(), pods)
    assert first == build_inventory(list(index.values()), pods)
    assert len(counted) == 300 and first.nodes
    counted.clear()
    assert nodeindex.build_indexed_inventory(index.values(), pods) == first
    assert counted == []  # nothing changed: nothing parsed
    # One node relabelled (kopf stores a new value), one node's GPU pod gone.
    changed = raw_nodes[7]
    changed["metadata"]["labels"]["nvidia.com/gpu.count"] = "1"
    index[changed["metadata"]["name"]] = trim_node(changed)
    freed = pods[0]["spec"]["nodeName"]
    again = nodeindex.build_indexed_inventory(index.values(), pods[1:])
    assert sorted(counted) == sorted({changed["metadata"]["name"], freed})
    assert again == build_inventory(list(index.values()), pods[1:])


def test_only_replaced_node_values_are_read_again_when_pods_did_not_change(counted: list[str]) -> None:
    raw_nodes, pods = synthetic_cluster(200, seed=5)
    index = {n["metadata"]["name"]: trim_node(n) for n in raw_nodes}
    nodeindex.build_indexed_inventory(index.values(), pods_index := [p for e in map(gpu_pod, pods) for p in e])
    counted.clear()
    gone, relabelled = raw_nodes[3], raw_nodes[150]
    gone["spec"] = {"unschedulable": True}  # now excluded
    relabelled["metadata"]["labels"]["nvidia.com/gpu.count"] = "2"
    for n in (gone, relabelled):
        index[n["metadata"]["name"]] = trim_node(n)
    inventory = nodeindex.build_indexed_inventory(index.values(), pods_index)
    assert sorted(counted) == sorted([gone["metadata"]["name"], relabelled["metadata"]["name"]])
    assert inventory == build_inventory(list(index.values()), pods_index)
    assert gone["metadata"]["name"] in {x.node for x in inventory.excluded}


def gpu_pod(pod: dict) -> list:
    from hetero_operator.cluster.nodeindex import gpu_pod_entry
    entry = gpu_pod_entry(pod)
    return list(entry.values()) if entry else []


def test_unchanged_node_keeps_its_value_in_a_kopf_store() -> None:
    # kopf's Store keeps the old value when the new one compares equal (indexing.Store._replace):
    # equality must be the dict's, so the memo survives a re-list.
    raw_nodes, _ = synthetic_cluster(1, seed=0)
    a, b = trim_node(raw_nodes[0]), trim_node(raw_nodes[0])
    a.parsed({}, ())
    assert a == b and isinstance(a, dict) and a._memo is not None and b._memo is None


def test_our_pod_counts_on_its_pinned_node_before_it_is_bound() -> None:
    from hetero_operator.api.labels import LABEL_MANAGED_BY, MANAGED_BY
    from hetero_operator.cluster.nodeindex import gpu_pod_entry

    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In",
                                                 "values": ["node-00003"]}]}]}}}
    ours = {"metadata": {"name": "j-g0", "namespace": "a", "labels": {LABEL_MANAGED_BY: MANAGED_BY}},
            "spec": {"affinity": affinity, "containers": [
                {"name": "w", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
            "status": {"phase": "Pending"}}
    entry = gpu_pod_entry(ours)
    assert entry is not None and list(entry) == ["node-00003"]
    assert entry["node-00003"]["spec"]["nodeName"] == "node-00003"
    assert nodeindex.indexed_used_resources(entry.values()) == {"node-00003": {"nvidia.com/gpu": 4}}
    theirs = {**ours, "metadata": {"name": "x", "namespace": "a", "labels": {}}}
    assert gpu_pod_entry(theirs) is None  # another controller's unbound pod: not placed yet


def test_a_dra_pod_with_resource_claims_is_not_a_gpu_pod_entry_and_does_not_crash() -> None:
    """A container's ``resources.claims`` (DRA) is a list of names, not a resource map: the pod
    index function met it on DRA nodes and raised AttributeError on every event."""
    from hetero_operator.cluster.nodeindex import gpu_pod_entry
    pod = {"metadata": {"name": "p", "namespace": "ns", "labels": {}},
           "spec": {"nodeName": "node-a", "containers": [
               {"name": "worker", "resources": {"claims": [{"name": "gpus"}]}}]},
           "status": {"phase": "Running"}}
    assert gpu_pod_entry(pod) is None


def test_when_the_gpu_pods_change_only_nodes_whose_used_devices_changed_are_looked_at(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The operator's starts differ in their pods (each leaves out its own and adds other starts'
    # held ones): a start must not walk every node's parse again for that (bench_operator).
    raw_nodes, pods = synthetic_cluster(200, seed=7)
    index = {n["metadata"]["name"]: trim_node(n) for n in raw_nodes}
    pods_index = [p for e in map(gpu_pod, pods) for p in e]
    nodeindex.build_indexed_inventory(index.values(), pods_index)
    looked_at: list[str] = []
    real = nodeindex.IndexedNode.parsed

    def parsed(self, used, *args):  # type: ignore[no-untyped-def]
        looked_at.append(self.name)
        return real(self, used, *args)

    monkeypatch.setattr(nodeindex.IndexedNode, "parsed", parsed)
    freed = pods_index[0]["spec"]["nodeName"]
    busy = next(n for n in index if n not in {p["spec"]["nodeName"] for p in pods_index}
                and "nvidia.com/gpu" in index[n]["status"]["allocatable"]
                and int(index[n]["status"]["allocatable"]["nvidia.com/gpu"]) > 0)
    added = gpu_pod({"metadata": {"name": "new", "namespace": "t"}, "spec": {"nodeName": busy, "containers": [
        {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}, "status": {"phase": "Running"}})
    now = pods_index[1:] + added
    inventory = nodeindex.build_indexed_inventory(index.values(), now)
    assert sorted(looked_at) == sorted([freed, busy])
    assert inventory == build_inventory(list(index.values()), now)
    free = {d.node: d.free for d in inventory.devices()}
    assert free[busy] == int(index[busy]["status"]["allocatable"]["nvidia.com/gpu"]) - 1
    looked_at.clear()  # the same pods again, one node relabelled: that node only
    relabelled = raw_nodes[40]
    relabelled["metadata"]["labels"]["nvidia.com/gpu.count"] = "1"
    index[relabelled["metadata"]["name"]] = trim_node(relabelled)
    assert nodeindex.build_indexed_inventory(index.values(), list(now)) == build_inventory(
        list(index.values()), now)
    assert looked_at == [relabelled["metadata"]["name"]]
