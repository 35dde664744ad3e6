"""Plan a job onto an inventory: which device each rank uses, its group, image, precision, batch.

Policy (documented in ``docs/planning.md``):

1. **Eligibility** per device class: ``spec.gpus`` allow/deny lists of products and MIG profiles,
   ``allowMig``, ``minMemoryMiB``; a memory cap of at least one sample
   (``(memory - memoryReserveMiB) // memoryPerSampleMiB``); forced BF16 needs cc >= 8.0; an image
   variant that fits the node (:mod:`hetero_operator.planning.images`).  A node none of whose devices is
   eligible is excluded for this job with the reason.
2. **Rank count**: ``min(spec.gpus.ranks, globalBatchSize, free eligible devices)``; fewer than
   ``minRanks`` is :class:`~hetero_operator.api.types.Unschedulable` (all-or-nothing).
3. **Selection**: strongest devices first (speed tiers, descending); inside a tier, fewest nodes:
   first the tier's devices on nodes the plan already uses, then whole nodes largest-first, and for
   the last partial need the smallest node that holds it (best fit).  This uses the minimum number
   of nodes for the tier and packs same-type devices on one node (their NVLink/PCIe).
4. **Groups**: one group per (node, GPU type) with ranks contiguous; a MIG device is a group of
   its own (a CUDA process can use one MIG device, and one pod per MIG device keeps
   ``LOCAL_WORLD_SIZE=1``).  Groups are ordered node by node in selection order, so rank 0 sits on
   the strongest node.
5. **Batch split**: :func:`~heterotrain_common.split.split_batch` by speed
   (``Proportional``) or equally (``Equal``), capped by memory.
6. **Extra env**: ``NCCL_P2P_DISABLE=1`` for every MIG group and for GeForce/RTX groups with more
   than one GPU (NCCL hangs and corrupt copies on consumer P2P and MIG, see ``gpu-facts.md``).

Deterministic: the same job and inventory give the same plan (every order has a name tie-break).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from hetero_operator.api import memoryplan
from hetero_operator.api import types as model
from hetero_operator.api.spec import JobSpec
from hetero_operator.api.types import GroupPlan, Inventory, Plan, RankPlacement
from hetero_operator.planning import (elasticplan, layoutchoice, linklearning, memory,
                                      pipelineplan, remedies)
from hetero_operator.planning.batching import step_time
from hetero_operator.planning.marginal import (PlanInputs, Slot, SpeedFigure, StepModel,
                                               cheapest_mix, leave_out_unpaying, plan_cost,
                                               price_for, type_values)
from hetero_operator.planning.pools import (TORCH_VERSION_MISMATCH, Pool, eligible_pools,
                                            group_specs, image_warnings, is_consumer_gpu, select,
                                            torch_version_mismatch)
from hetero_operator.planning.profiles import efficiency as learned_efficiency
from hetero_operator.planning.profiles import for_batch
from hetero_operator.planning.unschedulable import (batch_too_small, insufficient_gpus,
                                                    insufficient_memory)
from heterotrain_common.split import split_batch

P2P_DISABLE_ENV = {"NCCL_P2P_DISABLE": "1"}
WORKER_SHARDINGS: tuple[str, ...] = ("None", "Group", "Full")
"""Sharding modes the worker runs today (docs/memory.md, "What is built"): ``Auto`` chooses among
these only, and an explicit other mode is refused rather than planned and left to fail."""
MODEL_DOES_NOT_FIT = "ModelDoesNotFit"
"""Unschedulable reason: no allowed sharding mode fits the model state and one sample's
activations on some GPU type (:mod:`hetero_operator.planning.memory`)."""


def plan_job(job: JobSpec, inventory: Inventory, *,
             inputs: PlanInputs | None = None, suggest: bool = True) -> Plan | model.Unschedulable:
    """Plan every rank of ``job`` onto ``inventory``.

    Args:
        job: the parsed job.
        inventory: from :func:`hetero_operator.cluster.inventory.build_inventory`.
        inputs: learned speeds, prices, links, a target throughput
            (:class:`~hetero_operator.planning.marginal.PlanInputs`); default: none of them.
        suggest: an unschedulable message names the spec changes that would plan, each checked
            by planning the changed job again (:mod:`hetero_operator.planning.remedies`); False
            for those re-plans.

    Returns:
        A :class:`~hetero_operator.api.types.Plan`, or :class:`~hetero_operator.api.types.Unschedulable`
        when fewer than ``minRanks`` eligible devices are free, ``minRanks`` exceeds the global
        batch, or the chosen devices' memory cannot hold the global batch.
    """
    inputs = inputs or PlanInputs()
    replan = ((lambda changed: plan_job(changed, inventory, inputs=inputs, suggest=False))
              if suggest else None)
    pools, job_excluded = eligible_pools(job, inventory)
    figures, reference_sps = apply_learned_speeds(pools, job, inputs)
    excluded = tuple(sorted((*inventory.excluded, *job_excluded), key=lambda e: (e.node, e.reason)))
    global_batch = job.training.global_batch_size
    elastic_refused = elasticplan.refusal(job)  # spec.elastic: queue, pipeline, sharding
    if elastic_refused:
        return model.Unschedulable(shortfalls=(), excluded=excluded, message=elastic_refused,
                                   reason=elasticplan.ELASTIC_NOT_PLANNED,
                                   warnings=inventory.warnings)
    pipe_refused = pipelineplan.refusal(job) if job.training.pipeline is not None else ""
    if pipe_refused:
        return model.Unschedulable(shortfalls=(), excluded=excluded, message=pipe_refused,
                                   reason=pipelineplan.PIPELINE_NOT_PLANNED,
                                   warnings=inventory.warnings)
    if job.gpus.min_ranks > global_batch:
        return batch_too_small(job, excluded, inventory.warnings)
    total_free = sum(p.free for p in pools)
    if total_free < job.gpus.min_ranks:
        return insufficient_gpus(job, inventory, pools, excluded, replan=replan)
    n = min(job.gpus.ranks, global_batch, total_free)
    taken = select(pools, n)
    mismatch = torch_version_mismatch(taken)
    if mismatch:
        return model.Unschedulable(shortfalls=(), excluded=excluded, message=mismatch,
                                   reason=TORCH_VERSION_MISMATCH, warnings=inventory.warnings)
    step_model = _step_model(job, pools, figures, reference_sps, inputs)
    left_out: list[model.LeftOut] = []
    candidates = taken
    if job.gpus.selection == "Throughput" and job.training.pipeline is None:
        kept, left_out = leave_out_unpaying(
            _slots(group_specs(taken)), step_model, min_ranks=job.gpus.min_ranks,
            min_gain_percent=float(job.gpus.min_gain_percent))
        dropped = {lo.gpu_type for lo in left_out}
        taken = [(p, k) for p, k in taken if p.gpu_type not in dropped]
        n = sum(k for _, k in taken)
    groups_spec = group_specs(taken)
    speeds = [p.speed for p, size in groups_spec for _ in range(size)]
    caps = [p.cap for p, size in groups_spec for _ in range(size)]
    if sum(caps) < global_batch:
        return insufficient_memory(job, caps, excluded, inventory.warnings)
    if job.training.pipeline is not None:  # the stages' own split of the blocks and batches
        piped = _pipelined(job, groups_spec, taken, inputs, reference_sps, excluded, inventory)
        if job.training.sharding != "Auto" or isinstance(piped, model.Unschedulable):
            return piped
        flat_job = dataclasses.replace(job, training=dataclasses.replace(job.training,
                                                                         pipeline=None))
        flat = plan_job(flat_job, inventory, inputs=inputs, suggest=False)
        return layoutchoice.weigh(piped, flat, global_batch=global_batch, pin=inputs.layout_pin,
                                  ratios=layoutchoice.learned_ratios(inputs.learned),
                                  measured_modes=layoutchoice.measured_flat_modes(
                                      flat, inputs.learned))
    weights = speeds if job.training.batch_split == "Proportional" else [1.0] * n
    batches = split_batch(global_batch, weights, caps)
    equal = split_batch(global_batch, [1.0] * n, caps)
    speedup = step_time(equal, speeds) / step_time(batches, speeds)
    ranks, groups = _placements(groups_spec, batches)
    shared = sorted({f"{p.device.gpu_type} on {p.device.node}" for p, size in groups_spec
                     if size > 1 and p.device.time_sliced_replicas > 1})
    mem = plan_memory(job, ranks, inputs, shared_gpu_groups=shared,
                      sample_s=step_model.sample_s if step_model.absolute else None)
    if isinstance(mem, memoryplan.MemoryRefusal):
        message = _memory_refusal(job, candidates if left_out else taken, mem, inputs, step_model,
                                  replan)
        alone = (remedies.fewer_types(job, pools, replan)
                 if replan and not any(o.fits and o.available for o in mem.options) else "")
        return model.Unschedulable(shortfalls=(), excluded=excluded,
                                   message=message + (f". Or: {alone}" if alone else ""),
                                   reason=MODEL_DOES_NOT_FIT, warnings=inventory.warnings)
    picked = (elasticplan.sharding_refusal(mem.mode) if job.elastic is not None and mem is not None
              else "")
    if picked:  # Auto picked a sharded mode for an elastic job
        return model.Unschedulable(shortfalls=(), excluded=excluded, message=picked,
                                   reason=elasticplan.ELASTIC_NOT_PLANNED,
                                   warnings=inventory.warnings)
    value = _plan_value(groups_spec, group_specs(candidates), step_model, figures, job, inputs,
                        left_out)
    return Plan(ranks=ranks, groups=groups, excluded=excluded,
                expected_speedup_over_equal=round(speedup, 6),
                warnings=(*inventory.warnings, *image_warnings(taken)), value=value, memory=mem)


def _pipelined(job: JobSpec, groups_spec: list[tuple[Pool, int]], taken: list[tuple[Pool, int]],
               inputs: PlanInputs, reference_sps: float | None,
               excluded: tuple[model.ExcludedNode, ...], inventory: Inventory,
               ) -> Plan | model.Unschedulable:
    """The plan of a job with ``spec.training.pipeline``: every rank's stage, replica and batch
    (:func:`hetero_operator.planning.pipelineplan.plan_pipeline`), one precision on every rank
    (:func:`~hetero_operator.planning.pipelineplan.stage_precision`); the stage
    planner checks memory per stage, so no sharding decision (``Plan.memory`` is None)."""
    planned = pipelineplan.plan_pipeline(job, groups_spec, link=inputs.link,
                                         reference_samples_per_s=reference_sps,
                                         learned=inputs.learned)
    if isinstance(planned, str):
        return model.Unschedulable(shortfalls=(), excluded=excluded, message=planned,
                                   reason=pipelineplan.PIPELINE_NOT_PLANNED,
                                   warnings=inventory.warnings)
    pipe, stages, replicas, batches = planned
    ranks, groups = _placements(groups_spec, batches)
    precision = pipelineplan.stage_precision(job)
    ranks = tuple(dataclasses.replace(r, stage=stages[r.rank], stage_replica=replicas[r.rank],
                                      precision=precision) for r in ranks)
    groups = tuple(dataclasses.replace(g, precision=precision) for g in groups)
    return Plan(ranks=ranks, groups=groups, excluded=excluded, expected_speedup_over_equal=1.0,
                warnings=(*inventory.warnings, *image_warnings(taken)), pipeline=pipe)


def _memory_refusal(job: JobSpec, taken: list[tuple[Pool, int]],
                    refusal: memoryplan.MemoryRefusal, inputs: PlanInputs, step_model: StepModel,
                    replan: remedies.Replan | None) -> str:
    """The refusal's message over ``taken``: every eligible type the plan would take, those
    ``spec.gpus.selection Throughput`` left out too (their shortfalls are what a user reads), and
    each mode that fits but is not built for this job with the checked change that plans it
    (:func:`_unbuilt_fixes`).  Where ``taken`` fits after all, ``refusal`` stands as it is."""
    groups_spec = group_specs(taken)
    speeds = [p.speed for p, size in groups_spec for _ in range(size)]
    caps = [p.cap for p, size in groups_spec for _ in range(size)]
    weights = speeds if job.training.batch_split == "Proportional" else [1.0] * len(speeds)
    ranks, _ = _placements(groups_spec, split_batch(job.training.global_batch_size, weights, caps))
    shared = sorted({f"{p.device.gpu_type} on {p.device.node}" for p, size in groups_spec
                     if size > 1 and p.device.time_sliced_replicas > 1})
    sample_s = step_model.sample_s if step_model.absolute else None
    mem = plan_memory(job, ranks, inputs, shared_gpu_groups=shared, sample_s=sample_s)
    if not isinstance(mem, memoryplan.MemoryRefusal):
        return refusal.message
    # another mode that fits every rank is the fix the message names already
    other_fits = any(o.fits and o.available for o in mem.options)
    fixes = _unbuilt_fixes(job, mem, replan) if replan and not other_fits else {}
    if fixes:  # the same refusal, each fitting mode's clause naming the change that plans it
        mem = plan_memory(job, ranks, inputs, shared_gpu_groups=shared, sample_s=sample_s,
                          fixes=fixes)
    return mem.message if isinstance(mem, memoryplan.MemoryRefusal) else refusal.message


def _unbuilt_fixes(job: JobSpec, refusal: memoryplan.MemoryRefusal,
                   replan: remedies.Replan) -> dict[str, str]:
    """Per mode that fits every rank but is not built for this job: the checked change that plans
    it (:func:`hetero_operator.planning.remedies.unbuilt_mode`); modes without one left out."""
    fixes = {o.mode: remedies.unbuilt_mode(job, o.mode, replan)
             for o in refusal.options if o.fits and not o.available and o.mode in WORKER_SHARDINGS}
    return {mode: fix for mode, fix in fixes.items() if fix}


def plan_memory(job: JobSpec, ranks: tuple[RankPlacement, ...], inputs: PlanInputs, *,
                shared_gpu_groups: Sequence[str] = (), sample_s: Mapping[str, float] | None = None,
                fixes: Mapping[str, str] | None = None,
                ) -> memoryplan.MemoryPlan | memoryplan.MemoryRefusal | None:
    """The memory model's decision for the placed ranks (None without
    ``spec.training.model.parameters``); the cross-type link is the inter-node one when the
    ranks span nodes, else the intra-node one.

    ``shared_gpu_groups`` names the planned groups of two or more ranks on time-sliced devices:
    their ranks may get replicas of one physical GPU, so the worker's communicator rule gives
    them a Gloo group, and FSDP2 (Group sharding) over Gloo on CUDA is not a supported path
    (``hetero_worker.memory.group.refuse_gloo_on_cuda`` refuses it at start-up too).

    ``sample_s`` (seconds per sample by GPU type, from the learned speeds or the table at the
    reference samples/s) gives every fitting mode its predicted step, and ``Auto`` the best
    predicted throughput (:mod:`hetero_operator.planning.steptime`).

    ``fixes`` replaces, per mode, why the worker does not run it with the checked change that
    plans it (:func:`_unbuilt_fixes`), for the refusal message."""
    t = job.training
    if t.model_parameters <= 0:
        return None
    slots = [memoryplan.RankSlot(rank=r.rank, group=r.group, node=r.node, gpu_type=r.gpu_type,
                             memory_mib=r.memory_mib, precision=r.precision,
                             local_batch=r.local_batch) for r in ranks]
    spans_nodes = len({r.node for r in ranks}) > 1
    gbps = inputs.link.inter_node_gbps if spans_nodes else inputs.link.intra_node_gbps
    facts = memoryplan.ModelMemory(
        parameters=t.model_parameters, optimizer=t.optimizer,
        activation_bytes_per_sample=t.activation_bytes_per_sample,
        checkpointed_activation_bytes_per_sample=t.checkpointed_activation_bytes_per_sample)
    why = {m: f"the worker does not run {m} sharding yet" for m in memoryplan.MODES
           if m not in WORKER_SHARDINGS}
    if "Group" in WORKER_SHARDINGS:  # fp16, rebalancing and compression: built (issue 29)
        if shared_gpu_groups:
            why["Group"] = (f"Group sharding would run FSDP2 over a Gloo group on CUDA "
                            f"({', '.join(shared_gpu_groups)}: time-sliced replicas may share a "
                            "physical GPU, where NCCL refuses two ranks; Gloo has no CUDA "
                            "reduce-scatter/all-gather, pytorch/pytorch#132471): set "
                            "spec.training.sharding Full (it stages through the CPU) or None")
    gap, full_after = _full_sharding_gap(job) if "Full" in WORKER_SHARDINGS else ("", "")
    if gap:
        why["Full"] = f"Full sharding is not built {gap} yet: {full_after}"
    available = tuple(m for m in WORKER_SHARDINGS if m not in why)
    why.update(fixes or {})
    return memory.plan_memory(slots, facts, t.sharding, reserve_mib=t.memory_reserve_mib,
                              cross_gbps=gbps, available=available, unavailable_why=why,
                              sample_s=sample_s, intra_gbps=inputs.link.intra_node_gbps,
                              full_after=full_after,
                              cross_bytes_per_s=linklearning.learned_rates(inputs.learned))


def _full_sharding_gap(job: JobSpec) -> tuple[str, str]:
    """What the worker's Full sharding (``hetero_worker.memory.full``) does not cover yet for this
    job, every gap at once, and the changes that close them all; ``("", "")`` when nothing.

    Returns:
        e.g. ``("with compression (...)", "leave spec.training.compression out")``; fp16 ranks,
        rebalancing and checkpoints (``hetero_worker.ckpt.flatdcp``) are built under Full
        (issue 29), compression is not (:data:`memory.FULL_COMPRESSION_WHY`).
    """
    t = job.training
    gaps: list[str] = []
    changes: list[str] = []
    if t.compression != "None":  # fp16, rebalancing, checkpoints are built under Full (issue 29)
        gaps.append(f"with compression ({memory.FULL_COMPRESSION_WHY})")
        changes.append("leave spec.training.compression out")
    return " or ".join(gaps), " and ".join(changes)


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
    batches = _expected_batches(pools, job)
    for p in pools:
        t = p.gpu_type
        table.setdefault(t, p.speed)
        # the figure measured nearest to the batch this type would get (per-sample throughput
        # depends on the batch: learned figures are kept per batch band)
        figure = for_batch(inputs.learned.get((t, p.precision)), batches[t])
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
                age_s=None if inputs.now_s is None else round(lf.age_s(inputs.now_s), 1),
                table_speed=speed, observed_by=getattr(lf, "observed_by", ""))
        else:
            overridden = any(k in job.gpus.speed_overrides for k in _override_keys(t))
            figures[t] = SpeedFigure(relative_speed=speed,
                                     source="override" if overridden else "table")
    speeds = {t: f.relative_speed for t, f in figures.items()}
    for p in pools:
        p.speed = speeds[p.gpu_type]
    return figures, reference


def _expected_batches(pools: list[Pool], job: JobSpec) -> dict[str, float]:
    """Each GPU type's local batch under the table speeds, over the fastest devices the job could
    take (what picks a learned figure's batch band before the split is known)."""
    g = job.training.global_batch_size
    devices = sorted(((p.speed, p.gpu_type) for p in pools for _ in range(p.free)), reverse=True)
    devices = devices[:max(1, min(job.gpus.ranks, g, len(devices)))]
    equal = job.training.batch_split != "Proportional"
    total = len(devices) if equal else (sum(speed for speed, _ in devices) or 1.0)
    out: dict[str, float] = {}
    for speed, t in devices:
        out.setdefault(t, g * (1.0 if equal else speed) / total)
    for p in pools:  # a type the fastest devices leave out: as if it got an equal share
        out.setdefault(p.gpu_type, g / len(devices) if devices else float(g))
    return out


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
    learned_eff = learned_efficiency(inputs.learned)
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
        learned_eff = learned_efficiency(inputs.learned)
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


# --- eligibility -----------------------------------------------------------------------------


# --- selection -------------------------------------------------------------------------------


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
