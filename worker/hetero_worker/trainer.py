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

The Trainer is built from parts that each own their state (:class:`Trainer` wires them): the data
part (:class:`~hetero_worker.loading.TrainData`: the split, the data position, the loader), the
step count (:class:`~hetero_worker.steps.StepCount`), the gradient sync
(:class:`~hetero_worker.comm.sync.WeightedGradSync`, with the process groups), the model part
(:class:`~hetero_worker.memory.wrap.ModelPart`: DDP or sharded wrapping), the stepping part
(:class:`~hetero_worker.stepping.Stepper`, with the efficiency window), the checkpoint manager
(:class:`~hetero_worker.ckpt.trainer_state.Checkpointing`, over the parts as ``Stateful``) and
the graceful stop (:class:`~hetero_worker.stop.GracefulStop`).

Process groups follow the communicator rule (:mod:`hetero_worker.comm.commplan`): the default group
is Gloo only; NCCL only inside a group of one GPU type and PyTorch build; DDP is built on the
plan's DDP group. Speed features compose through :meth:`Trainer.use_speed` (the controller's
``before_wrap`` / ``after_step``), never by replacing the trainer's methods.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hetero_worker import membership, profiling
from hetero_worker.ckpt.trainer_state import Checkpointing
from hetero_worker.comm.commplan import CommRank
from hetero_worker.comm.groups import (ProcessGroups, build_hierarchy_groups, gather_comm_ranks,
                                       warn_mixed_builds)
from hetero_worker.comm.sync import WeightedGradSync
from hetero_worker.efficiency import EfficiencyWindow
from hetero_worker.loading import TrainData
from hetero_worker.memory import caps as memcap
from hetero_worker.memory.wrap import ModelPart
from hetero_worker.partattr import part_attr
from hetero_worker.pipelinepart import PipelinePart
from hetero_worker.precision import PrecisionPolicy, agree_found_inf
from hetero_worker.runtime import rendezvous
from hetero_worker.runtime.nullmetrics import make_metrics
from hetero_worker.runtime.preflight import exit_on_setup_error, preflight
from hetero_worker.runtime.shutdown import leave_process_group
from hetero_worker.runtime.startup import cuda_index, seed_everything, wants_speed_features
from hetero_worker.speed.controller import attach
from hetero_worker.speed.stealing import check_stealable
from hetero_worker.stepping import StepResult, Stepper
from hetero_worker.steps import StepCount
from hetero_worker.stop import GracefulStop
from hetero_worker.tracking import with_tracking
from heterotrain_common import termination
from heterotrain_common.contract import Contract

__all__ = ["StepResult", "Trainer", "exit_on_setup_error", "init", "seed_everything"]


