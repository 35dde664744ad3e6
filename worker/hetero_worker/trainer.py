"""The user-facing training API: one object that turns a script into a heterogeneous DDP rank.

Example (the whole surface; see docs/worker.md)::

    from hetero_worker import trainer as ht
    t = ht.init()                                    # contract from env, rendezvous, groups
    model = t.wrap(Net())                            # DDP + weighted hierarchical comm hook
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    loader = t.loader(dataset)                       # this rank's uneven batches
    t.resume(opt)                                    # no-op without a checkpoint
    while t.epoch < epochs:
        for x, y in loader:
            t.step(opt, lambda m: F.cross_entropy(m(t.to_device(x)), t.to_device(y)))
            t.maybe_checkpoint(opt)                  # every HTJ_CHECKPOINT_INTERVAL_STEPS
    t.close()

``step`` runs forward and loss under the rank's autocast precision, backward (gradients are
weighted by ``local_batch / global_batch`` and summed hierarchically inside backward), the
fp16 scaler with cross-rank skip agreement, the optimizer step, and records step / compute /
communication-wait time, samples and loss to the rank's metrics.

Process groups follow the communicator rule (:mod:`hetero_worker.comm.commplan`): the default group
is Gloo only; NCCL only inside a group of one GPU type and PyTorch build; DDP is built on the
plan's DDP group. Speed features compose through :meth:`Trainer.use_speed` (the controller's
``before_wrap`` / ``after_step``), never by replacing the trainer's methods.
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from hetero_worker import profiling
from hetero_worker.ckpt.trainer_state import Checkpointing
from hetero_worker.comm.collectives import broadcast_from_rank0_
from hetero_worker.comm.commplan import CommRank, plan_communicators
from hetero_worker.comm.groups import ProcessGroups, build_process_groups, gather_comm_ranks
from hetero_worker.comm.sync import WeightedGradSync
from hetero_worker.efficiency import EfficiencyWindow
from hetero_worker.loading import Loading
from hetero_worker.memory import caps as memcap
from hetero_worker.memory import full as fullshard
from hetero_worker.memory import group as sharding
from hetero_worker.memory import microbatch
from hetero_worker.memory.batchnorm import check_norm_layers
from hetero_worker.memory.wrap import ShardedWrapping
from hetero_worker.precision import PrecisionPolicy, agree_found_inf
from hetero_worker.runtime import rendezvous
from hetero_worker.runtime.preemption import GracefulStop
from hetero_worker.runtime.preflight import exit_on_setup_error, preflight
from hetero_worker.runtime.shutdown import leave_process_group
from hetero_worker.runtime.simulation import simulate_compute
from hetero_worker.runtime.startup import cuda_index, seed_everything, wants_speed_features
from hetero_worker.sampler import HeteroBatchSampler
from hetero_worker.speed.controller import attach
from hetero_worker.speed.stealing import WorkStealing
from hetero_worker.stepping import StepResult, Stepping
from heterotrain_common.contract import Contract
from heterotrain_common.topology import build_layout

__all__ = ["StepResult", "Trainer", "exit_on_setup_error", "init", "seed_everything"]


class _NullMetrics:
    """Stands in for ``hetero_worker.metrics.WorkerMetrics`` when it is unavailable."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def _make_metrics(contract: Contract) -> Any:
    try:
        from hetero_worker.metrics import WorkerMetrics  # prometheus-client absent: no metrics
    except ImportError:
        return _NullMetrics()
    return WorkerMetrics(contract)


