"""Atomic checkpoints that every rank loads safely, agrees on, and can resume under a new plan.

Rank 0 writes each checkpoint into a directory of its own (``<dir>/step-<N>-<id>/checkpoint.pt``
with a ``MANIFEST.json`` of every file's size and SHA-256, :mod:`hetero_worker.ckpt.store`):
written into a ``.tmp`` directory, fsynced, read back for the manifest, renamed into place and
verified; the newest ``keep`` checkpoints stay.  A rank killed mid-write leaves every earlier
checkpoint intact, never half a one.

The file (format :data:`FORMAT`) holds only tensors and plain Python types, so every rank loads it
with ``torch.load(weights_only=True)``: a file on a shared volume cannot run code in a rank
(loading without ``weights_only`` unpickles arbitrary objects; see the warning in ``torch.load``).

* job-wide state: ``model``, ``optimizer``, ``scaler`` (the loss scale is agreed, so it is the same
  on every rank), ``step``, a random ``checkpoint_id``;
* the job's **global** data position ``data`` (epoch, seed, samples consumed of the epoch's global
  order; :meth:`hetero_worker.sampler.HeteroBatchSampler.state_dict`), never per-rank positions, so
  any split or world size continues with exact epoch coverage;
* the ``plan`` it was taken under (world size, planned split, device per rank), the current
  ``split``, the hierarchy ``layout`` and the ``compression`` settings;
* ``ranks``: per-rank state of the saving plan (RNG states, compression error feedback). It is
  used only when the resuming plan is the same (:func:`same_plan`); otherwise every rank starts
  with fresh RNG (:func:`fresh_rng`) and nothing is indexed by a rank that may no longer exist.

Under Group sharding the file is a manifest of format :data:`SHARDED_FORMAT`: the same keys with
``model`` and ``optimizer`` None and ``sharded`` naming a ``torch.distributed.checkpoint``
directory beside it (:mod:`hetero_worker.ckpt.sharded` writes, checks and loads it).

:func:`load_checkpoint` is collective: the ranks agree on the newest checkpoint every one of them
can read (:func:`hetero_worker.ckpt.agreement.agree_on_newest`), falling back to an older one
when the newest is unreadable, and confirm its step and id before anything is restored.

Saving and agreeing use ``group`` (a trainer's checkpoint process group, with its own timeout) so
that the other ranks waiting for rank 0's write never hit the training collectives' timeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hetero_worker.ckpt import store
from hetero_worker.ckpt.agreement import (Finding, ResumeDisagreement, agree_on_newest,
                                          agree_on_resume)
from hetero_worker.ckpt.ownership import Owner
from hetero_worker.ckpt.pieces import (fill_from_full, held_pieces, optimizer_fqns,
                                       parameter_names, persistent_buffers)
from hetero_worker.ckpt.saving import CheckpointSaveError, discard_tmp
from hetero_worker.ckpt.files import (CHECKPOINT_FILE, FORMAT, FORMATS, SHARDED_FORMAT, fresh_rng,
                                      gather_to_rank0, load_file, manifest,
                                      refuse_pipeline_checkpoint, rng_state, same_plan,
                                      save_atomic, set_rng_state)
from hetero_worker.comm import agree
from hetero_worker.runtime.ranklog import log
from heterotrain_common import defaults

LAST_RESUME: dict[str, Any] = {}
"""What the last :func:`load_checkpoint` of this process resumed from: ``step``, ``fallback``
(the note when an unreadable newer checkpoint was passed over, else ``""``); rank 0 exports it as
metrics (``htj_checkpoint_resume_step``, ``htj_checkpoint_fallbacks_total``)."""


def agree_saved(error: str, group: Any) -> None:
    """Every rank learns whether rank 0's save succeeded (raises the same error on every rank)."""
    if not dist.is_initialized():
        if error:
            raise CheckpointSaveError(error)
        return
    failed = agree.gather_errors(error, group)
    if failed:
        raise CheckpointSaveError("; ".join(f"rank {rank}: {text}" for rank, text in failed)
                      + " (the previous checkpoints are kept)")


