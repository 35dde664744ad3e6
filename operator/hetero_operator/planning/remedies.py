"""What would plan: spec changes for an unschedulable message, each checked by planning again (pure).

An unschedulable message ends with what to change.  The changes here are not guesses: each is
planned with the changed spec through ``replan`` (the planner without these remedies, so it never
recurses) and named only when that plans, with what it plans (ranks, sharding mode):

* :func:`fewer_types`: the model does not fit every eligible GPU type, but the types that hold the
  whole state alone do: ``spec.gpus.allowedProducts`` of those types (and ``minRanks`` as low as
  their free devices, when it must be lower);
* :func:`min_memory`: ``spec.gpus.minMemoryMiB`` excludes too many devices: the highest value that
  admits enough of them;
* :func:`fewer_ranks`: whether lowering ``spec.gpus.minRanks`` to the free devices plans;
* :func:`precision`: which other ``spec.training.precision`` plans, for one that excludes devices;
* :func:`unbuilt_mode`: a sharding mode fits but the worker does not run it for this job yet
  (fp16 ranks, checkpoints, rebalancing or compression): every spec change it needs, together.

Each costs one plan of the same inventory, and only on the unschedulable path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace

from hetero_operator.api import types as model
from hetero_operator.api.memoryplan import ModelMemory
from hetero_operator.api.spec import JobSpec
from hetero_operator.api.types import ExcludedNode, Plan, Unschedulable
from hetero_operator.planning import memory
from hetero_operator.planning.pools import Pool

Replan = Callable[[JobSpec], Plan | Unschedulable]
"""Plans a changed job over the same inventory and inputs, without remedies."""

MAX_PROBES = 4
"""Most re-plans one remedy tries (each a whole plan of the inventory)."""


def fewer_types(job: JobSpec, pools: Sequence[Pool], replan: Replan) -> str:
    """For a model that does not fit: the eligible GPU types that hold the whole state and one
    sample alone, when planning with only them works.

    Returns:
        e.g. ``"NVIDIA-A100-SXM4-40GB alone holds the whole state: spec.gpus.allowedProducts
        [NVIDIA-A100-SXM4-40GB] and spec.gpus.minRanks 1 would plan (1 rank, sharding None)"``;
        ``""`` when no type, or every type, holds it, or that plan fails too.
    """
    t = job.training
    if t.model_parameters <= 0:
        return ""
    facts = ModelMemory(
        parameters=t.model_parameters, optimizer=t.optimizer,
        activation_bytes_per_sample=t.activation_bytes_per_sample,
        checkpointed_activation_bytes_per_sample=t.checkpointed_activation_bytes_per_sample)
    need = (t.model_parameters * memory.state_bytes_per_parameter(t.optimizer, "fp32")
            + memory.smallest_activation_bytes(facts))
    free: dict[str, int] = {}
    holds: dict[str, bool] = {}
    for p in pools:
        free[p.gpu_type] = free.get(p.gpu_type, 0) + p.free
        holds[p.gpu_type] = memory.usable_bytes(p.device.memory_mib, t.memory_reserve_mib) >= need
    fitting = sorted(g for g, ok in holds.items() if ok and free[g] > 0)
    if not fitting or len(fitting) == len(holds):
        return ""
    min_ranks = min(job.gpus.min_ranks, sum(free[g] for g in fitting))
    changed = replace(job, gpus=replace(job.gpus, allowed_products=tuple(fitting),
                                        min_ranks=min_ranks))
    result = replan(changed)
    if not isinstance(result, Plan):
        return ""
    change = f"spec.gpus.allowedProducts [{', '.join(fitting)}]"
    if min_ranks < job.gpus.min_ranks:
        change += f" and spec.gpus.minRanks {min_ranks}"
    return (f"{' and '.join(fitting)} alone {'holds' if len(fitting) == 1 else 'hold'} the whole "
            f"state: {change} would plan ({_planned(result)})")


def min_memory(job: JobSpec, excluded: Sequence[ExcludedNode], replan: Replan) -> str:
    """For devices ``spec.gpus.minMemoryMiB`` excludes: the highest value that plans, one of the
    excluded devices' memory sizes (largest first, at most :data:`MAX_PROBES` tried).

    Returns:
        e.g. ``"set spec.gpus.minMemoryMiB to 16384 (what Tesla-V100-SXM2-16GB has): it would plan
        2 ranks"``; ``""`` when no tried value plans.
    """
    sizes: dict[int, str] = {}
    for e in excluded:
        found = re.search(r"has (\d+) MiB < spec\.gpus\.minMemoryMiB", e.message)
        if e.reason == model.INSUFFICIENT_MEMORY and found:
            sizes.setdefault(int(found.group(1)), e.gpu_type)
    for mib in sorted(sizes, reverse=True)[:MAX_PROBES]:
        result = replan(replace(job, gpus=replace(job.gpus, min_memory_mib=mib)))
        if isinstance(result, Plan):
            return (f"set spec.gpus.minMemoryMiB to {mib} (what {sizes[mib]} has): it would plan "
                    f"{_planned(result)}")
    return ""


def unbuilt_mode(job: JobSpec, mode: str, replan: Replan) -> str:
    """For a sharding ``mode`` that fits every rank but that the worker does not run for this job
    yet: all the spec changes it needs at once (``compression`` left out for Full; fp16 ranks,
    rebalancing and checkpoints are built under Group and Full, issue 29), named only when
    planning the changed job works.

    Returns:
        e.g. ``"Full sharding is not built with compression (...) yet: it plans if
        spec.training.compression is left out (checked: 4 ranks, sharding Full)"``; ``""`` when
        nothing here would change or the changed job does not plan with ``mode``.
    """
    t = job.training
    changes: list[str] = []
    gaps: list[str] = []
    training = t
    if mode == "Full" and t.compression != "None":  # rebalancing is built (issue 29, item 3)
        training = replace(training, compression="None")
        gaps.append(f"with compression ({memory.FULL_COMPRESSION_WHY})")
        changes.append("spec.training.compression is left out")
    if not changes:
        return ""
    result = replan(replace(job, training=training))
    if not isinstance(result, Plan) or result.memory is None or result.memory.mode != mode:
        return ""  # a plan of another mode is that mode's clause to name
    return (f"{mode} sharding is not built {' or '.join(gaps)} yet: it plans if "
            f"{' and '.join(changes)} (checked: {_planned(result)})")


def precision(job: JobSpec, tried: Sequence[str], replan: Replan) -> str:
    """For a ``spec.training.precision`` that excludes devices: which of ``tried`` plans.

    Returns:
        e.g. ``" (checked: FP32 plans 4 ranks, sharding Full)"``, or ``" (checked: neither plans
        with the rest of the spec as it stands; planning with it names what else to change)"``.
    """
    for value in tried:
        if value != job.training.precision:
            result = replan(replace(job, training=replace(job.training, precision=value)))
            if isinstance(result, Plan):
                return f" (checked: {value} plans {_planned(result)})"
    return (f" (checked: {'neither' if len(tried) == 2 else 'none'} plans with the rest of the spec "
            "as it stands; planning with it names what else to change)")


def fewer_ranks(job: JobSpec, ranks: int, replan: Replan) -> str:
    """For too few free devices: ``""`` when ``spec.gpus.minRanks`` of ``ranks`` plans, else why
    not, so the hint to lower it does not lead to another refusal unsaid.

    Returns:
        e.g. ``" (checked: that alone does not plan: ModelDoesNotFit)"``.
    """
    result = replan(replace(job, gpus=replace(job.gpus, min_ranks=ranks)))
    return "" if isinstance(result, Plan) else f" (checked: that alone does not plan: {result.reason})"


def _planned(plan: Plan) -> str:
    ranks = f"{plan.world_size} rank{'s' if plan.world_size != 1 else ''}"
    return f"{ranks}, sharding {plan.memory.mode}" if plan.memory is not None else ranks
