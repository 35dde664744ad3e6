"""Speed features on top of :class:`hetero_worker.trainer.Trainer`: rebalancing, inter-group
compression, the measured ``auto`` hierarchy.

:func:`attach` composes them with a trainer through its explicit seams (nothing replaces a
method of the trainer or of its sync at runtime):

* the trainer's :class:`~hetero_worker.sync.WeightedGradSync` hands its reductions to
  :class:`CodecReducer` (``sync.use_reducer``; same weighting, same groups; the leaders'
  all-reduce goes through the job's codec, and the rebalancer's per-rank stats ride along in the
  first reduction of each step);
* ``Trainer.step`` calls :meth:`SpeedController.after_step`: it merges the stats that travelled
  with the step's gradients, runs the :class:`~hetero_worker.rebalance.Rebalancer` and applies a
  new split with ``Trainer.set_split`` (sampler and weights change at the step boundary);
* with ``HTJ_HIERARCHY=auto`` ``Trainer.wrap`` calls :meth:`SpeedController.before_wrap`: the links
  are measured once with the training backends on the training device (the groups the chosen
  layout would use, per the communicator rule), the probe groups are destroyed, and the trainer
  switches to the layout :func:`hetero_worker.linkcost.choose_hierarchy` predicts fastest
  (``Trainer.use_layout``).

Stats lag one step: the stats of step ``s`` ride in step ``s + 1``'s first gradient reduction (the
compute time of step ``s`` is only known after its backward), so a decision taken after step
``s + 1`` applies from step ``s + 2``.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hetero_worker import contract
from hetero_worker.compression import CompressionConfig, InterGroupCodec, make_codec
from hetero_worker.groups import hierarchical_all_reduce_
from hetero_worker.linkcost import LinkModel, RankPlace, predict_modes
from hetero_worker.rebalance import RebalanceConfig, Rebalancer, pack_stats, unpack_stats

REBALANCE_INTERVAL_ENV = contract.REBALANCE_INTERVAL_STEPS
"""Spec ``training.rebalance.intervalSteps``; 0 or unset disables rebalancing."""


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
        return cls(rebalance=RebalanceConfig(interval_steps=contract.rebalance_interval_steps(env)),
                   compression=CompressionConfig.from_env(env))

    @classmethod
    def from_contract(cls, parsed: contract.Contract) -> SpeedConfig:
        """The speed settings of a parsed contract (what ``init(environ=...)`` read)."""
        return cls(rebalance=RebalanceConfig(interval_steps=parsed.rebalance_interval_steps),
                   compression=CompressionConfig.from_contract(parsed))


class CodecReducer:
    """Weighted hierarchical SUM with a codec on the leaders' link and stats piggyback.

    The trainer's :class:`~hetero_worker.sync.WeightedGradSync` hands its reductions to it
    (:meth:`install` calls ``sync.use_reducer``), so the sync's communication thread, overlap and
    wait accounting stay as they are; its DDP hook passes each bucket's parameter shapes along
    (PowerSGD needs the matrices).

    With PowerSGD the step's buckets are reduced in **one exchange** (:meth:`stash`): the hook
    keeps each bucket until DDP hands over the last one, then one reduction of all of them runs
    (one in-group reduce, the codec's two leader all-reduces, one broadcast per step instead of
    per bucket; pytorch/pytorch#74148 and torch's ``batched_powerSGD_hook`` make the same trade)
    and completes every bucket's future.  The codec then holds one state for all parameters
    (key 0), which also survives DDP's bucket rebuild after the first step (a permutation of the
    same parameters).  Other codecs reduce per bucket, overlapping backward.

    Args:
        sync: the trainer's ``WeightedGradSync`` (weight, groups, byte counter are shared).
        compression: codec choice; codecs are kept per DDP bucket (error feedback state), or
            one for the whole step (PowerSGD).
    """

    def __init__(self, sync: Any, compression: CompressionConfig) -> None:
        self.sync = sync
        self.compression = compression
        self.codecs: dict[int, InterGroupCodec] = {}
        # Codec state follows parameters, not bucket positions: DDP rebuilds its buckets after
        # the first iteration (and again after a restart), reordering their tensors.
        self.param_index: dict[int, int] = {}  # id(parameter) -> index in model.parameters()
        self.bucket_keys: dict[int, tuple[int, ...]] = {}  # bucket -> its parameters' indices
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
        from hetero_worker.sync import device_future
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
        if key in self.bucket_keys and hasattr(codec, "align_"):
            codec.align_(self.bucket_keys[key])  # permute error feedback to this bucket order
        host = wire if wire.device.type == "cpu" else wire.cpu()
        views, offset = [], 0
        for shape in shapes:
            views.append(host[offset:offset + shape.numel()].view(shape))
            offset += shape.numel()
        before = codec.bytes_sent
        codec.allreduce_(views, self.sync.groups.leaders, exact=host[n:] if has_stats else None)
        if host is not wire:
            wire.copy_(host)
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
    if reducer.one_exchange:  # the step's buckets in one reduction (CodecReducer.stash)
        return reducer.stash(bucket.buffer(), [p.shape for p in params], keys, bucket.is_last())
    if keys is not None:
        reducer.bucket_keys[bucket.index()] = keys
    return reducer.sync.submit(bucket.buffer(), [p.shape for p in params],
                               bucket.index())


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

    def __init__(self, trainer: Any, config: SpeedConfig) -> None:
        self.trainer = trainer
        self.config = config
        self.reducer = CodecReducer(trainer.sync, config.compression)
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
        if self.trainer.contract.hierarchy != "auto":
            return
        grad_bytes = 4.0 * sum(p.numel() for p in model.parameters() if p.requires_grad)
        start = time.perf_counter()
        link, costs, mode = measure_and_choose(self.trainer, grad_bytes=grad_bytes,
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

    def throughput_by_class(self) -> dict[str, float]:
        """Measured samples/s of one device per GPU product (for job status and the planner)."""
        if self.rebalancer is None:
            return {}
        return self.rebalancer.throughput_by_class(
            [e.gpu_product for e in self.trainer.contract.topology])


def attach(trainer: Any, config: SpeedConfig | None = None) -> SpeedController:
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


def places_of(topology: Sequence[Any]) -> list[RankPlace]:
    """:class:`RankPlace` per rank from the contract's topology entries."""
    return [RankPlace(node=e.node, arch=e.compute_capability, group=e.group) for e in topology]