class Trainer:
    """One rank of a heterogeneous data-parallel job. Build it with :func:`init`.

    Args:
        contract: the parsed contract of this rank.
        delay_per_sample_s: simulated seconds per sample at speed 1.0 (None: from env).
        seed: seed of model init (same on every rank) and of the sampler.
        sync_mode: ``"hook"`` (DDP comm hook) or ``"manual"`` (no DDP; one flattened reduction
            right after backward).
        max_grad_norm: clip every step to this 2-norm of the full gradient (every rank, shard and
            group; after the fp16 unscale; :meth:`clip_grad_norm_`); None: no clipping.
        tracking: experiment tracking in the spec's form (``{"wandb": {"project": "p"}}``), over
            ``spec.training.tracking`` per backend (:func:`hetero_worker.tracking.with_tracking`).
        metrics_contract: the contract the metrics name the rank by (an elastic member joining a
            running job: its launch rank; None: ``contract``).

    Attributes:
        global_step: optimizer steps taken (skipped ones included), restored by :meth:`resume`.
        local_batches: the current split, ``len == world_size``.
        data, steps, sync, parts_model, stepper, checkpoints, stop: the parts.
    """

    def __init__(self, contract: Contract, *, delay_per_sample_s: float | None = None,
                 seed: int = 0, sync_mode: str = "hook",
                 max_grad_norm: float | None = None,
                 tracking: Mapping[str, Any] | None = None,
                 metrics_contract: Contract | None = None) -> None:
        if sync_mode not in ("hook", "manual"):
            raise ValueError(f"sync_mode must be 'hook' or 'manual', got {sync_mode!r}")
        self.contract = contract = with_tracking(contract, tracking)
        self.rank = contract.dist.rank
        self.seed = seed
        self.sync_mode = sync_mode
        use_cuda = torch.cuda.is_available() and not contract.device.simulated
        self.device = torch.device(f"cuda:{cuda_index(contract)}" if use_cuda else "cpu")
        self.delay_per_sample_s = (delay_per_sample_s if delay_per_sample_s is not None
                                   else contract.run.sim_delay_per_sample_s)
        self.precision = PrecisionPolicy(precision=contract.precision,
                                         device_type=self.device.type)
        self.comm_ranks: list[CommRank] = gather_comm_ranks(contract.topology, self.device)
        warn_mixed_builds(self.comm_ranks)
        groups = self.build_groups(contract.comm.hierarchy)
        # checkpoints and the stop agreement: their own group and timeout (slow storage)
        self.ckpt_group = (rendezvous.checkpoint_group(contract.checkpoint.timeout_s)
                           if dist.is_initialized() else None)
        # SIGTERM: stop at a step every rank agrees on, with one checkpoint
        self.stop = GracefulStop(self.rank, self.ckpt_group,
                                 termination_grace_s=contract.run.termination_grace_s)
        self.stop.watch(lambda: self.steps.global_step)
        self.membership: Any = None  # elastic jobs: hetero_worker.membership.Membership (init)
        self.metrics = make_metrics(contract if metrics_contract is None else metrics_contract)
        self.profiler = profiling.from_contract(contract, cuda=use_cuda)  # None unless asked
        # The memory model's cap (issue 12): counted when the plan set one, enforced on a
        # simulated device (a real GPU's allocator enforces its own).
        self.memory: memcap.MemoryMeter | None = None
        if contract.memory.cap_bytes:
            self.memory = memcap.MemoryMeter(
                contract.memory.cap_bytes if contract.device.simulated else 0,
                contract.device.product)
        self.steps = StepCount(contract.batch.max_steps)
        self.data = TrainData(contract.local_batches, self.rank, seed=seed, steps=self.steps,
                              metrics=self.metrics)
        self.sync = WeightedGradSync(groups, self.data.local_batches,
                                     on_inter_group_bytes=self.metrics.add_inter_group_bytes)
        self.data.follow_split(self._follow_split)
        # One fp16 rank makes every rank scale (same loss scale in the summed gradients).
        self.scaler = self.precision.make_scaler(
            job_has_fp16=agree_found_inf(contract.precision == "fp16"))
        self.parts_model = ModelPart(contract, device=self.device, sync=self.sync,
                                     sync_mode=sync_mode, comm_ranks=self.comm_ranks,
                                     memory=self.memory)
        self.window = EfficiencyWindow(self.rank, self.metrics,
                                       contract.run.predicted_samples_per_s)
        self.stepper = Stepper(contract, model=self.parts_model, data=self.data, steps=self.steps,
                               sync=self.sync, sync_mode=sync_mode, precision=self.precision,
                               scaler=self.scaler, metrics=self.metrics, window=self.window,
                               memory=self.memory, profiler=self.profiler,
                               delay_per_sample_s=self.delay_per_sample_s,
                               max_grad_norm=max_grad_norm)
        self.checkpoints = Checkpointing(contract, model=self.parts_model, sync=self.sync,
                                         data=self.data, steps=self.steps, scaler=self.scaler,
                                         group=self.ckpt_group, metrics=self.metrics, seed=seed)
        self.metrics.start_server()
        self.pipeline = (PipelinePart(contract, steps=self.steps, metrics=self.metrics, seed=seed)
                         if contract.pipeline.enabled else None)  # issue 30: the rank's stage
        if self.pipeline is not None:  # its loader yields the pipeline's batches; stage checkpoints
            self.data = self.pipeline.data
            self.checkpoints.use_stages(self.pipeline)
        self.metrics.set_local_batch(self.local_batch)

    def _follow_split(self, local_batches: tuple[int, ...]) -> None:
        """What follows the data part's split: the sync's and the sharded sync's weights, the
        rebalancer's current split, the ``htj_local_batch_size`` gauge."""
        self.sync.on_split(local_batches)
        if self.parts_model.shard_sync is not None:
            self.parts_model.shard_sync.on_split(local_batches)
        rebalancer = getattr(self.speed, "rebalancer", None)
        if rebalancer is not None:
            rebalancer.split = list(local_batches)
        self.metrics.set_local_batch(local_batches[self.rank])

    # --- the parts' state, as the Trainer's attributes (each part owns it; read-only unless
    # settable) ----------------------------------------------------------------------------------
    groups = part_attr("sync.groups", "The process groups in use (the gradient sync's).")
    layout = part_attr("sync.groups.layout", "The hierarchy layout in use.")
    local_batches = part_attr("data.local_batches", "The current split (the data part's).")
    local_batch = part_attr("data.local_batch", "This rank's samples per step.")
    sampler = part_attr("data.sampler",
                        "The loader's sampler or stream position (None before :meth:`loader`).")
    epoch = part_attr("data.epoch", "Current epoch of the loader's sampler (0 before :meth:`loader`).")
    global_step = part_attr("steps.global_step", "Optimizer steps taken (skipped ones included).",
                            convert=int)
    max_steps = part_attr("steps.max_steps", "``HTJ_MAX_STEPS`` (``heterotrain run --max-steps``): "
                          "the loader yields no batch once :attr:`global_step` reaches it; None: "
                          "no limit.")
    done = part_attr("steps.done", "True once :attr:`max_steps` steps are taken.")
    model = part_attr("parts_model.model", "What :meth:`wrap` returned (None before).")
    module = part_attr("parts_model.module",
                       "The unwrapped model on the device (None before :meth:`wrap`).")
    shard_sync = part_attr("parts_model.shard_sync",
                           "The Group or Full sharding sync (None unsharded).")
    totals = part_attr("stepper.totals",
                       "Steps, samples, step/compute/wait seconds and skipped steps so far.")
    speed = part_attr("stepper.speed", "The speed controller "
                      "(:func:`hetero_worker.speed.controller.attach`), or None.")
    efficiency_ratio = part_attr("window.ratio",
                                 "Rank 0: the last ``htj_job_efficiency_ratio`` (None before).")
    tracked = part_attr("checkpoints.tracked", "What :meth:`track` registered, by name.")
    before_checkpoint_publish = part_attr(
        "checkpoints.before_publish",
        "Test hook of the sharded save (called on rank 0 before publishing), or None.",
        convert=lambda hook: hook)
    stop_requested = part_attr("stop.stop_requested", "This rank received SIGTERM.")
    stopping = part_attr("stop.stopping", "Every rank agreed to stop after :attr:`stop_step`.")
    stop_step = part_attr("stop.stop_step",
                          "The step every rank agreed to stop after (None before).")
    stop_agreements = part_attr("stop.agreements", "Stop agreements started so far.")

    # --- setup ------------------------------------------------------------------------------
    def build_groups(self, mode: str) -> ProcessGroups:
        """Create the process groups of hierarchy ``mode`` under the communicator rule.

        Collective: every rank calls it with the same ``mode``. The caller owns the result
        (``ProcessGroups.destroy`` when it was only a probe).
        """
        return build_hierarchy_groups(self.contract.topology, self.comm_ranks, self.rank, mode)

    def use_layout(self, mode: str) -> None:
        """Switch to hierarchy ``mode`` before :meth:`wrap` (collective; old groups destroyed)."""
        if self.model is not None:
            raise RuntimeError("use_layout() must run before wrap()")
        if mode == self.layout.mode:
            return
        old = self.sync.groups
        self.sync.set_groups(self.build_groups(mode))
        old.destroy()

    def use_speed(self, controller: Any) -> None:
        """Compose a speed controller (``before_wrap``, ``after_step``; ``speed.controller.attach``)."""
        if self.model is not None:
            raise RuntimeError("use_speed() must run before wrap()")
        self.stepper.speed = controller

    def epochs(self, default: int) -> int:
        """Epochs to train: ``HTJ_EPOCHS`` (``heterotrain run --epochs``), else ``default``."""
        epochs = self.contract.batch.epochs
        return epochs if epochs is not None else int(default)

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
        if self.pipeline is not None:  # the rank's stage of the nn.Sequential
            return self.pipeline.wrap(model)
        return self.parts_model.wrap(
            model, block, local_batches=self.local_batches, has_scaler=self.scaler is not None,
            use_layout=self.use_layout,
            before_wrap=self.speed.before_wrap if self.speed is not None else None)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's full parameters by name (collective under ``Full`` sharding, where
        ``model.parameters()`` are this rank's flat slices; else the module's own)."""
        return self.parts_model.full_state_dict()

    def to_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` on this rank's device."""
        return tensor.to(self.device, non_blocking=True)

    def loader(self, dataset: Any, **kwargs: Any) -> Any:
        """A ``DataLoader`` over this rank's uneven batches: :meth:`hetero_worker.loading.TrainData.loader`
        (same arguments: ``shuffle``, ``collate_fn``, ``epochs``, ``num_workers``, ``pin_memory``,
        ``prefetch_factor``, ``worker_init_fn`` and PyTorch's other ``DataLoader`` arguments;
        the refused ones are :data:`hetero_worker.loading.REFUSED_ARGS`)."""
        return self.data.loader(dataset, **kwargs)

    def set_split(self, local_batches: Sequence[int], *, rebalance: bool = True) -> None:
        """Change the batch split at a step boundary (same call on every rank).

        The data part's position holds the split; the weights of the gradient sync (and of the
        sharded sync), the sampler's slices, the rebalancer's current split and the
        ``htj_local_batch_size`` gauge all follow it.

        Args:
            local_batches: samples per step of every rank, in rank order.
            rebalance: count it in ``htj_rebalances_total``; False for a split restored from a
                checkpoint, which continues the saved run rather than rebalancing it.

        Raises:
            ValueError: a batch below 1, or a split the sampler refuses.
        """
        self.data.position.set_split(local_batches)
        if rebalance:
            self.metrics.record_rebalance()

    # --- training ---------------------------------------------------------------------------
    def step(self, optimizer: torch.optim.Optimizer,
             loss_fn: Callable[..., torch.Tensor], *,
             batch: Sequence[Any] | None = None, num_tokens: Any = None) -> StepResult:
        """One optimizer step on every rank.

        Args:
            optimizer: over the wrapped model's parameters.
            loss_fn: ``loss_fn(model)`` returns this rank's *mean* loss over its local batch
                (a scalar tensor); with ``batch``, ``loss_fn(model, *micro_batch)`` returns the
                mean loss over that micro-batch. It runs under the rank's autocast.
            batch: the local batch's tensors (samples along dim 0); given, the step runs it in
                micro-batches of at most ``HTJ_MICRO_BATCH_SIZE`` samples with gradient
                accumulation and one synchronisation (:mod:`hetero_worker.memory.microbatch`).
            num_tokens: the loss is a mean over valid tokens (e.g. ``ignore_index=-100``): this
                rank's count (with ``batch``: each sample's, a 1-D tensor); the update is then the
                mean over every valid token of the job's batch (:mod:`hetero_worker.comm.tokens`;
                one all-reduce; give it on every rank or on none).

        Under a pipeline (``HTJ_PIPELINE_*``) ``loss_fn(output, target)`` runs per micro-batch on
        the last stage and ``batch`` is ``(inputs, target)`` from :meth:`loader`
        (:mod:`hetero_worker.pipelinepart`).

        Returns:
            The :class:`StepResult`.

        Raises:
            RuntimeError: no model yet, or the plan needs micro-batches and ``batch`` is missing.
            torch.OutOfMemoryError: a simulated device's memory cap was exceeded
                (:mod:`hetero_worker.memory.caps`).
        """
        if self.pipeline is not None:  # loss_fn(output, target), batch=(inputs, target)
            return self._step(optimizer, loss_fn, batch, num_tokens)
        if self.model is None:
            raise RuntimeError("call Trainer.wrap(model) before step()")
        if self.membership is not None:  # elastic: a lost rank shrinks the job, the step is redone
            return self.membership.guarded_step(
                self, optimizer, lambda: self._step(optimizer, loss_fn, batch, num_tokens))
        return self._step(optimizer, loss_fn, batch, num_tokens)

    def _step(self, optimizer: torch.optim.Optimizer, loss_fn: Callable[..., torch.Tensor],
              batch: Sequence[Any] | None, num_tokens: Any) -> StepResult:
        """:meth:`step` after its checks: the step (the pipeline's or stepper's) and the stop agreement."""
        self.stop.begin(self.global_step)  # overlaps the step; answered at its end
        result = (self.stepper.staged(self.pipeline, optimizer, loss_fn, batch) if self.pipeline
                  else self.stepper.step(optimizer, loss_fn, batch, num_tokens))
        self.stop.end(self.global_step)
        if self.stopping:  # SIGTERM somewhere: one checkpoint at this step, exit 75 on every rank
            self.stop_now(optimizer)
        return result

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip the gradients to the global 2-norm ``max_norm`` (every shard and group, each
        element once; collective): for an optimizer step pre-hook, which runs after the sync and
        the fp16 unscale. Returns the norm before clipping (:mod:`hetero_worker.comm.clipping`)."""
        return self.stepper.clip_grad_norm_(max_norm)

    def steal_step(self, optimizer: torch.optim.Optimizer, dispenser: Any,
                   loss_sum_fn: Callable[[torch.nn.Module, list[int]], torch.Tensor]) -> Any:
        """One work-stealing optimizer step: :meth:`hetero_worker.stepping.Stepper.steal_step`
        (the arguments, result and errors are described there). Call :meth:`wrap` and
        :meth:`loader` first."""
        check_stealable(self.sampler, self.module)  # before any collective
        return self.stepper.steal_step(optimizer, dispenser, loss_sum_fn)

    def rank_summary(self) -> dict[str, Any]:
        """This rank's totals: device, batch, samples/s, share of step time spent waiting."""
        return self.stepper.rank_summary()

    def gather_summaries(self) -> list[dict[str, Any]]:
        """Every rank's :meth:`rank_summary`, ordered by rank (collective)."""
        return self.stepper.gather_summaries()

    # --- checkpoints ------------------------------------------------------------------------
    def track(self, name: str, obj: Any) -> Any:
        """Save ``obj``'s state in every checkpoint and restore it in :meth:`resume`
        (:meth:`hetero_worker.ckpt.trainer_state.Checkpointing.track`: an object with
        ``state_dict()`` / ``load_state_dict(state)``, e.g. ``t.track("lr", LambdaLR(opt, f))``;
        call it on every rank, before :meth:`resume`). Returns ``obj``."""
        return self.checkpoints.track(name, obj)

    def save_checkpoint(self, optimizer: torch.optim.Optimizer,
                        directory: str | None = None) -> str:
        """Write a checkpoint (collective; rank 0 writes atomically). Returns its path.

        Holds model, optimizer, scaler, the job's global data position, the plan, per-rank
        RNG and compression state (:mod:`hetero_worker.ckpt.resume`) and what :meth:`track`
        registered."""
        return self.checkpoints.save(optimizer, directory)

    def maybe_checkpoint(self, optimizer: torch.optim.Optimizer,
                         every_steps: int | None = None) -> bool:
        """Checkpoint when :attr:`global_step` is a multiple of the interval; True if saved.

        Args:
            optimizer: saved with the model.
            every_steps: interval; None uses ``HTJ_CHECKPOINT_INTERVAL_STEPS`` (default
                :data:`heterotrain_common.defaults.CHECKPOINT_INTERVAL_STEPS`) when
                ``HTJ_CHECKPOINT_DIR`` is set, and never saves without a directory; 0 never saves.

        A failed save is a warning and ``htj_checkpoint_save_failures_total``, tried again at the
        next interval (False); ``HTJ_CHECKPOINT_MAX_FAILURES`` failures in a row raise
        :class:`~hetero_worker.ckpt.saving.CheckpointSaveError` on every rank
        (:mod:`hetero_worker.ckpt.saving`).
        """
        return self.checkpoints.maybe_save(optimizer, every_steps)

    def resume(self, optimizer: torch.optim.Optimizer, directory: str | None = None) -> bool:
        """Restore the latest checkpoint if there is one; True when resumed (collective).

        The ranks agree on the newest checkpoint every one of them can read (an unreadable
        newest one is passed over on every rank, and rank 0 says so); a rank with no usable
        checkpoint while others have one makes every rank raise
        :class:`~hetero_worker.ckpt.agreement.ResumeDisagreement`. Under the same plan the split, RNG
        and compression state continue exactly; under a new plan (another world size or split)
        the data continue from the global position with fresh RNG
        (:meth:`hetero_worker.ckpt.trainer_state.Checkpointing.resume_from`). What :meth:`track`
        registered gets its saved state back. Call it after :meth:`wrap`, :meth:`loader` and
        :meth:`track`, before the first step.
        """
        if self.membership is not None and self.membership.joining is not None:
            return False  # joining a running elastic job: its state comes from a peer
        return self.checkpoints.resume(optimizer, directory)

    def stop_now(self, optimizer: torch.optim.Optimizer) -> None:
        """Write the stop checkpoint (with a checkpoint directory), leave the group, exit 75.

        Collective: every rank calls it after the same step (when :attr:`stopping` is set).
        """
        save = (lambda: self.save_checkpoint(optimizer)) if self.contract.checkpoint.dir else None
        self.stop.exit(self.global_step, save=save, close=self.close)

    def close(self) -> None:
        """Flush metrics, write a profiler trace still open, and leave the process group.

        Rank 0 records the job's last step, planned steps and loss in its termination message
        (in a pod: the operator's ``status.result`` and final ``status.progress``;
        :mod:`heterotrain_common.termination`)."""
        if self.profiler is not None:
            self.profiler.close()
        self.metrics.update_device()
        self.metrics.flush()
        if self.rank == 0:
            stats = self.metrics.stats()
            termination.record({"step": self.global_step, "totalSteps": stats.get("total_steps"),
                                "loss": stats.get("loss")})
        self.metrics.stop_server()
        if self.stepper.tracker is not None:
            self.stepper.tracker.close()
        self.sync.close()
        if dist.is_initialized():
            self.window.finish(wait=True)
        leave_process_group()  # together, and without torch 2.13's Gloo exit abort


