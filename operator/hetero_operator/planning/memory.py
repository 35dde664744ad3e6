"""Memory model of the planner: what each rank holds, what fits, and which sharding mode (pure).

Per rank the planner counts, in bytes (docs/memory.md has the worked example):

* **model state**: parameters, gradients and optimizer state, ``parameters x`` :func:`state_bytes_per_parameter`
  (by optimizer and precision), times the rank's *share* of the state under the sharding mode;
* **activations**: ``activationBytesPerSample x`` samples of one micro-batch (or the checkpointed
  figure when activation checkpointing is on);
* a **reserve**: ``memoryReserveMiB`` (CUDA context, NCCL buffers) plus :data:`FRAGMENTATION_PERCENT`
  of the device's memory for the caching allocator's fragmentation.

``usable = device memory - reserve``; a rank fits when ``state share + micro-batch activations <= usable``.

Sharding modes, in the order of the traffic they add (``spec.training.sharding``):

* ``None``: every rank holds the whole state (DDP); one gradient reduction per step.
* ``Group``: state sharded evenly inside each group (one node, one GPU type: FSDP2 inside an NCCL
  communicator), replicated across groups; across types still one gradient reduction per step.
* ``Full``: state sharded over all ranks, each rank's share proportional to its usable memory
  (ZeRO-3); parameters are gathered per block for forward and backward across types, so the slow
  cross-type link carries two all-gathers and one reduce-scatter of the parameters per step.

``Auto`` takes the mode with the best predicted throughput whose every rank fits (step time per
mode: compute with recomputation, cross-type and in-group traffic per micro-batch,
:mod:`hetero_operator.planning.steptime`), or, without seconds per sample, the least cross-type
traffic (:func:`mode_traffic`).  Where a rank's share of the batch does not fit at once it gets micro-batches
(gradient accumulation, one synchronisation per step); where not even one sample fits beside its
state, activation checkpointing (when the job gives ``checkpointedActivationBytesPerSample``).
No kopf, no kubernetes, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from hetero_operator.api.memoryplan import (MODES, MemoryPlan, MemoryRefusal, ModelMemory,
                                            ModeOption, RankMemory, RankSlot)
from hetero_operator.api.quantities import MIB, gib
from hetero_operator.cluster.gputable import GPU_MODELS, PRODUCT_LABELS, GpuModel
from hetero_operator.planning.steptime import FULL_TRANSFERS_PER_MICRO_BATCH, mode_step_time
from heterotrain_common.split import split_batch

OPTIMIZER_STATE_BYTES = {"SGD": 0, "Momentum": 4, "Adam": 8, "AdamW": 8}
"""Optimizer state per parameter, bytes: momentum buffer (fp32) for SGD with momentum; ``exp_avg``
and ``exp_avg_sq`` (fp32 each) for Adam/AdamW (``torch.optim.Adam`` keeps both in the parameter's
dtype, fp32 here; ZeRO, Rajbhandari et al. 2020, section 3.1, counts the same 8 bytes)."""
PARAM_BYTES = 4
"""Parameter bytes: fp32 in every precision, because the worker's mixed precision is
``torch.autocast`` (parameters stay fp32, only the ops run in bf16/fp16; PyTorch AMP docs)."""
GRAD_BYTES = 4
"""Gradient bytes: ``.grad`` has the parameter's dtype (fp32) under autocast."""
FRAGMENTATION_PERCENT = 5
"""Share of a device's memory kept for the caching allocator's fragmentation (the worker measures
the real figure as ``htj_torch_memory_fragmentation_ratio``; docs/memory.md)."""
FULL_COMPRESSION_WHY = (
    "Full sharding reduce-scatters each block's gradients over all ranks inside backward, so there "
    "is no one cross-group exchange for Int8 or PowerSGD to compress; spec.training.sharding Group "
    "compresses its cross-group exchange")
"""Why the worker refuses ``spec.training.compression`` under ``Full`` sharding (issue 29, item 4;
``hetero_worker.memory.group.check_supported`` refuses it too): the reason and the other fix."""


