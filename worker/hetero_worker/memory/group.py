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

With the speed features (issue 29) the cross-group exchange is the speed controller's
(:meth:`GroupShardSync.reduce` hands it to the sync's codec reducer): each rank puts its own chunks
of the group sum into a zero buffer, the reducer's hierarchical sum (reduce in the group, the
leaders' codec: Int8 or PowerSGD with error feedback, broadcast in the group) gives every rank the
total, and the rebalancer's per-rank stats ride along exactly.  fp16 with a loss scaler needs
nothing more: every rank scales its loss by the one agreed scale, the summed gradients are
unscaled per shard by ``AgreeingGradScaler.unscale_`` (``torch.amp.GradScaler`` handles DTensor
gradients; the found-inf flag is OR-ed over every rank), and the optimizer keeps fp32 state for
the fp32 shards (autocast leaves parameters in their dtype).

Not built: compression under ``Full`` sharding (:mod:`hetero_worker.memory.full`);
:func:`check_supported` refuses it with the fix. Checkpoints under Group and Full sharding are
sharded with ``torch.distributed.checkpoint`` (:mod:`hetero_worker.ckpt.sharded`,
:mod:`hetero_worker.ckpt.flatdcp`).
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


FULL_COMPRESSION_REFUSAL = (
    "Full sharding with compression is not built: Full reduce-scatters each block's gradients over "
    "all ranks inside backward, so there is no one cross-group exchange for Int8 or PowerSGD to "
    "compress; leave spec.training.compression out, or use spec.training.sharding Group (its "
    "cross-group exchange is compressed) (docs/memory.md)")
"""The worker's refusal of compression under ``Full`` (the planner refuses it first, with the same
reason, from the operator's memory planning; docs/memory.md)."""


def check_supported(*, checkpoint_dir: str, sharding: str, compression: str = "none") -> None:
    """Refuse what the worker does not build under sharding (the error names the reason and the fix).

    fp16 with a loss scaler and rebalancing are built under Group and Full, compression under
    Group (:meth:`GroupShardSync.reduce`; issue 29).

    Raises:
        RuntimeError: compression under ``full`` sharding (:data:`FULL_COMPRESSION_REFUSAL`).
            ``checkpoint_dir`` is accepted under every mode (Group and Full checkpoint with
            :mod:`hetero_worker.ckpt.sharded`; issue 29, item 2).
    """
    if compression != "none" and sharding == "full":
        raise RuntimeError(FULL_COMPRESSION_REFUSAL)
    del checkpoint_dir  # every mode checkpoints (hetero_worker.ckpt.sharded, DCP)


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
        sync: the trainer's gradient sync; when the speed features gave it a codec reducer
            (``sync.reducer``: rebalancing or compression), the cross-group exchange is the
            reducer's (:meth:`reduce`). None: the plain exchange only.

    Attributes:
        inter_group_bytes: bytes this rank sent across groups (leaders only; the reducer's
            exchange counts its own, through the sync).
        comm_s: seconds in the cross-group reduction since :meth:`take_comm_s`.
    """

    def __init__(self, *, intra: Any, intra_ranks: Sequence[int], leaders: Any | None,
                 local_batches: Sequence[int], rank: int, sync: Any = None) -> None:
        self.intra, self.intra_ranks, self.leaders, self.rank = intra, tuple(intra_ranks), leaders, rank
        self.local_batches = list(local_batches)
        self.sync = sync
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
        all-reduce among leaders (Gloo), broadcast in the group, keep the own chunk.

        With the speed features' codec reducer on the sync (rebalancing or compression):
        :meth:`_reduce_through` instead (the leaders' codec, the rebalancer's stats along)."""
        start = time.perf_counter()
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return
        reducer = getattr(self.sync, "reducer", None)
        if reducer is not None:
            self._reduce_through(reducer, grads)
            self.comm_s += time.perf_counter() - start
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

    def _reduce_through(self, reducer: Any, grads: Sequence[Any]) -> None:
        """The cross-group exchange by the speed controller's codec reducer (issue 29).

        Each rank writes its own chunks of the group's gradient sum (FSDP2's reduce-scatter left
        them in its ``DTensor`` shards) into a zero buffer of the full gradients, so the
        reducer's hierarchical sum (``CodecReducer.sum_``: reduce in the group, the leaders' codec
        on the cross-group link, broadcast in the group) gives every rank the total; the pending
        rebalancer stats (one slot per rank) ride along exactly and come back as the merged stats.
        The codec keeps its error feedback in the reducer (checkpointed, and held back on a
        skipped fp16 step by ``end_step``).

        Args:
            reducer: ``hetero_worker.speed.controller.CodecReducer`` (``sum_``, ``pending``,
                ``merged``).
            grads: the parameters' gradients, ``DTensor`` shards, in parameter order.
        """
        index = self.intra_ranks.index(self.rank)
        n_g = len(self.intra_ranks)
        locals_ = [g.to_local() for g in grads]
        shapes = [torch.Size(g.shape) for g in grads]  # global shapes (PowerSGD's matrices)
        flat = torch.zeros(sum(s.numel() for s in shapes), dtype=locals_[0].dtype,
                           device=locals_[0].device)
        views, offset = [], 0
        for shape, local in zip(shapes, locals_, strict=True):
            total = flat[offset:offset + shape.numel()].view(shape)
            offset += shape.numel()
            chunks = torch.chunk(total, n_g, dim=0)
            mine = chunks[index] if index < len(chunks) else None
            if mine is not None and local.numel():
                mine.copy_(local)
            views.append((mine, local))
        stats, reducer.pending = reducer.pending, None
        reducer.sum_(flat, shapes, exact=stats)
        if stats is not None:
            reducer.merged = stats.float().cpu()
        for mine, local in views:
            if mine is not None and local.numel():
                local.copy_(mine)