def measure_and_choose(trainer: Any, *, grad_bytes: float | None = None,
                       probe_bytes: int = 1 << 20, trial_s: dict[str, float] | None = None,
                       ) -> tuple[LinkModel, dict[str, float], str]:
    """Measure intra- and inter-node bandwidth once, then pick the cheapest hierarchy.

    Collective on all ranks.  The probe builds the groups the ``node`` and ``flat`` layouts would
    train with (``trainer.build_groups``: the communicator rule's backends, NCCL inside a node of
    one GPU type, Gloo elsewhere) and times a ``probe_bytes`` all-reduce (and a 4-byte one, for
    latency) of tensors on the training device inside every node at once, among the node leaders,
    and over all ranks (the flat ring, whose measured bandwidth then stands in for the per-edge
    model of ``flat``); the times are MAX-reduced so every rank computes the same choice.  Every
    probe group is destroyed afterwards.

    Args:
        trainer: the trainer (contract topology, rank, device, ``build_groups``).
        grad_bytes: fp32 gradient bytes per rank (default: 100 MiB; only the ratio between modes
            matters once bandwidth dominates).
        probe_bytes: bytes per probe all-reduce.
        trial_s: filled with the close-call trial's seconds per mode when one runs.

    Returns:
        ``(link model, predicted seconds per mode, chosen mode)``.
    """
    topology = trainer.contract.topology
    places = places_of(topology)
    device = trainer.device
    node = trainer.build_groups("node")
    flat = trainer.build_groups("flat")
    try:
        times = torch.zeros(6, dtype=torch.float64)
        if len(node.intra_ranks) > 1 and not node.layout.is_flat:  # inside every node at once
            times[0] = _time_allreduce(probe_bytes, node.intra, node.intra_backend, device)
            times[1] = _time_allreduce(4, node.intra, node.intra_backend, device)
        dist.barrier()
        if node.leaders is not None:  # the node leaders' ring (Gloo, as in training)
            times[2] = _time_allreduce(probe_bytes, node.leaders, "gloo", device)
            times[3] = _time_allreduce(4, node.leaders, "gloo", device)
        dist.barrier()
        if dist.get_world_size() > 1:  # one ring over all ranks (what flat trains with)
            times[4] = _time_allreduce(probe_bytes, flat.intra, flat.intra_backend, device)
            times[5] = _time_allreduce(4, flat.intra, flat.intra_backend, device)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # every rank decides on the same numbers
    finally:
        node.destroy()
        flat.destroy()
    link = _link_from_times(times.tolist(), probe_bytes, node.layout, dist.get_world_size())
    size = grad_bytes or float(100 << 20)
    costs = predict_modes(places, size, link)
    return link, costs, _settle_close_calls(trainer, costs, size, record=trial_s)


FLAT_TRIAL_MARGIN = 0.15
"""A hierarchy must beat ``flat``'s trial sync by more than this share to be chosen over it."""


