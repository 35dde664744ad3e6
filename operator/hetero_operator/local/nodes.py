"""This machine's real GPUs as Kubernetes Node objects, so ``heterotrain run`` plans onto them.

GFD labels one product per node, so a machine with several GPU models becomes one pseudo-node per
model (``<host>-<product>``); MIG-enabled GPUs are left out (one process per MIG slice would need
the slices' UUIDs; the embedded default uses whole GPUs only). The planner then groups ranks by
(node, product) exactly as on a cluster. Pure and torch-free: the caller passes
:func:`heterotrain_common.nvml.list_gpus` output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from heterotrain_common.nvml import GpuInfo

FAMILIES = (("7.5", "turing"), ("7.", "volta"), ("8.9", "ada-lovelace"), ("8.", "ampere"),
            ("9.", "hopper"), ("10.", "blackwell"), ("12.", "blackwell"), ("6.", "pascal"))
"""Compute capability prefix -> GFD family (first match wins; shared/docs/gpu-facts.md)."""


def family(compute_capability: str) -> str:
    """GFD ``gpu.family`` for a compute capability, ``""`` when unknown."""
    return next((f for prefix, f in FAMILIES if compute_capability.startswith(prefix)), "")


def visible_gpus(gpus: Sequence[GpuInfo], *, preset: str | None,
                 device_order: str | None) -> list[GpuInfo]:
    """The GPUs a preset ``CUDA_VISIBLE_DEVICES`` leaves visible, in the preset's order.

    Entries are UUIDs (``GPU-…``, a unique prefix is enough, as CUDA accepts) or indices. Indices
    mean NVML's (PCI bus) order only under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; in CUDA's default
    fastest-first order they can be mapped only when the machine has one GPU model (then the two
    orders agree). As in CUDA, the list ends at the first entry that names no GPU.

    Args:
        gpus: from :func:`heterotrain_common.nvml.list_gpus`.
        preset: the environment's ``CUDA_VISIBLE_DEVICES``; None means every GPU.
        device_order: the environment's ``CUDA_DEVICE_ORDER``.

    Returns:
        The visible GPUs.

    Raises:
        ValueError: indices in fastest-first order on a machine with several GPU models (the
            message says to give UUIDs or set ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).
    """
    if preset is None:
        return list(gpus)
    by_index = {g.index: g for g in gpus}
    several_models = len({g.product for g in gpus}) > 1
    visible: list[GpuInfo] = []
    for entry in (e.strip() for e in preset.split(",")):
        if entry.isdigit():
            if device_order != "PCI_BUS_ID" and several_models:
                raise ValueError(f"CUDA_VISIBLE_DEVICES={preset} gives indices in CUDA's default "
                                 "fastest-first order, which cannot be mapped on a machine with "
                                 "several GPU models: give GPU UUIDs (nvidia-smi -L) or set "
                                 "CUDA_DEVICE_ORDER=PCI_BUS_ID")
            match = [by_index[int(entry)]] if int(entry) in by_index else []
        else:
            match = [g for g in gpus if entry and g.uuid.startswith(entry)]
        if len(match) != 1:
            break
        visible.append(match[0])
    return visible


def nodes_from_gpus(gpus: Sequence[GpuInfo], *, host: str, driver_version: str,
                    cuda_version: str) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """Node objects with GFD labels for the whole (non-MIG) GPUs of one machine.

    Args:
        gpus: from :func:`heterotrain_common.nvml.list_gpus`.
        host: node name prefix (the hostname).
        driver_version: e.g. ``"550.54.15"``.
        cuda_version: highest CUDA the driver supports, e.g. ``"12.4"``.

    Returns:
        ``(nodes, indices)``: the Node dicts, and per node name the NVML indices of its GPUs in
        order (a group's ``LOCAL_RANK`` i uses ``indices[node][i]``).
    """
    by_product: dict[str, list[GpuInfo]] = {}
    for gpu in gpus:
        if not gpu.mig_enabled:
            by_product.setdefault(gpu.product, []).append(gpu)
    major, _, minor = driver_version.partition(".")
    cuda_major, _, cuda_minor = cuda_version.partition(".")
    nodes, indices = [], {}
    for product, same in sorted(by_product.items()):
        name = f"{host}-{product}".lower()
        cc_major, _, cc_minor = same[0].compute_capability.partition(".")
        labels = {
            "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.count": str(len(same)),
            "nvidia.com/gpu.memory": str(min(g.memory_mib for g in same)),
            "nvidia.com/gpu.compute.major": cc_major, "nvidia.com/gpu.compute.minor": cc_minor,
            "nvidia.com/cuda.driver-version.full": driver_version,
            "nvidia.com/cuda.driver-version.major": major,
            "nvidia.com/cuda.driver-version.minor": minor.partition(".")[0],
            "nvidia.com/cuda.runtime-version.full": cuda_version,
            "nvidia.com/cuda.runtime-version.major": cuda_major,
            "nvidia.com/cuda.runtime-version.minor": cuda_minor,
        }
        if family(same[0].compute_capability):
            labels["nvidia.com/gpu.family"] = family(same[0].compute_capability)
        nodes.append({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"capacity": {"nvidia.com/gpu": str(len(same))},
                       "allocatable": {"nvidia.com/gpu": str(len(same))},
                       "conditions": [{"type": "Ready", "status": "True"}]}})
        indices[name] = [g.index for g in same]
    return nodes, indices
