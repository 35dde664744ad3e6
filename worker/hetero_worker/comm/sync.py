"""Weighted gradient synchronisation for uneven local batches.

Each rank's loss is the mean over its own ``b_r`` samples, so plain DDP averaging (weight
``1 / world_size``) is wrong when batches differ (case 15; pytorch/pytorch#67253, #37359). The
update equals the single-process mean over the global batch ``B = sum(b)`` when every rank's
gradient is weighted by ``b_r / B`` and the weighted gradients are *summed*:
``sum_r (b_r / B) * (1 / b_r) * sum_{i in r} grad l_i = (1 / B) * sum_i grad l_i``.

:class:`WeightedGradSync` is registered as a DDP communication hook (DDP's bucketing is kept). The
hook weights the bucket and reduces it hierarchically (reduce in the group, all-reduce among the
leaders, broadcast in the group; :func:`hetero_worker.comm.groups.hierarchical_all_reduce_`).

CPU buckets of a hierarchical layout go through the pipelined hierarchy
(:mod:`hetero_worker.comm.pipeline`): the in-group reduce, the leaders' exchange and the in-group
broadcast run on three process groups, each started from the previous stage's completion in
DDP's bucket order, so the exchange of bucket ``k`` is in flight while backward produces bucket
``k + 1`` and bucket ``k - 1`` is broadcast. A flat layout's hook issues its one all-reduce
itself as async work and returns the future, as torch's own ``allreduce_hook`` does. CUDA
buckets of a hierarchy run the three collectives *blocking*, one after another, on a single
communication thread owned by the sync object (queued in DDP's order, the same on every rank),
which synchronises the host copies Gloo needs; the hook returns a future the thread completes.
With ``overlap=False`` the hook runs the
collectives on the autograd thread and returns a completed future (simplest, no overlap).

Flat fast path: when the layout is a single group, :meth:`WeightedGradSync.register` installs no
Python hook at all. The trainer multiplies the local loss by ``loss_factor = world_size * b_r / B``
instead, and DDP's own C++ all-reduce with its ``1 / world_size`` average yields exactly
``sum_r (b_r / B) * g_r`` (the case 15 workaround: scale the loss, keep the mean), at plain DDP's
cost. The same identity, ``sum_r (W * b_r / B) * g_r / W``, holds bit for bit when ``W`` is a power
of two and to rounding otherwise.

Communication wait: the time from the last gradient becoming ready (backward compute is done; a
final callback of the backward pass marks it, :meth:`WeightedGradSync.watch_backward`) to the end
of backward is time spent only waiting for collectives, including waiting for slower ranks.

The split is pluggable: :meth:`WeightedGradSync.on_split` takes the list of local batches for the
next step, so a rebalancer only passes new numbers at a step boundary. So is the reduction itself:
:meth:`WeightedGradSync.use_reducer` hands every reduction to a collaborator (the speed features'
codec reducer) by composition; nothing replaces the sync's methods at runtime.

Futures completed on the communication thread are created with their device
(``torch.futures.Future(devices=[device])``): only then does torch record a CUDA event when the
thread sets the result and make DDP's stream wait for it (a future without devices skips that
synchronisation; see the FIXME in torch/csrc/distributed/c10d/reducer.cpp and the ``devices``
argument of ``torch.futures.Future``).
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations as real objects.

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.distributed as dist

from hetero_worker.comm.collectives import flat_reduce_
from hetero_worker.comm.commplan import GLOO
from hetero_worker.comm.groups import ProcessGroups, hierarchical_all_reduce_
from hetero_worker.comm.pipeline import HierarchyPipeline

HIERARCHICAL_BUCKET_CAP_MB = 25.0
"""DDP bucket cap on hierarchical layouts, given explicitly (see :meth:`WeightedGradSync.ddp_options`)."""


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
        overlap: run the hook's collectives on the communication thread (default) or inline.

    Attributes:
        weight: this rank's current gradient weight ``b_rank / B``.
        comm_s: seconds the training thread waited for collectives since :meth:`take_comm_s`.
        last_ready_s: ``time.perf_counter()`` when the hook last received a bucket.
    """

    def __init__(self, groups: ProcessGroups, local_batches: Sequence[int], *,
                 on_inter_group_bytes: Callable[[int], None] | None = None,
                 overlap: bool = True) -> None:
        self.groups = groups
        self.on_inter_group_bytes = on_inter_group_bytes
        self.overlap = overlap
        self.comm_s = 0.0
        self.last_ready_s = 0.0
        self.inter_group_bytes = 0
        self._bytes_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._pipeline: HierarchyPipeline | None = None
        self.weight_in_loss = False
        self.local_batches: tuple[int, ...] = ()
        self.weight = 1.0
        self.reducer: Any = None
        self.on_split(local_batches)

    def use_reducer(self, reducer: Any) -> None:
        """Hand every reduction to ``reducer`` from now on (call before :meth:`register`).

        ``reducer`` provides ``reduce_views_(flat, shapes, key) -> flat`` (weighting included) and
        ``hook`` (a DDP comm hook taking ``(reducer, bucket)``); see
        :class:`hetero_worker.speed.controller.CodecReducer`.
        """
        self.reducer = reducer

    def set_groups(self, groups: ProcessGroups) -> None:
        """Reduce over ``groups`` from the next reduction on (same rank; at a step boundary)."""
        if groups.rank != self.groups.rank:
            raise ValueError(f"groups of rank {groups.rank} given to rank {self.groups.rank}")
        self.groups = groups

    def on_split(self, local_batches: Sequence[int]) -> None:
        """Follow a new batch split from the next reduction on (the data part's position tells it,
        at a step boundary)."""
        self.local_batches = tuple(int(b) for b in local_batches)
        self.weight = rank_weight(self.local_batches, self.groups.rank)

    def take_comm_s(self) -> float:
        """Return and reset the accumulated collective time in seconds."""
        value, self.comm_s = self.comm_s, 0.0
        return value

    def reduce_(self, flat: torch.Tensor, shapes: Sequence[torch.Size] | None = None,
                key: int = 0) -> torch.Tensor:
        """Weight ``flat`` (1-D gradient buffer) by ``weight`` and sum it over all ranks in place.

        Blocking; returns ``flat``. Does not touch :attr:`comm_s` (callers account for waiting).

        Args:
            flat: 1-D buffer on CPU or the rank's CUDA device.
            shapes: the gradient shapes laid out in ``flat`` (the reducer's codec may need them).
            key: codec slot (DDP bucket index).
        """
        if self.reducer is not None:
            return self.reducer.reduce_views_(flat, shapes, key)
        flat.mul_(self.weight)
        self.count_inter_group_bytes(hierarchical_all_reduce_(flat, self.groups))
        return flat

    def count_inter_group_bytes(self, sent: int) -> None:
        """Add ``sent`` payload bytes that crossed topology groups (thread-safe; metrics too)."""
        if not sent:
            return
        with self._bytes_lock:
            self.inter_group_bytes += sent
        if self.on_inter_group_bytes is not None:
            self.on_inter_group_bytes(sent)

    def add_comm_s(self, seconds: float) -> None:
        """Account ``seconds`` the training thread waited on collectives outside backward (e.g.
        the scaler's found-inf agreement)."""
        self.comm_s += seconds

    def submit(self, flat: torch.Tensor, shapes: Sequence[torch.Size] | None = None,
               key: int = 0) -> torch.futures.Future[torch.Tensor]:
        """Queue :meth:`reduce_` of ``flat`` on the communication thread; a future of the result.

        Buckets run strictly in submission order (one worker thread). The future carries
        ``flat``'s device, so completing it from the thread synchronises CUDA streams.
        """
        self.mark_ready()
        if not self.overlap:
            future = device_future(flat.device)
            future.set_result(self.reduce_(flat, shapes, key))
            self.comm_s += time.perf_counter() - self.last_ready_s
            return future
        direct = self._direct_future(flat)
        if direct is not None:
            return direct
        future = device_future(flat.device)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="htj-comm")

        def run() -> None:
            try:
                if flat.is_cuda:  # the thread's current device defaults to cuda:0
                    torch.cuda.set_device(flat.device)
                future.set_result(self.reduce_(flat, shapes, key))
            except BaseException as exc:  # surfaces in DDP's wait on the future
                future.set_exception(exc)

        self._executor.submit(run)
        return future

    def pipeline(self) -> HierarchyPipeline:
        """This rank's :class:`~hetero_worker.comm.pipeline.HierarchyPipeline` over the current
        groups (made on first use; hierarchical layouts only)."""
        if self._pipeline is None or self._pipeline.groups is not self.groups:
            if self._pipeline is not None:
                self._pipeline.close()
            self._pipeline = HierarchyPipeline(self.groups, self.count_inter_group_bytes)
        return self._pipeline

    def pipelined(self, flat: torch.Tensor) -> bool:
        """True when ``flat`` goes through the pipelined hierarchy: overlap on, a hierarchical
        layout, a CPU buffer (CUDA buckets keep the blocking chain on the communication thread)."""
        return self.overlap and not self.groups.layout.is_flat and flat.device.type == "cpu"

    def _direct_future(self, flat: torch.Tensor) -> torch.futures.Future[torch.Tensor] | None:
        """The bucket's reduction issued right here as asynchronous collectives, or None.

        A flat layout: one all-reduce, as torch's own ``allreduce_hook`` issues it. A CPU bucket
        of a hierarchical layout: the pipelined hierarchy (:meth:`pipeline`: in-group reduce,
        leaders' all-reduce and in-group broadcast on three process groups, each started when its
        input is ready, so buckets overlap each other and backward). Every rank submits in DDP's
        bucket order, so the collectives pair up. Only for CPU tensors on Gloo groups without a
        reducer (a reducer submits to the pipeline itself, with its codec and piggyback).
        """
        groups = self.groups
        if (self.reducer is not None or flat.device.type != "cpu"
                or groups.intra_backend != GLOO):
            return None
        if groups.layout.is_flat:
            nbytes = flat.numel() * flat.element_size()
            flat.mul_(self.weight)
            work = dist.all_reduce(flat, group=groups.intra, async_op=True)
            self.count_inter_group_bytes(nbytes if groups.intra_crosses else 0)
            return work.get_future().then(_first_tensor)
        flat.mul_(self.weight)
        return self.pipeline().submit(flat)

    def mark_ready(self) -> None:
        """Record that a gradient just became ready (a bucket reached the hook, or backward's
        compute finished: :meth:`watch_backward`)."""
        self.last_ready_s = time.perf_counter()

    def watch_backward(self, root: torch.Tensor) -> None:
        """Mark the end of backward's compute for the backward pass about to start from ``root``.

        A hook on ``root`` (the first node backward runs) queues :meth:`mark_ready` as a final
        callback of that backward pass (``Variable._execution_engine.queue_callback``, as FSDP
        does). Final callbacks run in queue order once every gradient is computed, and DDP queues
        its own (which waits for the reductions) later, when its last bucket is ready; so the mark
        is the moment the last gradient became ready, at one Python call per backward instead of
        one per parameter (a post-accumulate-grad hook on each parameter cost several per cent of
        a small model's step on a loaded machine). No-op when ``root`` needs no gradient.
        """
        if not root.requires_grad:
            return
        queue = torch.autograd.Variable._execution_engine.queue_callback

        def at_start(grad: torch.Tensor) -> torch.Tensor:
            queue(self.mark_ready)
            return grad

        root.register_hook(at_start)

    def end_of_backward(self) -> None:
        """Account the wait after the last gradient (call right after ``backward()`` returns).

        On the threaded and the flat fast path, the time from the last gradient becoming ready to
        the end of backward is spent only waiting for collectives (and for slower ranks).
        """
        if (self.overlap or self.weight_in_loss) and self.last_ready_s:
            self.comm_s += time.perf_counter() - self.last_ready_s
        self.last_ready_s = 0.0

    def close(self) -> None:
        """Stop the communication threads (idempotent)."""
        if self._pipeline is not None:
            self._pipeline.close()
            self._pipeline = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    @property
    def loss_factor(self) -> float:
        """Factor for the local mean loss: ``world_size * weight`` on the flat fast path, else 1."""
        if not self.weight_in_loss:
            return 1.0
        return len(self.local_batches) * self.weight

    def ddp_options(self) -> dict[str, Any]:
        """Keyword arguments for the ``DistributedDataParallel`` this sync will be registered on.

        * ``gradient_as_bucket_view=True``: gradients are views into DDP's buckets, which saves
          the two copies per step between them and one gradient's memory (torch DDP docs).
        * hierarchical layouts: ``bucket_cap_mb=25`` given explicitly, which makes DDP drop its
          1 MiB first bucket (``dist._DEFAULT_FIRST_BUCKET_BYTES``, used only with the default
          cap). A bucket costs a hierarchy three dependent collectives, and a bucket's chain
          waits for the previous one's, where DDP's flat all-reduces of two buckets run at
          once: on 4 Gloo ranks / 2 cores the 2.25 MB gradient of the benchmark MLP took
          15.0 ms in two buckets, 10.9 ms in one, and the flat all-reduce of the two 11.7 ms
          (issue 11). 25 MB is DDP's own default cap for every other bucket.
        """
        options: dict[str, Any] = {"gradient_as_bucket_view": True}
        if not self.groups.layout.is_flat:
            options["bucket_cap_mb"] = HIERARCHICAL_BUCKET_CAP_MB
        return options

    def register(self, ddp_model: torch.nn.parallel.DistributedDataParallel, *,
                 fast_flat: bool = True) -> None:
        """Make ``ddp_model`` reduce with this sync (before its first backward).

        Installs :func:`weighted_hook` (or the reducer's hook, see :meth:`use_reducer`); for a
        flat layout with ``fast_flat`` and no reducer it keeps DDP's built-in all-reduce and moves
        the weight into the loss (:attr:`loss_factor`).
        """
        if self.reducer is not None:
            self.weight_in_loss = False
            ddp_model.register_comm_hook(self.reducer, self.reducer.hook)
            return
        if fast_flat and self.groups.layout.is_flat:
            self.weight_in_loss = True
            return
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
        start = time.perf_counter()
        flat_reduce_(grads, lambda flat: self.reduce_(flat, [g.shape for g in grads]))
        self.comm_s += time.perf_counter() - start


def device_future(device: torch.device) -> torch.futures.Future:
    """A future that synchronises ``device``'s streams when completed (CPU: a plain future)."""
    if device.type == "cuda":
        return torch.futures.Future(devices=[device])
    return torch.futures.Future()


def _first_tensor(future: torch.futures.Future) -> torch.Tensor:
    """A collective's future value (the list of its tensors) -> its one tensor (DDP wants that)."""
    return future.value()[0]


def weighted_hook(sync: WeightedGradSync,
                  bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: weighted hierarchical sum of one bucket (see module docstring)."""
    return sync.submit(bucket.buffer())