def _settle_close_calls(trainer: Any, costs: dict[str, float], grad_bytes: float, *,
                        margin: float = 4.0, budget_s: float = 0.5, repeats: int = 5,
                        record: dict[str, float] | None = None) -> str:
    """The cost model's pick, or, when other modes are predicted within ``margin`` x of it and
    cheap to try (predicted under ``budget_s``), the fastest of them timed on a real sync.

    The link model ignores per-call software costs (a hierarchy runs three collectives per DDP
    bucket on the sync's Python thread, flat one all-reduce per bucket in DDP's C++), so the
    trial runs exactly those paths, with the training backends on the training device, on a
    gradient-sized buffer cut like DDP's buckets (1 MiB first, then up to 25 MiB).  The modes
    take turns, one sync each per round and each round starting with the next mode, after a
    barrier, so the load drift of a shared machine hits every mode alike (timed one mode after
    the other, a busy second on a 2-core machine picked the wrong layout); the median of
    ``repeats`` rounds counts (one more round opens the connections).  Collective; times are
    MAX-reduced so every rank picks the same.  The trial groups are destroyed.

    ``flat`` wins unless another mode's sync is more than :data:`FLAT_TRIAL_MARGIN` faster: the
    trial times the syncs alone, while in a step flat's all-reduce overlaps backward inside DDP
    and a hierarchy adds a Python communication thread next to autograd.  On the benchmark's
    unshaped link (2 cores, 4 ranks) the trial put ``node`` level with or ahead of ``flat``
    while the steps of ``node`` took 25-40 % longer.
    """
    from hetero_worker.linkcost import FIXED_MODES
    from hetero_worker.sync import WeightedGradSync
    best = min(FIXED_MODES, key=lambda m: (round(costs[m], 9), FIXED_MODES.index(m)))
    close = [m for m in ("flat", "node", "arch") if costs[m] <= margin * costs[best]
             and costs[m] <= budget_s]
    if len(close) < 2:
        return best
    numel = int(min(grad_bytes, 64 << 20) // 4)
    first = min(numel, (1 << 20) // 4)
    sizes = [first] + [min(25 << 18, numel - o) for o in range(first, numel, 25 << 18)]
    trials = []
    try:
        for mode in close:  # collective, same order on every rank
            groups = trainer.build_groups(mode)
            trials.append((groups, WeightedGradSync(groups, [1] * len(trainer.contract.topology))))
        samples: list[list[float]] = [[] for _ in close]
        for round_ in range(repeats + 1):  # round 0 opens the connections
            for i in [(round_ + k) % len(close) for k in range(len(close))]:
                groups, sync = trials[i]
                pieces = [torch.zeros(n, device=trainer.device) for n in sizes if n > 0]
                dist.barrier()
                start = time.perf_counter()
                if groups.layout.is_flat:  # DDP's own all-reduce per bucket, no Python thread
                    for piece in pieces:
                        hierarchical_all_reduce_(piece, groups)
                else:
                    for future in [sync.submit(piece) for piece in pieces]:
                        future.wait()
                if trainer.device.type == "cuda":
                    torch.cuda.synchronize(trainer.device)
                if round_:
                    samples[i].append(time.perf_counter() - start)
    finally:
        for groups, sync in trials:
            sync.close()
            groups.destroy()
    timed = torch.tensor([sorted(x)[len(x) // 2] for x in samples], dtype=torch.float64)
    dist.all_reduce(timed, op=dist.ReduceOp.MAX)
    if record is not None:
        record.update({mode: float(t) for mode, t in zip(close, timed)})
    fastest = int(torch.argmin(timed))
    if "flat" in close and timed[close.index("flat")] <= (1 + FLAT_TRIAL_MARGIN) * timed[fastest]:
        return "flat"
    return close[fastest]


def _time_allreduce(nbytes: int, group: Any, backend: str, device: torch.device,
                    repeats: int = 3) -> float:
    """Best of ``repeats`` SUM all-reduces of ``nbytes`` on ``device`` over ``group`` (seconds),
    the way training runs them (a Gloo group with CUDA tensors goes through a host copy)."""
    t = torch.zeros(max(nbytes // 4, 1), device=device)

    def once() -> None:
        if backend == "gloo" and t.is_cuda:
            host = t.cpu()
            dist.all_reduce(host, group=group)
            t.copy_(host)
        else:
            dist.all_reduce(t, group=group)
        if t.is_cuda:
            torch.cuda.synchronize(t.device)

    once()  # warm-up (connections, NCCL communicator)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        once()
        best = min(best, time.perf_counter() - start)
    return best


def _link_from_times(times: Sequence[float], probe_bytes: int, layout: Any, world: int) -> LinkModel:
    """Bandwidth = ring bytes per rank / (time - latency part); defaults where not measurable.

    ``times``: intra probe, intra 4-byte, leaders probe, leaders 4-byte, world probe, world 4-byte
    (seconds, 0 when not measured).
    """
    def model(total_s: float, small_s: float, n: int, default_bw: float) -> tuple[float, float]:
        if n < 2 or total_s <= 0:
            return default_bw, 20e-6
        latency_s = small_s / (2 * (n - 1))
        transfer_s = max(total_s - small_s, 1e-9)
        return 2 * (n - 1) / n * probe_bytes / transfer_s, latency_s
    node_size = max(len(g) for g in layout.groups)
    intra_bw, intra_lat = model(times[0], times[1], node_size, 10e9)
    inter_bw, inter_lat = model(times[2], times[3], len(layout.groups), intra_bw)
    ring_bw, ring_lat = model(times[4], times[5], world, 0.0)
    return LinkModel(intra_bw_bytes_per_s=intra_bw, inter_bw_bytes_per_s=inter_bw,
                     intra_latency_s=intra_lat, inter_latency_s=inter_lat,
                     ring_bw_bytes_per_s=ring_bw or None, ring_latency_s=ring_lat)
