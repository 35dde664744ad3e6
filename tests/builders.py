"""Builders for test inputs: Node and Pod dicts shaped like the API's, and job manifests.

``make_node(product="Tesla-T4", count=2)`` gives a Ready node with GFD labels and matching
allocatable; ``mig=`` selects the MIG strategy, ``replicas=`` time-slicing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hetero_operator.api.settings import OperatorConfig
from hetero_operator.api.spec import JobSpec, parse_job

CATALOG_118_124_128 = [
    {"image": "reg/train:cu118", "cudaVersion": "11.8",
     "computeCapabilities": ["6.0", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0"]},
    {"image": "reg/train:cu124", "cudaVersion": "12.4",
     "computeCapabilities": ["7.0", "7.5", "8.0", "8.6", "8.9", "9.0"]},
    {"image": "reg/train:cu128", "cudaVersion": "12.8",
     "computeCapabilities": ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]},
]
"""cu118/cu124/cu128 catalog; cu128 has no 7.0 kernels (as PyTorch's CUDA 12.8 wheels)."""
REPO = Path(__file__).resolve().parents[1]


def make_node(name: str = "node-a", *, product: str | None = "NVIDIA-A100-SXM4-40GB", count: int = 1,
              memory_mib: int | None = 40960, cc: str | None = "8.0", family: str | None = None,
              driver: str | None = "550.107.02", runtime: str | None = "12.4",
              deprecated_cuda: bool = False, mig_single: str | None = None,
              mig_mixed: dict[str, tuple[int, int]] | None = None, whole_allocatable: int | None = None,
              replicas: int | None = None, unschedulable: bool = False, ready: bool | None = True,
              taints: list[dict[str, str]] | None = None, mig_state: str | None = None,
              labels: dict[str, str] | None = None, allocatable: dict[str, str] | None = None,
              ) -> dict[str, Any]:
    """A Node dict.

    Args:
        product: base ``gpu.product`` (None omits the label).
        count: physical GPUs (``gpu.count``); MIG single: the number of slices.
        mig_single: profile for the single strategy (product gets ``-MIG-<profile>``).
        mig_mixed: ``{profile: (count, memory_mib)}`` for the mixed strategy.
        whole_allocatable: ``nvidia.com/gpu`` allocatable (default: ``count``, 0 under mixed MIG).
        replicas: time-slicing replicas (product gets ``-SHARED``, allocatable count * replicas).
        deprecated_cuda: write only ``cuda.driver.*``/``cuda.runtime.*``.
        ready: Ready condition status; None omits conditions.
    """
    lab: dict[str, str] = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": str(count)}
    if product is not None:
        suffix = f"-MIG-{mig_single}" if mig_single else "-SHARED" if replicas else ""
        lab["nvidia.com/gpu.product"] = product + suffix
    if memory_mib is not None:
        lab["nvidia.com/gpu.memory"] = str(memory_mib)
    if cc is not None:
        major, minor = cc.split(".")
        lab["nvidia.com/gpu.compute.major"], lab["nvidia.com/gpu.compute.minor"] = major, minor
    if family:
        lab["nvidia.com/gpu.family"] = family
    lab.update(_cuda_labels(driver, runtime, deprecated_cuda))
    if mig_single:
        lab["nvidia.com/mig.strategy"] = "single"
    alloc: dict[str, str] = {}
    if mig_mixed is not None:
        lab["nvidia.com/mig.strategy"] = "mixed"
        for profile, (n, mem) in mig_mixed.items():
            lab[f"nvidia.com/mig-{profile}.count"] = str(n)
            lab[f"nvidia.com/mig-{profile}.memory"] = str(mem)
            alloc[f"nvidia.com/mig-{profile}"] = str(n)
    if replicas:
        lab["nvidia.com/gpu.replicas"] = str(replicas)
        lab["nvidia.com/gpu.sharing-strategy"] = "time-slicing"
    if mig_state:
        lab["nvidia.com/mig.config"] = "all-1g.10gb"
        lab["nvidia.com/mig.config.state"] = mig_state
    lab.update(labels or {})
    whole = whole_allocatable if whole_allocatable is not None else (
        0 if mig_mixed is not None else count * (replicas or 1))
    alloc["nvidia.com/gpu"] = str(whole)
    alloc.update(allocatable or {})
    node: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": lab},
        "spec": {}, "status": {"allocatable": {"cpu": "16", **alloc}, "capacity": {"cpu": "16", **alloc}},
    }
    if unschedulable:
        node["spec"]["unschedulable"] = True
    if taints:
        node["spec"]["taints"] = taints
    if ready is not None:
        node["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False",
                                         "reason": "KubeletReady" if ready else "KubeletNotReady"}]
    return node


