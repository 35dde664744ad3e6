"""Build the structured "no plan" result and its one-line message (pure).

The message names each short GPU type with what the job needed and what was free, and where its
devices are, e.g. ``Tesla-T4: need 2, free 1 (node-c: MIG reconfiguration pending)``, and ends with
what to change: ``To plan: set spec.gpus.minRanks to 1 or less; or add 1 more Tesla-T4 GPU ...``.
With several eligible types the message starts with the totals and lists each type's free count;
the ``need`` of a :class:`Shortfall` is then what the job would need of that type if every other
eligible type were used fully (``minRanks - free of the others``).
"""

from __future__ import annotations

import re

from collections.abc import Sequence

from hetero_operator.api import types as model
from hetero_operator.api.spec import JobSpec
from hetero_operator.api.types import (ExcludedNode, Inventory, InventoryWarning, Shortfall,
                                       Unschedulable)
from hetero_operator.cluster import gfd
from hetero_operator.cluster.gputable import PRODUCT_LABELS
from hetero_operator.planning import remedies
from hetero_operator.planning.eligibility import type_rejection
from hetero_operator.planning.pools import Pool

MAX_NOTES = 3
"""Notes listed per type in the message (the ``shortfalls`` and ``excluded`` fields have all)."""


def insufficient_gpus(job: JobSpec, inventory: Inventory, pools: Sequence[Pool],
                      excluded: Sequence[ExcludedNode], *,
                      replan: remedies.Replan | None = None) -> Unschedulable:
    """Fewer eligible free devices than ``spec.gpus.minRanks``.

    Every eligible GPU type gets a :class:`Shortfall` whose reasons say where its devices are (free,
    in use, on excluded nodes); the message ends with what to change (``To plan: ...``).  With
    ``replan``, a ``minMemoryMiB`` that excludes devices gets the value that would plan, checked
    by planning with it (:func:`hetero_operator.planning.remedies.min_memory`).
    """
    need_total = job.gpus.min_ranks
    free: dict[str, int] = {}
    notes: dict[str, list[str]] = {}
    for p in pools:
        t = p.device.gpu_type
        free[t] = free.get(t, 0) + p.free
        note = device_note(p)
        if note:
            notes.setdefault(t, []).append(f"{p.node}: {note}")
    other: list[str] = []
    denied: list[ExcludedNode] = []
    fixable: list[ExcludedNode] = []
    for e in excluded:
        note = f"{e.node}: {model.REASON_PHRASES.get(e.reason, e.reason)}"
        if e.reason != model.DENIED_BY_SPEC and e.gpu_type and _allowed(job, e.gpu_type):
            free.setdefault(e.gpu_type, 0)
            notes.setdefault(e.gpu_type, []).append(note)
            fixable.append(e)
        elif e.reason == model.DENIED_BY_SPEC:
            denied.append(e)
        elif e.reason != model.NO_GPUS:
            other.append(note)
            fixable.append(e)
    total_free = sum(free.values())
    shortfalls = tuple(
        Shortfall(gpu_type=t, need=need_total - (total_free - free[t]), free=free[t],
                  reasons=tuple(notes.get(t, ())))
        for t in sorted(free))
    message = _message(need_total, total_free, shortfalls, other, len(denied))
    # adding a device of a type its own memory or precision excludes would not help
    unhelpful = {e.gpu_type for e in fixable if e.reason in DEVICE_REJECTIONS}
    addable = sorted(t for t in free if t not in unhelpful or any(p.gpu_type == t for p in pools))
    hints = _hints(job, need_total, total_free, addable, denied, fixable, replan)
    return Unschedulable(shortfalls=shortfalls, excluded=tuple(excluded),
                         message=f"{message}. To plan: {'; or '.join(hints)}",
                         reason="InsufficientGPUs", warnings=inventory.warnings)