def state_bytes_per_parameter(optimizer: str, precision: str) -> int:
    """Bytes of model state per parameter: parameter + gradient + optimizer state.

    Args:
        optimizer: one of :data:`OPTIMIZERS`.
        precision: ``"bf16"|"fp16"|"fp32"``; the same bytes in each, because autocast keeps fp32
            parameters and gradients (no fp16 weight copy; fp16's loss scaler is one scalar).

    Returns:
        e.g. 16 for AdamW (4 + 4 + 8), 4 + 4 + 4 = 12 for Momentum, 8 for SGD.
    """
    if precision not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"unknown precision {precision!r}")
    return PARAM_BYTES + GRAD_BYTES + OPTIMIZER_STATE_BYTES[optimizer]


def reserve_bytes(memory_mib: int, reserve_mib: int) -> int:
    """What a device keeps back: ``reserve_mib`` (CUDA context, NCCL) plus
    :data:`FRAGMENTATION_PERCENT` of its memory, bytes."""
    return reserve_mib * MIB + memory_mib * MIB * FRAGMENTATION_PERCENT // 100


def usable_bytes(memory_mib: int, reserve_mib: int) -> int:
    """Memory a rank may fill with state and activations, bytes (0 when the reserve is larger).

    ``memory_mib`` is the device's label (``nvidia.com/gpu.memory``; for a MIG device the
    profile's own memory, which the inventory already reads from ``nvidia.com/mig-<p>.memory``)."""
    return max(0, memory_mib * MIB - reserve_bytes(memory_mib, reserve_mib))


def state_shares_ppm(slots: Sequence[RankSlot], mode: str, reserve_mib: int) -> list[int]:
    """Each rank's share of the whole state, parts per million (sums to 1e6 per replica).

    ``None``: 1e6 each. ``Group``: 1e6 split evenly inside each group (remainder to the first
    members). ``Full``: 1e6 split over all ranks proportionally to usable memory. Both by
    largest remainders (:func:`heterotrain_common.split.split_batch`), so the shares are uneven
    where the devices are.
    """
    if mode == "None":
        return [10**6] * len(slots)
    if mode == "Group":
        members: dict[int, list[int]] = {}
        for i, s in enumerate(slots):
            members.setdefault(s.group, []).append(i)
        out = [0] * len(slots)
        for idx in members.values():
            for i, share in zip(idx, split_batch(10**6, [1] * len(idx), min_batch=0)):
                out[i] = share
        return out
    usable = [usable_bytes(s.memory_mib, reserve_mib) for s in slots]
    weights = usable if any(usable) else [1] * len(slots)  # no usable memory anywhere: even
    return split_batch(10**6, weights, min_batch=0)


def mode_traffic(slots: Sequence[RankSlot], mode: str, state_param_bytes: int, shares_ppm: Sequence[int],
                 cross_gbps: float) -> tuple[int, float]:
    """Cross-type bytes one rank sends per step (the largest over ranks) and their seconds.

    ``None`` and ``Group``: one ring all-reduce of the fp32 gradients among the GPU-type groups,
    ``2 (G-1)/G x gradient bytes`` (G groups; 0 with one group).  ``Full``: each rank gathers what it
    does not hold twice and reduce-scatters once, which Gloo runs as an all-reduce:
    ``4 x (1 - share) x parameter bytes`` (only the part
    held by other types crosses the link; counted whole here, an upper bound when a type has
    several ranks).

    Args:
        slots: the plan's ranks.
        mode: one of :data:`MODES`.
        state_param_bytes: fp32 parameter bytes (= gradient bytes), ``parameters x 4``.
        shares_ppm: from :func:`state_shares_ppm`.
        cross_gbps: the link between GPU types, Gbit/s.

    Returns:
        ``(bytes, seconds)``.
    """
    groups = len({s.group for s in slots})
    types = len({s.gpu_type for s in slots})
    if types <= 1 and mode != "Full":
        nbytes = 0
    elif mode in ("None", "Group"):
        nbytes = 2 * (groups - 1) * state_param_bytes // max(groups, 1)
    else:
        nbytes = max(FULL_TRANSFERS_PER_MICRO_BATCH * (10**6 - sh) * state_param_bytes // 10**6
                     for sh in shares_ppm) if types > 1 else 0
    return nbytes, nbytes * 8 / (cross_gbps * 1e9)


