"""Work stealing inside a step: micro-batches handed out through a shared counter.

The step's global batch (positions ``0 .. G-1`` of the step's slice of the epoch order) is cut into
``ceil(G / m)`` micro-batches of ``m`` samples.  Every rank repeatedly takes the next micro-batch
index with ``store.add(key, 1)`` (atomic on the ``TCPStore`` that torch.distributed already runs for
rendezvous) until the counter passes the last micro-batch, accumulating gradients of the *summed*
loss over what it took.  One SUM all-reduce then carries the gradients plus the sample count, and
every rank divides by the samples actually processed, so the update is the mean gradient over the
processed samples no matter who did them.  A rank that stalls simply takes fewer (or no)
micro-batches; the others absorb its share inside the same step.

See torch.distributed ``Store.add`` / ``TCPStore`` (https://pytorch.org/docs/stable/distributed.html#torch.distributed.Store.add).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any
from dataclasses import dataclass

import torch
import torch.distributed as dist

def default_store() -> dist.Store:
    """The store of the default process group (the rendezvous ``TCPStore``)."""
    return dist.distributed_c10d._get_default_store()


@dataclass(kw_only=True)
class MicroBatchDispenser:
    """Hands out micro-batch indices of a step through ``store.add``.

    Attributes:
        store: a torch.distributed ``Store`` shared by all ranks (``TCPStore``).
        global_batch: samples per step over all ranks.
        micro_batch: samples per micro-batch (the last one may be smaller).
        prefix: key prefix; distinct per job / dispenser.
    """

    store: dist.Store
    global_batch: int
    micro_batch: int
    prefix: str = "htj/steal"

    def __post_init__(self) -> None:
        if self.micro_batch < 1 or self.global_batch < 1:
            raise ValueError("micro_batch and global_batch must be >= 1")

    @property
    def num_micro_batches(self) -> int:
        """``ceil(global_batch / micro_batch)``."""
        return math.ceil(self.global_batch / self.micro_batch)

    def take(self, step: int) -> int | None:
        """Claim the next micro-batch of ``step``; None once all are claimed (one store round trip)."""
        index = int(self.store.add(f"{self.prefix}/{step}", 1)) - 1
        return index if index < self.num_micro_batches else None

    def bounds(self, index: int) -> tuple[int, int]:
        """Positions ``[start, end)`` inside the step's global batch covered by micro-batch ``index``."""
        start = index * self.micro_batch
        return start, min(start + self.micro_batch, self.global_batch)

    def forget(self, step: int) -> None:
        """Delete the counter of ``step`` (call on one rank once every rank has left that step)."""
        try:
            self.store.delete_key(f"{self.prefix}/{step}")
        except (RuntimeError, NotImplementedError):
            pass


@dataclass(frozen=True, kw_only=True, slots=True)
class StealResult:
    """Outcome of one work-stealing step on this rank.

    Attributes:
        taken: micro-batch indices this rank processed.
        local_samples: samples this rank processed.
        total_samples: samples processed by all ranks (after the all-reduce).
        compute_s: seconds this rank spent computing (excluding the all-reduce).
        loss_sum: summed loss over all processed samples (after the all-reduce).
    """

    taken: tuple[int, ...]
    local_samples: int
    total_samples: int
    compute_s: float
    loss_sum: float