def device_note(pool: Pool) -> str:
    """Why a pool's devices are or are not free, every reason named: ``"2 of 4 in use (1 allocated
    to DRA ResourceClaims), 1 more unhealthy (in capacity, not allocatable: e.g. an XID error)"``.

    ``in use`` counts what pods bound to the node request (and GPUs held for jobs whose pods the
    API does not show yet) or, on DRA nodes, devices allocated to ResourceClaims; ``unhealthy``
    devices are not in the pool's total at all (:attr:`hetero_operator.api.types.Device.unhealthy`).
    """
    d = pool.device
    parts = []
    busy = d.total - pool.free
    if busy:
        claimed = f" ({d.claimed} allocated to DRA ResourceClaims)" if d.claimed else ""
        parts.append(f"{busy} of {d.total} in use{claimed}")
    elif pool.free:
        parts.append(f"{pool.free} free")
    if d.unhealthy:
        parts.append(f"{d.unhealthy} more unhealthy (in capacity but not allocatable, or tainted by "
                     "the DRA driver: e.g. an XID error)")
    return ", ".join(parts)


FIXES: dict[str, str] = {
    model.UNSCHEDULABLE: "uncordon {node} (kubectl uncordon {node})",
    model.NOT_READY: "bring {node} back to Ready",
    model.TAINTED: "tolerate or remove the taint on {node}",
    model.MIG_PENDING: "wait for the MIG reconfiguration on {node} to finish",
    model.MIG_FAILED: "fix the MIG configuration of {node} (nvidia.com/mig.config)",
    model.MALFORMED_LABELS: "fix the GPU labels of {node} (GPU Feature Discovery)",
    model.GPUS_UNHEALTHY: "repair the GPUs of {node} ({message})",
    model.NO_COMPATIBLE_IMAGE: "add a spec.images variant that fits {node} ({message})",
    model.INSUFFICIENT_MEMORY: "lower spec.gpus.minMemoryMiB ({message})",
    model.PRECISION_UNSUPPORTED: "use spec.training.precision Auto ({message})",
}
"""Per exclusion reason, what would make the node usable ({node}, {message} filled in)."""


DEVICE_REJECTIONS = frozenset({model.INSUFFICIENT_MEMORY, model.PRECISION_UNSUPPORTED})
"""Exclusions of a device by what the device is (its memory, its compute capability), not by its
node's state: another node of that type would be excluded alike."""


def _hints(job: JobSpec, need: int, free: int, types: Sequence[str],
           denied: Sequence[ExcludedNode], fixable: Sequence[ExcludedNode],
           replan: remedies.Replan | None = None) -> list[str]:
    """What to change so the job plans: lower minRanks, add capacity (of ``types``: those another
    device of would help), allow a product, fix nodes."""
    short = need - free
    hints = []
    if free >= 1:
        default = " (it defaults to spec.gpus.ranks)" if job.gpus.min_ranks == job.gpus.ranks else ""
        hints.append(f"set spec.gpus.minRanks to {free} or less{default}"
                     + (remedies.fewer_ranks(job, free, replan) if replan else ""))
    plural = "s" if short != 1 else ""
    denied_types = sorted({e.gpu_type for e in denied if e.gpu_type})
    absent = [p for p in job.gpus.allowed_products if p not in denied_types]
    if types:
        hints.append(f"add {short} more {' or '.join(types)} GPU{plural} (a node, or free used ones)")
    elif job.gpus.min_memory_mib and any(e.reason == model.INSUFFICIENT_MEMORY for e in fixable):
        hints.append(f"add {short} GPU{plural} of at least {job.gpus.min_memory_mib} MiB "
                     "(spec.gpus.minMemoryMiB)")
    elif absent and len(absent) == len(job.gpus.allowed_products):
        on_nodes = f" (the nodes have {', '.join(denied_types)})" if denied_types else ""
        hints.append(f"add {short} {' or '.join(absent)} GPU{plural}: no node has one of "
                     f"spec.gpus.allowedProducts{on_nodes}{_label_hint(absent)}")
    else:
        hints.append(f"add {short} GPU{plural} of a type spec.gpus allows")
    if denied_types:
        shown = ", ".join(denied_types[:MAX_NOTES]) + (", ..." if len(denied_types) > MAX_NOTES else "")
        hints.append(f"allow {shown} in spec.gpus ({_denied_why(denied)})")
    usable_types = set(types)  # nodes of a type the job could use come first
    ordered = sorted(fixable, key=lambda e: e.gpu_type not in usable_types)
    memory = [e for e in ordered if e.reason == model.INSUFFICIENT_MEMORY]
    if memory:  # one hint for all of them: the same field, the largest device named
        hints.append((remedies.min_memory(job, memory, replan) if replan else "")
                     or _memory_hint(job, memory))
    precision = [e for e in ordered if e.reason == model.PRECISION_UNSUPPORTED]
    if precision:  # one hint for all of them: the same field
        hints.append(_precision_hint(precision)
                     + (remedies.precision(job, ("Auto", "FP32"), replan) if replan else ""))
    for e in [e for e in ordered if e.reason not in (model.INSUFFICIENT_MEMORY,
                                                     model.PRECISION_UNSUPPORTED)][:MAX_NOTES]:
        fix = FIXES.get(e.reason)
        if fix:
            hints.append(fix.format(node=e.node, message=e.message.rstrip(".")))
    return hints