class Trainer(Loading, Stepping, ShardedWrapping, WorkStealing, EfficiencyWindow, Checkpointing,
              GracefulStop):
    """One rank of a heterogeneous data-parallel job. Build it with :func:`init`.

    Args:
        contract: the parsed contract of this rank.
        delay_per_sample_s: simulated seconds per sample at speed 1.0 (None: from env).
        seed: seed of model init (same on every rank) and of the sampler.
        sync_mode: ``"hook"`` (DDP comm hook) or ``"manual"`` (no DDP; one flattened reduction
            right after backward).

    Attributes:
        global_step: optimizer steps taken (skipped ones included), restored by :meth:`resume`.
        local_batches: the current split, ``len == world_size``.
    """

    def __init__(self, contract: Contract, *, delay_per_sample_s: float | None = None,
                 seed: int = 0, sync_mode: str = "hook") -> None:
        if sync_mode not in ("hook", "manual"):
            raise ValueError(f"sync_mode must be 'hook' or 'manual', got {sync_mode!r}")
        self.contract = contract
        self.rank = contract.dist.rank
        self.seed = seed
        self.sync_mode = sync_mode
        self.speed: Any = None  # hetero_worker.speed.controller.SpeedController when init() attached one
        use_cuda = torch.cuda.is_available() and not contract.device.simulated
        self.device = torch.device(f"cuda:{cuda_index(contract)}" if use_cuda else "cpu")
        self.delay_per_sample_s = (delay_per_sample_s if delay_per_sample_s is not None
                                   else contract.run.sim_delay_per_sample_s)
        self.precision = PrecisionPolicy(precision=contract.precision,
                                         device_type=self.device.type)
        self.local_batches = list(contract.local_batches)
        self.comm_ranks: list[CommRank] = gather_comm_ranks(contract.topology, self.device)
        builds = sorted({r.torch_build for r in self.comm_ranks})
        if len(builds) > 1:
            warnings.warn(f"ranks run different PyTorch builds ({', '.join(builds)}); groups that "
                          "would cross them use Gloo (plan one build per job)", stacklevel=2)
        self.groups = self.build_groups(contract.comm.hierarchy)
        self.layout = self.groups.layout
        # checkpoints and the stop agreement: their own group and timeout (slow storage)
        self.ckpt_group = (rendezvous.checkpoint_group(contract.checkpoint.timeout_s)
                           if dist.is_initialized() else None)
        self._init_stop()  # SIGTERM: stop at a step every rank agrees on, with one checkpoint
        self.metrics = _make_metrics(contract)
        self.profiler = profiling.from_contract(contract, cuda=use_cuda)  # None unless asked
        # The memory model's cap (issue 12): counted when the plan set one, enforced on a
        # simulated device (a real GPU's allocator enforces its own).
        self.memory: memcap.MemoryMeter | None = None
        # HTJ_SHARDING=group / full after wrap()
        self.shard_sync: sharding.GroupShardSync | fullshard.FullShardSync | None = None
        if contract.memory.cap_bytes:
            self.memory = memcap.MemoryMeter(
                contract.memory.cap_bytes if contract.device.simulated else 0,
                contract.device.product)
        self.sync = WeightedGradSync(self.groups, self.local_batches,
                                     on_inter_group_bytes=self.metrics.add_inter_group_bytes)
        # One fp16 rank makes every rank scale (same loss scale in the summed gradients).
        self.scaler = self.precision.make_scaler(
            job_has_fp16=agree_found_inf(contract.precision == "fp16"))
        self.sampler: HeteroBatchSampler | None = None
        self.model: torch.nn.Module | None = None
        self.module: torch.nn.Module | None = None
        self.global_step = 0
        self.totals = {"steps": 0, "samples": 0, "step_s": 0.0, "compute_s": 0.0,
                       "comm_wait_s": 0.0, "skipped": 0}
        self.efficiency_ratio: float | None = None  # rank 0: the last htj_job_efficiency_ratio
        self._window: dict[str, Any] = {"start": None, "samples": 0, "compute_s": 0.0}
        self._efficiency_pending: tuple[Any, torch.Tensor, float] | None = None  # async reduce
        self.metrics.start_server()
        self.metrics.set_local_batch(self.local_batches[self.rank])

    # --- setup ------------------------------------------------------------------------------
    def build_groups(self, mode: str) -> ProcessGroups:
        """Create the process groups of hierarchy ``mode`` under the communicator rule.

        Collective: every rank calls it with the same ``mode``. The caller owns the result
        (``ProcessGroups.destroy`` when it was only a probe).
        """
        layout = build_layout(self.contract.topology, mode)
        plan = plan_communicators(self.comm_ranks, layout)
        return build_process_groups(plan, self.rank,
                                    topology_group_of=[e.group for e in self.contract.topology])

    def use_layout(self, mode: str) -> None:
        """Switch to hierarchy ``mode`` before :meth:`wrap` (collective); the old groups are
        destroyed."""
        if self.model is not None:
            raise RuntimeError("use_layout() must run before wrap()")
        if mode == self.layout.mode:
            return
        old, self.groups = self.groups, self.build_groups(mode)
        self.layout = self.groups.layout
        self.sync.set_groups(self.groups)
        old.destroy()

    def use_speed(self, controller: Any) -> None:
        """Compose a speed controller (``before_wrap(model)``, ``after_step(compute_s, batch)``;
        :func:`hetero_worker.speed.controller.attach` calls this)."""
        if self.model is not None:
            raise RuntimeError("use_speed() must run before wrap()")
        self.speed = controller

    @property
    def local_batch(self) -> int:
        """This rank's samples per step."""
        return self.local_batches[self.rank]

    @property
    def epoch(self) -> int:
        """Current epoch of the loader's sampler (0 before :meth:`loader`)."""
        return self.sampler.epoch if self.sampler is not None else 0

    @property
    def max_steps(self) -> int | None:
        """``HTJ_MAX_STEPS`` (``heterotrain run --max-steps``): the loader yields no batch once
        :attr:`global_step` reaches it; None: no limit."""
        return self.contract.batch.max_steps

    def epochs(self, default: int) -> int:
        """Epochs to train: ``HTJ_EPOCHS`` (``heterotrain run --epochs``) when set, else
        ``default`` (the script's own number)."""
        epochs = self.contract.batch.epochs
        return epochs if epochs is not None else int(default)

    @property
    def done(self) -> bool:
        """True once :attr:`max_steps` steps are taken."""
        return self.max_steps is not None and self.global_step >= self.max_steps

    def wrap(self, model: torch.nn.Module, *,
             block: type[torch.nn.Module] | None = None) -> torch.nn.Module:
        """Move ``model`` to the rank's device and make it data-parallel.

        In ``hook`` mode returns a ``DistributedDataParallel`` whose communication hook is the
        weighted hierarchical sum (:mod:`hetero_worker.comm.sync`); in ``manual`` mode returns the
        model itself after broadcasting rank 0's parameters.

        Args:
            model: the user's model.
            block: the model's repeated block class (e.g. a transformer layer); where the plan
                turns activation checkpointing on (``HTJ_ACTIVATION_CHECKPOINTING=1``) each
                instance recomputes its activations in backward (:mod:`hetero_worker.memory.microbatch`);
                under sharding it is the unit gathered and freed (``HTJ_SHARDING=full``: each
                instance is gathered for its forward and recomputed in backward,
                :mod:`hetero_worker.memory.full`).

        Raises:
            RuntimeError: the plan needs activation checkpointing and no ``block`` was named.
        """
        if self.contract.memory.activation_checkpointing:
            if block is None:
                raise RuntimeError("the plan turns activation checkpointing on for this rank "
                                   "(HTJ_ACTIVATION_CHECKPOINTING=1): name the model's block class, "
                                   "t.wrap(model, block=MyBlock)")
            if self.contract.memory.sharding != "full":  # Full recomputes every block already
                microbatch.checkpoint_blocks(model, block)
        check_norm_layers(model, rank=self.rank, local_batch=self.local_batch,
                          micro_batch_size=self.contract.memory.micro_batch_size)  # case 57
        if self.speed is not None:
            self.speed.before_wrap(model)  # e.g. hierarchy auto: measure, then use_layout
        if self.contract.memory.sharding != "none":
            return self._wrap_sharded(model, block)
        self.module = model.to(self.device)
        if self.memory is not None:  # parameters from the start; gradients, optimizer state later
            self.memory.set_state(self.module.parameters(), None)
        if self.sync_mode == "manual":
            for tensor in self.module.state_dict().values():  # over the Gloo world group
                broadcast_from_rank0_(tensor)
            self.model = self.module
            return self.model
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        # DDP's start-up check and broadcast (and the flat fast path) run on a group that obeys
        # the communicator rule: the flat NCCL group of a one-type job, else the Gloo world.
        ddp = DistributedDataParallel(self.module, device_ids=device_ids,
                                      process_group=self.groups.ddp_group,
                                      **self.sync.ddp_options())  # bucket views, bucket cap
        self.sync.register(ddp)  # "backward compute done" is marked by _backward (watch_backward)
        self.model = ddp
        return ddp

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's full parameters by name (collective under ``Full`` sharding, where
        ``model.parameters()`` are this rank's flat slices; else the module's own)."""
        if isinstance(self.shard_sync, fullshard.FullShardSync):
            return self.shard_sync.full_state_dict()
        if self.module is None:
            raise RuntimeError("call Trainer.wrap(model) first")
        return {k: v.detach() for k, v in self.module.named_parameters()}

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on this rank's device."""
        return tensor.to(self.device, non_blocking=True)

    def set_split(self, local_batches: Sequence[int], *, rebalance: bool = True) -> None:
        """Change the batch split at a step boundary (same call on every rank).

        The one place a split changes: the weights of the gradient sync (and of the sharded sync),
        the sampler's slices, the rebalancer's current split and the ``htj_local_batch_size``
        gauge all follow.

        Args:
            local_batches: samples per step of every rank, in rank order.
            rebalance: count it in ``htj_rebalances_total``; False for a split restored from a
                checkpoint, which continues the saved run rather than rebalancing it.
        """
        self.local_batches = [int(b) for b in local_batches]
        self.sync.set_split(self.local_batches)
        if self.shard_sync is not None:
            self.shard_sync.set_split(self.local_batches)
        if self.sampler is not None:
            self.sampler.set_split(self.local_batches)
        rebalancer = getattr(self.speed, "rebalancer", None)
        if rebalancer is not None:
            rebalancer.split = list(self.local_batches)
        self.metrics.set_local_batch(self.local_batch)
        if rebalance:
            self.metrics.record_rebalance()

    # --- training ---------------------------------------------------------------------------
    def step(self, optimizer: torch.optim.Optimizer,
             loss_fn: Callable[..., torch.Tensor], *,
             batch: Sequence[Any] | None = None) -> StepResult:
        """One optimizer step on every rank.

        Args:
            optimizer: over the wrapped model's parameters.
            loss_fn: ``loss_fn(model)`` returns this rank's *mean* loss over its local batch
                (a scalar tensor); with ``batch``, ``loss_fn(model, *micro_batch)`` returns the
                mean loss over that micro-batch. It runs under the rank's autocast.
            batch: the local batch's tensors (samples along dim 0); given, the step runs it in
                micro-batches of at most ``HTJ_MICRO_BATCH_SIZE`` samples with gradient
                accumulation and one synchronisation (:mod:`hetero_worker.memory.microbatch`).

        Returns:
            The :class:`StepResult`.

        Raises:
            RuntimeError: no model yet, or the plan needs micro-batches and ``batch`` is missing.
            torch.OutOfMemoryError: a simulated device's memory cap was exceeded
                (:mod:`hetero_worker.memory.caps`).
        """
        if self.model is None:
            raise RuntimeError("call Trainer.wrap(model) before step()")
        self._begin_stop_agreement()  # overlaps the step; answered at its end
        local = self.local_batch  # a split change decided after this step applies to the next
        if self.profiler is not None:
            self.profiler.before_step(self.global_step + 1)
        start = time.perf_counter()
        if self._window["start"] is None:
            self._window["start"] = start
        optimizer.zero_grad(set_to_none=True)
        simulate_compute(self.contract.device, self.local_batch, self.delay_per_sample_s)
        micro = self.contract.memory.micro_batch_size
        around = self.memory.micro_batch if self.memory is not None else None
        if batch is None:
            if 0 < micro < local:
                raise RuntimeError(
                    f"the plan runs this rank's {local} samples as micro-batches of {micro} "
                    "(HTJ_MICRO_BATCH_SIZE: they do not fit its memory at once): pass the batch, "
                    "t.step(opt, lambda m, x, y: loss(m(x), y), batch=(x, y))")
            with around() if around else contextlib.nullcontext():
                with self.precision.autocast():
                    loss = loss_fn(self.model)
                self._backward(loss)
        else:
            count = None
            if self.shard_sync is not None:  # ranks that share collectives run equally many
                count = self.shard_sync.micro_count(micro)
            loss = microbatch.accumulate(self.model, loss_fn, batch, micro,
                                         autocast=self.precision.autocast,
                                         backward=self._backward, around_micro=around, count=count)
        self.sync.end_of_backward()
        if self.shard_sync is not None:  # Group: the one cross-group reduction (Full: bookkeeping)
            self.shard_sync.reduce(list(self.module.parameters()))
            self.sync.add_comm_s(self.shard_sync.take_comm_s())
            self.metrics.add_inter_group_bytes(self.shard_sync.inter_group_bytes)
            self.shard_sync.inter_group_bytes = 0
        elif self.sync_mode == "manual":
            self.sync.sync_after_backward(self.model.parameters())
        skipped = self._optimizer_step(optimizer)
        if self.memory is not None:
            self.memory.set_state(self.module.parameters(), optimizer)
            self.metrics.set_memory_peak(self.memory.peak_bytes, self.memory.cap_bytes)
        step_s = time.perf_counter() - start
        result = self._record(loss.detach().float().item(), skipped, step_s)
        if self.speed is not None:
            self.speed.after_step(result.compute_s, local)
        if self.profiler is not None:
            self.profiler.after_step(self.global_step)
        self._end_stop_agreement()
        if self.stopping:  # SIGTERM somewhere: one checkpoint at this step, exit 75 on every rank
            self.stop_now(optimizer)
        return result

    def close(self) -> None:
        """Flush metrics, write a profiler trace still open, and leave the process group."""
        if self.profiler is not None:
            self.profiler.close()
        self.metrics.update_device()
        self.metrics.flush()
        self.metrics.stop_server()
        self.sync.close()
        if dist.is_initialized():
            self._finish_efficiency(wait=True)
        leave_process_group()  # together, and without torch 2.13's Gloo exit abort


