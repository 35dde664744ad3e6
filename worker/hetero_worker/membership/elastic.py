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

Growing (a lost member's GPU free again): the supervisor announces a generation that adds the
member and starts its process with ``HTJ_ELASTIC_JOIN_GENERATION``. That process builds its
Trainer alone (a world of one, :meth:`Membership.trainer_contract`), says it is ready at its first
step and waits; the running ranks ask at each stop agreement whether a member waits
(:meth:`Membership.join_waiting`) and, once every one of them agrees, switch to the new generation
after that step (:meth:`Membership.guarded_step`): the same re-forming, the joiner taking a
running rank's model, optimizer and scaler state (no checkpoint is read) and the global batch
re-split over every member by its planned share (:func:`hetero_worker.membership.reform.member_split`).

On Kubernetes the membership keeper (:mod:`hetero_worker.membership.keeper`) hosts the store: every
rank writes its info (GPU product, node) when it joins and beats from a daemon thread
(:mod:`hetero_worker.membership.heartbeat`), which also cuts the rank's connections the moment a
loss is announced. A rank started with ``HTJ_ELASTIC_JOIN_GENERATION=next`` asks the keeper for
its generation (``elastic/want/<member>``) and joins the one it is assigned. A rank whose training
ended well says so (``elastic/done/<member>``) as the process exits (:meth:`Membership.at_exit`).
"""

from __future__ import annotations

import atexit
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import torch

from hetero_worker.membership import reform, sockets
from hetero_worker.membership.heartbeat import Heartbeat
from hetero_worker.membership.host import ElasticHost
from hetero_worker.runtime import rendezvous
from hetero_worker.stepping import StepResult
from heterotrain_common import envnames, membership
from heterotrain_common.contract import Contract, RankEntry

ANNOUNCE_WAIT_S = 30.0
"""How long a rank whose step failed waits for the supervisor to announce a new generation before
it treats the failure as an ordinary error (the supervisor announces within its 0.1 s poll)."""


JOIN_POLL_S = 0.05
"""How often a member waiting to join asks whether it is let in (or the job finished), seconds."""


def from_env(env: Mapping[str, str], contract: Contract) -> Membership | None:
    """The membership part when ``HTJ_ELASTIC_STORE`` is set (an elastic job), else None."""
    address = env.get(envnames.ELASTIC_STORE, "")
    if not address:
        return None
    member = int(env.get(envnames.ELASTIC_MEMBER, contract.dist.rank))
    joining = env.get(envnames.ELASTIC_JOIN_GENERATION, "")
    return Membership(address, member=member, contract=contract,
                      join_generation=(None if not joining else joining
                                       if joining == membership.JOIN_NEXT else int(joining)))


def join_job(env: Mapping[str, str], contract: Contract, *,
             rendezvous_timeout_s: float) -> Membership | None:
    """Join the job's default group (Gloo only: never a world-wide NCCL communicator).

    An elastic job (``HTJ_ELASTIC_STORE`` set) joins generation 0 through the supervisor's store
    and gets its :class:`Membership` back (a rank started to grow the job,
    ``HTJ_ELASTIC_JOIN_GENERATION``, starts in a world of one and joins at its first step); any
    other job joins rank 0's TCPStore
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
        join_generation: the generation that adds this member to a running job (a rank started
            to grow it), or :data:`~heterotrain_common.membership.JOIN_NEXT` (the keeper assigns
            it); None: a rank of the launch.

    Attributes:
        joining: the generation this member still has to join, or ``"next"`` until the keeper
            assigned one (None once joined, or at launch).
        generation: the current generation (0 at launch).
        members: the current generation's members (launch ranks), in rank order.
        steps_redone: interrupted steps this rank redid.
        last_recovery_s: seconds from the loss (or a grow's announcement) to the first step
            completed after it (None before).
        last_reform_s: seconds this rank spent in the last re-forming (groups, state, split).
        lock: held while :meth:`_reform` switches :attr:`sockets` and :attr:`generation` (the
            heartbeat's cut takes it without waiting).
        heartbeat: the beating thread (None before :meth:`join` and after :meth:`close`).
    """

    def __init__(self, address: str, *, member: int, contract: Contract,
                 join_generation: int | str | None = None) -> None:
        self.address, self.member = address, member
        self.joining = join_generation
        self.launch_topology: tuple[RankEntry, ...] = contract.topology
        self.collective_timeout_s = contract.comm.collective_timeout_s
        self.rendezvous_timeout_s = contract.comm.rendezvous_timeout_s
        self.store = _connect(address, timeout_s=contract.comm.rendezvous_timeout_s)
        self.generation = 0
        self.members: tuple[int, ...] = (tuple(range(contract.dist.world_size))
                                         if join_generation is None else (member,))
        self.steps_redone = 0
        self.last_recovery_s: float | None = None
        self.last_reform_s: float | None = None  # seconds the last re-forming took on this rank
        self._lost_at_s: float | None = None  # wall time of the last loss, until a step completes
        self.metrics: Any = None
        self._sockets_before: dict[int, str] = {}
        self.sockets: dict[int, str] = {}  # the current generation's connections (fd -> inode)
        entry = contract.topology[member] if member < len(contract.topology) else None
        self.info = json.dumps({"gpu_product": entry.gpu_product if entry else membership.UNKNOWN,
                                "node": entry.node if entry else membership.UNKNOWN})
        self.lock = threading.Lock()
        self.heartbeat: Heartbeat | None = None
        self._trainer: ElasticHost | None = None

    def join(self) -> None:
        """Initialise the default process group of generation 0 (Gloo) through the store; a
        joining member (:attr:`joining`) a world of one until its first step."""
        import torch.distributed as dist

        self.store.set(membership.INFO_KEY.format(member=self.member), self.info)
        # its own connection, made before the snapshot: the cut never shuts the heartbeat's
        self.heartbeat = Heartbeat(_connect(self.address, timeout_s=self.rendezvous_timeout_s),
                                   self).start()
        atexit.register(self.at_exit)
        _watch_uncaught()
        self._sockets_before = sockets.snapshot()  # the generation's connections: until attach
        if self.joining is not None:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            return
        self._init_group(self.members.index(self.member), len(self.members))

    def trainer_contract(self, contract: Contract) -> Contract:
        """The contract the Trainer is built with: ``contract``, or for a joining member the
        same rank alone (rank 0 of a world of one) until it joins."""
        if self.joining is None:
            return contract
        return reform.rank_contract(contract, reform.shrunk_topology(self.launch_topology,
                                                                     [self.member]), 0)

    def join_waiting(self) -> bool:
        """True when a newer generation is announced and every member it adds said it is ready
        (the stop agreement's question; one store round trip, two or more when one is)."""
        announced = self._newest(self.generation)
        if announced is None:
            return False
        return all(self.store.check([membership.READY_KEY.format(
            generation=announced.generation, member=int(j["member"]))]) for j in announced.joined)

    def _newest(self, after: int) -> membership.Generation | None:
        """The newest generation announced after ``after`` (None when none is)."""
        generation = after
        while self.store.check([membership.GENERATION_KEY.format(generation=generation + 1)]):
            generation += 1
        if generation == after:
            return None
        return membership.Generation.from_json(
            generation, self.store.get(membership.GENERATION_KEY.format(generation=generation)))

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
        self._trainer = trainer
        self.metrics = trainer.metrics
        trainer.stop.watch_joins(self.join_waiting)
        self.sockets = sockets.opened_since(self._sockets_before)  # the groups the Trainer built
        self._metric("set_membership_generation", self.generation)

    def _metric(self, name: str, *args: Any) -> None:
        call = getattr(self.metrics, name, None)
        if call is not None:
            call(*args)

    def guarded_step(self, trainer: ElasticHost, optimizer: torch.optim.Optimizer,
                     run: Callable[[], StepResult]) -> StepResult:
        """Run one step (``run``); when it fails because a member was lost, re-form and return a
        skipped result (the loader's next batch redoes the step). Other errors are raised. A
        joining member joins instead of its first step (a skipped result too); after a step every
        rank agreed to let a waiting member in, every running rank switches to the new
        generation."""
        if self.joining is not None:
            return self._join_running_job(trainer, optimizer)
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
            return _skipped(started)
        if self._lost_at_s is not None:  # the first step completed since the loss
            self.last_recovery_s = time.time() - self._lost_at_s
            self._lost_at_s = None
            self._metric("observe_membership_recovery", self.last_recovery_s)
            if trainer.rank == 0:
                self.store.set(membership.RESUMED_KEY.format(generation=self.generation),
                               json.dumps({"step": trainer.global_step,
                                           "redone": self.steps_redone,
                                           "recovery_s": self.last_recovery_s,
                                           "reform_s": self.last_reform_s}))
        if trainer.stop.join_due:  # every rank agreed: a waiting member joins after this step
            announced = self._newest(self.generation)
            assert announced is not None, "join agreed with no generation announced"
            if trainer.rank == 0:  # the joining members stop waiting and join
                self.store.set(membership.ADMITTED_KEY.format(generation=announced.generation), "1")
            now = trainer.data.position  # the start of the next step
            self._reform(trainer, optimizer, announced, epoch=now.epoch, cursor=now.cursor,
                         completed=True, global_batch=now.global_batch, error=None)
        return result

    def _join_running_job(self, trainer: ElasticHost,
                          optimizer: torch.optim.Optimizer) -> StepResult:
        """Say ready (a ``next`` joiner: first ask the keeper which generation adds it), wait for
        the running ranks to let this member in, take their state."""
        started = time.perf_counter()
        if self.joining == membership.JOIN_NEXT:
            assigned = membership.ASSIGNED_KEY.format(member=self.member)
            if self.store.check([assigned]):  # a previous incarnation's answer
                self.store.delete_key(assigned)
            self.store.set(membership.WANT_KEY.format(member=self.member), self.info)
            self._wait_or_finish(assigned, "assigned a generation by the membership keeper")
            self.joining = int(self.store.get(assigned))
        generation = int(self.joining)  # type: ignore[arg-type]
        key = membership.GENERATION_KEY.format(generation=generation)
        self.store.set(membership.READY_KEY.format(generation=generation, member=self.member), "1")
        self._wait_or_finish(membership.ADMITTED_KEY.format(generation=generation),
                             f"let into generation {generation}")
        announced = membership.Generation.from_json(generation, self.store.get(key))
        self.joining = None
        self._reform(trainer, optimizer, announced, epoch=0, cursor=0, completed=False,
                     global_batch=0, error=None, fresh=True)
        return _skipped(started)

    def _wait_or_finish(self, key: str, what: str) -> None:
        """Poll (:data:`JOIN_POLL_S`) until ``key`` is set; exit 0 when the job finished first.

        Raises:
            RuntimeError: not ``what`` within the rendezvous timeout.
        """
        deadline = time.monotonic() + self.rendezvous_timeout_s
        while not self.store.check([key]):
            if self.store.check([membership.FINISHED_KEY]):  # the job ended before we could join
                print(f"heterotrain: member {self.member}: the job finished before this rank "
                      "could join it; exiting", file=sys.stderr, flush=True)
                sys.exit(0)
            if time.monotonic() > deadline:
                raise RuntimeError(f"member {self.member} was not {what} within "
                                   f"{self.rendezvous_timeout_s:g} s (HTJ_RENDEZVOUS_TIMEOUT_S)")
            time.sleep(JOIN_POLL_S)

    def ended_well(self) -> bool:
        """True when this rank's training ended well: it joined, the Trainer left the process
        group (:meth:`hetero_worker.trainer.Trainer.close` passed its leaving barrier with every
        rank), not for a graceful stop (exit 75), and no exception reached ``sys.excepthook``."""
        import torch.distributed as dist

        trainer = self._trainer
        return (trainer is not None and self.joining is None and not dist.is_initialized()
                and not trainer.stop.stopping and not _UNCAUGHT)

    def at_exit(self) -> None:
        """At interpreter exit (``atexit``): set ``elastic/done/<member>`` when the training
        ended well (:meth:`ended_well`), then :meth:`close`. A SIGKILLed process or ``os._exit``
        never gets here, so it is never counted done. Store errors are ignored (the keeper
        may be gone)."""
        try:
            if self.ended_well():
                self.store.set(membership.DONE_KEY.format(member=self.member), "1")
        except Exception as exc:  # noqa: BLE001  exiting anyway
            print(f"heterotrain: member {self.member}: could not say done ({exc})",
                  file=sys.stderr, flush=True)
        self.close()

    def close(self) -> None:
        """Stop the heartbeat (idempotent)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None

    def _await_generation(self) -> membership.Generation | None:
        """The newest generation announced after ours, waiting up to :data:`ANNOUNCE_WAIT_S` for
        the first; None when none comes."""
        key = membership.GENERATION_KEY.format(generation=self.generation + 1)
        try:
            self.store.wait([key], timedelta(seconds=ANNOUNCE_WAIT_S))
        except RuntimeError:  # DistStoreError: no announcement in time
            return None
        return self._newest(self.generation)  # several losses: straight to the newest

    def _reform(self, trainer: ElasticHost, optimizer: torch.optim.Optimizer,
                announced: membership.Generation, *, epoch: int, cursor: int,
                completed: bool, global_batch: int, error: BaseException | None,
                fresh: bool = False) -> None:
        """Join ``announced`` and point the trainer at it (see the module's docstring); ``fresh``:
        this member holds no state of the job yet (it is joining)."""
        import torch.distributed as dist

        started = time.perf_counter()
        if self.member not in announced.members:  # we were counted lost: leave as a loss
            if error is not None:
                raise error
            raise RuntimeError(f"member {self.member} is not in generation "
                               f"{announced.generation} ({list(announced.members)})")
        old_members = self.members
        with self.lock:  # from the cut until the new sockets are known: no heartbeat cut
            sockets.cut(self.sockets)  # peers blocked on us notice now, not at their timeout
            _retire(_live_groups())  # never destroyed: see _retire
            dist.destroy_process_group()  # every group of the old generation
            before = sockets.snapshot()
            self.generation, self.members = announced.generation, announced.members
            self._lost_at_s = announced.lost_at_s
            rank = self.members.index(self.member)
            self._init_group(rank, len(self.members))
            mine = [-1 if fresh else trainer.global_step, epoch, cursor, completed, global_batch]
            views: list[Any] = [None] * len(self.members)
            dist.all_gather_object(views, mine)
            source = max(range(len(views)), key=lambda r: (views[r][0], -r))
            if any(v[0] != views[source][0] for v in views):  # a survivor completed it; a joiner
                _adopt_state(trainer, optimizer, source)
            trainer.global_step, epoch, cursor, source_completed, global_batch = views[source]
            redone = not source_completed  # nobody completed the interrupted step: it is redone
            topology = reform.shrunk_topology(self.launch_topology, self.members)
            split = reform.member_split(global_batch, self.launch_topology, self.members)
            reform.apply(trainer, reform.rank_contract(trainer.contract, topology, rank),
                         split=split, epoch=epoch, cursor=cursor)
            self.sockets = sockets.opened_since(before)  # every group of the new generation
        self.last_reform_s = time.perf_counter() - started
        if redone:
            self.steps_redone += 1
            self._metric("record_step_redone")
        self._metric("set_membership_generation", self.generation)
        change = "; ".join(
            f"{', '.join(x.get('gpu_product', '?') + ' on ' + x.get('node', '?') for x in xs)} {what}"
            for xs, what in ((announced.lost, "lost"), (announced.joined, "joined")) if xs)
        print(f"heterotrain: rank {rank} (member {self.member}): {change or 'a rank lost'}; "
              f"generation {self.generation}: {len(old_members)} -> {len(self.members)} ranks, "
              f"split {split}, continuing at step {trainer.global_step + 1} "
              f"({'redone' if redone else 'next'}; no checkpoint read)",
              file=sys.stderr, flush=True)


def _live_groups() -> list[Any]:
    """Every process group this process holds (``torch.distributed``'s group map)."""
    import torch.distributed.distributed_c10d as c10d

    world = getattr(c10d, "_world", None)
    return list(getattr(world, "pg_map", {}) or {})


def _retire(groups: list[Any]) -> None:
    """Keep an old generation's process groups alive until the process ends (one reference each
    that is never dropped: not even the interpreter's shutdown destroys them).

    Destroying a Gloo group joins its worker threads. A worker may still be inside an operation
    the generation abandoned (seen in CI: a ``reduce`` waiting to send until the collective
    timeout), or releasing a just-finished one's tensors, which needs the GIL that the destroying
    thread may hold (seen in CI: ``~ProcessGroupGloo`` under ``~Reducer``). Either way the rank
    hung at a re-formation. Left alone, such a worker ends by its timeout and nobody waits on it;
    the cost is the old groups' threads and already shut-down sockets, per re-formation, until the
    process exits.
    """
    import ctypes

    for group in groups:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))


_UNCAUGHT: list[BaseException] = []
"""Exceptions that reached ``sys.excepthook`` (such a process did not end well)."""


def _watch_uncaught() -> None:
    """Wrap ``sys.excepthook`` (once) so that :data:`_UNCAUGHT` records an uncaught exception."""
    hook = sys.excepthook
    if getattr(hook, "_heterotrain_notes", False):
        return

    def note(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        _UNCAUGHT.append(value)
        hook(kind, value, tb)

    note._heterotrain_notes = True  # type: ignore[attr-defined]
    sys.excepthook = note


def _skipped(started: float) -> StepResult:
    """The skipped result of a step spent re-forming (from ``started``, ``perf_counter``)."""
    elapsed = time.perf_counter() - started
    return StepResult(loss=math.nan, skipped=True, step_s=elapsed, compute_s=0.0,
                      comm_wait_s=elapsed)


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
