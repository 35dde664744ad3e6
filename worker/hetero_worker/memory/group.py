"""``Group`` sharding: FSDP2 inside each GPU-type group, one weighted reduction across groups (issue 12).

Inside a group (one node, one GPU type: :mod:`hetero_worker.comm.commplan` lets it use NCCL on GPUs,
Gloo on CPU) the model is sharded with PyTorch's FSDP2 ``fully_shard`` on a one-dimensional
``DeviceMesh`` of that group's process group: each rank holds ``1/n`` of the parameters, gradients
and optimizer state (FSDP2 shards dim 0 with ``torch.chunk``), and FSDP2 gathers a block's
parameters for its forward and backward and reduce-scatters its gradients, all inside the group.

Across groups the state is replicated, and the gradients meet once per step: after backward every
rank of a group holds its shard of the *group's* weighted gradient sum; :meth:`GroupShardSync.reduce`
gathers the group sum inside the group (``DTensor.full_tensor``), the group leaders all-reduce it
over their Gloo group (whatever crosses GPU types goes over Gloo), the leader broadcasts the total
inside the group, and each rank keeps its own chunk.

Weighting: rank r's loss is multiplied by ``n_g * b_r / B`` (``n_g`` its group's size, ``b_r`` its
local batch, ``B`` the global batch), so FSDP2's average over the group (divide by ``n_g``) leaves
``sum_r b_r / B * grad_r``, summed over groups: the single-process full-batch gradient.

Not built: rebalancing and compression under Group sharding (they ride in the DDP reduction
this replaces), fp16 with a loss scaler under Group sharding (FSDP2 needs ``ShardedGradScaler``-style
unscaling of DTensor gradients), checkpoints under ``Full`` sharding (uneven shards across types,
:mod:`hetero_worker.memory.full`). :func:`check_supported` refuses those with the fix. Checkpoints under Group sharding are sharded
with ``torch.distributed.checkpoint`` (:mod:`hetero_worker.ckpt.sharded`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

__all__ = ["GroupShardSync", "check_supported", "shard_group"]


def check_supported(*, precision_has_scaler: bool, checkpoint_dir: str, sharding: str,
                    rebalance_interval_steps: int = 0, compression: str = "none") -> None:
    """Refuse what the worker does not build yet under sharding (the error names the fix).

    Raises:
        RuntimeError: a checkpoint directory under ``full`` sharding, fp16 with a loss
            scaler, or rebalancing / compression (both ride in the DDP reduction that Group
            sharding replaces). Group sharding checkpoints with :mod:`hetero_worker.ckpt.sharded`.
    """
    mode = sharding.capitalize()  # Group or Full (hetero_worker.memory.full)
    if precision_has_scaler:
        raise RuntimeError(f"{mode} sharding with fp16 and a loss scaler is not built yet: set "
                           "spec.training.precision to BF16 or FP32 (docs/memory.md)")
    if rebalance_interval_steps or compression != "none":
        raise RuntimeError(f"{mode} sharding with rebalancing or compression is not built yet: leave "
                           "spec.training.rebalance and spec.training.compression out (docs/memory.md)")
    if checkpoint_dir and sharding == "full":  # Group checkpoints: hetero_worker.ckpt.sharded (DCP)
        raise RuntimeError("Full sharding does not checkpoint yet: leave spec.training.checkpoint "
                           "out or use spec.training.sharding Group (docs/memory.md)")


GLOO_CUDA_ISSUE = "pytorch/pytorch#132471"
"""Gloo's reduce-scatter / all-gather of CUDA tensors, which FSDP2 needs, are not supported paths."""


def refuse_gloo_on_cuda(plan: Any, comm_ranks: Sequence[Any]) -> None:
    """Refuse Group sharding where a group of two or more CUDA ranks communicates over Gloo.

    The communicator rule gives a group Gloo when its members may share a physical GPU (MIG
    slices of one card, time-sliced GPUs) or run different PyTorch builds; FSDP2 over such a
    group would run Gloo's CUDA reduce-scatter and all-gather (:data:`GLOO_CUDA_ISSUE`).  Full
    sharding stages every collective through the CPU and runs there.  Checked on every rank from
    the job-wide communicator plan (the same verdict everywhere, before any FSDP2 collective).

    Args:
        plan: the :class:`~hetero_worker.comm.commplan.CommPlan` of the ``group`` layout.
        comm_ranks: every rank's :class:`~hetero_worker.comm.commplan.CommRank`.

    Raises:
        RuntimeError: such a group exists (the message names it, the reason and the fix).
    """
    for g in plan.intra:
        if g.backend == "gloo" and len(g.ranks) > 1 and any(comm_ranks[r].on_cuda for r in g.ranks):
            raise RuntimeError(
                f"Group sharding of ranks {list(g.ranks)} would run FSDP2 over a Gloo group on CUDA "
                f"({g.reason}; Gloo has no CUDA reduce-scatter/all-gather, {GLOO_CUDA_ISSUE}): set "
                "spec.training.sharding Full (it stages its collectives through the CPU) or None")


