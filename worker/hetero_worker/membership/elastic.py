"""The Trainer's membership part: join through the supervisor's store, survive a lost rank.

Detection: a rank exchanging data with the lost one sees its connection close within
milliseconds. Once the supervisor has announced the loss, every survivor that noticed shuts down
its connections of the old generation (:mod:`hetero_worker.membership.sockets`), so a rank
blocked on a live peer sees that connection close too; the bound without that cascade (a socket
not recorded) is the collective timeout (``HTJ_COLLECTIVE_TIMEOUT_S``; docs/elastic.md).

On a failed step (a ``RuntimeError`` from a collective) :meth:`Membership.guarded_step` waits up to
:data:`ANNOUNCE_WAIT_S` for the supervisor's next generation (none: the error was not a lost
member and is raised as it was), destroys every process group, joins the new generation's groups
(store prefix ``gen<g>/``), and agrees with the survivors on the state to go on from: the ranks
all-gather their step count and data position; when some survivor had completed the interrupted
step (a ring all-reduce can complete on one rank and fail on another) its model, optimizer and
scaler state are broadcast to the others, so every survivor continues from the same completed
step. The global batch is re-split over the survivors and the data position moved to the start
of the first step not completed; the step returns a skipped :class:`StepResult` and the loader's
next batch is that step again, cut for the new world.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch

from hetero_worker.membership import reform, sockets
from hetero_worker.membership.host import ElasticHost
from hetero_worker.runtime import rendezvous
from hetero_worker.stepping import StepResult
from heterotrain_common import envnames, membership
from heterotrain_common.contract import Contract, RankEntry

ANNOUNCE_WAIT_S = 30.0
"""How long a rank whose step failed waits for the supervisor to announce a new generation before
it treats the failure as an ordinary error (the supervisor announces within its 0.1 s poll)."""


def from_env(env: Mapping[str, str], contract: Contract) -> Membership | None:
    """The membership part when ``HTJ_ELASTIC_STORE`` is set (an elastic job), else None."""
    address = env.get(envnames.ELASTIC_STORE, "")
    if not address:
        return None
    member = int(env.get(envnames.ELASTIC_MEMBER, contract.dist.rank))
    return Membership(address, member=member, contract=contract)


def join_job(env: Mapping[str, str], contract: Contract, *,
             rendezvous_timeout_s: float) -> Membership | None:
    """Join the job's default group (Gloo only: never a world-wide NCCL communicator).

    An elastic job (``HTJ_ELASTIC_STORE`` set) joins generation 0 through the supervisor's store
    and gets its :class:`Membership` back; any other job joins rank 0's TCPStore
    (:func:`hetero_worker.runtime.rendezvous.init_distributed`) and gets None.

    Raises:
        RendezvousTimeout: rank 0 (or the supervisor's store) unreachable in time.
    """
    elastic = from_env(env, contract)
    if elastic is not None:
        elastic.join()
        return elastic
    where = contract.dist
    rendezvous.init_distributed(
        rank=where.rank, world_size=where.world_size, master_addr=where.master_addr,
        master_port=where.master_port, backend="gloo", timeout_s=rendezvous_timeout_s,
        collective_timeout_s=contract.comm.collective_timeout_s)
    return None


class Membership:
    """One elastic rank's membership.

    Args:
        address: ``host:port`` of the supervisor's store (``HTJ_ELASTIC_STORE``).
        member: this process's member id (its launch rank, ``HTJ_ELASTIC_MEMBER``).
        contract: the launch contract (its topology is generation 0's).

    Attributes:
        generation: the current generation (0 at launch).
        members: the current generation's members (launch ranks), in rank order.
        steps_redone: interrupted steps this rank redid.
        last_recovery_s: seconds from the loss to the first step completed after it (None before).
    """

    def __init__(self, address: str, *, member: int, contract: Contract) -> None:
        self.address, self.member = address, member
        self.launch_topology: tuple[RankEntry, ...] = contract.topology
        self.collective_timeout_s = contract.comm.collective_timeout_s
        self.rendezvous_timeout_s = contract.comm.rendezvous_timeout_s
        self.store = _connect(address, timeout_s=contract.comm.rendezvous_timeout_s)
        self.generation = 0
        self.members: tuple[int, ...] = tuple(range(contract.dist.world_size))
        self.steps_redone = 0
        self.last_recovery_s: float | None = None
        self._lost_at_s: float | None = None  # wall time of the last loss, until a step completes
        self.metrics: Any = None
        self._sockets_before: dict[int, str] = {}
        self.sockets: dict[int, str] = {}  # the current generation's connections (fd -> inode)

    def join(self) -> None:
        """Initialise the default process group of generation 0 (Gloo) through the store."""
        self._sockets_before = sockets.snapshot()  # the generation's connections: until attach
        self._init_group(self.members.index(self.member), len(self.members))

    def _init_group(self, rank: int, world_size: int) -> None:
        import torch.distributed as dist

        from hetero_worker.runtime import rendezvous

        timeout = timedelta(seconds=self.collective_timeout_s)
        rendezvous._STATE["collective_timeout"] = timeout  # every group the worker makes uses it
        prefix = membership.generation_prefix(self.generation)
        # Joining waits for the slowest survivor, which may notice the loss only when its own
        # collective times out: the join gets the rendezvous timeout, the collectives their own.
        dist.init_process_group("gloo", store=dist.PrefixStore(prefix, self.store), rank=rank,
                                world_size=world_size,
                                timeout=timedelta(seconds=max(self.rendezvous_timeout_s,
                                                              2 * self.collective_timeout_s)))
        dist.distributed_c10d._set_pg_timeout(timeout)

    def attach(self, trainer: ElasticHost) -> None:
        """Become ``trainer``'s membership part (its metrics report the generation)."""
        trainer.membership = self
        self.metrics = trainer.metrics
        self.sockets = sockets.opened_since(self._sockets_before)  # the groups the Trainer built
        self._metric("set_membership_generation", self.generation)

    def _metric(self, name: str, *args: Any) -> None:
        call = getattr(self.metrics, name, None)
        if call is not None:
            call(*args)

    def guarded_step(self, trainer: ElasticHost, optimizer: torch.optim.Optimizer,
                     run: Callable[[], StepResult]) -> StepResult:
        """Run one step (``run``); when it fails because a member was lost, re-form and return a
        skipped result (the loader's next batch redoes the step). Other errors are raised."""
        entry_step = trainer.global_step
        position = trainer.data.position
        entry = (position.epoch, position.cursor, position.global_batch)
        started = time.perf_counter()
        try:
            result = run()
        except RuntimeError as exc:
            if not peer_failure(exc):  # the script's own error (a shape, a NaN check): as before
                raise
            announced = self._await_generation()
            if announced is None:
                raise
            completed = trainer.global_step > entry_step
            epoch, cursor = entry[0], entry[1] if completed else entry[1] - entry[2]
            self._reform(trainer, optimizer, announced, epoch=epoch, cursor=cursor,
                         completed=completed, global_batch=entry[2], error=exc)
            elapsed = time.perf_counter() - started
            return StepResult(loss=math.nan, skipped=True, step_s=elapsed, compute_s=0.0,
                              comm_wait_s=elapsed)
        if self._lost_at_s is not None:  # the first step completed since the loss
            self.last_recovery_s = time.time() - self._lost_at_s
            self._lost_at_s = None
            self._metric("observe_membership_recovery", self.last_recovery_s)
            if trainer.rank == 0:
                self.store.set(membership.RESUMED_KEY.format(generation=self.generation),
                               json.dumps({"step": trainer.global_step,
                                           "redone": self.steps_redone,
                                           "recovery_s": self.last_recovery_s}))
        return result

    def _await_generation(self) -> membership.Generation | None:
        """The newest generation announced after ours, waiting up to :data:`ANNOUNCE_WAIT_S` for
        the first; None when none comes."""
        key = membership.GENERATION_KEY.format(generation=self.generation + 1)
        try:
            self.store.wait([key], timedelta(seconds=ANNOUNCE_WAIT_S))
        except RuntimeError:  # DistStoreError: no announcement in time
            return None
        generation = self.generation + 1
        while self.store.check([membership.GENERATION_KEY.format(generation=generation + 1)]):
            generation += 1  # several losses: go straight to the newest generation
        return membership.Generation.from_json(
            generation, self.store.get(membership.GENERATION_KEY.format(generation=generation)))

    def _reform(self, trainer: ElasticHost, optimizer: torch.optim.Optimizer,
                announced: membership.Generation, *, epoch: int, cursor: int,
                completed: bool, global_batch: int, error: BaseException) -> None:
        """Join ``announced`` and point the trainer at it (see the module's docstring)."""
        import torch.distributed as dist

        if self.member not in announced.members:  # we were counted lost: leave as a loss
            raise error
        old_members, old_split = self.members, list(trainer.data.position.local_batches)
        sockets.cut(self.sockets)  # peers blocked on us notice now, not at their timeout
        dist.destroy_process_group()  # every group of the old generation
        before = sockets.snapshot()
        self.generation, self.members = announced.generation, announced.members
        self._lost_at_s = announced.lost_at_s
        rank = self.members.index(self.member)
        self._init_group(rank, len(self.members))
        mine = [trainer.global_step, epoch, cursor, completed]
        views: list[Any] = [None] * len(self.members)
        dist.all_gather_object(views, mine)
        source = max(range(len(views)), key=lambda r: (views[r][0], -r))
        if any(v[0] != views[source][0] for v in views):  # some survivor completed the step
            _adopt_state(trainer, optimizer, source)
        trainer.global_step, epoch, cursor, source_completed = views[source]
        redone = not source_completed  # nobody completed the interrupted step: it is redone
        topology = reform.shrunk_topology(self.launch_topology, self.members)
        split = reform.survivor_split(global_batch, old_members, old_split, self.members)
        reform.apply(trainer, reform.rank_contract(trainer.contract, topology, rank),
                     split=split, epoch=epoch, cursor=cursor)
        self.sockets = sockets.opened_since(before)
        if redone:
            self.steps_redone += 1
            self._metric("record_step_redone")
        self._metric("set_membership_generation", self.generation)
        lost = ", ".join(f"{x.get('gpu_product', '?')} on {x.get('node', '?')}"
                         for x in announced.lost)
        print(f"heterotrain: rank {rank} (member {self.member}): {lost or 'a rank'} lost; "
              f"generation {self.generation}: {len(old_members)} -> {len(self.members)} ranks, "
              f"split {split}, continuing at step {trainer.global_step + 1} "
              f"({'redone' if redone else 'next'}; no checkpoint read)",
              file=sys.stderr, flush=True)


PEER_FAILURE_MARKS = ("gloo", "nccl", "connection closed", "connection reset", "timed out",
                      "broken pipe")
"""Words of the errors a collective raises when a peer is gone (lower case)."""


def peer_failure(exc: BaseException) -> bool:
    """True when ``exc`` may be a collective's failure because a peer is gone (a
    ``torch.distributed.DistError``, or an error naming the transport): only then does a rank wait
    for a new generation; any other error is raised at once."""
    import torch.distributed as dist

    text = str(exc).lower()
    return isinstance(exc, dist.DistError) or any(mark in text for mark in PEER_FAILURE_MARKS)


def _connect(address: str, *, timeout_s: float) -> Any:
    """A client of the supervisor's ``TCPStore`` at ``address`` (``host:port``)."""
    import torch.distributed as dist

    host, _, port = address.rpartition(":")
    return dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s))


def _adopt_state(trainer: ElasticHost, optimizer: torch.optim.Optimizer, source: int) -> None:
    """Every survivor takes rank ``source``'s model, optimizer and scaler state (collective)."""
    import torch.distributed as dist

    module = trainer.parts_model.module
    state = [None]
    if dist.get_rank() == source:
        state = [{"model": {k: v.detach().cpu() for k, v in module.state_dict().items()},
                  "optimizer": optimizer.state_dict(),
                  "scaler": trainer.scaler.state_dict() if trainer.scaler is not None else None}]
    dist.broadcast_object_list(state, src=source)
    if dist.get_rank() != source:
        got = state[0]
        module.load_state_dict(got["model"])
        optimizer.load_state_dict(got["optimizer"])
        if trainer.scaler is not None and got["scaler"] is not None:
            trainer.scaler.load_state_dict(got["scaler"])
