"""Build the structured "no plan" result and its one-line message (pure).

The message names each short GPU type with what the job needed and what was free, and why devices
are missing, e.g. ``Tesla-T4: need 2, free 1 (node-c: MIG reconfiguration pending)``.  With several
eligible types, ``need`` for a type is what the job would need of it if every other eligible type
were used fully (``minRanks - free of the others``), and the message starts with the totals.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from . import gfd, model
from .eligibility import type_rejection
from .model import ExcludedNode, Inventory, InventoryWarning, Shortfall, Unschedulable
from .spec import JobSpec

if TYPE_CHECKING:
    from .planning import Pool

MAX_NOTES = 3
"""Notes listed per type in the message (the ``shortfalls`` and ``excluded`` fields have all)."""


def insufficient_gpus(job: JobSpec, inventory: Inventory, pools: Sequence[Pool],
                      excluded: Sequence[ExcludedNode]) -> Unschedulable:
    """Fewer eligible free devices than ``spec.gpus.minRanks``."""
    need_total = job.gpus.min_ranks
    free: dict[str, int] = {}
    notes: dict[str, list[str]] = {}
    for p in pools:
        t = p.device.gpu_type
        free[t] = free.get(t, 0) + p.free
        busy = p.device.total - p.free
        if busy:
            notes.setdefault(t, []).append(f"{p.node}: {busy} of {p.device.total} in use")
    other: list[str] = []
    denied = 0
    for e in excluded:
        note = f"{e.node}: {model.REASON_PHRASES.get(e.reason, e.reason)}"
        if e.reason != model.DENIED_BY_SPEC and e.gpu_type and _allowed(job, e.gpu_type):
            free.setdefault(e.gpu_type, 0)
            notes.setdefault(e.gpu_type, []).append(note)
        elif e.reason == model.DENIED_BY_SPEC:
            denied += 1
        elif e.reason != model.NO_GPUS:
            other.append(note)
    total_free = sum(free.values())
    shortfalls = tuple(
        Shortfall(gpu_type=t, need=need_total - (total_free - free[t]), free=free[t],
                  reasons=tuple(notes.get(t, ())))
        for t in sorted(free))
    return Unschedulable(shortfalls=shortfalls, excluded=tuple(excluded),
                         message=_message(need_total, total_free, shortfalls, other, denied),
                         reason="InsufficientGPUs", warnings=inventory.warnings)


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
    several = len(shortfalls) > 1  # then a type's need assumes every other type is used fully
    parts = [f"{s.gpu_type}: need {s.need}{' with all others used' if several else ''}, "
             f"free {s.free}{_notes(s.reasons)}" for s in shortfalls]
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
