"""Kueue's queues for ``heterotrain cluster up --kueue``: one ResourceFlavor per GPU type of the
node list, one ClusterQueue over them, a LocalQueue in ``default`` and the PriorityClass that
``examples/queued-job.yaml`` names, so that example is admitted as written (docs/kueue.md).

Each flavor pins ``nvidia.com/gpu.product`` (the operator's pod sets select it); the ClusterQueue
covers ``cpu``, ``memory`` and ``nvidia.com/gpu`` in one resource group, each flavor's quota the sum
of the allocatable of the nodes of that GPU type (so Kueue admits what the nodes can hold), and
preempts lower priorities within itself.  The names are defined here only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from . import controlplane

KUEUE_API = "kueue.x-k8s.io/v1beta2"
CLUSTER_QUEUE = "heterotrain-gpus"
"""The ClusterQueue over every GPU type of the node list."""
LOCAL_QUEUE = "gpu-queue"
"""The LocalQueue of ``default`` (``kueue.x-k8s.io/queue-name`` of examples/queued-job.yaml)."""
LOCAL_QUEUE_NAMESPACE = "default"
PRIORITY_CLASS = "training"
"""The PriorityClass of examples/queued-job.yaml (``spec.runPolicy.schedulingPolicy.priorityClass``)."""
PRIORITY_VALUE = 1000
PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
COVERED = ("cpu", "memory", GPU_RESOURCE)


def flavor_name(product: str) -> str:
    """A ResourceFlavor name for a GPU product: lower case, runs of other characters as ``-``
    (``Tesla-T4`` -> ``tesla-t4``)."""
    return re.sub(r"[^a-z0-9]+", "-", product.lower()).strip("-")


def _quantity(value: str) -> float:
    """A CPU or memory quantity as a number (cores, bytes)."""
    units = {"m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
             "Ti": 2**40}
    found = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(value))
    if not found:
        raise ValueError(f"not a quantity: {value!r}")
    return float(found.group(1)) * units.get(found.group(2), 1)


def _total(values: Iterable[str], resource: str) -> str:
    total = sum(_quantity(v) for v in values)
    if resource == "memory":
        return f"{int(total // 2**20)}Mi"
    if resource == "cpu":
        return f"{int(round(total * 1000))}m"
    return str(int(total))


def gpu_types(nodes: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """Per GPU product of the nodes that have GPUs: the summed allocatable of :data:`COVERED`."""
    by_product: dict[str, dict[str, list[str]]] = {}
    for node in nodes:
        product = ((node.get("metadata") or {}).get("labels") or {}).get(PRODUCT_LABEL)
        status = node.get("status") or {}
        alloc = status.get("allocatable") or status.get("capacity") or {}
        if not product or not int(alloc.get(GPU_RESOURCE, 0) or 0):
            continue
        sums = by_product.setdefault(product, {r: [] for r in COVERED})
        for r in COVERED:
            sums[r].append(str(alloc.get(r, 0)))
    return {p: {r: _total(v, r) for r, v in sums.items()} for p, sums in sorted(by_product.items())}


def manifests(nodes: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ResourceFlavors, the ClusterQueue, the LocalQueue and the PriorityClass for ``nodes``."""
    types = gpu_types(nodes)
    flavors = [{"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": flavor_name(p)},
                "spec": {"nodeLabels": {PRODUCT_LABEL: p}}} for p in types]
    cq = {"apiVersion": KUEUE_API, "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
          "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                   "resourceGroups": [{"coveredResources": list(COVERED), "flavors": [
                       {"name": flavor_name(p), "resources": [{"name": r, "nominalQuota": q[r]} for r in COVERED]}
                       for p, q in types.items()]}]}}
    lq = {"apiVersion": KUEUE_API, "kind": "LocalQueue",
          "metadata": {"name": LOCAL_QUEUE, "namespace": LOCAL_QUEUE_NAMESPACE},
          "spec": {"clusterQueue": CLUSTER_QUEUE}}
    pc = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": PRIORITY_CLASS},
          "value": PRIORITY_VALUE, "globalDefault": False,
          "description": "HeteroTrainingJobs of the local cluster's queue (examples/queued-job.yaml)"}
    return [*flavors, cq, lq, pc]


def install(cluster_dir: Path, nodes: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``kubectl apply`` :func:`manifests` (Kueue's CRDs and webhooks must be up); returns them.

    Raises:
        ControlPlaneError: refused by the API server or Kueue's webhooks.
    """
    docs = manifests(nodes)
    controlplane.kubectl(cluster_dir, "apply", "-f", "-",
                         input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    return docs


def uninstall(cluster_dir: Path, docs: Iterable[Mapping[str, Any]]) -> None:
    """Delete what :func:`install` made (tests sharing one cluster)."""
    controlplane.kubectl(cluster_dir, "delete", "--ignore-not-found", "--wait=false", "-f", "-",
                         input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(docs)}))
