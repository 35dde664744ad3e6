"""Pools of interchangeable devices: which devices a job may use, grouped and selected strongest
first (pure)."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass

from hetero_operator.api import types as model
from hetero_operator.api.platforms import node_platform
from hetero_operator.api.spec import ImageVariant, JobSpec
from hetero_operator.api.types import Device, ExcludedNode, Inventory, NodeInventory
from hetero_operator.cluster.driverupgrade import upgrade_pending
from hetero_operator.cluster.gputable import effective_speed
from hetero_operator.planning.eligibility import device_rejection, memory_cap, precision_for
from hetero_operator.planning.images import choose_image

_CONSUMER = re.compile(r"GEFORCE|(^|-)RTX-\d{4}(-|$)|TITAN", re.IGNORECASE)


@dataclass(slots=True)
class Pool:
    """Eligible devices of one class on one node, with the job-specific facts.

    Attributes:
        device: the inventory's device class.
        speed: relative speed after ``speedOverrides``.
        image: chosen image (``""`` without a catalog).
        precision: ``"bf16"|"fp16"|"fp32"``.
        cap: largest local batch the memory holds (the global batch when uncapped).
        free: free devices.
        variant: the chosen image variant (None without a catalog).
        image_warning: non-empty when the image runs through CUDA minor-version compatibility.
        gpu_type: ``device.gpu_type``, computed once per device class (a plan reads it per pool
            and per rank: at 10,000 nodes the property's string building cost ~4 ms a plan).
        deferred: the node waits for a driver upgrade that will cordon and empty it
            (:func:`hetero_operator.cluster.driverupgrade.upgrade_pending`): :func:`select`
            takes its devices only when the others do not suffice.
    """

    device: Device
    speed: float
    image: str
    precision: str
    cap: int
    free: int
    variant: ImageVariant | None
    image_warning: str
    gpu_type: str
    deferred: bool = False

    @property
    def node(self) -> str:
        """Node name."""
        return self.device.node


def is_consumer_gpu(product: str) -> bool:
    """GeForce / RTX consumer parts (P2P over PCIe unreliable with NCCL, nccl-tests#117)."""
    return bool(_CONSUMER.search(product)) and "RTX-A" not in product.upper()
TORCH_VERSION_MISMATCH = "TorchVersionMismatch"
"""Unschedulable reason: the chosen image variants carry different PyTorch releases."""
CUDA_MINOR_VERSION_COMPAT = "CudaMinorVersionCompatibility"
"""Plan warning reason: a node runs its image through CUDA minor-version compatibility."""


def torch_version_mismatch(taken: Iterable[tuple[Pool, int]]) -> str:
    """Refusal message when the chosen variants differ in ``torchVersion``, else ``""``.

    Ranks of different PyTorch builds in one process group are unsupported (different NCCL/Gloo
    versions, DDP internals and ``*_object`` pickling), so when any chosen variant declares a
    ``torchVersion`` every chosen variant must declare the same one.

    Returns:
        e.g. ``"the chosen image variants carry different PyTorch releases: reg/w:cu118
        (torchVersion 2.7.1) on node-v100; reg/w:cu128 (torchVersion 2.13.0) on node-t4; ..."``.
    """
    nodes: dict[ImageVariant, dict[str, None]] = {}
    for pool, _ in taken:
        if pool.variant is not None:
            nodes.setdefault(pool.variant, {})[pool.node] = None
    versions = {v.torch_version for v in nodes}
    if len(versions) <= 1 or not any(versions):
        return ""
    parts = [f"{v.image} (torchVersion {v.torch_version or 'unset'}) on {', '.join(ns)}"
             for v, ns in sorted(nodes.items(), key=lambda it: (it[0].torch_version, it[0].image))]
    return ("the chosen image variants carry different PyTorch releases, and ranks of one job "
            f"must run one PyTorch build: {'; '.join(parts)}; give every spec.images entry the "
            "same torchVersion (build all variants from one release: scripts/build-images.sh), "
            "or restrict spec.gpus.allowedProducts to nodes that pick one release")


def image_warnings(taken: Iterable[tuple[Pool, int]]) -> tuple[model.InventoryWarning, ...]:
    """One ``CudaMinorVersionCompatibility`` warning per chosen node and image that needs it."""
    seen: dict[tuple[str, str], str] = {}
    for pool, _ in taken:
        if pool.image_warning:
            seen.setdefault((pool.node, pool.image), pool.image_warning)
    return tuple(model.InventoryWarning(node=node, reason=CUDA_MINOR_VERSION_COMPAT, message=msg)
                 for (node, _), msg in seen.items())


def eligible_pools(job: JobSpec, inventory: Inventory) -> tuple[list[Pool], list[ExcludedNode]]:
    """Eligible device classes (free > 0 or not) and job-specific node exclusions.

    Everything that depends only on the device class and the node's CUDA (filters, speed,
    precision, memory cap, image, GPU type) is computed once per distinct key: inventories
    repeat a few.  This loop runs once per device of the cluster (13,440 at 10,000 nodes in
    bench/bench_plan.py), so it builds the pools positionally from a per-(node CUDA) cache.
    """
    pools: list[Pool] = []
    excluded: list[ExcludedNode] = []
    caches: dict[tuple, dict[tuple, tuple]] = {}
    append = pools.append
    for node in inventory.nodes:
        first_rejection: tuple[str, str] | None = None
        found = False
        labels = inventory.labels.get(node.name) or {}
        deferred = upgrade_pending(labels)
        platform = node_platform(labels)  # the image must be built for it (case 53)
        node_key = (node.max_cuda, node.driver_version, platform)
        cache = caches.get(node_key)
        if cache is None:
            cache = caches[node_key] = {}
        for dev in node.devices:
            key = (dev.product, dev.mig_profile, dev.memory_mib, dev.compute_capability,
                   dev.relative_speed, dev.compute_slices)
            facts = cache.get(key)
            if facts is None:
                facts = cache[key] = _class_facts(job, node, dev, platform)
                if len(facts) != 2:
                    facts = cache[key] = (*facts, dev.gpu_type)
            if len(facts) == 2:  # (reason, message)
                first_rejection = first_rejection or facts  # type: ignore[assignment]
                continue
            speed, precision, cap, image, variant, warning, gpu_type = facts
            # Pool's field order: device, speed, image, precision, cap, free, variant, warning, type
            append(Pool(dev, speed, image, precision, cap, dev.free, variant, warning, gpu_type,
                        deferred))
            found = True
        if not found and first_rejection is not None:
            reason, message = first_rejection
            excluded.append(ExcludedNode(node=node.name, reason=reason, message=message,
                                         gpu_type=node.devices[0].gpu_type))
    return pools, excluded


def _class_facts(job: JobSpec, node: NodeInventory, dev: Device, platform: str | None = None) -> tuple:
    """``(reason, message)`` when the job cannot use the device class on such a node (of
    ``os/arch`` ``platform``, None when unlabelled), else
    ``(speed after overrides, precision, memory cap, image, variant, image warning)``."""
    rejection = device_rejection(job, dev)
    if rejection is not None:
        return rejection
    image, variant, warning = "", None, ""
    if job.images:
        choice = choose_image(job.images, compute_capability=dev.compute_capability,
                              max_cuda=node.max_cuda, driver_version=node.driver_version,
                              platform=platform)
        if not choice.ok:
            return model.NO_COMPATIBLE_IMAGE, choice.message
        image, variant, warning = choice.image, choice.variant, choice.minor_compat_warning
    speed = effective_speed(product=dev.product, mig_profile=dev.mig_profile,
                            table_speed=dev.relative_speed, compute_slices=dev.compute_slices,
                            overrides=job.gpus.speed_overrides)
    return (speed, precision_for(job.training.precision, dev.compute_capability),
            min(memory_cap(job, dev.memory_mib), job.training.global_batch_size), image, variant,
            warning)


def select(pools: Iterable[Pool], n: int) -> list[tuple[Pool, int]]:
    """Choose ``n`` devices: strongest tier first, fewest nodes inside a tier; devices of
    :attr:`Pool.deferred` nodes only after all the others (case 52: a node waiting for its driver
    upgrade is used only when the job does not fit elsewhere).

    Returns:
        ``(pool, count)`` in selection order; counts sum to ``n`` (``n`` <= total free).
    """
    pools = list(pools)
    if any(p.deferred for p in pools):
        first = _select_tiers([p for p in pools if not p.deferred], n, {})
        need = n - sum(k for _, k in first)
        used = dict.fromkeys(p.node for p, _ in first)
        return first + (_select_tiers([p for p in pools if p.deferred], need, used) if need else [])
    return _select_tiers(pools, n, {})


def _select_tiers(pools: list[Pool], n: int, used_nodes: dict[str, None]) -> list[tuple[Pool, int]]:
    """:func:`select` over ``pools``: at most ``n`` devices (fewer when they have fewer free)."""
    tiers: dict[float, list[Pool]] = {}
    rounded: dict[float, float] = {}  # a few distinct speeds over thousands of pools
    for p in pools:
        if p.free > 0:
            tier = rounded.get(p.speed)
            if tier is None:
                tier = rounded[p.speed] = round(p.speed, 9)
            tiers.setdefault(tier, []).append(p)
    taken: list[tuple[Pool, int]] = []
    need = n
    for speed in sorted(tiers, reverse=True):
        if need == 0:
            break
        tier = tiers[speed]
        take = min(need, sum(p.free for p in tier))
        chosen = _tier_nodes(tier, take, used_nodes)
        taken.extend(_take_from_nodes(tier, take, chosen))
        used_nodes.update(dict.fromkeys(chosen))
        need -= take
    return taken


def _tier_nodes(tier: list[Pool], take: int, used: dict[str, None]) -> list[str]:
    """Nodes that supply ``take`` devices of a tier with the fewest new nodes."""
    capacity: dict[str, int] = {}
    for p in tier:
        capacity[p.node] = capacity.get(p.node, 0) + p.free
    chosen: list[str] = []
    remaining = take
    for node in sorted((nd for nd in capacity if nd in used), key=lambda nd: (-capacity[nd], nd)):
        if remaining <= 0:
            break
        chosen.append(node)
        remaining -= capacity[node]
    if remaining <= 0:
        return chosen
    fresh = sorted((nd for nd in capacity if nd not in used), key=lambda nd: (-capacity[nd], nd))
    neg_caps = [-capacity[nd] for nd in fresh]
    front = 0
    while remaining > 0:
        fit_end = bisect.bisect_right(neg_caps, -remaining, lo=front)
        if fit_end > front:  # some node holds the rest: the smallest such (best fit)
            best = bisect.bisect_left(neg_caps, neg_caps[fit_end - 1], lo=front)
            chosen.append(fresh[best])
            return chosen
        chosen.append(fresh[front])
        remaining -= capacity[fresh[front]]
        front += 1
    return chosen


def _take_from_nodes(tier: list[Pool], take: int, nodes: list[str]) -> list[tuple[Pool, int]]:
    """Take ``take`` devices from the tier's pools on ``nodes`` (in that order, then pool order)."""
    order = {nd: i for i, nd in enumerate(nodes)}
    out = []
    for p in sorted((p for p in tier if p.node in order),
                    key=lambda p: (order[p.node], p.device.resource_name)):
        if take == 0:
            break
        k = min(take, p.free)
        out.append((p, k))
        take -= k
    return out


def group_specs(taken: list[tuple[Pool, int]]) -> list[tuple[Pool, int]]:
    """(pool, group size) per group: node by node in first-selection order; MIG devices alone."""
    node_order: dict[str, int] = {}
    for p, _ in taken:
        node_order.setdefault(p.node, len(node_order))
    ordered = sorted(enumerate(taken), key=lambda it: (node_order[it[1][0].node], it[0]))
    specs: list[tuple[Pool, int]] = []
    for _, (p, k) in ordered:
        specs.extend([(p, 1)] * k if p.device.is_mig else [(p, k)])
    return specs
