"""Re-form one rank's Trainer for a new membership generation (the survivors of a lost rank, or
the members of a grown job).

Pure parts (:func:`shrunk_topology`, :func:`member_split`) say what the new world is; the
:func:`apply` step points the Trainer's parts at it: the contract's rank and topology, the
communicator facts, the gradient sync's groups, the checkpoint group (the graceful stop's and the
checkpoints'), the data position (new rank, new split, where to continue) and the DDP wrapper,
which is rebuilt on the new DDP group around the same module (the optimizer keeps its parameters).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from hetero_worker.membership.host import ElasticHost
from heterotrain_common.contract import Contract, RankEntry
from heterotrain_common.split import split_batch


def shrunk_topology(launch: Sequence[RankEntry], members: Sequence[int]) -> tuple[RankEntry, ...]:
    """The topology of ``members`` (launch ranks, in order): entries renumbered ``0..n-1`` and
    their groups renumbered in order of first appearance (a group keeps its node and GPU type)."""
    groups: dict[int, int] = {}
    entries = []
    for rank, member in enumerate(members):
        entry = launch[member]
        group = groups.setdefault(entry.group, len(groups))
        entries.append(dataclasses.replace(entry, rank=rank, group=group))
    return tuple(entries)


def member_split(global_batch: int, launch: Sequence[RankEntry],
                 members: Sequence[int]) -> list[int]:
    """The same global batch over ``members`` (launch ranks), by the project's one splitter, each
    weighted by its launch batch (the planner's from its speed; an elastic job runs without the
    rebalancer): every member of the launch back gives the launch split again."""
    return split_batch(global_batch, [float(launch[m].local_batch) for m in members])


def rank_contract(contract: Contract, topology: tuple[RankEntry, ...], rank: int) -> Contract:
    """``contract`` as rank ``rank`` of ``topology``: ``RANK``, ``WORLD_SIZE``, the group fields
    and every entry's ``local_batch`` follow."""
    me = topology[rank]
    peers = [e.rank for e in topology if e.group == me.group]
    info = dataclasses.replace(contract.dist, rank=rank, world_size=len(topology), group=me.group,
                               group_rank=peers.index(rank), group_size=len(peers))
    return dataclasses.replace(contract, dist=info, topology=topology)


def apply(trainer: ElasticHost, contract: Contract, *, split: Sequence[int], epoch: int,
          cursor: int) -> None:
    """Point ``trainer``'s parts at the new generation (collective on the new default group:
    every survivor calls it after ``init_process_group``)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from hetero_worker.comm.groups import gather_comm_ranks
    from hetero_worker.runtime import rendezvous

    rank = contract.dist.rank
    trainer.contract, trainer.rank = contract, rank
    for part in (trainer.stepper, trainer.parts_model, trainer.checkpoints, trainer.data):
        part.rank = rank
    for part in (trainer.stepper, trainer.parts_model, trainer.checkpoints):
        part.contract = contract
    trainer.comm_ranks = trainer.parts_model.comm_ranks = gather_comm_ranks(contract.topology,
                                                                            trainer.device)
    mode = trainer.sync.groups.layout.mode
    trainer.sync.close()  # its threads held the old groups; they restart on the new ones
    trainer.sync.groups = trainer.build_groups(mode)
    group = (rendezvous.checkpoint_group(contract.checkpoint.timeout_s)
             if dist.is_initialized() else None)
    trainer.ckpt_group = trainer.checkpoints.group = group
    trainer.stop.regroup(rank, group, at_step=trainer.global_step)  # the next step agrees
    trainer.window.restart(rank)
    trainer.data.position.move_to(rank=rank, local_batches=split, epoch=epoch, cursor=cursor)
    part = trainer.parts_model
    if part.model is not part.module:  # DDP: rebuilt on the new group around the same module
        device_ids = [trainer.device.index] if trainer.device.type == "cuda" else None
        ddp = DistributedDataParallel(part.module, device_ids=device_ids,
                                      process_group=trainer.sync.groups.ddp_group,
                                      **trainer.sync.ddp_options())
        trainer.sync.register(ddp)
        part.model = ddp
