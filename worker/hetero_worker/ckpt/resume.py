"""Checkpoint and resume a :class:`~hetero_worker.trainer.Trainer`, under the same or a new plan.

What the trainer's checkpoints carry besides model and optimizer (:mod:`hetero_worker.ckpt.checkpoint`
writes and agrees on the file):

* the plan it was taken under (:func:`plan_of`): world size, the planned split, device per rank,
  the current (maybe rebalanced) split, the hierarchy layout and the compression settings;
* per rank: RNG states and the compression codecs' error feedback (int8 error buffers, PowerSGD
  errors, ``Q`` factors and iteration counter), one entry per DDP bucket;
* ``extra["tracked"]``: the state of what ``Trainer.track`` registered (an LR scheduler, a
  counter), rank 0's, restored on every rank (:mod:`hetero_worker.ckpt.tracked`).

On resume (:func:`resume_trainer`):

* **same plan** (same world size, planned split and devices): the saved split, every rank's RNG
  and, when the layout and compression settings are also the same, every leader's codec state are
  restored: the run continues as if never interrupted (bit-identical on CPU);
* **new plan** (a re-plan onto other capacity: another world size or split): the contract's split
  is used, the data continue from the job's global position (exact epoch coverage), every rank
  gets fresh RNG, and the compression state is discarded with a ``compression_state_reset`` line
  (its tensors belong to the old leaders' group).

Under ``Group`` sharding no rank holds the whole model: model and optimizer state are saved
sharded with ``torch.distributed.checkpoint`` and resharded onto the resuming plan's groups
(:mod:`hetero_worker.ckpt.sharded`); everything above holds the same way.

Codec state is restored into the reducer's codecs, which are handed the live leaders' process group
on every call: a process group is never serialised, so it can never come back as the default
(world) group (case 37; pytorch/pytorch#79334 drops the group on pickling and substitutes the
default one).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch

from hetero_worker.ckpt import checkpoint, tracked
from hetero_worker.ckpt.ownership import Owner
from hetero_worker.speed.codecs import make_codec

__all__ = ["codec_states", "plan_of", "restore_codecs", "resume_trainer", "save_trainer_checkpoint"]


def _log(rank: int, message: str) -> None:
    print(f"heterotrain: rank {rank}: {message}", file=sys.stderr, flush=True)


def _reducer(trainer: Any) -> Any:
    """The installed codec reducer (:class:`hetero_worker.speed.controller.CodecReducer`) or None."""
    reducer = getattr(trainer.sync, "reducer", None)
    return reducer if reducer is not None and hasattr(reducer, "codecs") else None


def plan_of(trainer: Any) -> dict[str, Any]:
    """The plan a trainer runs under, plain types only.

    Returns:
        ``world_size``, ``planned_split`` (the contract's), ``devices`` (GPU product per rank),
        ``split`` (current), ``layout`` (``mode``, ``groups``, ``leaders``), ``compression``
        (codec settings, or None without a codec reducer).
    """
    layout = trainer.layout
    reducer = _reducer(trainer)
    compression = None
    if reducer is not None:
        config = reducer.compression
        compression = {"mode": config.mode, "powersgd_rank": config.powersgd_rank,
                       "powersgd_start_iter": getattr(config, "powersgd_start_iter", 0)}
    return {"world_size": len(trainer.contract.topology),
            "planned_split": [int(b) for b in trainer.contract.local_batches],
            "devices": [e.gpu_product for e in trainer.contract.topology],
            "split": [int(b) for b in trainer.local_batches],
            "layout": {"mode": layout.mode, "groups": [list(g) for g in layout.groups],
                       "leaders": list(layout.leaders)},
            "compression": compression}


def codec_states(trainer: Any) -> dict[str, Any]:
    """This rank's codec states by DDP bucket (``str(bucket index)``); empty for non-leaders."""
    reducer = _reducer(trainer)
    if reducer is None:
        return {}
    return {str(key): codec.state_dict() for key, codec in sorted(reducer.codecs.items())
            if hasattr(codec, "state_dict")}


def restore_codecs(trainer: Any, states: Mapping[str, Any]) -> int:
    """Build the reducer's codecs from saved states (before the first step); returns how many.

    Codecs are made exactly as the reducer makes them (``make_codec(config, seed=bucket)``) and
    get the live leaders' group on every call.
    """
    reducer = _reducer(trainer)
    if reducer is None:
        return 0
    for key, state in states.items():
        codec = make_codec(reducer.compression, seed=int(key))
        codec.load_state_dict(state)  # type: ignore[attr-defined]
        reducer.codecs[int(key)] = codec
    return len(states)


def save_trainer_checkpoint(trainer: Any, optimizer: torch.optim.Optimizer,
                            directory: str) -> str:
    """Write the trainer's checkpoint (collective; rank 0 writes atomically). Returns its path.

    Under Group sharding the model and optimizer state go through
    :func:`hetero_worker.ckpt.sharded.save_sharded_checkpoint` (the largest group writes, DCP);
    a ``before_checkpoint_publish(step)`` attribute on the trainer, if set, is that function's
    test hook. Full sharding is refused (not built)."""
    if trainer.module is None:
        raise RuntimeError("wrap a model before checkpointing")
    extra = {"tracked": tracked.states(getattr(trainer, "tracked", {}))}  # checked on every rank
    if trainer.contract.memory.sharding == "full" and directory:
        raise RuntimeError("Full sharding does not checkpoint yet: leave spec.training.checkpoint "
                           "out or use spec.training.sharding Group (docs/memory.md)")
    if getattr(trainer, "shard_sync", None) is not None:  # Group sharding: DCP, one group writes
        from hetero_worker.ckpt import \
            sharded as shardckpt  # noqa: PLC0415 (imports torch.distributed.checkpoint)
        path = shardckpt.save_sharded_checkpoint(
            directory, step=trainer.global_step, model=trainer.module, optimizer=optimizer,
            groups=trainer.layout.groups, group=trainer.groups.intra, rank=trainer.rank,
            scaler=trainer.scaler, sampler=trainer.sampler, plan=plan_of(trainer),
            rank_state={"compression": codec_states(trainer)}, extra=extra,
            before_publish=getattr(trainer, "before_checkpoint_publish", None),
            keep=trainer.contract.checkpoint.keep, ckpt_group=getattr(trainer, "ckpt_group", None),
            ckpt_timeout_s=trainer.contract.checkpoint.timeout_s if getattr(
                trainer, "ckpt_group", None) is not None else None, owner=owner_of(trainer))
        return str(path)
    path = checkpoint.save_checkpoint(
        directory, step=trainer.global_step, model=trainer.module, optimizer=optimizer,
        scaler=trainer.scaler, sampler=trainer.sampler, plan=plan_of(trainer),
        rank_state={"compression": codec_states(trainer)}, extra=extra,
        keep=trainer.contract.checkpoint.keep, group=getattr(trainer, "ckpt_group", None),
        owner=owner_of(trainer))
    return str(path)


def owner_of(trainer: Any) -> Owner:
    """The trainer's job UID and restart generation, for the manifest
    (:mod:`hetero_worker.ckpt.ownership`)."""
    return Owner(job_uid=trainer.contract.dist.job_uid,
                 generation=trainer.contract.dist.restart_generation)


def resume_trainer(trainer: Any, optimizer: torch.optim.Optimizer,
                   directory: str | None) -> bool:
    """Agree on, load and apply the checkpoint in ``directory`` (collective; every rank).

    Call after ``wrap`` and ``loader`` (the data position goes into the loader's sampler) and
    before the first step (codec state goes into codecs not yet used).

    Returns:
        True when the job resumed, False when no rank has a checkpoint.

    Raises:
        hetero_worker.ckpt.agreement.ResumeDisagreement: a rank found another checkpoint than rank 0,
            none, or could not read it.
    """
    if trainer.module is None:
        raise RuntimeError("wrap a model before resume()")
    if trainer.contract.memory.sharding == "full" and directory:
        raise RuntimeError("Full sharding does not resume from checkpoints yet: leave "
                           "spec.training.checkpoint out or use spec.training.sharding Group "
                           "(docs/memory.md)")
    current = plan_of(trainer)
    state = checkpoint.load_checkpoint(
        directory, model=trainer.module, optimizer=optimizer, scaler=trainer.scaler,
        sampler=trainer.sampler, plan=current, seed=trainer.seed,
        group=getattr(trainer, "ckpt_group", None))
    if state is None:
        return False
    rank = trainer.rank
    if state["data"] is not None and trainer.sampler is None:
        _log(rank, "checkpoint data position not applied: call Trainer.loader() before resume()")
    saved = state["plan"]
    if state["resumed_same_plan"]:
        split = [int(b) for b in state["split"] or current["split"]]
        if split != list(trainer.local_batches):
            trainer.set_split(split, rebalance=False)  # the saved (rebalanced) split
    elif rank == 0:
        data = state["data"] or {}
        _log(rank, f"resume_replanned: step {state['step']}, world {saved.get('world_size')} -> "
                   f"{current['world_size']}, split {state['split']} -> {current['split']}; data "
                   f"continue at epoch {data.get('epoch')}, sample {data.get('consumed')} of the "
                   "epoch's order; fresh RNG on every rank")
    _restore_compression(trainer, state, current)
    missing, unused = tracked.restore(getattr(trainer, "tracked", {}),
                                      (state.get("extra") or {}).get("tracked"))
    if rank == 0 and (missing or unused):
        _log(rank, f"tracked_state: the checkpoint of step {state['step']} has no state for "
                   f"{missing} (they start fresh) and state nothing tracks now for {unused}")
    trainer.global_step = int(state["step"])
    if rank == 0:  # the one line that says a user's script resumed, and from where
        epoch = trainer.epoch if trainer.sampler is not None else (state["data"] or {}).get("epoch")
        _log(rank, f"resumed at step {trainer.global_step}, epoch {epoch} from "
                   f"{checkpoint.LAST_RESUME.get('path', directory)}")
    return True


def _restore_compression(trainer: Any, state: Mapping[str, Any],
                         current: Mapping[str, Any]) -> None:
    """Restore this rank's codec state when plan, layout and settings match; else say reset."""
    if _reducer(trainer) is None:
        return
    ranks = state["ranks"]
    saved = ranks[trainer.rank].get("compression", {}) if (
        state["resumed_same_plan"] and trainer.rank < len(ranks)) else {}
    same = (state["resumed_same_plan"] and state.get("layout") == current["layout"]
            and state.get("compression") == current["compression"])
    if same:
        restore_codecs(trainer, saved)
        return
    had_state = any(r.get("compression") for r in ranks)  # some leader kept codec state
    if had_state and trainer.rank in current["layout"]["leaders"]:
        reason = ("plan changed" if not state["resumed_same_plan"] else
                  "layout changed" if state.get("layout") != current["layout"] else
                  "compression settings changed")
        _log(trainer.rank, f"compression_state_reset: {reason} (saved layout "
                           f"{(state.get('layout') or {}).get('groups')}, now "
                           f"{current['layout']['groups']}); error feedback and PowerSGD warm-up "
                           "start again")
