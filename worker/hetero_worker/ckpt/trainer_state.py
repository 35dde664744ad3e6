"""The Trainer's checkpoint manager (:class:`Checkpointing`): save, save every N steps, resume,
over the Trainer's parts seen as ``Stateful`` (``state_dict`` / ``load_state_dict``):

* the model and the optimizer (plain ``state_dict``, or DCP shards under Group sharding,
  :mod:`hetero_worker.ckpt.sharded`), the loss scaler;
* the data part's position (:class:`hetero_worker.loading.TrainData`, its sampler's global
  position) and the step count;
* the codec states (:class:`hetero_worker.ckpt.resume.CodecStates`) and the objects ``track``
  registered (:mod:`hetero_worker.ckpt.tracked`).

Under a pipeline (:meth:`Checkpointing.use_stages`) the model and optimizer are the rank's stage's,
saved once per stage and resumed per stage (:mod:`hetero_worker.ckpt.stagestate`); the rest is
saved and restored the same way.

The file's format and the same-plan / new-plan rules are :mod:`hetero_worker.ckpt.checkpoint`'s
and :mod:`hetero_worker.ckpt.resume`'s."""

from __future__ import annotations

from typing import Any

import torch

from hetero_worker.ckpt import checkpoint, saving, stagestate, store, tracked
from hetero_worker.ckpt.ownership import Owner, ResumeFilter
from hetero_worker.ckpt.pieces import held_pieces, persistent_buffers
from hetero_worker.ckpt.resume import CodecStates, plan_of, restore_compression
from hetero_worker.comm.sync import WeightedGradSync
from hetero_worker.loading import TrainData
from hetero_worker.memory.wrap import ModelPart
from hetero_worker.runtime.ranklog import log
from hetero_worker.steps import StepCount
from heterotrain_common.contract import Contract

__all__ = ["Checkpointing", "resume_trainer"]