def shard_group(module: torch.nn.Module, group: Any, device: torch.device,
                block: type[torch.nn.Module] | None) -> torch.nn.Module:
    """Shard ``module`` with FSDP2 over ``group`` (each ``block`` instance its own unit, then the
    root).

    Args:
        module: the model on its device, parameters equal on every rank.
        group: the process group of this rank's GPU-type group.
        device: the rank's device (``cpu`` or ``cuda:i``).
        block: the repeated block class (gathered and freed one block at a time); None: the whole
            model is one unit.

    Returns:
        ``module`` (FSDP2 shards in place; its parameters become ``DTensor`` shards).
    """
    mesh = DeviceMesh.from_group(group, device.type)
    if block is not None:
        for sub in list(module.modules()):
            if isinstance(sub, block) and sub is not module:
                fully_shard(sub, mesh=mesh)
    fully_shard(module, mesh=mesh)
    return module


class GroupShardSync:
    """The weighting and the one cross-group reduction of ``Group`` sharding.

    Args:
        intra: this rank's group's process group.
        intra_ranks: its global ranks, ascending (``intra_ranks[0]`` leads).
        leaders: the leaders' Gloo group (None on non-leaders or with one group).
        local_batches: the split, ``len == world_size``.
        rank: this rank's global rank.

    Attributes:
        inter_group_bytes: bytes this rank sent across groups (leaders only).
        comm_s: seconds in the cross-group reduction since :meth:`take_comm_s`.
    """

    def __init__(self, *, intra: Any, intra_ranks: Sequence[int], leaders: Any | None,
                 local_batches: Sequence[int], rank: int) -> None:
        self.intra, self.intra_ranks, self.leaders, self.rank = intra, tuple(intra_ranks), leaders, rank
        self.local_batches = list(local_batches)
        self.inter_group_bytes = 0
        self.comm_s = 0.0

    @property
    def loss_factor(self) -> float:
        """``n_g * b_r / B``: FSDP2's group average then leaves the rank's weight ``b_r / B``."""
        return len(self.intra_ranks) * self.local_batches[self.rank] / sum(self.local_batches)

    def on_split(self, local_batches: Sequence[int]) -> None:
        """Follow a new split (same call on every rank; the data part's position tells it)."""
        self.local_batches = list(local_batches)

    def micro_count(self, micro: int) -> int:
        """Micro-batches every rank of the group runs (FSDP2's collectives are the group's): the
        most any member needs with ``micro`` samples each (the group's value); 1 when 0."""
        group = [self.local_batches[r] for r in self.intra_ranks]
        return max(-(-b // micro) for b in group) if micro > 0 else 1

    def take_comm_s(self) -> float:
        """Seconds spent in :meth:`reduce` since the last call."""
        secs, self.comm_s = self.comm_s, 0.0
        return secs

    def reduce(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum the groups' gradients into every rank's shard: gather in the group, one flat
        all-reduce among leaders (Gloo), broadcast in the group, keep the own chunk."""
        start = time.perf_counter()
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        fulls = [g.full_tensor() for g in grads]
        flat = torch.cat([f.reshape(-1) for f in fulls])
        if self.leaders is not None:
            on_cpu = flat.device.type != "cpu"
            buf = flat.cpu() if on_cpu else flat  # the leaders' group is Gloo (CPU tensors)
            dist.all_reduce(buf, group=self.leaders)
            self.inter_group_bytes += buf.numel() * buf.element_size()
            if on_cpu:
                flat.copy_(buf)
        if len(self.intra_ranks) > 1:
            dist.broadcast(flat, src=self.intra_ranks[0], group=self.intra)
        index = self.intra_ranks.index(self.rank)
        offset = 0
        for g, f in zip(grads, fulls, strict=True):
            total = flat[offset:offset + f.numel()].view_as(f)
            offset += f.numel()
            chunks = torch.chunk(total, len(self.intra_ranks), dim=0)
            local = g.to_local()
            if index < len(chunks) and local.numel():
                local.copy_(chunks[index])
        self.comm_s += time.perf_counter() - start