def _cuda_labels(driver: str | None, runtime: str | None, deprecated: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    if driver:
        parts = driver.split(".")
        if deprecated:
            keys = ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev")
        else:
            out["nvidia.com/cuda.driver-version.full"] = driver
            keys = ("nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver-version.minor",
                    "nvidia.com/cuda.driver-version.revision")
        out.update(dict(zip(keys, parts)))
    if runtime:
        major, minor = runtime.split(".")
        if deprecated:
            out["nvidia.com/cuda.runtime.major"], out["nvidia.com/cuda.runtime.minor"] = major, minor
        else:
            out["nvidia.com/cuda.runtime-version.full"] = runtime
            out["nvidia.com/cuda.runtime-version.major"] = major
            out["nvidia.com/cuda.runtime-version.minor"] = minor
    return out


def make_pod(node: str, resources: dict[str, int], *, phase: str = "Running",
             name: str = "other") -> dict[str, Any]:
    """A Pod bound to ``node`` whose one container limits ``resources``."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [
                {"name": "main", "resources": {"limits": {k: str(v) for k, v in resources.items()}}}]},
            "status": {"phase": phase}}


def job_manifest(*, name: str = "job", ranks: int = 2, min_ranks: int | None = None,
                 global_batch: int | None = 64, images: list[dict[str, Any]] | None = None,
                 gpus: dict[str, Any] | None = None, training: dict[str, Any] | None = None,
                 ) -> dict[str, Any]:
    """A HeteroTrainingJob manifest dict (``global_batch=None`` omits ``globalBatchSize``)."""
    train: dict[str, Any] = {} if global_batch is None else {"globalBatchSize": global_batch}
    train.update(training or {})
    g: dict[str, Any] = {"ranks": ranks, **({"minRanks": min_ranks} if min_ranks else {})}
    g.update(gpus or {})
    return {"apiVersion": "heterotrain.io/v1alpha1", "kind": "HeteroTrainingJob",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"worker": {"command": ["python", "-m", "train"]}, "images": images or [],
                     "gpus": g, "training": train}}


def a100_and_two_t4_plan(job: JobSpec) -> Any:
    """``job`` planned on node-a100 (1x A100-40GB) and node-t4 (2x T4); asserts it is a Plan."""
    from hetero_operator.api import types as model
    from hetero_operator.cluster.inventory import build_inventory
    from hetero_operator.planning.plan import plan_job

    nodes = [make_node("node-a100", product="NVIDIA-A100-SXM4-40GB", memory_mib=40960),
             make_node("node-t4", product="Tesla-T4", count=2, memory_mib=15360, cc="7.5")]
    result = plan_job(job, build_inventory(nodes))
    assert isinstance(result, model.Plan)
    return result


def make_job(**kwargs: Any) -> JobSpec:
    """A parsed :class:`JobSpec`; keyword arguments as :func:`job_manifest`."""
    return parse_job(job_manifest(**kwargs))


def e2e_config(changes: Mapping[str, Any] | None = None) -> OperatorConfig:
    """The in-process operator's settings of the e2e tests: standalone, no metrics or health port,
    simulated devices, short intervals and backoff (1 s resync, 0.3 s progress reads, restarts
    after 0.3 s doubling to 1 s, unschedulable jobs re-planned every 2 s); ``changes`` by field
    path (:meth:`OperatorConfig.with_`) on top."""
    return OperatorConfig().with_({
        "peering.name": "", "ports.metrics": 0, "ports.health": 0, "pods.simulate_devices": True,
        "intervals.resync_s": 1.0, "intervals.progress_s": 0.3, "restart.backoff_base_s": 0.3,
        "restart.backoff_max_s": 1.0, "restart.unschedulable_retry_s": 2.0, **(changes or {})})


def digits_job(name: str, tmp: Path, *, args: list[str], **spec: Any) -> dict[str, Any]:
    """examples/digits.yaml renamed ``name``, the worker's ``args``, no simulated delay, its
    checkpoints under ``tmp/<name>/ckpt``; ``spec`` sections (``gpus={...}``) merged over it."""
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"]["name"] = name
    body["spec"]["worker"]["args"] = args
    body["spec"]["worker"]["env"] = [{"name": "HTJ_SIM_DELAY_PER_SAMPLE_S", "value": "0"}]
    body["spec"]["training"]["checkpoint"]["path"] = str(tmp / name / "ckpt")
    for section, values in spec.items():
        body["spec"].setdefault(section, {}).update(values)
    return body


def script_job(name: str, code: str, **spec: Any) -> dict[str, Any]:
    """A digits job whose 4 ranks (all or nothing: the same 3 pods every time on the mixed
    cluster, A100, V100, 2x T4) run ``python -c code`` without checkpoints (lifecycle tests that
    need no training); ``spec`` sections merged over it."""
    body = digits_job(name, Path("/tmp"), args=[])
    body["spec"]["worker"]["command"] = ["python", "-c", code]
    body["spec"]["gpus"]["minRanks"] = 4
    body["spec"]["training"].pop("checkpoint")
    for section, values in spec.items():
        body["spec"].setdefault(section, {}).update(values)
    return body


def local_job(path: Path, name: str, command: list[str], *, env: Mapping[str, str] | None = None) -> Path:
    """A job for ``heterotrain run`` written to ``path``: examples/digits.yaml renamed ``name``, its
    worker ``command`` with ``env``, FP32, no checkpoints, no restart (``backoffLimit: 0``)."""
    doc = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["worker"] = {"command": command, "env": [{"name": k, "value": v} for k, v in (env or {}).items()]}
    doc["spec"]["training"]["precision"] = "FP32"
    del doc["spec"]["training"]["checkpoint"]
    doc["spec"]["runPolicy"]["backoffLimit"] = 0
    path.write_text(yaml.safe_dump(doc))
    return path


def plan_batches_by_type(work: Path) -> dict[str, list[int]]:
    """The local batches of each GPU type (product -> its ranks' batches, in rank order) from the
    ``plan.json`` that ``heterotrain run --workdir WORK`` wrote."""
    import json

    by_type: dict[str, list[int]] = {}
    for g in json.loads((work / "plan.json").read_text())["groups"]:
        by_type.setdefault(g["product"], []).extend(g["local_batches"])
    return by_type