def _label_hint(absent: Sequence[str]) -> str:
    """``"; H100 is not a product name as GPU Feature Discovery labels it (nvidia.com/gpu.product):
    did you mean NVIDIA-H100-80GB-HBM3, NVIDIA-H100-NVL or NVIDIA-H100-PCIe?)"`` for the
    ``allowedProducts`` entries no node has that are a part of the built-in table's labels
    (:data:`hetero_operator.cluster.gputable.PRODUCT_LABELS`), else ``""``."""
    labels = sorted(set(PRODUCT_LABELS.values()))
    hints = []
    for entry in absent:
        close = [label for label in labels if entry and entry.lower() in label.lower()
                 and label != entry]
        if close and entry not in labels:
            named = ", ".join(close[:-1]) + " or " + close[-1] if len(close) > 1 else close[0]
            hints.append(f"{entry} is not a product name as GPU Feature Discovery labels it "
                         f"(nvidia.com/gpu.product): did you mean {named}?")
    return f" ({'; '.join(hints)})" if hints else ""


def _denied_why(denied: Sequence[ExcludedNode]) -> str:
    """Why ``spec.gpus`` denies the nodes, each type named: ``"NVIDIA-A100-SXM4-40GB, Tesla-T4,
    Tesla-V100-SXM2-16GB are not in spec.gpus.allowedProducts"``; other reasons each once."""
    suffix = " is not in spec.gpus.allowedProducts"
    whys = list(dict.fromkeys(e.message.partition("; ")[0] for e in denied))
    if len(whys) > 1 and all(w.endswith(suffix) for w in whys):
        types = [w.removesuffix(suffix) for w in whys]
        shown = ", ".join(types[:MAX_NOTES]) + (", ..." if len(types) > MAX_NOTES else "")
        return f"{shown} are not in spec.gpus.allowedProducts"
    return "; ".join(whys[:MAX_NOTES]) + ("; ..." if len(whys) > MAX_NOTES else "")


def _precision_hint(excluded: Sequence[ExcludedNode]) -> str:
    """One hint for every node ``spec.training.precision`` excludes, each GPU type said once:
    ``"use spec.training.precision Auto or FP32 (Tesla-T4 (cc 7.5), Tesla-V100-SXM2-16GB (cc 7.0)
    have no bf16; spec.training.precision BF16 needs cc >= 8.0)"``."""
    what: dict[str, None] = {}
    needs: dict[str, None] = {}
    for e in excluded:
        head, _, tail = e.message.rstrip(".").partition("; ")
        what.setdefault(head, None)
        if tail:
            needs.setdefault(tail.removesuffix(" (use Auto)"), None)
    lacks = re.fullmatch(r"(.*) (has no \w+)", next(iter(what)))
    if len(what) > 1 and lacks and all(h.endswith(lacks.group(2)) for h in what):
        heads = (", ".join(h.removesuffix(" " + lacks.group(2)) for h in what)
                 + " " + lacks.group(2).replace("has", "have", 1))
    else:
        heads = "; ".join(what)
    return f"use spec.training.precision Auto or FP32 ({'; '.join([heads, *needs])})"