def init(environ: Mapping[str, str] | None = None, *, seed: int = 0,
         delay_per_sample_s: float | None = None, sync_mode: str = "hook",
         rendezvous_timeout_s: float | None = None,
         max_grad_norm: float | None = None,
         tracking: Mapping[str, Any] | None = None) -> Trainer:
    """Parse the contract, join the job and build the :class:`Trainer`.

    Args:
        environ: defaults to ``os.environ``.
        seed: model-init and sampler seed (same on every rank).
        delay_per_sample_s: simulated seconds per sample (None: ``HTJ_SIM_DELAY_PER_SAMPLE_S``).
        sync_mode: ``"hook"`` or ``"manual"``.
        rendezvous_timeout_s: None reads ``HTJ_RENDEZVOUS_TIMEOUT_S`` (default 600 s).
        max_grad_norm: see :class:`Trainer` (None: no clipping).
        tracking: see :class:`Trainer` (None: the spec's ``spec.training.tracking`` only).

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
    # spec.elastic: through the supervisor's store; else rank 0's (Gloo only)
    elastic = membership.join_job(env, contract, rendezvous_timeout_s=rendezvous_timeout_s)
    seed_everything(seed)
    trainer = Trainer(elastic.trainer_contract(contract) if elastic else contract,
                      delay_per_sample_s=delay_per_sample_s, seed=seed, sync_mode=sync_mode,
                      max_grad_norm=max_grad_norm, tracking=tracking, metrics_contract=contract)
    if elastic is not None:
        elastic.attach(trainer)
    if wants_speed_features(contract) and sync_mode == "hook":
        attach(trainer)
    return trainer