def steal_step(*, step: int, dispenser: MicroBatchDispenser, params: Sequence[torch.Tensor],
               compute: Callable[[int, int], torch.Tensor],
               allreduce: Callable[[list[torch.Tensor]], None] | None = None,
               on_take: Callable[[int], None] | None = None,
               on_drained: Callable[[], None] | None = None) -> StealResult:
    """Run one work-stealing step: take micro-batches until none are left, then synchronise.

    Args:
        step: global step index (same on all ranks).
        dispenser: the shared micro-batch counter.
        params: parameters whose ``.grad`` accumulates; zeroed here first.
        compute: ``compute(start, end)`` runs forward on step positions ``[start, end)`` and returns
            the *summed* (not mean) loss, a scalar tensor; this function calls ``backward``.
        allreduce: SUM all-reduce over all ranks of a list of tensors in place (default: one flat
            ``dist.all_reduce``; pass a hierarchical sync to use groups).
        on_take: called with each taken index before it is computed (tests use it to stall).
        on_drained: called once this rank found no micro-batch left (before the all-reduce).

    Returns:
        :class:`StealResult`; afterwards every ``p.grad`` holds the mean gradient over the samples
        processed by all ranks (identical on every rank).
    """
    for p in params:
        p.grad = torch.zeros_like(p)
    taken: list[int] = []
    local = 0
    loss_sum = torch.zeros(())
    start_s = time.perf_counter()
    while (index := dispenser.take(step)) is not None:
        if on_take is not None:
            on_take(index)
        lo, hi = dispenser.bounds(index)
        loss = compute(lo, hi)
        loss.backward()
        loss_sum += loss.detach()
        taken.append(index)
        local += hi - lo
    compute_s = time.perf_counter() - start_s
    if on_drained is not None:
        on_drained()
    counts = torch.tensor([float(local), float(loss_sum)])
    tensors = [p.grad for p in params] + [counts]
    (allreduce or _flat_allreduce)(tensors)  # SUM: gradients of summed losses, samples, loss
    total = round(float(counts[0]))
    for p in params:
        p.grad.div_(max(total, 1))
    if dist.get_rank() == 0:
        dispenser.forget(step)  # every rank left the take loop before joining the all-reduce
    return StealResult(taken=tuple(taken), local_samples=local, total_samples=total,
                       compute_s=compute_s, loss_sum=float(counts[1]))


def _flat_allreduce(tensors: list[torch.Tensor]) -> None:
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def trainer_steal_step(trainer: Any, optimizer: torch.optim.Optimizer, dispenser: MicroBatchDispenser,
                       loss_sum_fn: Callable[[torch.nn.Module, list[int]], torch.Tensor]) -> StealResult:
    """One work-stealing optimizer step of a :class:`hetero_worker.trainer.Trainer`.

    The step's samples are the next ``global_batch`` positions of the trainer's sampler order
    (so epochs stay covered exactly as with the fixed split); micro-batches are computed on the
    unwrapped module (no DDP all-reduce per backward) and reduced once with the trainer's
    hierarchical groups.  Call :meth:`Trainer.wrap` and :meth:`Trainer.loader` first.

    Args:
        trainer: the rank's trainer.
        optimizer: over the model's parameters.
        dispenser: shared counter; ``global_batch`` must equal the trainer's global batch.
        loss_sum_fn: ``loss_sum_fn(module, dataset_indices)`` returns the *summed* loss of those
            samples (scalar tensor).

    Returns:
        The :class:`StealResult` (the optimizer step is taken).

    Raises:
        RuntimeError: no model or loader yet.
    """
    from hetero_worker.groups import hierarchical_all_reduce_
    sampler, module = trainer.sampler, trainer.module
    if sampler is None or module is None:
        raise RuntimeError("call Trainer.wrap(model) and Trainer.loader(dataset) first")
    if sampler.num_samples - sampler.cursor < sampler.global_batch:
        sampler.set_epoch(sampler.epoch + 1)
    order = sampler.permutation(sampler.epoch)
    base = sampler.cursor
    params = [p for p in module.parameters() if p.requires_grad]

    def compute(lo: int, hi: int) -> torch.Tensor:
        return loss_sum_fn(module, order[base + lo:base + hi].tolist())

    def allreduce(tensors: list[torch.Tensor]) -> None:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        hierarchical_all_reduce_(flat, trainer.groups)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()

    result = steal_step(step=trainer.global_step, dispenser=dispenser, params=params,
                        compute=compute, allreduce=allreduce)
    optimizer.step()
    sampler.cursor += sampler.global_batch
    trainer.global_step += 1
    return result