def _memory_hint(job: JobSpec, excluded: Sequence[ExcludedNode]) -> str:
    """One hint for the nodes with too little memory, the field named once: ``minMemoryMiB``
    with the largest excluded device's memory, else ``memoryReserveMiB``/``memoryPerSampleMiB``
    with the largest device's message; and how many more nodes the same change concerns."""
    def mib(e: ExcludedNode) -> int:
        found = re.search(r"has (\d+) MiB", e.message)
        return int(found.group(1)) if found else 0

    largest = max(excluded, key=mib)
    more = len(excluded) - 1
    if "minMemoryMiB" in largest.message:
        also = f"; {more} more node{'s' if more != 1 else ''} with less" if more else ""
        return (f"lower spec.gpus.minMemoryMiB from {job.gpus.min_memory_mib} ({largest.gpu_type} "
                f"has {mib(largest)} MiB{also})")
    also = f"; {more} more node{'s' if more != 1 else ''} alike" if more else ""
    return (f"lower spec.training.memoryReserveMiB or memoryPerSampleMiB "
            f"({largest.message.rstrip('.')}{also})")


def batch_too_small(job: JobSpec, excluded: Sequence[ExcludedNode],
                    warnings: Sequence[InventoryWarning]) -> Unschedulable:
    """``minRanks`` above the global batch: some rank would get no sample."""
    g, b = job.gpus.min_ranks, job.training.global_batch_size
    return Unschedulable(
        shortfalls=(), excluded=tuple(excluded), reason="GlobalBatchTooSmall",
        warnings=tuple(warnings),
        message=f"spec.training.globalBatchSize {b} < spec.gpus.minRanks {g}: every rank needs at "
                "least one sample; raise globalBatchSize or lower minRanks")


def insufficient_memory(job: JobSpec, caps: Sequence[int], excluded: Sequence[ExcludedNode],
                        warnings: Sequence[InventoryWarning]) -> Unschedulable:
    """The chosen devices' memory caps sum below the global batch."""
    t = job.training
    held = sum(caps)
    return Unschedulable(
        shortfalls=(), excluded=tuple(excluded), reason="InsufficientMemory",
        warnings=tuple(warnings),
        message=f"spec.training.globalBatchSize {t.global_batch_size} exceeds what the chosen "
                f"{len(caps)} devices hold at memoryPerSampleMiB {t.memory_per_sample_mib} and "
                f"memoryReserveMiB {t.memory_reserve_mib} ({held} samples); lower globalBatchSize "
                "or memoryPerSampleMiB, or raise spec.gpus.ranks")


def _allowed(job: JobSpec, gpu_type: str) -> bool:
    parts = gfd.split_product(gpu_type)
    return not type_rejection(job, parts.base, parts.mig_profile)


def _message(need: int, free: int, shortfalls: Sequence[Shortfall], other: list[str],
             denied: int) -> str:
    parts = [f"{s.gpu_type}: free {s.free}{_notes(s.reasons)}" if len(shortfalls) > 1
             else f"{s.gpu_type}: need {s.need}, free {s.free}{_notes(s.reasons)}" for s in shortfalls]
    if not parts:
        parts = [f"no eligible GPUs (denied by spec.gpus on {denied} "
                 f"node{'s' if denied != 1 else ''})" if denied else "no eligible GPUs"]
    text = "; ".join(parts)
    if len(shortfalls) != 1:
        text = f"need {need} ranks (spec.gpus.minRanks, default spec.gpus.ranks), {free} free: {text}"
    if other:
        text += f"; other nodes excluded{_notes(other)}"
    return text


def _notes(notes: Sequence[str]) -> str:
    if not notes:
        return ""
    shown = ", ".join(notes[:MAX_NOTES])
    more = f", and {len(notes) - MAX_NOTES} more" if len(notes) > MAX_NOTES else ""
    return f" ({shown}{more})"