def _fit_rank(slot: RankSlot, usable: int, state: int, m: ModelMemory) -> tuple[int, bool] | int:
    """``(samples that fit, checkpointing)`` when the rank fits (0 samples: activations not
    modelled), else the bytes it is short."""
    act = m.activation_bytes_per_sample
    budget = usable - state
    if act <= 0:
        return (0, False) if budget >= 0 else -budget
    if budget >= act:
        return budget // act, False
    ckpt = m.checkpointed_activation_bytes_per_sample
    if 0 < ckpt < act and budget >= ckpt:
        return budget // ckpt, True
    smallest = ckpt if 0 < ckpt < act else act
    return state + smallest - usable


def evaluate_mode(slots: Sequence[RankSlot], m: ModelMemory, mode: str, *, reserve_mib: int,
                  cross_gbps: float, available: bool = True) -> tuple[ModeOption, list[RankMemory]]:
    """Fit every rank under ``mode``.

    Returns:
        The :class:`ModeOption` and, when it fits, each rank's :class:`RankMemory` (else ``[]``).
    """
    per_param = state_bytes_per_parameter(m.optimizer, slots[0].precision if slots else "fp32")
    total = m.parameters * per_param
    shares = state_shares_ppm(slots, mode, reserve_mib)
    nbytes, secs = mode_traffic(slots, mode, m.parameters * PARAM_BYTES, shares, cross_gbps)
    ranks: list[RankMemory] = []
    short: dict[str, tuple[int, int]] = {}
    for s, share in zip(slots, shares):
        usable = usable_bytes(s.memory_mib, reserve_mib)
        state = -(-total * share // 10**6)  # ceil: a shard holds whole bytes
        fit = _fit_rank(s, usable, state, m)
        if isinstance(fit, int):
            worst = short.get(s.gpu_type, (0, usable))[0]
            short[s.gpu_type] = (max(worst, fit), usable)
            continue
        fitting, ckpt = fit
        mbs = min(s.local_batch, fitting) if fitting else s.local_batch
        per_sample = (m.checkpointed_activation_bytes_per_sample if ckpt
                      else m.activation_bytes_per_sample)
        ranks.append(RankMemory(
            rank=s.rank, gpu_type=s.gpu_type, usable_bytes=usable, state_share_ppm=share,
            state_bytes=state, micro_batch_size=mbs, micro_batches=math.ceil(s.local_batch / mbs),
            activation_checkpointing=ckpt, peak_bytes=state + mbs * per_sample,
            samples_that_fit=fitting))
    option = ModeOption(mode=mode, fits=not short, cross_type_bytes=nbytes, cross_type_s=secs,
                        shortfalls=tuple((t, b, u) for t, (b, u) in sorted(short.items())),
                        available=available)
    return option, (ranks if not short else [])


def plan_memory(slots: Sequence[RankSlot], m: ModelMemory, requested: str, *, reserve_mib: int,
                cross_gbps: float, available: Sequence[str] = MODES,
                unavailable_why: dict[str, str] | None = None,
                sample_s: Mapping[str, float] | None = None,
                intra_gbps: float | None = None, full_after: str = "",
                cross_bytes_per_s: Mapping[str, float] | None = None) -> MemoryPlan | MemoryRefusal:
    """Choose the sharding mode and each rank's micro-batches.

    Args:
        slots: the plan's ranks with their local batches (batch by speed).
        m: the model's memory facts.
        requested: ``spec.training.sharding`` (``Auto`` or one of :data:`MODES`).
        reserve_mib: ``spec.training.memoryReserveMiB``.
        cross_gbps: bandwidth between GPU types, Gbit/s (the plan's inter-node link when it spans
            nodes, else the intra-node one).
        available: modes the worker can run; ``Auto`` chooses only among them, an explicit mode
            outside them is refused.
        unavailable_why: per mode outside ``available``, why (for the refusal message).
        sample_s: seconds per sample of one device by GPU type (learned or table speeds in
            seconds); with it every fitting mode gets its predicted step
            (:func:`hetero_operator.planning.steptime.mode_step_time`) and ``Auto`` takes the
            best predicted throughput; without it ``Auto`` takes the least cross-type traffic.
        intra_gbps: bandwidth inside a node, Gbit/s (``Group``'s in-group traffic; default
            ``cross_gbps``).
        full_after: where ``Full`` is not in ``available`` for this job only, the changes after
            which the worker runs it (``"set spec.training.precision to FP32"``): a refusal's
            Full rank count is named with them.
        cross_bytes_per_s: per mode, the cross-type rate an earlier run measured, bytes/s
            (:mod:`hetero_operator.planning.linklearning`); a mode without one uses
            ``cross_gbps``.

    Returns:
        :class:`MemoryPlan`, or :class:`MemoryRefusal` naming the shortfall per GPU type.
    """
    per_param = state_bytes_per_parameter(m.optimizer, slots[0].precision)
    state = m.parameters * per_param
    evaluated = {mode: evaluate_mode(slots, m, mode, reserve_mib=reserve_mib,
                                     cross_gbps=cross_gbps, available=mode in available)
                 for mode in MODES}
    if sample_s is not None:
        learned_rate = cross_bytes_per_s or {}
        evaluated = {mode: (_with_step_time(option, slots, ranks, m, sample_s, cross_gbps,
                                            intra_gbps or cross_gbps, learned_rate.get(mode)),
                            ranks)
                     for mode, (option, ranks) in evaluated.items()}
    options = tuple(evaluated[mode][0] for mode in MODES)
    if requested == "Auto" and sample_s is not None:
        fitting = [o for o in options if o.fits and o.available]
        chosen = min(fitting, key=lambda o: (round(o.predicted_step_s or 0.0, 12),
                                             MODES.index(o.mode)), default=None)
    elif requested == "Auto":
        fitting = [o for o in options if o.fits and o.available]
        chosen = min(fitting, key=lambda o: (o.cross_type_s, MODES.index(o.mode)), default=None)
    else:
        chosen = evaluated[requested][0]
        if not chosen.available:
            why = (unavailable_why or {}).get(requested, "")
            return MemoryRefusal(message=_not_built(requested, options, why), options=options)
        if not chosen.fits:
            chosen = None
    if chosen is None:
        return MemoryRefusal(message=_refusal(requested, options, state, m, per_param,
                                              unavailable_why or {},
                                              bigger=bigger_gpus(
                                                  slots, state, m, reserve_mib,
                                                  full=("Full" in available or bool(full_after))
                                                  and not evaluated["Full"][0].fits,
                                                  full_after="" if "Full" in available
                                                  else full_after)),
                             options=options)
    ranks = tuple(evaluated[chosen.mode][1])
    return MemoryPlan(requested=requested, mode=chosen.mode, state_bytes=state,
                      bytes_per_parameter=per_param, ranks=ranks, options=options,
                      reasons=_reasons(chosen, ranks, options, state, slots))


def _with_step_time(option: ModeOption, slots: Sequence[RankSlot], ranks: Sequence[RankMemory],
                    m: ModelMemory, sample_s: Mapping[str, float], cross_gbps: float,
                    intra_gbps: float, cross_bytes_per_s: float | None) -> ModeOption:
    """``option`` with its predicted step when it fits and every type has a speed."""
    if not option.fits or not ranks or any(s.gpu_type not in sample_s for s in slots):
        return option
    t = mode_step_time(slots, ranks, option.mode, sample_s=sample_s,
                       param_bytes=m.parameters * PARAM_BYTES, cross_gbps=cross_gbps,
                       intra_gbps=intra_gbps, cross_bytes_per_s=cross_bytes_per_s)
    return replace(option, predicted_step_s=t.step_s, predicted_samples_per_s=t.samples_per_s,
                   step_cross_type_bytes=t.cross_type_bytes)


def _state_words(state: int, m: ModelMemory, per_param: int) -> str:
    return (f"model state {gib(state)} ({m.parameters:,} parameters x {per_param} B: fp32 "
            f"parameters and gradients, {m.optimizer} state)")


def _short_list(option: ModeOption) -> str:
    return "; ".join(f"{t} short by {gib(b)} ({gib(u)} usable)" for t, b, u in option.shortfalls)


def smallest_activation_bytes(m: ModelMemory) -> int:
    """One sample's activations as the planner would hold them: the checkpointed figure when it is
    given and smaller, else the plain one (0: activations not modelled), bytes."""
    ckpt, act = m.checkpointed_activation_bytes_per_sample, m.activation_bytes_per_sample
    return ckpt if 0 < ckpt < act else act


def smallest_gpu_holding(need_bytes: int, reserve_mib: int) -> GpuModel | None:
    """The row of the built-in GPU table with the least memory whose usable memory
    (:func:`usable_bytes`) holds ``need_bytes``; the faster of two alike; None when none does."""
    fits = [g for g in GPU_MODELS if usable_bytes(g.memory_mib, reserve_mib) >= need_bytes]
    return min(fits, key=lambda g: (g.memory_mib, -g.tflops), default=None)


def bigger_gpus(slots: Sequence[RankSlot], state: int, m: ModelMemory, reserve_mib: int, *,
                full: bool = True, full_after: str = "") -> str:
    """What memory would hold the model, for a refusal: the smallest GPU of the built-in table that
    holds the whole state and one sample per rank (named by its GPU Feature Discovery product, even
    when the cluster has none), or that no GPU does; and how many ranks of the job's largest GPU
    type ``Full`` sharding would need (each holds ``state / N`` plus one sample), when that type does
    not hold the whole state itself and ``full`` (the worker runs Full sharding for this job, after
    the changes ``full_after`` names, when it says any).

    Returns:
        e.g. ``"at least an NVIDIA-H100-80GB-HBM3 (79.6 GiB) per rank holds the whole state (the
        smallest such GPU in the built-in table), or spec.training.sharding Full over at least 2
        NVIDIA-A100-SXM4-40GB ranks (37.0 GiB usable each)"``.
    """
    act = smallest_activation_bytes(m)
    card = smallest_gpu_holding(state + act, reserve_mib)
    if card is not None:
        label = PRODUCT_LABELS.get(card.name, card.name)
        article = "an" if label.startswith(("NVIDIA", "A", "E", "I", "O")) else "a"
        text = (f"at least {article} {label} "
                f"({gib(card.memory_mib * MIB)}) per rank holds the whole state (the smallest such "
                "GPU in the built-in table)")
    else:
        top = max(GPU_MODELS, key=lambda g: g.memory_mib)
        text = (f"no GPU of the built-in table holds the whole state (the largest, "
                f"{PRODUCT_LABELS.get(top.name, top.name)}, has "
                f"{gib(usable_bytes(top.memory_mib, reserve_mib))} usable)")
    if slots and full:
        big = max(slots, key=lambda s: (s.memory_mib, s.gpu_type))
        room = usable_bytes(big.memory_mib, reserve_mib) - act
        if 0 < room < state:  # it does not hold the whole state: sharded over how many would
            n = max(2, -(-state // room))
            after = f"; Full also needs: {full_after}" if full_after else ""
            text += (f", or spec.training.sharding Full over at least {n} {big.gpu_type} ranks "
                     f"({gib(usable_bytes(big.memory_mib, reserve_mib))} usable each{after})")
    return text


def _refusal(requested: str, options: Sequence[ModeOption], state: int, m: ModelMemory,
             per_param: int, why: dict[str, str], bigger: str = "") -> str:
    what = _state_words(state, m, per_param)
    if m.activation_bytes_per_sample:
        ckpt = m.checkpointed_activation_bytes_per_sample
        with_ckpt = f"; {gib(ckpt)} with activation checkpointing" if ckpt else ""
        what += f" plus one sample's activations ({gib(m.activation_bytes_per_sample)}{with_ckpt})"
    if requested != "Auto":
        opt = next(o for o in options if o.mode == requested)
        better = [o.mode for o in options if o.fits and o.available]
        more = f" ({bigger})" if bigger else ""
        fix = (f"set spec.training.sharding to Auto (it would choose {better[0]})" if better else
               "no sharding mode fits either: lower spec.training.model.parameters or the batch's "
               f"activations, use an optimizer with less state, or add GPUs with more memory{more}")
        return (f"spec.training.sharding {requested}: {what} does not fit: {_short_list(opt)}; {fix}")
    tried = "; ".join(
        f"{o.mode}: {_short_list(o) or 'fits, but ' + (why.get(o.mode) or 'the worker does not run it yet')}"
        for o in options if not (o.fits and o.available))
    return (f"spec.training.sharding Auto: no sharding mode fits {what}: {tried}; lower "
            "spec.training.model.parameters, give spec.training.model."
            "checkpointedActivationBytesPerSample, use an optimizer with less state (SGD), or add "
            "GPUs with more memory" + (f": {bigger}" if bigger else ""))


def _not_built(requested: str, options: Sequence[ModeOption], why: str) -> str:
    usable = [o.mode for o in options if o.fits and o.available]
    alt = (f"; set spec.training.sharding to Auto (it would choose {usable[0]})" if usable
           else "")
    return (f"spec.training.sharding {requested}: "
            f"{why or f'the worker does not run {requested} sharding yet'} "
            f"(docs/memory.md, \"What is built\"){alt}")


def _reasons(chosen: ModeOption, ranks: Sequence[RankMemory], options: Sequence[ModeOption],
             state: int, slots: Sequence[RankSlot]) -> tuple[str, ...]:
    by_type: dict[str, list[RankMemory]] = {}
    for r in ranks:
        by_type.setdefault(r.gpu_type, []).append(r)
    replicated = next(o for o in options if o.mode == "None")
    group_size = {s.rank: sum(1 for t in slots if t.group == s.group) for s in slots}
    out = []
    for gpu_type, rs in by_type.items():
        r = max(rs, key=lambda x: x.state_bytes)
        fits_whole = all(t != gpu_type for t, _, _ in replicated.shortfalls)
        head = (f"model state {gib(state)} fits {gpu_type} ({gib(r.usable_bytes)} usable)" if fits_whole
                else f"model state {gib(state)} does not fit {gpu_type} ({gib(r.usable_bytes)} usable)")
        if chosen.mode == "None":
            held = "each holds all of it"
        elif chosen.mode == "Group" and group_size[r.rank] == 1:
            held = f"each {_short(gpu_type)} is a group of one and holds all of it"
        elif chosen.mode == "Group":
            pct = 100 / group_size[r.rank]
            held = f"each {_short(gpu_type)} holds {pct:.0f} % of its group's state"
        else:
            held = f"each {_short(gpu_type)} holds {r.state_share_ppm / 10**4:.1f} % of the state"
        micro = ""
        if any(x.micro_batches > 1 for x in rs):
            mb = max(x.micro_batches for x in rs)
            micro = (f"; its batch runs as up to {mb} micro-batches of {r.micro_batch_size} "
                     "(gradient accumulation, one synchronisation per step)")
        if any(x.activation_checkpointing for x in rs):
            micro += "; activation checkpointing on (one sample's activations do not fit otherwise)"
        out.append(f"{head}: {chosen.mode} sharding; {held}; planned peak "
                   f"{gib(r.peak_bytes)}{micro}")
    return tuple(out)


def _short(gpu_type: str) -> str:
    return gpu_type.removeprefix("NVIDIA-").removeprefix("Tesla-")