class Checkpointing:
    """Checkpoints of one rank's training parts (build it from the parts; the Trainer does).

    Args:
        contract: the rank's contract (``checkpoint`` settings, sharding, topology, owner).
        model: the model part (module, sharded sync).
        sync: the gradient sync (its groups: layout, the writing group; its codec reducer).
        data: the data part (split, data position).
        steps: the step count (saved as ``step``, restored on resume).
        scaler: the loss scaler (None: none).
        group: the checkpoint process group (None: the default group).
        metrics: the rank's metrics (resume step, fallbacks, save failures).
        seed: the job seed (fresh RNG under a new plan).

    Attributes:
        tracked: what :meth:`track` registered, by name.
        before_publish: test hook of the sharded save (called on rank 0 before publishing).
    """

    def __init__(self, contract: Contract, *, model: ModelPart, sync: WeightedGradSync,
                 data: TrainData, steps: StepCount, scaler: Any, group: Any, metrics: Any,
                 seed: int) -> None:
        self.contract, self.model, self.sync, self.data, self.steps = contract, model, sync, data, steps
        self.scaler, self.group, self.metrics, self.seed = scaler, group, metrics, seed
        self.rank = contract.dist.rank
        self.codecs = CodecStates(sync)
        self.tracked: dict[str, Any] = {}
        self.before_publish: Any = None
        self.periodic = saving.PeriodicSaves(max_failures=contract.checkpoint.max_failures,
                                             rank=self.rank, metrics=metrics)
        self._resume_called = False
        self.stages: Any = None

    def use_stages(self, part: Any) -> None:
        """Save and resume a pipelined rank's stage (:mod:`hetero_worker.ckpt.stagestate`).

        Args:
            part: the Trainer's :class:`hetero_worker.pipelinepart.PipelinePart` (its ``module``,
                ``stage``, ``replica``, ``data`` and the contract's stage cut).
        """
        self.stages = part
        self.data = part.data  # the pipeline's batches and data position

    @property
    def module(self) -> torch.nn.Module | None:
        """The unwrapped model (None before ``wrap``); a pipelined rank's stage module."""
        if self.stages is not None:
            return self.stages.module
        return self.model.module

    def plan(self) -> dict[str, Any]:
        """The plan the rank runs under now (:func:`hetero_worker.ckpt.resume.plan_of`)."""
        return plan_of(self.contract, self.data.local_batches, self.sync.groups.layout,
                       self.codecs.settings())

    def owner(self) -> Owner:
        """The job UID and restart generation the manifest records
        (:mod:`hetero_worker.ckpt.ownership`)."""
        return Owner(job_uid=self.contract.dist.job_uid,
                     generation=self.contract.dist.restart_generation,
                     job_name=self.contract.dist.job_name)

    def track(self, name: str, obj: Any) -> Any:
        """Save ``obj``'s state in every checkpoint and restore it in :meth:`resume`.

        ``obj`` has ``state_dict()`` and ``load_state_dict(state)`` (the ``Stateful`` protocol
        of ``torch.distributed.checkpoint``: an LR scheduler, a counter of your own); its state
        is job-wide (rank 0's is saved, every rank gets it back) and plain
        (:mod:`hetero_worker.ckpt.tracked`). Call it on every rank, before :meth:`resume`, e.g.
        ``sched = t.track("lr", LambdaLR(opt, f))``.

        Returns:
            ``obj``.

        Raises:
            TypeError: no ``state_dict``/``load_state_dict``, or a state weights-only loading
                refuses (named with its path and the fix).
            ValueError: ``name`` is tracked already (for another object).
            RuntimeError: :meth:`resume` ran already (the state would not be restored).
        """
        tracked.check_stateful(name, obj)
        registry: dict[str, Any] = self.__dict__.setdefault("tracked", {})
        if registry.get(name, obj) is not obj:
            raise ValueError(f"Trainer.track({name!r}): that name tracks another "
                             f"{type(registry[name]).__name__} already; choose another name")
        if self.__dict__.get("_resume_called"):
            raise RuntimeError(f"Trainer.track({name!r}) after resume(): its saved state would "
                               "not be restored; track it before t.resume(opt)")
        tracked.check_plain(name, obj.state_dict())
        registry[name] = obj
        return obj

    def _directory(self, directory: str | None) -> str:
        chosen = directory or self.contract.checkpoint.dir
        if not chosen:
            raise ValueError("no checkpoint directory: set HTJ_CHECKPOINT_DIR or pass one")
        return chosen

    def save(self, optimizer: torch.optim.Optimizer, directory: str | None = None) -> str:
        """Write a checkpoint (collective; rank 0 writes atomically). Returns its path.

        Under Group sharding the model and optimizer state go through
        :func:`hetero_worker.ckpt.sharded.save_sharded_checkpoint` (the largest group writes,
        DCP; :attr:`before_publish` is its test hook); under Full sharding every rank writes its
        uneven slices there by parameter name and element range (:mod:`hetero_worker.ckpt.flatdcp`).

        Raises:
            ValueError: no directory (``HTJ_CHECKPOINT_DIR`` unset and none passed).
            RuntimeError: no model wrapped yet.
            hetero_worker.ckpt.saving.CheckpointSaveError: the save failed (on every rank).
        """
        directory = self._directory(directory)
        module = self.module
        if module is None:
            raise RuntimeError("wrap a model before checkpointing")
        extra = {"tracked": tracked.states(self.tracked)}  # checked on every rank
        common = {"step": self.steps.global_step, "model": module, "optimizer": optimizer,
                  "scaler": self.scaler, "sampler": self.data.sampler, "plan": self.plan(),
                  "rank_state": {"compression": self.codecs.state_dict()}, "extra": extra,
                  "keep": self.contract.checkpoint.keep, "owner": self.owner()}
        if self.stages is not None:  # a pipeline: every stage's blocks once, by global index
            part = self.stages
            return str(stagestate.save_stage_checkpoint(
                directory, step=common["step"], stage=part.stage, replica=part.replica,
                stage_blocks=self.contract.pipeline.stage_blocks, module=module,
                optimizer=optimizer, sampler=common["sampler"], plan=common["plan"],
                extra=extra, keep=common["keep"], group=self.group, owner=common["owner"],
                scaler=common["scaler"]))
        if self.model.shard_sync is not None:  # Group sharding: DCP, one group writes
            from hetero_worker.ckpt import \
                sharded as shardckpt  # noqa: PLC0415 (imports torch.distributed.checkpoint)
            groups = self.sync.groups
            full = getattr(self.model.shard_sync, "units", None) is not None
            path = shardckpt.save_sharded_checkpoint(
                directory, rank=self.rank,
                groups=[list(range(self.contract.dist.world_size))] if full else groups.layout.groups,
                group=None if full else groups.intra,
                write_pieces=self._full_writer(optimizer) if full else None,
                before_publish=self.before_publish, ckpt_group=self.group,
                ckpt_timeout_s=self.contract.checkpoint.timeout_s if self.group is not None else None,
                **common)
            return str(path)
        return str(checkpoint.save_checkpoint(directory, group=self.group, **common))

    def _full_writer(self, optimizer: torch.optim.Optimizer) -> Any:
        """Under Full sharding: writes this rank's pieces (:mod:`hetero_worker.ckpt.flatdcp`)."""
        from hetero_worker.ckpt import flatdcp  # noqa: PLC0415 (imports torch.distributed.checkpoint)
        pieces = held_pieces(self.model.module, self.model.shard_sync)
        buffers = persistent_buffers(self.model.module) if self.rank == 0 else {}  # rank 0's, once
        return lambda path, group: flatdcp.save_pieces(path, pieces, optimizer, process_group=group,
                                                       buffers=buffers)

    def maybe_save(self, optimizer: torch.optim.Optimizer, every_steps: int | None = None) -> bool:
        """``Trainer.maybe_checkpoint`` (see there): save when the step count is a multiple of
        the interval; a failed periodic save is retried at the next interval
        (:class:`hetero_worker.ckpt.saving.PeriodicSaves`)."""
        if every_steps is None:
            if not self.contract.checkpoint.dir:
                return False
            every_steps = self.contract.checkpoint.interval_steps
        step = self.steps.global_step
        if every_steps <= 0 or step % every_steps:
            return False
        return self.periodic.run(lambda: self.save(optimizer), step) is not None

    def resume(self, optimizer: torch.optim.Optimizer, directory: str | None = None) -> bool:
        """``Trainer.resume`` (see there): :meth:`resume_from` the job's checkpoint directory,
        then the resume metrics."""
        self.__dict__["_resume_called"] = True
        resumed = self.resume_from(optimizer, directory or self.contract.checkpoint.dir)
        if resumed:
            self.metrics.set_resumed_step(self.steps.global_step)
            if checkpoint.LAST_RESUME.get("fallback"):  # a newer one was unreadable somewhere
                self.metrics.record_checkpoint_fallback()
        return resumed

    def resume_from(self, optimizer: torch.optim.Optimizer, directory: str | None) -> bool:
        """Agree on, load and apply the checkpoint in ``directory`` (collective; every rank).

        Call after ``wrap`` and ``loader`` (the data position goes into the loader's sampler) and
        before the first step (codec state goes into codecs not yet used).

        Returns:
            True when the job resumed, False when no rank has a checkpoint.

        Raises:
            RuntimeError: no model wrapped yet.
            hetero_worker.ckpt.agreement.ResumeDisagreement: a rank found another checkpoint than
                rank 0, none, or could not read it.
        """
        if self.module is None:
            raise RuntimeError("wrap a model before resume()")
        current = self.plan()
        mine = ResumeFilter(mine=self.owner(), resume_from=self.contract.checkpoint.resume_from)
        if self.stages is not None:  # a pipeline: this rank's stage
            state = stagestate.load_stage_checkpoint(
                directory, stage=self.stages.stage,
                stage_blocks=self.contract.pipeline.stage_blocks, module=self.module,
                optimizer=optimizer, sampler=self.data.sampler, plan=current, seed=self.seed,
                group=self.group, accept=mine.accepts, last_resume=checkpoint.LAST_RESUME,
                scaler=self.scaler)
        else:
            state = checkpoint.load_checkpoint(
                directory, model=self.module, optimizer=optimizer, scaler=self.scaler,
                sampler=self.data.sampler, plan=current, seed=self.seed, group=self.group,
                shard_sync=self.model.shard_sync, accept=mine.accepts)
        if state is None:
            found = store.candidates(directory) if directory and self.rank == 0 else []
            note = mine.passed_over(str(directory), found)
            if note:  # another job's checkpoints are there: say whose, and the field (issue 33)
                log(note, rank=self.rank)
                self.metrics.set_checkpoints_not_resumed(len(mine.others(found)))
            return False
        self._apply(state, current, directory)
        return True

    def _apply(self, state: dict[str, Any], current: dict[str, Any], directory: str | None) -> None:
        """After the load: the split, the codec states, what is tracked, the step count."""
        rank, data = self.rank, self.data
        if state["data"] is not None and data.sampler is None:
            log("checkpoint data position not applied: call Trainer.loader() before resume()",
                rank=rank)
        if state["resumed_same_plan"]:
            split = [int(b) for b in state["split"] or current["split"]]
            if split != data.local_batches:
                data.position.set_split(split)  # the saved (rebalanced) split, not a rebalance
        elif rank == 0:
            saved, position = state["plan"], state["data"] or {}
            log(f"resume_replanned: step {state['step']}, world {saved.get('world_size')} -> "
                f"{current['world_size']}, split {state['split']} -> {current['split']}; data "
                f"continue at epoch {position.get('epoch')}, sample {position.get('consumed')} of "
                "the epoch's order; fresh RNG on every rank", rank=rank)
        restore_compression(self.codecs, rank, state, current)
        missing, unused = tracked.restore(self.tracked, (state.get("extra") or {}).get("tracked"))
        if rank == 0 and (missing or unused):
            log(f"tracked_state: the checkpoint of step {state['step']} has no state for "
                f"{missing} (they start fresh) and state nothing tracks now for {unused}", rank=rank)
        self.steps.global_step = int(state["step"])
        if rank == 0:  # the one line that says a user's script resumed, and from where
            epoch = data.epoch if data.sampler is not None else (state["data"] or {}).get("epoch")
            log(f"resumed at step {self.steps.global_step}, epoch {epoch} from "
                f"{checkpoint.LAST_RESUME.get('path', directory)}", rank=rank)


def resume_trainer(manager: Checkpointing, optimizer: torch.optim.Optimizer,
                   directory: str | None) -> bool:
    """:meth:`Checkpointing.resume_from` as a function."""
    return Checkpointing.resume_from(manager, optimizer, directory)
