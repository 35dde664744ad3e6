"""The pipelined hierarchy: DDP buckets reduced in group, exchanged across groups and broadcast in
group, with the three stages of different buckets in flight together (issue 23).

Before, a group leader ran each bucket's three dependent collectives (in-group reduce, the
leaders' cross-group all-reduce, in-group broadcast) one after the other on one thread, and a
bucket's chain waited for the previous bucket's: nothing of the cross-type exchange overlapped
the rest of backward or the other stages. Here every stage has its own process group
(:class:`~hetero_worker.comm.groups.ProcessGroups`: ``intra`` for the reduce, ``leaders`` for the
exchange, ``intra_bcast`` for the broadcast), and each stage is started asynchronously as soon as
its input is ready:

* stage A, the in-group reduce of bucket ``k``, is issued by the DDP hook itself, on the autograd
  thread, while backward goes on producing bucket ``k + 1``;
* stage B, the exchange among the leaders (Gloo: the communicator rule keeps every cross-type
  group on Gloo), is issued from the completion callback of bucket ``k``'s reduce
  (``Future.then``; no thread of ours), or, with a codec (a blocking chain of collectives: int8's
  all-gathers, PowerSGD's two all-reduces), run on one communication thread;
* stage C, the in-group broadcast, is issued from the exchange's completion, while bucket
  ``k + 1`` is exchanged.

Every rank must issue the collectives of one process group in the same order. The hook runs in
DDP's bucket order (the same on every rank); completions can arrive in any order (Gloo runs a
group's collectives on several threads), so each stage passes buckets on strictly in sequence
(:meth:`HierarchyPipeline._stage_done`, under one re-entrant lock: a callback on an already
completed future runs inline). Issuing a collective from a callback only enqueues it; no callback
ever waits for one, which is what deadlocks when torch's PowerSGD hook chains collectives on one
Gloo group. A non-leader issues its reduce and its broadcast receive (into its own buffer, so the
two never race) right in the hook.

CPU buffers only: a CUDA bucket keeps the blocking chain on the sync's communication thread
(:class:`hetero_worker.comm.sync.WeightedGradSync`), whose host copies are synchronised there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hetero_worker.comm.groups import ProcessGroups

Exchange = Callable[[torch.Tensor, int], int]
"""``exchange(wire, n)``: SUM ``wire`` (1-D, its first ``n`` elements the gradient, the rest exact
extras) over the leaders' group in place, blocking; returns the payload bytes it sent across
groups."""


@dataclass(eq=False)
class _Bucket:
    seq: int
    flat: torch.Tensor
    wire: torch.Tensor
    n: int
    out: torch.futures.Future
    exchange: Exchange | None
    on_extra: Callable[[torch.Tensor], None] | None
    extra_bytes: int = field(default=0)


class HierarchyPipeline:
    """One rank's pipelined hierarchical SUM of DDP buckets (see the module docstring).

    Args:
        groups: this rank's groups of a hierarchical layout (``intra_bcast`` set where the rank's
            group has two or more ranks; :func:`~hetero_worker.comm.groups.build_process_groups`
            builds it).
        count_bytes: called with the payload bytes of every collective that crosses topology
            groups (thread-safe callee; e.g. ``WeightedGradSync.count_inter_group_bytes``).

    Raises:
        ValueError: ``groups`` is a flat layout, or a group of several ranks has no broadcast group.
    """

    def __init__(self, groups: ProcessGroups, count_bytes: Callable[[int], None]) -> None:
        if groups.layout.is_flat:
            raise ValueError("the pipeline is for hierarchical layouts; a flat one has one stage")
        self.multi = len(groups.intra_ranks) > 1
        if self.multi and groups.intra_bcast is None:
            raise ValueError(f"group {list(groups.intra_ranks)} has no broadcast process group")
        self.groups = groups
        self.count_bytes = count_bytes
        self._lock = threading.RLock()
        self._next_seq = 0
        self._waiting: list[dict[int, _Bucket]] = [{}, {}]  # stage A done / stage B done
        self._cursor = [0, 0]  # next sequence number each stage passes on
        self._executor: ThreadPoolExecutor | None = None
        self._failure: BaseException | None = None

    def submit(self, flat: torch.Tensor, *, extra: torch.Tensor | None = None,
               exchange: Exchange | None = None,
               on_extra: Callable[[torch.Tensor], None] | None = None) -> torch.futures.Future:
        """Start the SUM of one bucket over all ranks; a future of ``flat`` summed.

        Call from the DDP hook, in DDP's bucket order, on every rank.

        Args:
            flat: the bucket's 1-D CPU buffer, already weighted; a leader overwrites it with the
                sum, a non-leader's future holds the sum in a new tensor.
            extra: 1-D values SUM-reduced exactly along with the bucket (e.g. the rebalancer's
                stats); ``on_extra`` gets their sum.
            exchange: the leaders' codec (:data:`Exchange`); None: one plain async all-reduce.
            on_extra: called with the summed ``extra`` (a view; copy to keep) before the future
                completes.

        Returns:
            ``torch.futures.Future[torch.Tensor]`` of shape ``flat.shape``.

        Raises:
            ValueError: ``flat`` is not on the CPU.
        """
        if flat.device.type != "cpu":
            raise ValueError(f"the pipeline runs on CPU buffers, got one on {flat.device}")
        n = flat.numel()
        wire = flat if extra is None else torch.cat([flat, extra.to(flat.dtype).reshape(-1)])
        groups = self.groups
        nbytes = n * flat.element_size()
        if not groups.is_leader:  # reduce to the leader and receive its broadcast, both now
            dist.reduce(wire, dst=groups.leader, group=groups.intra, async_op=True)
            self.count_bytes(nbytes if groups.intra_crosses else 0)
            recv = torch.empty_like(wire)
            work = dist.broadcast(recv, src=groups.leader, group=groups.intra_bcast, async_op=True)
            return work.get_future().then(lambda f: _received(f, n, on_extra))
        with self._lock:
            bucket = _Bucket(self._next_seq, flat, wire, n, torch.futures.Future(), exchange,
                             on_extra)
            self._next_seq += 1
        if self.multi:
            work = dist.reduce(wire, dst=groups.leader, group=groups.intra, async_op=True)
            work.get_future().then(lambda f: self._guarded(bucket, f, self._stage_done, 0))
        else:
            self._stage_done(bucket, 0)
        return bucket.out

    def close(self) -> None:
        """Stop the codec thread (idempotent; after the last bucket's future completed)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _guarded(self, bucket: _Bucket, future: torch.futures.Future | None,
                 then: Callable[[_Bucket, int], None], stage: int) -> None:
        """``then(bucket, stage)`` once ``future`` (a stage's collective) succeeded, else fail."""
        try:
            if future is not None:
                future.value()  # raises the collective's error
            then(bucket, stage)
        except BaseException as exc:  # surfaces in DDP's wait on the bucket's future
            self._fail(bucket, exc)

    def _fail(self, bucket: _Bucket, exc: BaseException) -> None:
        with self._lock:
            self._failure = self._failure or exc
        if not bucket.out.done():
            bucket.out.set_exception(exc)

    def _stage_done(self, bucket: _Bucket, stage: int) -> None:
        """Bucket finished stage ``stage`` (0: reduce, 1: exchange): pass every bucket whose turn
        it is on to the next stage, strictly in sequence (the same order on every rank)."""
        with self._lock:
            waiting = self._waiting[stage]
            waiting[bucket.seq] = bucket
            while self._cursor[stage] in waiting:
                ready = waiting.pop(self._cursor[stage])
                self._cursor[stage] += 1
                if self._failure is not None:
                    self._fail(ready, self._failure)
                    continue
                try:
                    (self._exchange if stage == 0 else self._broadcast)(ready)
                except BaseException as exc:
                    self._fail(ready, exc)

    def _exchange(self, bucket: _Bucket) -> None:
        """Stage B: the leaders' SUM (async all-reduce, or the codec on the thread)."""
        groups = self.groups
        if groups.leaders is None:  # one group: nothing crosses
            self._stage_done(bucket, 1)
            return
        if bucket.exchange is None:
            work = dist.all_reduce(bucket.wire, group=groups.leaders, async_op=True)
            self.count_bytes(bucket.n * bucket.flat.element_size() if groups.leaders_cross else 0)
            work.get_future().then(lambda f: self._guarded(bucket, f, self._stage_done, 1))
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="htj-exchange")

        def run() -> None:
            try:
                assert bucket.exchange is not None
                self.count_bytes(bucket.exchange(bucket.wire, bucket.n))
            except BaseException as exc:
                self._fail(bucket, exc)
                with self._lock:  # later buckets must not wait for this one forever
                    self._stage_done(bucket, 1)
                return
            self._stage_done(bucket, 1)

        self._executor.submit(run)

    def _broadcast(self, bucket: _Bucket) -> None:
        """Stage C: the leader's in-group broadcast, then the bucket's future completes."""
        if bucket.out.done():  # failed in the exchange; passed on only to keep the order
            return
        if not self.multi:
            self._finish(bucket, 0)
            return
        work = dist.broadcast(bucket.wire, src=self.groups.leader, group=self.groups.intra_bcast,
                              async_op=True)
        work.get_future().then(lambda f: self._guarded(bucket, f, self._finish, 2))

    def _finish(self, bucket: _Bucket, _stage: int) -> None:
        if bucket.wire is not bucket.flat:
            bucket.flat.copy_(bucket.wire[:bucket.n])
            if bucket.on_extra is not None:
                bucket.on_extra(bucket.wire[bucket.n:])
        bucket.out.set_result(bucket.flat)


def _received(future: torch.futures.Future, n: int,
              on_extra: Callable[[torch.Tensor], None] | None) -> torch.Tensor:
    """A non-leader's broadcast arrived: the bucket's sum (and the extras to ``on_extra``)."""
    recv = future.value()[0]
    if recv.numel() > n and on_extra is not None:
        on_extra(recv[n:])
    return recv[:n]