def init(environ: Mapping[str, str] | None = None, *, seed: int = 0,
         delay_per_sample_s: float | None = None, sync_mode: str = "hook",
         rendezvous_timeout_s: float | None = None) -> Trainer:
    """Parse the contract, join the job and build the :class:`Trainer`.

    Args:
        environ: defaults to ``os.environ``.
        seed: model-init and sampler seed (same on every rank).
        delay_per_sample_s: simulated seconds per sample (None: ``HTJ_SIM_DELAY_PER_SAMPLE_S``).
        sync_mode: ``"hook"`` or ``"manual"``.
        rendezvous_timeout_s: None reads ``HTJ_RENDEZVOUS_TIMEOUT_S`` (default 600 s).

    Raises:
        ContractError: a contract variable is missing, malformed or inconsistent.
        RendezvousTimeout: rank 0 did not become reachable in time.
    """
    env = os.environ if environ is None else environ
    contract = preflight(env)
    if delay_per_sample_s is None:
        delay_per_sample_s = contract.run.sim_delay_per_sample_s
    if rendezvous_timeout_s is None:
        rendezvous_timeout_s = contract.comm.rendezvous_timeout_s
    use_cuda = torch.cuda.is_available() and not contract.device.simulated
    if use_cuda:
        torch.cuda.set_device(cuda_index(contract))
    where = contract.dist
    rendezvous.init_distributed(  # Gloo only: never a world-wide NCCL communicator
        rank=where.rank, world_size=where.world_size, master_addr=where.master_addr,
        master_port=where.master_port, backend="gloo", timeout_s=rendezvous_timeout_s,
        collective_timeout_s=contract.comm.collective_timeout_s)
    seed_everything(seed)
    trainer = Trainer(contract, delay_per_sample_s=delay_per_sample_s, seed=seed,
                      sync_mode=sync_mode)
    if wants_speed_features(contract) and sync_mode == "hook":
        attach(trainer)
    return trainer
