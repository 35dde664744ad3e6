"""Weighted gradient synchronisation for uneven local batches.

Each rank's loss is the mean over its own ``b_r`` samples, so plain DDP averaging (weight
``1 / world_size``) is wrong when batches differ (case 15; pytorch/pytorch#67253, #37359). The
update equals the single-process mean over the global batch ``B = sum(b)`` when every rank's
gradient is weighted by ``b_r / B`` and the weighted gradients are *summed*:
``sum_r (b_r / B) * (1 / b_r) * sum_{i in r} grad l_i = (1 / B) * sum_i grad l_i``.

:class:`WeightedGradSync` is registered as a DDP communication hook (DDP's bucketing is kept). The
hook weights the bucket and reduces it hierarchically (reduce in the group, all-reduce among the
leaders, broadcast in the group; :func:`hetero_worker.groups.hierarchical_all_reduce_`).

Why the hook blocks: chaining the three collectives through ``Future.then`` callbacks can deadlock
on Gloo in torch 2.13 (its own PowerSGD hook does on CPU), so the hook runs the collectives to
completion on the autograd thread and returns an already completed future. That keeps bucketing
and the weighting but gives up overlap of communication with the rest of backward.

The split is pluggable: :meth:`WeightedGradSync.set_split` takes the list of local batches for the
next step, so a rebalancer only passes new numbers at a step boundary.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as real objects.

import time
from collections.abc import Callable, Iterable, Sequence

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from hetero_worker.groups import ProcessGroups, hierarchical_all_reduce_


def rank_weight(local_batches: Sequence[int], rank: int) -> float:
    """``local_batches[rank] / sum(local_batches)``.

    Raises:
        ValueError: a batch below 1 or ``rank`` out of range.
    """
    if not 0 <= rank < len(local_batches) or min(local_batches) < 1:
        raise ValueError(f"need batches >= 1 and 0 <= rank < {len(local_batches)}; "
                         f"got {list(local_batches)}, rank {rank}")
    return local_batches[rank] / sum(local_batches)


class WeightedGradSync:
    """Weighted, hierarchical gradient sum for one rank.

    Args:
        groups: this rank's process groups.
        local_batches: samples per step of every rank, ``len == world_size``.
        on_inter_group_bytes: called with the payload bytes of every collective that crosses
            topology groups (e.g. ``WorkerMetrics.add_inter_group_bytes``).

    Attributes:
        weight: this rank's current gradient weight ``b_rank / B``.
        comm_s: seconds spent in collectives since the last :meth:`take_comm_s`.
    """

    def __init__(self, groups: ProcessGroups, local_batches: Sequence[int], *,
                 on_inter_group_bytes: Callable[[int], None] | None = None) -> None:
        self.groups = groups
        self.on_inter_group_bytes = on_inter_group_bytes
        self.comm_s = 0.0
        self.inter_group_bytes = 0
        self.local_batches: tuple[int, ...] = ()
        self.weight = 1.0
        self.set_split(local_batches)

    def set_split(self, local_batches: Sequence[int]) -> None:
        """Use a new batch split from the next reduction on (call at a step boundary)."""
        self.local_batches = tuple(int(b) for b in local_batches)
        self.weight = rank_weight(self.local_batches, self.groups.rank)

    def take_comm_s(self) -> float:
        """Return and reset the accumulated collective time in seconds."""
        value, self.comm_s = self.comm_s, 0.0
        return value

    def reduce_(self, flat: torch.Tensor) -> torch.Tensor:
        """Weight ``flat`` (1-D gradient buffer) by ``weight`` and sum it over all ranks in place."""
        flat.mul_(self.weight)
        start = time.perf_counter()
        sent = hierarchical_all_reduce_(flat, self.groups)
        self.comm_s += time.perf_counter() - start
        if sent:
            self.inter_group_bytes += sent
            if self.on_inter_group_bytes is not None:
                self.on_inter_group_bytes(sent)
        return flat

    def register(self, ddp_model: torch.nn.parallel.DistributedDataParallel) -> None:
        """Install :func:`weighted_hook` on a DDP model (before its first backward)."""
        ddp_model.register_comm_hook(self, weighted_hook)

    def sync_after_backward(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Fallback without DDP: flatten all gradients, reduce once, copy back.

        Call right after ``backward()`` on every rank. Parameters without a gradient get a zero one
        first, so every rank sends the same layout.
        """
        params = [p for p in parameters if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = self.reduce_(_flatten_dense_tensors(grads))
        for grad, synced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            grad.copy_(synced)


def weighted_hook(sync: WeightedGradSync,
                  bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: weighted hierarchical sum of one bucket (blocking, see module)."""
    result = sync.reduce_(bucket.buffer())
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(result)
    return future
