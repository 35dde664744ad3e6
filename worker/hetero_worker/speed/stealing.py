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
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from hetero_worker.comm.collectives import flat_reduce_
from hetero_worker.comm.groups import hierarchical_all_reduce_


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
               on_drained: Callable[[], None] | None = None,
               autocast: Callable[[], AbstractContextManager[Any]] | None = None,
               scale: Callable[[torch.Tensor], torch.Tensor] | None = None) -> StealResult:
    """Run one work-stealing step: take micro-batches until none are left, then synchronise.

    Everything is computed on the parameters' device: the loss sum and the sample count travel
    in the same buffer as the gradients (one collective), so they live where the gradients live.

    Args:
        step: global step index (same on all ranks).
        dispenser: the shared micro-batch counter.
        params: parameters whose ``.grad`` accumulates; zeroed here first. All on one device.
        compute: ``compute(start, end)`` runs forward on step positions ``[start, end)`` and returns
            the *summed* (not mean) loss, a scalar tensor; this function calls ``backward``.
        allreduce: SUM all-reduce over all ranks of a list of tensors in place (default: one flat
            ``dist.all_reduce``; pass a hierarchical sync to use groups).
        on_take: called with each taken index before it is computed (tests use it to stall).
        on_drained: called once this rank found no micro-batch left (before the all-reduce).
        autocast: context manager factory the forward runs under (the rank's precision; default
            none).
        scale: applied to each loss before ``backward`` (a ``GradScaler.scale``; the gradients
            then stay scaled, and the caller unscales before the optimizer step).

    Returns:
        :class:`StealResult`; afterwards every ``p.grad`` holds the mean gradient over the samples
        processed by all ranks (identical on every rank; times the loss scale under ``scale``).
    """
    device = params[0].device if params else torch.device("cpu")
    for p in params:
        p.grad = torch.zeros_like(p)
    taken: list[int] = []
    local = 0
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    start_s = time.perf_counter()
    while (index := dispenser.take(step)) is not None:
        if on_take is not None:
            on_take(index)
        lo, hi = dispenser.bounds(index)
        with autocast() if autocast is not None else nullcontext():
            loss = compute(lo, hi)
        (scale(loss) if scale is not None else loss).backward()
        loss_sum += loss.detach().to(torch.float64)
        taken.append(index)
        local += hi - lo
    compute_s = time.perf_counter() - start_s
    if not taken and scale is not None:
        # A rank that took nothing (the others drained the step first) still steps its scaler
        # with everyone: a GradScaler creates its scale on the first scale() call, and unscale_
        # before that raises (found by the feature matrix, fp16 x stealing, issue 21).
        scale(torch.zeros((), device=device))
    if on_drained is not None:
        on_drained()
    wire = params[0].dtype if params else torch.float64  # counts ride with the gradients
    counts = torch.stack([torch.tensor(float(local), dtype=torch.float64, device=device),
                          loss_sum]).to(wire)
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
    """One SUM all-reduce over the default (Gloo) group, in the widest dtype of ``tensors``."""
    flat_reduce_(tensors, dist.all_reduce, dtype=_wire_dtype(tensors))


def _wire_dtype(tensors: Sequence[torch.Tensor]) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def hierarchical_allreduce(groups: Any) -> Callable[[list[torch.Tensor]], None]:
    """An ``allreduce`` for :func:`steal_step` over the job's hierarchical groups."""

    def allreduce(tensors: list[torch.Tensor]) -> None:
        flat_reduce_(tensors, lambda flat: hierarchical_all_reduce_(flat, groups),
                     dtype=_wire_dtype(tensors))
    return allreduce


def codec_allreduce(reducer: Any) -> Callable[[list[torch.Tensor]], None]:
    """An ``allreduce`` for :func:`steal_step` through the job's codec reducer: the gradients go
    over the hierarchy with the leaders' link compressed, the last tensor (the sample count and
    loss sum) rides along exactly (:meth:`hetero_worker.speed.controller.CodecReducer.sum_`)."""

    def allreduce(tensors: list[torch.Tensor]) -> None:
        *grads, counts = tensors
        flat_reduce_(grads, lambda flat: reducer.sum_(flat, [g.shape for g in grads], counts),
                     dtype=_wire_dtype(grads))
    return allreduce


def check_stealable(sampler: Any, module: torch.nn.Module | None, sharding: str = "none") -> None:
    """Refuse a work-stealing step before any collective.

    Args:
        sampler: the loader's position (None before ``Trainer.loader``).
        module: the unwrapped model (None before ``Trainer.wrap``).
        sharding: ``HTJ_SHARDING``.

    Raises:
        RuntimeError: no model or loader yet, a stream's loader (no indices to take), or
            Group/Full sharding (their collectives need the same micro-batches on every rank of a
            group, which stealing does not give).
    """
    if sampler is None or module is None:
        raise RuntimeError("call Trainer.wrap(model) and Trainer.loader(dataset) first")
    if not hasattr(sampler, "permutation"):  # a stream (hetero_worker.streaming)
        raise RuntimeError(
            "work stealing takes each step's samples by index from a map-style dataset's "
            "order; this loader reads a stream (an IterableDataset): train it with "
            "Trainer.step, or pass a map-style dataset to Trainer.loader")
    if sharding != "none":
        raise RuntimeError(
            f"work stealing under {sharding.capitalize()} sharding is not built "
            "(the sharded collectives need equal micro-batch counts on every rank, stealing "
            "gives each rank what it takes): set spec.training.sharding None, or train with "
            "Trainer.step")


class StealingTrainer(Protocol):
    """What :func:`trainer_steal_step` calls (:class:`hetero_worker.trainer.Trainer` has it)."""

    def steal_step(self, optimizer: torch.optim.Optimizer, dispenser: MicroBatchDispenser,
                   loss_sum_fn: Callable[[torch.nn.Module, list[int]], torch.Tensor]
                   ) -> StealResult:
        """One work-stealing optimizer step."""
        ...


def trainer_steal_step(trainer: StealingTrainer, optimizer: torch.optim.Optimizer,
                       dispenser: MicroBatchDispenser,
                       loss_sum_fn: Callable[[torch.nn.Module, list[int]], torch.Tensor]
                       ) -> StealResult:
    """One work-stealing optimizer step of a trainer: ``trainer.steal_step(...)`` (see
    :meth:`hetero_worker.trainer.Trainer.steal_step`, which runs
    :meth:`hetero_worker.stepping.Stepper.steal_step`)."""
    return trainer.steal_step(optimizer, dispenser, loss_sum_fn)
