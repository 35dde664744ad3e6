"""The Trainer's model part: the user's model moved to the rank's device and made data-parallel:
DDP with the weighted hierarchical comm hook, the manual sync, or sharded under
``HTJ_SHARDING=group|full`` (:mod:`hetero_worker.memory.group`, :mod:`hetero_worker.memory.full`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hetero_worker.comm.collectives import broadcast_from_rank0_
from hetero_worker.comm.commplan import CommRank
from hetero_worker.comm.sync import WeightedGradSync
from hetero_worker.memory.batchnorm import check_norm_layers
from hetero_worker.memory import caps as memcap
from hetero_worker.memory import full as fullshard
from hetero_worker.memory import group as sharding
from hetero_worker.memory import microbatch
from heterotrain_common.contract import Contract


class ModelPart:
    """The model, its wrapper and the sharded sync of one rank.

    Args:
        contract: the rank's contract (memory, sharding, checkpoint and comm settings, topology).
        device: the rank's device.
        sync: the gradient sync (DDP's hook and options, its process groups).
        sync_mode: ``"hook"`` or ``"manual"``.
        comm_ranks: every rank's communicator facts (the Gloo-on-CUDA check of Group sharding).
        memory: the memory meter (None without a cap).

    Attributes:
        module: the unwrapped model on the device (None before :meth:`wrap`).
        model: what ``wrap`` returned (DDP, or the module itself).
        shard_sync: the Group or Full sharding sync (None unsharded).
    """

    def __init__(self, contract: Contract, *, device: torch.device, sync: WeightedGradSync,
                 sync_mode: str, comm_ranks: list[CommRank],
                 memory: memcap.MemoryMeter | None) -> None:
        self.contract, self.device, self.sync, self.sync_mode = contract, device, sync, sync_mode
        self.comm_ranks, self.memory = comm_ranks, memory
        self.rank = contract.dist.rank
        self.module: torch.nn.Module | None = None
        self.model: torch.nn.Module | None = None
        self.shard_sync: sharding.GroupShardSync | fullshard.FullShardSync | None = None

    def wrap(self, model: torch.nn.Module, block: type[torch.nn.Module] | None, *,
             local_batches: list[int], has_scaler: bool,
             use_layout: Callable[[str], None],
             before_wrap: Callable[[torch.nn.Module], None] | None = None) -> torch.nn.Module:
        """``Trainer.wrap`` (see there).

        Args:
            model: the user's model.
            block: the model's repeated block class (activation checkpointing, sharding unit).
            local_batches: the current split (the sharded syncs' weights).
            has_scaler: the job scales its loss (every wrapping runs with it: Group and Full
                sharding unscale their sharded gradients through the same agreed scaler).
            use_layout: switches the trainer's hierarchy (Group sharding uses ``"group"``).
            before_wrap: the speed controller's hook, called before any wrapping (e.g. the
                ``auto`` hierarchy: measure, then ``use_layout``).

        Raises:
            RuntimeError: the plan needs activation checkpointing and no ``block`` was named.
            ValueError: BatchNorm would see a one-sample micro-batch on this rank
                (:func:`hetero_worker.memory.batchnorm.check_norm_layers`).
        """
        memory = self.contract.memory
        if memory.activation_checkpointing:
            if block is None:
                raise RuntimeError("the plan turns activation checkpointing on for this rank "
                                   "(HTJ_ACTIVATION_CHECKPOINTING=1): name the model's block class, "
                                   "t.wrap(model, block=MyBlock)")
            if memory.sharding != "full":  # Full recomputes every block already
                microbatch.checkpoint_blocks(model, block)
        check_norm_layers(model, rank=self.rank, local_batch=local_batches[self.rank],
                          micro_batch_size=memory.micro_batch_size)  # BatchNorm policy (case 57)
        if before_wrap is not None:
            before_wrap(model)
        if memory.sharding != "none":
            return self._wrap_sharded(model, block, local_batches, use_layout)
        self.module = model.to(self.device)
        self._count_parameters()
        if self.sync_mode == "manual":
            for tensor in self.module.state_dict().values():  # over the Gloo world group
                broadcast_from_rank0_(tensor)
            self.model = self.module
            return self.model
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # DDP's start-up check and broadcast (and the flat fast path) run on a group that obeys
        # the communicator rule: the flat NCCL group of a one-type job, else the Gloo world.
        ddp = DistributedDataParallel(self.module, device_ids=device_ids,
                                      process_group=self.sync.groups.ddp_group,
                                      **self.sync.ddp_options())  # bucket views, bucket cap
        self.sync.register(ddp)  # "backward compute done" is marked by the step (watch_backward)
        self.model = ddp
        return ddp

    def _count_parameters(self) -> None:
        """The memory meter counts the parameters from the start (gradients, optimizer state
        after each step)."""
        if self.memory is not None and self.module is not None:
            self.memory.set_state(self.module.parameters(), None)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's full parameters by name (collective under ``Full`` sharding, where
        ``model.parameters()`` are this rank's flat slices; else the module's own)."""
        if isinstance(self.shard_sync, fullshard.FullShardSync):
            return self.shard_sync.full_state_dict()
        if self.module is None:
            raise RuntimeError("call Trainer.wrap(model) first")
        return {k: v.detach() for k, v in self.module.named_parameters()}

    def _wrap_sharded(self, model: torch.nn.Module, block: type[torch.nn.Module] | None,
                      local_batches: list[int],
                      use_layout: Callable[[str], None]) -> torch.nn.Module:
        """``HTJ_SHARDING=group``: FSDP2 inside the rank's GPU-type group (:mod:`hetero_worker.memory.group`);
        ``full``: :meth:`_wrap_full`."""
        contract = self.contract
        sharding.check_supported(checkpoint_dir=contract.checkpoint.dir,
                                 sharding=contract.memory.sharding,
                                 compression=contract.comm.compression)
        if contract.memory.sharding == "full":
            return self._wrap_full(model, block, local_batches)
        use_layout("group")  # intra = the topology group (one node, one GPU type)
        groups = self.sync.groups
        sharding.refuse_gloo_on_cuda(groups.plan, self.comm_ranks)
        self.module = model.to(self.device)
        for tensor in self.module.state_dict().values():  # same start on every rank (Gloo world)
            broadcast_from_rank0_(tensor)
        sharding.shard_group(self.module, groups.intra, self.device, block)
        self.shard_sync = sharding.GroupShardSync(
            intra=groups.intra, intra_ranks=groups.intra_ranks, leaders=groups.leaders,
            local_batches=local_batches, rank=self.rank, sync=self.sync)
        self._count_parameters()
        self.model = self.module
        return self.model

    def _wrap_full(self, model: torch.nn.Module, block: type[torch.nn.Module] | None,
                   local_batches: list[int]) -> torch.nn.Module:
        """``HTJ_SHARDING=full``: uneven flat slices over all ranks (:mod:`hetero_worker.memory.full`),
        every collective on the Gloo world group."""
        self.module = model.to(self.device)
        for tensor in self.module.state_dict().values():  # same start on every rank (Gloo world)
            broadcast_from_rank0_(tensor)
        world = self.contract.dist.world_size
        shares = self.contract.memory.shard_ppm or tuple(fullshard.slice_sizes(10**6, [1] * world))
        units = fullshard.shard_full(self.module, block=block, shares_ppm=shares, rank=self.rank,
                                     groups_of_ranks=[e.group for e in self.contract.topology],
                                     device=self.device)
        micro = torch.zeros(world, dtype=torch.int64)  # every rank's micro-batch size (Gloo)
        micro[self.rank] = self.contract.memory.micro_batch_size
        dist.all_reduce(micro)
        self.shard_sync = fullshard.FullShardSync(units=units, local_batches=local_batches,
                                                  micro_batch_sizes=micro.tolist(), rank=self.rank,
                                                  sync=self.sync)
        self._count_parameters()
        self.model = self.module
        return self.model
