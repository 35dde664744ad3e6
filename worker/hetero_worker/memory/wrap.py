"""Wrapping a model under ``HTJ_SHARDING=group|full``: the :class:`~hetero_worker.trainer.Trainer`'s sharded
side, over :mod:`hetero_worker.memory.group` and :mod:`hetero_worker.memory.full`."""

from __future__ import annotations

import torch
import torch.distributed as dist

from hetero_worker.comm.collectives import broadcast_from_rank0_
from hetero_worker.memory import full as fullshard
from hetero_worker.memory import group as sharding


class ShardedWrapping:
    """The Trainer's wrapping under ``HTJ_SHARDING=group|full`` (a mixin of :class:`hetero_worker.trainer.Trainer`)."""

    def _wrap_sharded(self, model: torch.nn.Module,
                      block: type[torch.nn.Module] | None) -> torch.nn.Module:
        """``HTJ_SHARDING=group``: FSDP2 inside the rank's GPU-type group (:mod:`hetero_worker.memory.group`);
        ``full``: :meth:`_wrap_full`."""
        sharding.check_supported(precision_has_scaler=self.scaler is not None,
                                 checkpoint_dir=self.contract.checkpoint.dir,
                                 sharding=self.contract.memory.sharding,
                                 rebalance_interval_steps=self.contract.comm.rebalance_interval_steps,
                                 compression=self.contract.comm.compression)
        if self.contract.memory.sharding == "full":
            return self._wrap_full(model, block)
        self.use_layout("group")  # intra = the topology group (one node, one GPU type)
        sharding.refuse_gloo_on_cuda(self.groups.plan, self.comm_ranks)
        self.module = model.to(self.device)
        for tensor in self.module.state_dict().values():  # same start on every rank (Gloo world)
            broadcast_from_rank0_(tensor)
        sharding.shard_group(self.module, self.groups.intra, self.device, block)
        self.shard_sync = sharding.GroupShardSync(
            intra=self.groups.intra, intra_ranks=self.groups.intra_ranks, leaders=self.groups.leaders,
            local_batches=self.local_batches, rank=self.rank)
        if self.memory is not None:
            self.memory.set_state(self.module.parameters(), None)
        self.model = self.module
        return self.model

    def _wrap_full(self, model: torch.nn.Module,
                   block: type[torch.nn.Module] | None) -> torch.nn.Module:
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
        self.shard_sync = fullshard.FullShardSync(units=units, local_batches=self.local_batches,
                                                  micro_batch_sizes=micro.tolist(), rank=self.rank)
        if self.memory is not None:
            self.memory.set_state(self.module.parameters(), None)
        self.model = self.module
        return self.model