def save_checkpoint(directory: str | Path, *, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scaler: Any = None, sampler: Any = None,
                    plan: Mapping[str, Any] | None = None,
                    rank_state: Mapping[str, Any] | None = None,
                    extra: Mapping[str, Any] | None = None, keep: int = defaults.CHECKPOINT_KEEP,
                    group: Any = None, owner: Owner | None = None) -> Path:
    """Write a checkpoint; collective: call on every rank at the same step.

    Args:
        directory: checkpoint directory (created if missing).
        step: optimizer steps taken so far (the step to resume *after*).
        model: the unwrapped model; its ``state_dict`` is saved (replicas are identical).
        optimizer, scaler: saved when given (``state_dict()`` each; same on every rank).
        sampler: its ``state_dict()`` is the job's global data position (same on every rank).
        plan: the plan identity (:data:`PLAN_KEYS`) plus ``split``, ``layout``, ``compression``
            (plain types; :func:`hetero_worker.ckpt.resume.plan_of`).
        rank_state: this rank's own state besides RNG (e.g. ``compression`` error feedback),
            tensors and plain types only.
        extra: more plain state saved as ``extra``.
        keep: verified checkpoints to keep (the newest ``keep``).
        group: the process group of the save (None: the default group).
        owner: the job UID and restart generation the manifest records (None: from the
            environment, :mod:`hetero_worker.ckpt.ownership`).

    Returns:
        The new checkpoint's ``checkpoint.pt`` (written by rank 0; every rank returns once rank 0
        has published and verified it).

    Raises:
        hetero_worker.ckpt.saving.CheckpointSaveError: rank 0 could not write or verify it, with
            any exception (``OSError``, ``RuntimeError``, ...); raised on every rank at once with
            the same message, its ``.tmp`` removed, earlier checkpoints kept.
    """
    directory = Path(directory)
    mine = {"rng": rng_state(), **(dict(rank_state) if rank_state else {})}
    ranks = gather_to_rank0(mine, group)
    checkpoint_id = agree.agreed_token(group)
    error, path = "", directory / store.dir_name(step, checkpoint_id) / CHECKPOINT_FILE
    if ranks is not None:
        tmp = store.tmp_dir(directory, step, checkpoint_id)
        try:
            tmp.mkdir(parents=True, exist_ok=True)
            state = manifest(checkpoint_id=checkpoint_id, step=step, model=model,
                             optimizer=optimizer, scaler=scaler, sampler=sampler, plan=plan,
                             ranks=ranks, extra=extra)
            state["optimizer_fqns"] = optimizer_fqns(model, optimizer)  # ids -> names (pieces)
            save_atomic(state, tmp / CHECKPOINT_FILE)
            path = store.publish_verified(directory, tmp, step=step, checkpoint_id=checkpoint_id,
                                          fmt=FORMAT, keep=keep, owner=owner)
        except Exception as exc:  # noqa: BLE001 - any type (torch.save on a full disk: RuntimeError)
            discard_tmp(tmp)
            error = f"saving the checkpoint of step {step} in {directory}: {type(exc).__name__}: {exc}"
    agree_saved(error[:agree.ERROR_BYTES], group)
    return path


def read_file(path: Path) -> tuple[dict[str, Any] | None, Finding]:
    """Read one ``checkpoint.pt`` on this rank (weights only) and say what was found.

    Returns:
        ``(state or None, Finding)``: the finding carries the step and checkpoint id, ``missing``
        when there is no file, or the error when it could not be read.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    if not path.exists():
        return None, Finding(rank=rank, path=str(path), missing=True)
    try:
        state = load_file(path)
        if not isinstance(state, dict) or state.get("format") not in FORMATS:
            found = state.get("format", 1) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"checkpoint format {found}, expected {FORMAT} or {SHARDED_FORMAT}")
        if state["format"] == SHARDED_FORMAT:  # the DCP directory it names must be complete
            from hetero_worker.ckpt.sharded import check_sharded_dir  # noqa: PLC0415 (DCP import)
            check_sharded_dir(path.parent, state["sharded"])
    except Exception as exc:  # noqa: BLE001 - every failure is reported to the agreement
        return None, Finding(rank=rank, path=str(path), error=f"{type(exc).__name__}: {exc}"[:300])
    return state, Finding(rank=rank, path=str(path), step=int(state["step"]),
                          checkpoint_id=str(state["checkpoint_id"]))


def read_checkpoint(directory: str | Path | None) -> tuple[dict[str, Any] | None, Finding]:
    """Read the newest checkpoint of ``directory`` this rank can verify (weights only); without
    any, the newest candidate's failure (or ``missing``).  One rank's view, no agreement."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    if not directory:
        return None, Finding(rank=rank, path="", missing=True)
    found = store.candidates(directory)
    if not found:
        return None, Finding(rank=rank, path=str(Path(directory) / CHECKPOINT_FILE), missing=True)
    first_failure: tuple[None, Finding] | None = None
    for c in found:
        problem = store.verify(c)
        state, finding = (None, Finding(rank=rank, path=str(c.file), error=problem)) if problem else read_file(c.file)
        if state is not None:
            return state, finding
        first_failure = first_failure or (None, finding)
    assert first_failure is not None
    return first_failure


