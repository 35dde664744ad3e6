"""Plan a job onto an inventory: which device each rank uses, its group, image, precision, batch.

Policy (documented in ``docs/planning.md``):

1. **Eligibility** per device class: ``spec.gpus`` allow/deny lists of products and MIG profiles,
   ``allowMig``, ``minMemoryMiB``; a memory cap of at least one sample
   (``(memory - memoryReserveMiB) // memoryPerSampleMiB``); forced BF16 needs cc >= 8.0; an image
   variant that fits the node (:mod:`hetero_operator.images`).  A node none of whose devices is
   eligible is excluded for this job with the reason.
2. **Rank count**: ``min(spec.gpus.ranks, globalBatchSize, free eligible devices)``; fewer than
   ``minRanks`` is :class:`~hetero_operator.model.Unschedulable` (all-or-nothing).
3. **Selection**: strongest devices first (speed tiers, descending); inside a tier, fewest nodes:
   first the tier's devices on nodes the plan already uses, then whole nodes largest-first, and for
   the last partial need the smallest node that holds it (best fit).  This uses the minimum number
   of nodes for the tier and packs same-type devices on one node (their NVLink/PCIe).
4. **Groups**: one group per (node, GPU type) with ranks contiguous; a MIG device is a group of
   its own (a CUDA process can use one MIG device, and one pod per MIG device keeps
   ``LOCAL_WORLD_SIZE=1``).  Groups are ordered node by node in selection order, so rank 0 sits on
   the strongest node.
5. **Batch split**: :func:`~hetero_operator.batching.split_global_batch` by speed
   (``Proportional``) or equally (``Equal``), capped by memory.
6. **Extra env**: ``NCCL_P2P_DISABLE=1`` for every MIG group and for GeForce/RTX groups with more
   than one GPU (NCCL hangs and corrupt copies on consumer P2P and MIG, see ``gpu-facts.md``).

Deterministic: the same job and inventory give the same plan (every order has a name tie-break).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import memory, model
from .batching import split_global_batch, step_time
from .eligibility import device_rejection, memory_cap, precision_for
from .images import choose_image
from .model import Device, ExcludedNode, GroupPlan, Inventory, NodeInventory, Plan, RankPlacement
from .marginal import (PlanInputs, Slot, SpeedFigure, StepModel, cheapest_mix, leave_out_unpaying,
                       plan_cost, price_for, type_values)
from .profiles import JOB_EFFICIENCY
from .spec import ImageVariant, JobSpec
from .speed import effective_speed
from .unschedulable import batch_too_small, insufficient_gpus, insufficient_memory

P2P_DISABLE_ENV = {"NCCL_P2P_DISABLE": "1"}
WORKER_SHARDINGS: tuple[str, ...] = ("None", "Group", "Full")
"""Sharding modes the worker runs today (docs/memory.md, "What is built"): ``Auto`` chooses among
these only, and an explicit other mode is refused rather than planned and left to fail."""
MODEL_DOES_NOT_FIT = "ModelDoesNotFit"
"""Unschedulable reason: no allowed sharding mode fits the model state and one sample's
activations on some GPU type (:mod:`hetero_operator.memory`)."""
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

    @property
    def node(self) -> str:
        """Node name."""
        return self.device.node


def is_consumer_gpu(product: str) -> bool:
    """GeForce / RTX consumer parts (P2P over PCIe unreliable with NCCL, nccl-tests#117)."""
    return bool(_CONSUMER.search(product)) and "RTX-A" not in product.upper()


def plan_job(job: JobSpec, inventory: Inventory, *,
             inputs: PlanInputs | None = None) -> Plan | model.Unschedulable:
    """Plan every rank of ``job`` onto ``inventory``.

    Args:
        job: the parsed job.
        inventory: from :func:`hetero_operator.inventory.build_inventory`.
        inputs: learned speeds, prices, links, a target throughput
            (:class:`~hetero_operator.marginal.PlanInputs`); default: none of them.

    Returns:
        A :class:`~hetero_operator.model.Plan`, or :class:`~hetero_operator.model.Unschedulable`
        when fewer than ``minRanks`` eligible devices are free, ``minRanks`` exceeds the global
        batch, or the chosen devices' memory cannot hold the global batch.
    """
    inputs = inputs or PlanInputs()
    pools, job_excluded = eligible_pools(job, inventory)
    figures, reference_sps = apply_learned_speeds(pools, job, inputs)
    excluded = tuple(sorted((*inventory.excluded, *job_excluded), key=lambda e: (e.node, e.reason)))
    global_batch = job.training.global_batch_size
    if job.gpus.min_ranks > global_batch:
        return batch_too_small(job, excluded, inventory.warnings)
    total_free = sum(p.free for p in pools)
    if total_free < job.gpus.min_ranks:
        return insufficient_gpus(job, inventory, pools, excluded)
    n = min(job.gpus.ranks, global_batch, total_free)
    taken = select(pools, n)
    mismatch = torch_version_mismatch(taken)
    if mismatch:
        return model.Unschedulable(shortfalls=(), excluded=excluded, message=mismatch,
                                   reason=TORCH_VERSION_MISMATCH, warnings=inventory.warnings)
    step_model = _step_model(job, pools, figures, reference_sps, inputs)
    left_out: list[model.LeftOut] = []
    candidates = taken
    if job.gpus.selection == "Throughput":
        kept, left_out = leave_out_unpaying(
            _slots(_group_specs(taken)), step_model, min_ranks=job.gpus.min_ranks,
            min_gain_percent=float(job.gpus.min_gain_percent))
        dropped = {lo.gpu_type for lo in left_out}
        taken = [(p, k) for p, k in taken if p.gpu_type not in dropped]
        n = sum(k for _, k in taken)
    groups_spec = _group_specs(taken)
    speeds = [p.speed for p, size in groups_spec for _ in range(size)]
    caps = [p.cap for p, size in groups_spec for _ in range(size)]
    if sum(caps) < global_batch:
        return insufficient_memory(job, caps, excluded, inventory.warnings)
    weights = speeds if job.training.batch_split == "Proportional" else [1.0] * n
    batches = split_global_batch(global_batch, weights, caps)
    equal = split_global_batch(global_batch, [1.0] * n, caps)
    speedup = step_time(equal, speeds) / step_time(batches, speeds)
    ranks, groups = _placements(groups_spec, batches)
    mem = plan_memory(job, ranks, inputs)
    if isinstance(mem, memory.MemoryRefusal):
        return model.Unschedulable(shortfalls=(), excluded=excluded, message=mem.message,
                                   reason=MODEL_DOES_NOT_FIT, warnings=inventory.warnings)
    value = _plan_value(groups_spec, _group_specs(candidates), step_model, figures, job, inputs,
                        left_out)
    return Plan(ranks=ranks, groups=groups, excluded=excluded,
                expected_speedup_over_equal=round(speedup, 6),
                warnings=(*inventory.warnings, *image_warnings(taken)), value=value, memory=mem)


def plan_memory(job: JobSpec, ranks: tuple[RankPlacement, ...], inputs: PlanInputs,
                ) -> memory.MemoryPlan | memory.MemoryRefusal | None:
    """The memory model's decision for the placed ranks (None without
    ``spec.training.model.parameters``); the cross-type link is the inter-node one when the
    ranks span nodes, else the intra-node one."""
    t = job.training
    if t.model_parameters <= 0:
        return None
    slots = [memory.RankSlot(rank=r.rank, group=r.group, node=r.node, gpu_type=r.gpu_type,
                             memory_mib=r.memory_mib, precision=r.precision,
                             local_batch=r.local_batch) for r in ranks]
    spans_nodes = len({r.node for r in ranks}) > 1
    gbps = inputs.link.inter_node_gbps if spans_nodes else inputs.link.intra_node_gbps
    facts = memory.ModelMemory(
        parameters=t.model_parameters, optimizer=t.optimizer,
        activation_bytes_per_sample=t.activation_bytes_per_sample,
        checkpointed_activation_bytes_per_sample=t.checkpointed_activation_bytes_per_sample)
    why = {m: f"the worker does not run {m} sharding yet" for m in memory.MODES
           if m not in WORKER_SHARDINGS}
    if "Group" in WORKER_SHARDINGS:  # what the worker's Group sharding does not cover yet
        fp16 = sorted({r.gpu_type for r in ranks if r.precision == "fp16"})
        if fp16:
            why["Group"] = (f"Group sharding with fp16 is not built yet ({', '.join(fp16)} would "
                            "run fp16 under precision Auto): set spec.training.precision to FP32 "
                            "or BF16")
        elif t.rebalance_interval_steps or t.compression != "None":
            why["Group"] = ("Group sharding with rebalancing or compression is not built yet: leave "
                            "spec.training.rebalance and spec.training.compression out")
    if "Full" in WORKER_SHARDINGS and (gap := _full_sharding_gap(job, ranks)):
        why["Full"] = gap
    available = tuple(m for m in WORKER_SHARDINGS if m not in why)
    return memory.plan_memory(slots, facts, t.sharding, reserve_mib=t.memory_reserve_mib,
                              cross_gbps=gbps, available=available, unavailable_why=why)


def _full_sharding_gap(job: JobSpec, ranks: Iterable[RankPlacement]) -> str:
    """What the worker's Full sharding (``hetero_worker.fullshard``) does not cover yet for this
    job, as the reason with its fix; ``""`` when nothing."""
    t = job.training
    fp16 = sorted({r.gpu_type for r in ranks if r.precision == "fp16"})
    if fp16:
        return (f"Full sharding with fp16 is not built yet ({', '.join(fp16)} would run fp16 under "
                "precision Auto): set spec.training.precision to FP32 or BF16")
    if t.checkpoint_path:
        return ("Full sharding does not checkpoint yet: leave spec.training.checkpoint out or use "
                "spec.training.sharding Group")
    if t.rebalance_interval_steps or t.compression != "None":
        return ("Full sharding with rebalancing or compression is not built yet: leave "
                "spec.training.rebalance and spec.training.compression out")
    return ""


# --- the step-time model: learned speeds, marginal value, leaving out what does not pay -------

def apply_learned_speeds(pools: list[Pool], job: JobSpec, inputs: PlanInputs,
                         ) -> tuple[dict[str, SpeedFigure], float | None]:
    """Replace pool speeds by learned ones where the job's profile has them.

    The reference (samples/s of a speed-1.0 device) comes from the learned type with the highest
    table speed (the anchor: ``learned samples/s / table speed``, so a learned A100 stays 1.0),
    else ``spec.training.referenceSamplesPerSecond``, else ``inputs.reference_samples_per_s``;
    learned types get ``learned / reference`` as speed, so learned and table figures share one
    scale.

    Returns:
        ``(figure per GPU type, reference samples/s or None)``.
    """
    table: dict[str, float] = {}
    learned: dict[str, Any] = {}
    for p in pools:
        t = p.gpu_type
        table.setdefault(t, p.speed)
        figure = inputs.learned.get((t, p.precision))
        if figure is not None:
            learned.setdefault(t, figure)
    if learned:
        anchor = max(learned, key=lambda t: (table[t], t))
        reference = learned[anchor].samples_per_s / table[anchor]
    else:
        reference = (float(job.training.reference_samples_per_second)
                     or inputs.reference_samples_per_s or None)
    figures: dict[str, SpeedFigure] = {}
    for t, speed in table.items():
        if t in learned and reference:
            lf = learned[t]
            figures[t] = SpeedFigure(
                relative_speed=lf.samples_per_s / reference, source="learned",
                samples_per_s=lf.samples_per_s, observations=lf.observations,
                age_s=None if inputs.now_s is None else round(lf.age_s(inputs.now_s), 1))
        else:
            overridden = any(k in job.gpus.speed_overrides for k in _override_keys(t))
            figures[t] = SpeedFigure(relative_speed=speed,
                                     source="override" if overridden else "table")
    speeds = {t: f.relative_speed for t, f in figures.items()}
    for p in pools:
        p.speed = speeds[p.gpu_type]
    return figures, reference


def _override_keys(gpu_type: str) -> tuple[str, ...]:
    base, _, profile = gpu_type.partition("-MIG-")
    return (gpu_type, profile, base) if profile else (gpu_type,)


def _step_model(job: JobSpec, pools: list[Pool], figures: dict[str, SpeedFigure],
                reference_sps: float | None, inputs: PlanInputs) -> StepModel:
    absolute = reference_sps is not None and reference_sps > 0
    sample_s = {}
    for t, f in figures.items():
        if f.source == "learned" and f.samples_per_s:
            sample_s[t] = 1.0 / f.samples_per_s
        else:
            sample_s[t] = 1.0 / (f.relative_speed * (reference_sps if absolute else 1.0))
    grad_bytes = gradient_bytes(job)
    learned_eff = inputs.learned.get(JOB_EFFICIENCY)
    # The learned efficiency includes synchronisation: used only where the model has none.
    efficiency = (learned_eff.samples_per_s if learned_eff is not None and absolute
                  and not grad_bytes else 1.0)
    return StepModel(global_batch=job.training.global_batch_size,
                     proportional=job.training.batch_split == "Proportional", sample_s=sample_s,
                     absolute=absolute, grad_bytes=grad_bytes, link=inputs.link,
                     hierarchy=job.training.hierarchy, efficiency=efficiency)


def gradient_bytes(job: JobSpec) -> float:
    """Bytes of one gradient sync: ``spec.training.gradientMiB``, else 4 bytes (fp32) per
    parameter of ``spec.training.model.parameters`` when the job states it, else 0 (unknown)."""
    if job.training.gradient_mib:
        return float(job.training.gradient_mib) * 2**20
    return 4.0 * float(getattr(job.training, "model_parameters", 0) or 0)


def _slots(specs: list[tuple[Pool, int]]) -> list[Slot]:
    out = []
    for index, (p, size) in enumerate(specs):
        slot = Slot(gpu_type=p.gpu_type, node=p.device.node, arch=p.device.compute_capability,
                    group=index, speed=p.speed, cap=p.cap)
        out.extend([slot] * size)  # Slot is frozen: one object per group, repeated per rank
    return out


def _plan_value(specs: list[tuple[Pool, int]], candidate_specs: list[tuple[Pool, int]],
                step_model: StepModel, figures: dict[str, SpeedFigure], job: JobSpec,
                inputs: PlanInputs, left_out: list[model.LeftOut]) -> model.PlanValue | None:
    slots = _slots(specs)
    prices = {p.device.gpu_type: price_for(inputs.prices, p.device.gpu_type, p.device.product,
                                           p.device.mig_profile) for p, _ in candidate_specs}
    types, full = type_values(slots, step_model, figures=figures, prices=prices)
    if full is None:
        return None
    hourly, per_million = plan_cost(slots, prices, full.throughput, step_model.absolute)
    mix = None
    if inputs.target_samples_per_s is not None:
        mix = cheapest_mix(_slots(candidate_specs), step_model, prices,
                           target_samples_per_s=inputs.target_samples_per_s,
                           min_ranks=job.gpus.min_ranks)
    if not step_model.absolute:
        note = ("not modelled: no absolute throughput (no learned speeds for this profileKey, "
                "no spec.training.referenceSamplesPerSecond); throughputs are A100-equivalents")
    elif step_model.grad_bytes <= 0:
        note = ("not modelled: no gradient size (spec.training.gradientMiB or "
                "spec.training.model.parameters)")
        learned_eff = inputs.learned.get(JOB_EFFICIENCY)
        if learned_eff is not None:
            note += (f"; throughput x {learned_eff.samples_per_s:.3f}, the efficiency earlier jobs "
                     f"of this profileKey reached ({learned_eff.observations} obs.: waiting, "
                     "synchronisation, data loading)")
    else:
        note = (f"{step_model.grad_bytes / 2**20:.1f} MiB per sync over the {full.hierarchy} layout, "
                f"{inputs.link.intra_node_gbps:g} Gbit/s inside a node, "
                f"{inputs.link.inter_node_gbps:g} Gbit/s between nodes")
    return model.PlanValue(
        absolute=step_model.absolute, predicted_throughput=round(full.throughput, 6),
        compute_s=round(full.compute_s, 9), communication_s=round(full.communication_s, 9),
        hierarchy=full.hierarchy, communication_note=note, types=types, left_out=tuple(left_out),
        cost_per_hour=hourly, cost_per_million_samples=per_million, cheapest_mix=mix)


# --- one PyTorch per job ---------------------------------------------------------------------

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


# --- eligibility -----------------------------------------------------------------------------

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
        node_key = (node.max_cuda, node.driver_version)
        cache = caches.get(node_key)
        if cache is None:
            cache = caches[node_key] = {}
        for dev in node.devices:
            key = (dev.product, dev.mig_profile, dev.memory_mib, dev.compute_capability,
                   dev.relative_speed, dev.compute_slices)
            facts = cache.get(key)
            if facts is None:
                facts = cache[key] = _class_facts(job, node, dev)
                if len(facts) != 2:
                    facts = cache[key] = (*facts, dev.gpu_type)
            if len(facts) == 2:  # (reason, message)
                first_rejection = first_rejection or facts  # type: ignore[assignment]
                continue
            speed, precision, cap, image, variant, warning, gpu_type = facts
            # Pool's field order: device, speed, image, precision, cap, free, variant, warning, type
            append(Pool(dev, speed, image, precision, cap, dev.free, variant, warning, gpu_type))
            found = True
        if not found and first_rejection is not None:
            reason, message = first_rejection
            excluded.append(ExcludedNode(node=node.name, reason=reason, message=message,
                                         gpu_type=node.devices[0].gpu_type))
    return pools, excluded


def _class_facts(job: JobSpec, node: NodeInventory, dev: Device) -> tuple:
    """``(reason, message)`` when the job cannot use the device class on such a node, else
    ``(speed after overrides, precision, memory cap, image, variant, image warning)``."""
    rejection = device_rejection(job, dev)
    if rejection is not None:
        return rejection
    image, variant, warning = "", None, ""
    if job.images:
        choice = choose_image(job.images, compute_capability=dev.compute_capability,
                              max_cuda=node.max_cuda, driver_version=node.driver_version)
        if not choice.ok:
            return model.NO_COMPATIBLE_IMAGE, choice.message
        image, variant, warning = choice.image, choice.variant, choice.minor_compat_warning
    speed = effective_speed(product=dev.product, mig_profile=dev.mig_profile,
                            table_speed=dev.relative_speed, compute_slices=dev.compute_slices,
                            overrides=job.gpus.speed_overrides)
    return (speed, precision_for(job.training.precision, dev.compute_capability),
            min(memory_cap(job, dev.memory_mib), job.training.global_batch_size), image, variant,
            warning)


# --- selection -------------------------------------------------------------------------------

def select(pools: Iterable[Pool], n: int) -> list[tuple[Pool, int]]:
    """Choose ``n`` devices: strongest tier first, fewest nodes inside a tier.

    Returns:
        ``(pool, count)`` in selection order; counts sum to ``n`` (``n`` <= total free).
    """
    tiers: dict[float, list[Pool]] = {}
    rounded: dict[float, float] = {}  # a few distinct speeds over thousands of pools
    for p in pools:
        if p.free > 0:
            tier = rounded.get(p.speed)
            if tier is None:
                tier = rounded[p.speed] = round(p.speed, 9)
            tiers.setdefault(tier, []).append(p)
    taken: list[tuple[Pool, int]] = []
    used_nodes: dict[str, None] = {}
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


def _group_specs(taken: list[tuple[Pool, int]]) -> list[tuple[Pool, int]]:
    """(pool, group size) per group: node by node in first-selection order; MIG devices alone."""
    node_order: dict[str, int] = {}
    for p, _ in taken:
        node_order.setdefault(p.node, len(node_order))
    ordered = sorted(enumerate(taken), key=lambda it: (node_order[it[1][0].node], it[0]))
    specs: list[tuple[Pool, int]] = []
    for _, (p, k) in ordered:
        specs.extend([(p, 1)] * k if p.device.is_mig else [(p, k)])
    return specs


def _placements(specs: list[tuple[Pool, int]], batches: list[int],
                ) -> tuple[tuple[RankPlacement, ...], tuple[GroupPlan, ...]]:
    """Ranks and groups from (pool, group size) specs and the per-rank local batches."""
    ranks: list[RankPlacement] = []
    groups: list[GroupPlan] = []
    rank = 0
    for index, (p, size) in enumerate(specs):
        d = p.device
        members = tuple(range(rank, rank + size))
        for local, r in enumerate(members):
            ranks.append(RankPlacement(
                rank=r, group=index, node=d.node, product=d.product, mig_profile=d.mig_profile,
                compute_capability=d.compute_capability, resource_name=d.resource_name,
                image=p.image, precision=p.precision, local_batch=batches[r],
                relative_speed=p.speed, memory_mib=d.memory_mib, architecture=d.architecture,
                group_rank=local))
        extra = dict(P2P_DISABLE_ENV) if d.is_mig or (size > 1 and is_consumer_gpu(d.product)) else {}
        groups.append(GroupPlan(
            index=index, node=d.node, product=d.product, mig_profile=d.mig_profile,
            resource_name=d.resource_name, image=p.image, precision=p.precision, ranks=members,
            local_batches=tuple(batches[r] for r in members), architecture=d.architecture,
            compute_capability=d.compute_capability, memory_mib=d.memory_mib,
            relative_speed=p.speed, extra_env=extra))
        rank += size
    return tuple(ranks), tuple(groups)
