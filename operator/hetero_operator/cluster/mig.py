"""MIG and whole-GPU counts of one node from its GFD labels and allocatable: mixed and single
strategy, slices that do not fit beside whole GPUs (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetero_operator.api import types as model
from hetero_operator.api.types import Device, InventoryWarning
from hetero_operator.cluster import gfd
from hetero_operator.cluster.gputable import lookup_model, memory_from_name, mig_speed


class NodeExcluded(Exception):
    """The node offers nothing to plan on: ``reason`` (CamelCase) and a one-line ``message``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def table_memory(base: str) -> int:
    """The GPU table's memory of product ``base``, MiB (0 when the table does not know it)."""
    table = lookup_model(base)
    return table.memory_mib if table else 0


def gpus_taken_by_mig(mixed: list[Device], base: str) -> int:
    """Fewest physical GPUs the MIG slices can occupy: compute slices / slices per GPU, rounded up.

    A MIG-enabled GPU has 7 compute slices (4 on an A30; NVIDIA MIG user guide, "Supported
    Profiles"), and a GPU is offered either whole or as its slices, never both.
    """
    if not mixed:
        return 0
    table = lookup_model(base)
    per_gpu = 4 if table is not None and table.name == "A30" else 7
    return -(-sum(d.total * d.compute_slices for d in mixed) // per_gpu)


def whole_or_single(name: str, labels: Mapping[str, str], alloc: Mapping[str, int] | None,
                     used: Mapping[str, int], product: gfd.ProductName, speed: float,
                     common: dict[str, Any], mig_gpus: int,
                     warnings: list[InventoryWarning]) -> list[Device]:
    """Devices behind ``nvidia.com/gpu``: whole GPUs, or MIG slices under the single strategy.

    Whole GPUs are capped at ``gpu.count`` minus ``mig_gpus`` (the GPUs the mixed-strategy slices
    occupy), so a stale whole-GPU allocatable next to MIG slices never offers a GPU twice.
    """
    count_label = gfd.read_int(labels, gfd.COUNT)
    advertised = alloc.get(gfd.GPU_RESOURCE, 0) if alloc is not None else (count_label or 0)
    if advertised <= 0:
        return []
    in_use = used.get(gfd.GPU_RESOURCE, 0)
    mem_label = gfd.read_int(labels, gfd.MEMORY)
    if not product.mig_profile:
        product = _single_strategy_without_suffix(labels, product, mem_label)
    if product.mig_profile:
        slices = gfd.profile_slices(product.mig_profile)
        mem = mem_label or gfd.profile_memory_mib(product.mig_profile)
        return [Device(**common, mig_profile=product.mig_profile, memory_mib=mem,
                       resource_name=gfd.GPU_RESOURCE, total=advertised,
                       free=max(0, advertised - in_use), relative_speed=mig_speed(speed, slices),
                       compute_slices=slices,
                       multiprocessors=gfd.read_int(labels, gfd.MULTIPROCESSORS) or 0)]
    mem = mem_label or memory_from_name(product.base) or table_memory(product.base)
    if not mem:
        raise NodeExcluded(model.MALFORMED_LABELS, f"label {gfd.MEMORY} is missing and {product.base} is "
                        "not in the product table")
    cap = _whole_gpu_cap(name, count_label, mig_gpus, advertised, alloc is not None, warnings)
    total, free, replicas = advertised, max(0, advertised - in_use), 1
    if _is_shared(labels, product, advertised, count_label):
        physical = count_label or max(1, advertised // max(1, gfd.read_int(labels, gfd.REPLICAS) or 1))
        replicas = max(gfd.read_int(labels, gfd.REPLICAS) or 1, -(-advertised // physical))
        total = min(physical, advertised, cap)
        free = min(total, max(0, advertised - in_use))
    elif cap < total:
        total, free = cap, max(0, cap - in_use)
    if total <= 0:
        return []
    if replicas > 1 and str(labels.get(gfd.SHARING, "")).strip().lower() == "mps":
        # MPS runs the replicas' clients side by side, each pinned to memory / replicas and
        # 100 / replicas % of the SMs (k8s-device-plugin#764, #1655; shared case 54); time-slicing
        # gives each pod the whole card in turns, so it keeps the full memory and speed.
        mem, speed = mem // replicas, speed / replicas
    return [Device(**common, memory_mib=mem, resource_name=gfd.GPU_RESOURCE, total=total, free=free,
                   relative_speed=speed, time_sliced_replicas=replicas)]


def _whole_gpu_cap(name: str, count_label: int | None, mig_gpus: int, advertised: int,
                   from_allocatable: bool, warnings: list[InventoryWarning]) -> int:
    """Most whole GPUs the node can have next to its MIG slices (``advertised`` without slices).

    Allocatable is trusted when it is consistent with the slices (``advertised + mig_gpus <=
    gpu.count``); when it is not, it still counts carved GPUs, and since only a lower bound of the
    carved GPUs is known, no GPU is offered whole (a plan never requests a device that does not
    exist; tests/operator/test_inventory.py's property test).
    """
    if not mig_gpus:
        return advertised
    if count_label is None:
        cap, why = 0, (f"{gfd.COUNT} is missing, so which GPUs are still whole cannot be told; "
                       "offering none")
    elif from_allocatable and advertised + mig_gpus > count_label:
        # Stale: the whole count still includes carved GPUs. How many are carved is not known
        # (``mig_gpus`` is only a lower bound: 3 x 2g.20gb leave a GPU's 7th compute slice idle),
        # so none is offered whole until the device plugin re-registers.
        cap = 0
        why = (f"the slices occupy at least {mig_gpus} of the {count_label} GPUs ({gfd.COUNT}), so "
               "allocatable's whole count is stale and which GPUs are still whole cannot be told; "
               "offering none")
    else:
        cap = max(0, count_label - mig_gpus)
        why = (f"the slices occupy at least {mig_gpus} of the {count_label} GPUs ({gfd.COUNT}); "
               f"offering {cap} whole")
    if from_allocatable and advertised > cap:
        warnings.append(InventoryWarning(
            node=name, reason=model.GPU_OFFERED_TWICE,
            message=f"{name}: allocatable offers {advertised} whole {gfd.GPU_RESOURCE} next to MIG "
                    f"slices; {why} (a GPU is used whole or as its slices, never both: the device "
                    "plugin has not caught up with the MIG change)"))
    return cap


def _single_strategy_without_suffix(labels: Mapping[str, str], product: gfd.ProductName,
                                    mem_label: int | None) -> gfd.ProductName:
    """Under ``mig.strategy=single``, a ``gpu.memory`` far below the product's nominal memory
    means ``nvidia.com/gpu`` is a MIG slice even without the ``-MIG-`` suffix (case 03's rule).

    The profile comes from ``mig.config=all-<profile>``.

    Raises:
        NodeExcluded: ``MalformedLabels`` when the profile cannot be told.
    """
    nominal = memory_from_name(product.base) or table_memory(product.base)
    if (labels.get(gfd.MIG_STRATEGY) != "single" or not mem_label or not nominal
            or mem_label >= nominal * 0.6):
        return product
    config = str(labels.get(gfd.MIG_CONFIG, ""))
    profile = config[len("all-"):] if config.startswith("all-") else ""
    try:
        gfd.profile_slices(profile)
    except gfd.LabelError:
        raise NodeExcluded(model.MALFORMED_LABELS, f"{gfd.MEMORY}={mem_label} is far below "
                        f"{product.base}'s {nominal} MiB under mig.strategy=single, but neither the "
                        f"product nor {gfd.MIG_CONFIG}={config or '(missing)'} names the MIG profile"
                        ) from None
    return gfd.ProductName(base=product.base, mig_profile=profile, shared=product.shared)


def mixed_mig(name: str, labels: Mapping[str, str], alloc: Mapping[str, int] | None,
               used: Mapping[str, int], speed: float, common: dict[str, Any],
               warnings: list[InventoryWarning]) -> list[Device]:
    """Devices behind ``nvidia.com/mig-<profile>`` (mixed strategy).

    Allocatable says which resources exist and how many (its spelling is what a pod requests);
    the GFD label family of the same profile identity gives memory and multiprocessors
    (:func:`gfd.join_mig_profiles`).  Without an allocatable map (trimmed fixtures) the label
    families are the devices.
    """
    label_info = gfd.mig_profile_labels(labels)
    if alloc is None:
        counts = {p: info.get("count", 0) for p, info in label_info.items()}
        pairs: dict[str, str | None] = {p: p for p, n in counts.items() if n > 0}
        unmatched: tuple[str, ...] = ()
    else:
        counts = {r[len(gfd.MIG_RESOURCE_PREFIX):]: n for r, n in alloc.items()
                  if gfd.is_mig_resource(r) and n > 0}
        pairs, unmatched = gfd.join_mig_profiles(counts, label_info)
    devices = []
    for profile, family in pairs.items():
        info = label_info.get(family, {}) if family else {}
        resource = gfd.MIG_RESOURCE_PREFIX + profile
        if family is None:
            warnings.append(InventoryWarning(
                node=name, reason=model.MIG_LABELS_MISSING,
                message=f"{name}: allocatable {resource} has no nvidia.com/mig-<profile>.* labels of "
                        f"the same slices; memory taken from the name ({gfd.profile_memory_mib(profile)} "
                        "MiB), multiprocessors unknown"))
        elif family != profile:
            warnings.append(InventoryWarning(
                node=name, reason=model.MIG_PROFILE_NAME_MISMATCH,
                message=f"{name}: resource {resource} and labels nvidia.com/mig-{family}.* name the "
                        f"same MIG profile differently; requesting {resource}, memory and "
                        "multiprocessors from the labels"))
        slices = gfd.profile_slices(profile)
        total = counts[profile]
        devices.append(Device(
            **common, mig_profile=profile,
            memory_mib=info.get("memory") or gfd.profile_memory_mib(profile),
            resource_name=resource, total=total, free=max(0, total - used.get(resource, 0)),
            relative_speed=mig_speed(speed, slices), compute_slices=slices,
            multiprocessors=info.get("multiprocessors", 0)))
    for family in unmatched:
        if label_info[family].get("count", 0) > 0:
            warnings.append(InventoryWarning(
                node=name, reason=model.MIG_LABELS_UNMATCHED,
                message=f"{name}: labels nvidia.com/mig-{family}.* count "
                        f"{label_info[family]['count']} devices but no allocatable nvidia.com/mig-* "
                        "resource has those slices; not offered (is the device plugin restarting?)"))
    return devices


def _is_shared(labels: Mapping[str, str], product: gfd.ProductName, advertised: int,
               count_label: int | None) -> bool:
    strategy = str(labels.get(gfd.SHARING, "") or "none").lower()
    return (product.shared or strategy != "none"
            or (count_label is not None and advertised > count_label))