def load_checkpoint(directory: str | Path | None, *, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scaler: Any = None, sampler: Any = None,
                    plan: Mapping[str, Any] | None = None, seed: int = 0,
                    group: Any = None, accept: Any = None,
                    shard_sync: Any = None) -> dict[str, Any] | None:
    """Agree on and restore a checkpoint of ``directory``; collective: call on every rank.

    The ranks agree on the newest checkpoint every one of them verifies against its manifest
    (:func:`hetero_worker.ckpt.agreement.agree_on_newest`; an unreadable newer one is passed over
    on every rank, and rank 0 says so); every rank reads it (weights only) and confirms rank 0's
    step and id before anything is restored. Model, optimizer, scaler and the global data
    position are always restored. RNG states are restored per rank when ``plan`` is the plan the
    checkpoint was taken under (:func:`same_plan`); otherwise every rank gets fresh RNG
    (:func:`fresh_rng` of ``seed``, the step and its rank).

    Args:
        directory: checkpoint directory (None or ``""``: this rank has none).
        model, optimizer, scaler, sampler: restored in place when given.
        plan: the resuming plan (see :func:`save_checkpoint`); None compares world sizes only.
        seed: the job seed, for fresh RNG under a new plan.
        group: the process group of the agreement (None: the default group).
        accept: which checkpoints this job may resume (a predicate on a
            :class:`hetero_worker.ckpt.store.Candidate`; None: every one;
            :class:`hetero_worker.ckpt.ownership.ResumeFilter.accepts`).
        shard_sync: the model part's sharded sync (a Full sharding sync's ``units`` say what
            this rank holds; None or a Group sync: the model's own parameters say it).

    Any checkpoint resumes under any sharding mode (:mod:`hetero_worker.ckpt.pieces`): one full
    state dict (format 2) is cut into the held pieces on every rank (case 62); a Group (FSDP2)
    DCP directory is resharded by DCP into None or Group, or read by row boxes into Full; a Full
    one (``layout: flat``) is read by element ranges into any mode
    (:func:`hetero_worker.ckpt.flatdcp.load_pieces`).

    Returns:
        The checkpoint dict (``step``, ``plan``, ``split``, ``ranks``, ...) with
        ``resumed_same_plan`` (bool) added, or None when no rank has a checkpoint.

    Raises:
        hetero_worker.ckpt.agreement.ResumeDisagreement: some rank found another step or checkpoint
            than rank 0, none, or could not read it (every rank raises the same message).
        ValueError: the data position is for another dataset (sampler).
    """
    chosen, _, note = agree_on_newest(directory, group, accept)
    if chosen is None:
        LAST_RESUME.clear()
        return None
    state, finding = read_file(chosen.file)
    agree_on_resume(finding, group)
    if state is None:  # every rank read it, or every rank raised above
        raise ResumeDisagreement([finding])
    refuse_pipeline_checkpoint(state)  # stage states resume under a pipeline only (files)
    LAST_RESUME.update(step=int(state["step"]), fallback=note, path=str(Path(chosen.file).parent))
    if note and (not dist.is_initialized() or dist.get_rank() == 0):
        log(f"checkpoint_fallback: resuming from step {state['step']} (checkpoint "
             f"{state['checkpoint_id']}); the newest is unreadable: {note}")
    full = getattr(shard_sync, "units", None) is not None  # Full sharding: flat unit slices
    sharded = state.get("sharded")
    if sharded:  # DCP: every rank loads its own chunks, resharded to its model
        from hetero_worker.ckpt.sharded import check_sharded_dir, load_sharded  # noqa: PLC0415
        path = check_sharded_dir(chosen.file.parent, sharded)
        if full or sharded.get("layout") == "flat":  # by name and element range
            from hetero_worker.ckpt.flatdcp import load_pieces  # noqa: PLC0415
            load_pieces(path, held_pieces(model, shard_sync), optimizer,
                        persistent_buffers(model))
        else:
            load_sharded(path, model=model, optimizer=optimizer)
    elif full or _is_sharded(model):  # one full state dict into shards (case 62)
        fill_from_full(held_pieces(model, shard_sync), optimizer, state["model"],
                       state["optimizer"], state.get("optimizer_fqns"),
                       parameter_names(model, shard_sync), persistent_buffers(model))
    else:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state["scaler"]:
        scaler.load_state_dict(state["scaler"])
    if sampler is not None and state["data"] is not None:
        sampler.load_state_dict(state["data"])
    rank = dist.get_rank() if dist.is_initialized() else 0
    state["resumed_same_plan"] = same_plan(state["plan"], plan)
    if state["resumed_same_plan"] and rank < len(state["ranks"]):
        set_rng_state(state["ranks"][rank]["rng"])
    else:
        fresh_rng(seed, int(state["step"]), rank)
    return state


def _is_sharded(model: torch.nn.Module) -> bool:
    """True when any parameter is a ``DTensor`` (FSDP2)."""
    from torch.distributed.tensor import DTensor  # noqa: PLC0415
    return any(isinstance(p, DTensor) for p in model.parameters())
