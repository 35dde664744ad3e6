"""Speed features on top of :class:`hetero_worker.trainer.Trainer`: rebalancing, inter-group
compression, the measured ``auto`` hierarchy.

:func:`attach` composes them with a trainer through its explicit seams (nothing replaces a
method of the trainer or of its sync at runtime):

* the trainer's :class:`~hetero_worker.comm.sync.WeightedGradSync` hands its reductions to
  :class:`CodecReducer` (``sync.use_reducer``; same weighting, same groups; the leaders'
  all-reduce goes through the job's codec, and the rebalancer's per-rank stats ride along in the
  first reduction of each step);
* ``Trainer.step`` calls :meth:`SpeedController.after_step`: it merges the stats that travelled
  with the step's gradients, runs the :class:`~hetero_worker.speed.rebalance.Rebalancer` and applies a
  new split with ``Trainer.set_split`` (sampler and weights change at the step boundary);
* with ``HTJ_HIERARCHY=auto`` ``Trainer.wrap`` calls :meth:`SpeedController.before_wrap`: the links
  are measured once with the training backends on the training device (the groups the chosen
  layout would use, per the communicator rule), the probe groups are destroyed, and the trainer
  switches to the layout :func:`heterotrain_common.linkcost.choose_hierarchy` predicts fastest
  (``Trainer.use_layout``).

Stats lag one step: the stats of step ``s`` ride in step ``s + 1``'s first gradient reduction (the
compute time of step ``s`` is only known after its backward), so a decision taken after step
``s + 1`` applies from step ``s + 2``.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist

from hetero_worker.comm.collectives import host_copy, split_extra_, with_extra
from hetero_worker.comm.groups import hierarchical_all_reduce_
from hetero_worker.comm.sync import device_future
from hetero_worker.speed.bucket_codecs import codec_for_bucket
from hetero_worker.speed.codec import InterGroupCodec
from hetero_worker.speed.codecs import CompressionConfig, make_codec
from hetero_worker.speed.hierarchy import measure_and_choose
from hetero_worker.speed.rebalance import RebalanceConfig, Rebalancer, pack_stats, unpack_stats
from heterotrain_common import contract, envnames
from heterotrain_common.linkcost import LinkModel


@dataclass(frozen=True, kw_only=True, slots=True)
class SpeedConfig:
    """Per-job speed settings.

    Attributes:
        rebalance: rebalancer knobs (``interval_steps == 0`` disables it).
        compression: inter-group codec.
    """

    rebalance: RebalanceConfig = field(default_factory=lambda: RebalanceConfig(interval_steps=0))
    compression: CompressionConfig = field(default_factory=CompressionConfig)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SpeedConfig:
        """Read ``HTJ_REBALANCE_INTERVAL_STEPS``, ``HTJ_COMPRESSION``, ``HTJ_POWERSGD_RANK``.

        Raises:
            ValueError: a malformed value (the message names the variable).
        """
        env = os.environ if environ is None else environ
        return cls(rebalance=RebalanceConfig(interval_steps=contract.read_var(
                       env, envnames.REBALANCE_INTERVAL_STEPS)),
                   compression=CompressionConfig.from_env(env))

    @classmethod
    def from_contract(cls, parsed: contract.Contract) -> SpeedConfig:
        """The speed settings of a parsed contract (what ``init(environ=...)`` read)."""
        return cls(rebalance=RebalanceConfig(interval_steps=parsed.comm.rebalance_interval_steps),
                   compression=CompressionConfig.from_contract(parsed))


class CodecReducer:
    """Weighted hierarchical SUM with a codec on the leaders' link and stats piggyback.

    The trainer's :class:`~hetero_worker.comm.sync.WeightedGradSync` hands its reductions to it
    (:meth:`install` calls ``sync.use_reducer``), so the sync's communication thread, overlap and
    wait accounting stay as they are; its DDP hook passes each bucket's parameter shapes along
    (PowerSGD needs the matrices).

    CPU buckets of a hierarchical layout go through the sync's pipelined hierarchy
    (:meth:`submit_pipelined`): each bucket on its own, the codec in the pipeline's exchange
    stage, its state kept per bucket identity (the bucket's parameters) across DDP's bucket
    rebuilds (:mod:`hetero_worker.speed.bucket_codecs`). Elsewhere (CUDA buckets):

    With PowerSGD the step's buckets are reduced in **one exchange** (:meth:`stash`): the hook
    keeps each bucket until DDP hands over the last one, then one reduction of all of them runs
    (one in-group reduce, the codec's two leader all-reduces, one broadcast per step instead of
    per bucket; pytorch/pytorch#74148 and torch's ``batched_powerSGD_hook`` make the same trade)
    and completes every bucket's future.  The codec then holds one state for all parameters
    (key 0), which also survives DDP's bucket rebuild after the first step (a permutation of the
    same parameters).  Other codecs reduce per bucket, overlapping backward.

    Codec state and skipped steps (issue 21): with ``transactional`` (the job has a loss scaler)
    the stateful codecs hold their new state until :meth:`end_step` says whether the optimizer
    step was applied, so a skipped step (an fp16 overflow on any rank) leaves every codec's error
    feedback as it was; the codecs never store a non-finite error in any case.

    Args:
        sync: the trainer's ``WeightedGradSync`` (weight, groups, byte counter are shared).
        compression: codec choice; codecs are kept per DDP bucket (error feedback state), or
            one for the whole step (PowerSGD).
        transactional: hold codec state until :meth:`end_step` (a step may be skipped).
    """

    STEAL_KEY = -1
    """Codec slot of :meth:`sum_`'s reductions (work stealing: its own layout of the gradients)."""

    def __init__(self, sync: Any, compression: CompressionConfig, *,
                 transactional: bool = False) -> None:
        self.sync = sync
        self.compression = compression
        self.transactional = transactional
        self.codecs: dict[int, InterGroupCodec] = {}
        # Codec state follows parameters, not bucket positions: DDP rebuilds its buckets after
        # the first iteration (and again after a restart), reordering their tensors.
        self.param_index: dict[int, int] = {}  # id(parameter) -> index in model.parameters()
        self.bucket_keys: dict[int, tuple[int, ...]] = {}  # bucket -> its parameters' indices
        self.param_numels: list[int] = []  # elements per parameter index (bucket_codecs)
        self.pending: torch.Tensor | None = None
        self.merged: torch.Tensor | None = None
        self.hook = codec_hook
        self.one_exchange = compression.mode == "powersgd"
        self._step_buckets: list[tuple[torch.Tensor, list[torch.Size], Any]] = []
        self._step_keys: list[int] = []
        # (combined buffer, its buckets) in submission order; the comm thread pops them
        self._jobs: deque[tuple[torch.Tensor, list[tuple[torch.Tensor, list[torch.Size], Any]]]] = deque()

    @property
    def codec_bytes_sent(self) -> int:
        """Bytes this leader's codecs put on the leaders' link so far."""
        return sum(c.bytes_sent for c in self.codecs.values())

    def install(self) -> None:
        """Make the sync reduce through this reducer (``sync.use_reducer``; composition)."""
        self.sync.use_reducer(self)

    def end_step(self, *, applied: bool, scale_ratio: float = 1.0) -> None:
        """The optimizer step after this step's reductions was taken (``applied``) or skipped on
        every rank; ``scale_ratio`` = new loss scale / old (the codecs hold scaled residuals)."""
        for codec in self.codecs.values():
            end = getattr(codec, "end_step", None)
            if end is not None:
                end(applied=applied, scale_ratio=scale_ratio)

    def sum_(self, flat: torch.Tensor, shapes: Sequence[torch.Size],
             exact: torch.Tensor | None = None) -> torch.Tensor:
        """SUM ``flat`` over all ranks in place, unweighted, the leaders' link through the codec
        (slot :data:`STEAL_KEY`); ``exact`` (1-D float) rides along losslessly.  Work stealing's
        reduction (its gradients are sums over the samples each rank took).  Blocking."""
        n = flat.numel()
        wire = with_extra(flat, exact)
        sent = self._reduce(wire, n, list(shapes), self.STEAL_KEY, exact is not None)
        split_extra_(wire, n, flat, exact)
        self.sync.count_inter_group_bytes(sent)
        return flat

    def set_pending(self, stats: Sequence[float]) -> None:
        """Stats to append to the next reduction (one float per slot, this rank's slots only)."""
        self.pending = torch.tensor(list(stats), dtype=torch.float32)

    def take_merged(self) -> torch.Tensor | None:
        """The SUM of every rank's stats from the last reduction that carried them."""
        merged, self.merged = self.merged, None
        return merged

    def stash(self, buffer: torch.Tensor, shapes: Sequence[torch.Size], keys: Sequence[int] | None,
              last: bool) -> Any:
        """Keep one DDP bucket for the step's single exchange; a future of its reduced buffer.

        On the ``last`` bucket the step's buckets are concatenated (no copy when there is only
        one) and handed to ``sync.submit`` as one reduction; :meth:`reduce_views_` copies the
        result back into every bucket and completes their futures (or fails them all).

        Args:
            buffer: the bucket's flat gradient buffer.
            shapes: its parameters' shapes, in buffer order.
            keys: its parameters' indices in ``model.parameters()`` (None: unknown).
            last: ``GradBucket.is_last()``.
        """
        future = device_future(buffer.device)
        self._step_buckets.append((buffer, list(shapes), future))
        if keys is not None:
            self._step_keys.extend(keys)
        if last:
            buckets, self._step_buckets = self._step_buckets, []
            keys_all, self._step_keys = tuple(self._step_keys), []
            if self.param_index and len(keys_all) == sum(len(b[1]) for b in buckets):
                self.bucket_keys[0] = keys_all
            flat = buckets[0][0] if len(buckets) == 1 else torch.cat([b[0] for b in buckets])
            self._jobs.append((flat, buckets))
            self.sync.submit(flat, [shape for b in buckets for shape in b[1]], 0)
        return future

    def submit_pipelined(self, buffer: torch.Tensor, shapes: Sequence[torch.Size],
                         keys: Sequence[int] | None) -> Any:
        """One bucket through the sync's pipelined hierarchy; a future of its reduced buffer.

        The bucket is weighted, the pending stats ride along exactly, and a codec (if any) runs
        on this bucket alone in the pipeline's exchange stage, with its state found by the
        bucket's parameters (:func:`hetero_worker.speed.bucket_codecs.codec_for_bucket`), so it
        survives DDP's bucket rebuild.

        Args:
            buffer: the bucket's flat CPU gradient buffer.
            shapes: its parameters' shapes, in buffer order.
            keys: its parameters' indices in ``model.parameters()`` (needed with a codec).

        Raises:
            ValueError: a codec is on and ``keys`` is unknown.
        """
        sync = self.sync
        sync.mark_ready()
        buffer.mul_(sync.weight)
        stats, self.pending = self.pending, None
        exchange = None
        if self.compression.mode != "none":
            if keys is None:
                raise ValueError("a codec in the pipeline needs the bucket's parameter indices")
            shapes, keys = list(shapes), tuple(keys)
            exchange = lambda wire, n: self._exchange_bucket(wire, n, shapes, keys)  # noqa: E731
        return sync.pipeline().submit(buffer, extra=stats, exchange=exchange,
                                      on_extra=self._set_merged)

    def _set_merged(self, summed: torch.Tensor) -> None:
        self.merged = summed.float().clone()

    def _exchange_bucket(self, wire: torch.Tensor, n: int, shapes: Sequence[torch.Size],
                         keys: tuple[int, ...]) -> int:
        """The pipeline's exchange stage with the codec of this bucket (a leader, blocking)."""
        codec = codec_for_bucket(self.codecs, keys, self.param_numels,
                                 lambda seed: make_codec(self.compression, seed=seed))
        views, offset = [], 0
        for shape in shapes:
            views.append(wire[offset:offset + shape.numel()].view(shape))
            offset += shape.numel()
        before = codec.bytes_sent
        codec.allreduce_(views, self.sync.groups.leaders,
                         exact=wire[n:] if wire.numel() > n else None)
        return codec.bytes_sent - before if self.sync.groups.leaders_cross else 0

    def reduce_views_(self, flat: torch.Tensor, shapes: Sequence[torch.Size] | None,
                      key: int = 0) -> torch.Tensor:
        """Weight ``flat`` and SUM it over all ranks in place; ``shapes`` split it for PowerSGD.

        Blocking; does not touch ``sync.comm_s`` (the caller accounts for waiting).  When
        ``flat`` is a step's combined buffer from :meth:`stash`, the buckets' futures are
        completed here (with the exception, if the reduction fails).

        Args:
            flat: 1-D gradient buffer (CPU or CUDA), overwritten with the weighted sum.
            shapes: gradient shapes laid out back to back in ``flat`` (None: one 1-D tensor).
            key: codec slot (the DDP bucket index).
        """
        job = self._jobs.popleft() if self._jobs and self._jobs[0][0] is flat else None
        if job is None:
            return self._reduce_views(flat, shapes, key)
        buckets = job[1]
        try:
            self._reduce_views(flat, shapes, key)
        except BaseException as exc:
            for _, _, future in buckets:
                future.set_exception(exc)
            raise
        offset = 0
        for buffer, _, future in buckets:
            if buffer is not flat:
                buffer.copy_(flat[offset:offset + buffer.numel()])
            offset += buffer.numel()
            future.set_result(buffer)
        return flat

    def _reduce_views(self, flat: torch.Tensor, shapes: Sequence[torch.Size] | None,
                      key: int) -> torch.Tensor:
        flat.mul_(self.sync.weight)
        stats, self.pending = self.pending, None
        n = flat.numel()
        wire = flat if stats is None else torch.cat([flat, stats.to(flat.device, flat.dtype)])
        sent = self._reduce(wire, n, shapes or [torch.Size([n])], key, stats is not None)
        if stats is not None:
            flat.copy_(wire[:n])
            self.merged = wire[n:].float().cpu()
        self.sync.count_inter_group_bytes(sent)
        return flat

    def _reduce(self, wire: torch.Tensor, n: int, shapes: Sequence[torch.Size], key: int,
                has_stats: bool) -> int:
        return hierarchical_all_reduce_(
            wire, self.sync.groups, payload_numel=n,
            leaders_reduce=lambda t: self._leaders(t, n, shapes, key, has_stats))

    def _leaders(self, wire: torch.Tensor, n: int, shapes: Sequence[torch.Size], key: int,
                 has_stats: bool) -> int:
        """The codec's SUM over the leaders' Gloo group; CUDA buffers go through one host copy
        (the codecs compute on the host, where Gloo's collectives run)."""
        codec = self.codecs.get(key)
        if codec is None:
            codec = self.codecs[key] = make_codec(self.compression, seed=key)
        if hasattr(codec, "transactional"):  # also codecs restored from a checkpoint
            codec.transactional = self.transactional
        if key in self.bucket_keys and hasattr(codec, "align_"):
            codec.align_(self.bucket_keys[key])  # permute error feedback to this bucket order
        before = codec.bytes_sent
        with host_copy(wire) as host:
            views, offset = [], 0
            for shape in shapes:
                views.append(host[offset:offset + shape.numel()].view(shape))
                offset += shape.numel()
            codec.allreduce_(views, self.sync.groups.leaders, exact=host[n:] if has_stats else None)
        return codec.bytes_sent - before if self.sync.groups.leaders_cross else 0


def codec_hook(reducer, bucket):  # type: ignore[no-untyped-def]
    """DDP communication hook: hand the bucket and its shapes to ``sync.submit``.

    Unannotated on purpose: under ``from __future__ import annotations`` the annotations are
    strings and DDP's ``_check_comm_hook`` rejects anything but the ``dist.GradBucket`` class.

    Args:
        reducer: :class:`CodecReducer`.
        bucket: ``dist.GradBucket``.

    Returns:
        ``torch.futures.Future[torch.Tensor]`` of the reduced buffer (the sync's comm thread
        completes it; buckets run in DDP's order, the same on every rank).
    """
    params = bucket.parameters()
    keys = (tuple(reducer.param_index.get(id(p), -1) for p in params)
            if reducer.param_index else None)
    buffer = bucket.buffer()
    if reducer.sync.pipelined(buffer) and (reducer.compression.mode == "none" or keys is not None):
        return reducer.submit_pipelined(buffer, [p.shape for p in params], keys)
    if reducer.one_exchange:  # the step's buckets in one reduction (CodecReducer.stash)
        return reducer.stash(bucket.buffer(), [p.shape for p in params], keys, bucket.is_last())
    if keys is not None:
        reducer.bucket_keys[bucket.index()] = keys
    return reducer.sync.submit(bucket.buffer(), [p.shape for p in params],
                               bucket.index())


class TrainerSeams(Protocol):
    """The seams of :class:`hetero_worker.trainer.Trainer` the speed features compose through."""

    contract: contract.Contract
    rank: int
    device: torch.device
    sync: Any
    scaler: Any
    speed: Any
    model: torch.nn.Module | None
    global_step: int
    set_split: Callable[..., None]
    """``set_split(local_batches)``: change the split at a step boundary (every rank)."""

    @property
    def local_batches(self) -> list[int]:
        """The current split."""
        ...

    @property
    def layout(self) -> Any:
        """The hierarchy layout in use."""
        ...

    def build_groups(self, mode: str) -> Any:
        """The process groups of hierarchy ``mode`` (collective)."""
        ...

    def use_layout(self, mode: str) -> None:
        """Switch to hierarchy ``mode`` before ``wrap`` (collective)."""
        ...

    def use_speed(self, controller: Any) -> None:
        """Compose a speed controller."""
        ...

    def step(self, optimizer: torch.optim.Optimizer, loss_fn: Any) -> Any:
        """One optimizer step."""
        ...


class SpeedController:
    """Runs the rebalancer around ``Trainer.step``; build it with :func:`attach`.

    Attributes:
        trainer: the wrapped trainer.
        reducer: the gradient reducer installed in it.
        rebalancer: the split controller (``None`` when rebalancing is off).
        chosen_hierarchy: the layout mode in use.
        predicted_sync_s: cost-model seconds per mode (``auto`` only).
        probe_s: wall seconds the ``auto`` link probe and trial took in ``Trainer.wrap`` (a
            one-time start cost; None without ``auto``).
        trial_s: the close-call trial's median sync seconds per mode (empty when none ran).
    """

    def __init__(self, trainer: TrainerSeams, config: SpeedConfig) -> None:
        self.trainer = trainer
        self.config = config
        # With a loss scaler a step can be skipped: the codecs then hold their state until the
        # trainer says whether the step was applied (end_step).
        self.reducer = CodecReducer(trainer.sync, config.compression,
                                    transactional=trainer.scaler is not None)
        self.rebalancer = (Rebalancer(config=config.rebalance, split=list(trainer.local_batches))
                           if config.rebalance.interval_steps > 0 else None)
        self.chosen_hierarchy = trainer.layout.mode
        self.predicted_sync_s: dict[str, float] = {}
        self.link: LinkModel | None = None
        self.probe_s: float | None = None
        self.trial_s: dict[str, float] = {}
        self.world = dist.get_world_size()

    def step(self, optimizer: torch.optim.Optimizer, loss_fn: Any) -> Any:
        """``Trainer.step`` (which calls :meth:`after_step` itself); returns its result."""
        return self.trainer.step(optimizer, loss_fn)

    def before_wrap(self, model: torch.nn.Module) -> None:
        """Called by ``Trainer.wrap`` before DDP is built: with ``auto``, measure the links, pick
        the layout and switch the trainer to it (collective)."""
        self.reducer.param_index = {id(p): i for i, p in enumerate(model.parameters())}
        self.reducer.param_numels = [p.numel() for p in model.parameters()]
        if self.trainer.contract.comm.hierarchy != "auto":
            return
        grad_bytes = 4.0 * sum(p.numel() for p in model.parameters() if p.requires_grad)
        start = time.perf_counter()
        trainer = self.trainer
        link, costs, mode = measure_and_choose(trainer.contract.topology, trainer.device,
                                               trainer.build_groups, grad_bytes=grad_bytes,
                                               trial_s=self.trial_s)
        self.trainer.use_layout(mode)
        self.probe_s = time.perf_counter() - start
        self.link, self.predicted_sync_s, self.chosen_hierarchy = link, costs, mode

    def after_step(self, compute_s: float, batch: int) -> None:
        """Bookkeeping after one trainer step (``Trainer.step`` calls it).

        Args:
            compute_s: this rank's compute seconds of the step (``StepResult.compute_s``).
            batch: the local batch the step used (read before the step; a split change
                decided here applies from the next step).
        """
        merged = self.reducer.take_merged()
        if self.rebalancer is not None and merged is not None:
            rank_compute_s, rank_samples = unpack_stats(merged.tolist())
            new_split = self.rebalancer.observe(self.trainer.global_step - 1, rank_compute_s,
                                                rank_samples)
            if new_split is not None:
                self.trainer.set_split(new_split)
        if self.rebalancer is not None:
            self.reducer.set_pending(pack_stats(self.trainer.rank, self.world, compute_s, batch))

    def end_step(self, *, skipped: bool, scale_ratio: float = 1.0) -> None:
        """Called by ``Trainer`` after every optimizer step decision (``skipped`` on every rank
        when the scaler found inf/NaN): the codecs keep or drop the step's new state."""
        self.reducer.end_step(applied=not skipped, scale_ratio=scale_ratio)

    def throughput_by_class(self) -> dict[str, float]:
        """Measured samples/s of one device per GPU product (for job status and the planner)."""
        if self.rebalancer is None:
            return {}
        return self.rebalancer.throughput_by_class(
            [e.gpu_product for e in self.trainer.contract.topology])


def attach(trainer: TrainerSeams, config: SpeedConfig | None = None) -> SpeedController:
    """Compose the speed features with ``trainer`` (call on every rank, before ``trainer.wrap``).

    ``trainer.wrap`` then first measures the links and re-lays the groups when the contract says
    ``auto`` (collective; the gradient size is known there), and the sync reduces through
    :class:`CodecReducer` when rebalancing or compression is on.

    Args:
        trainer: a :class:`hetero_worker.trainer.Trainer` not yet wrapped around a model.
        config: default :meth:`SpeedConfig.from_contract` of the trainer's contract.

    Returns:
        The :class:`SpeedController` (``trainer.step`` drives it).

    Raises:
        RuntimeError: the trainer already wrapped a model.
    """
    if trainer.speed is not None:  # init() attached already (job asked for it)
        return trainer.speed
    if trainer.model is not None:
        raise RuntimeError("attach() must run before Trainer.wrap()")
    controller = SpeedController(trainer, config or SpeedConfig.from_contract(trainer.contract))
    if controller.rebalancer is not None or controller.config.compression.mode != "none":
        controller.reducer.install()  # else the trainer's own sync (and its flat fast path) stays
    trainer.use_speed(controller)
    return controller
