"""Atomic checkpoints that every rank loads safely, agrees on, and can resume under a new plan.

Rank 0 writes ``<dir>/checkpoint.pt`` through a temp file in the same directory, ``fsync`` and
``os.replace``: a rank killed mid-write leaves the previous checkpoint intact, never half a file.

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

:func:`load_checkpoint` is collective: rank 0's reading decides the resume step and every rank
confirms it (:func:`hetero_worker.ckpt.agreement.agree_on_resume`) before anything is restored.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hetero_worker.ckpt.agreement import Finding, agree_on_resume
from hetero_worker.ckpt.files import (CHECKPOINT_FILE, FORMAT, FORMATS, SHARDED_FORMAT, fresh_rng,
                                      gather_to_rank0, load_file, manifest, rng_state, same_plan,
                                      save_atomic, set_rng_state)


def save_checkpoint(directory: str | Path, *, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scaler: Any = None, sampler: Any = None,
                    plan: Mapping[str, Any] | None = None,
                    rank_state: Mapping[str, Any] | None = None,
                    extra: Mapping[str, Any] | None = None) -> Path:
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

    Returns:
        The checkpoint path (written by rank 0; every rank returns after the barrier).
    """
    path = Path(directory) / CHECKPOINT_FILE
    mine = {"rng": rng_state(), **(dict(rank_state) if rank_state else {})}
    ranks = gather_to_rank0(mine)
    if ranks is not None:
        save_atomic(manifest(checkpoint_id=secrets.token_hex(8), step=step, model=model,
                             optimizer=optimizer, scaler=scaler, sampler=sampler, plan=plan,
                             ranks=ranks, extra=extra), path)
    if dist.is_initialized():
        dist.barrier()
    return path


def read_checkpoint(directory: str | Path | None) -> tuple[dict[str, Any] | None, Finding]:
    """Read ``<directory>/checkpoint.pt`` on this rank (weights only) and say what was found.

    Returns:
        ``(state or None, Finding)``: the finding carries the step and checkpoint id, ``missing``
        when there is no file, or the error when it could not be read.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    if not directory:
        return None, Finding(rank=rank, path="", missing=True)
    path = Path(directory) / CHECKPOINT_FILE
    if not path.exists():
        return None, Finding(rank=rank, path=str(path), missing=True)
    try:
        state = load_file(path)
        if not isinstance(state, dict) or state.get("format") not in FORMATS:
            found = state.get("format", 1) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"checkpoint format {found}, expected {FORMAT} or {SHARDED_FORMAT}")
        if state["format"] == SHARDED_FORMAT:  # the DCP directory it names must be complete
            from hetero_worker.ckpt.sharded import check_sharded_dir  # noqa: PLC0415 (DCP import)
            check_sharded_dir(directory, state["sharded"])
    except Exception as exc:  # noqa: BLE001 - every failure is reported to the agreement
        return None, Finding(rank=rank, path=str(path), error=f"{type(exc).__name__}: {exc}"[:300])
    return state, Finding(rank=rank, path=str(path), step=int(state["step"]),
                          checkpoint_id=str(state["checkpoint_id"]))


def load_checkpoint(directory: str | Path | None, *, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scaler: Any = None, sampler: Any = None,
                    plan: Mapping[str, Any] | None = None, seed: int = 0) -> dict[str, Any] | None:
    """Agree on and restore the checkpoint in ``directory``; collective: call on every rank.

    Every rank reads the file (weights only); rank 0's finding is the decision and every rank
    confirms it before anything is restored. Model, optimizer, scaler and the global data
    position are always restored. RNG states are restored per rank when ``plan`` is the plan the
    checkpoint was taken under (:func:`same_plan`); otherwise every rank gets fresh RNG
    (:func:`fresh_rng` of ``seed``, the step and its rank).

    Args:
        directory: checkpoint directory (None or ``""``: this rank has none).
        model, optimizer, scaler, sampler: restored in place when given.
        plan: the resuming plan (see :func:`save_checkpoint`); None compares world sizes only.
        seed: the job seed, for fresh RNG under a new plan.

    Returns:
        The checkpoint dict (``step``, ``plan``, ``split``, ``ranks``, ...) with
        ``resumed_same_plan`` (bool) added, or None when no rank has a checkpoint.

    Raises:
        hetero_worker.ckpt.agreement.ResumeDisagreement: some rank found another step or checkpoint
            than rank 0, none, or could not read it (every rank raises the same message).
        ValueError: the data position is for another dataset (sampler).
    """
    state, finding = read_checkpoint(directory)
    agree_on_resume(finding)
    if state is None:
        return None
    if not state.get("sharded") and _is_sharded(model):
        raise ValueError("this checkpoint was taken without sharding (format 2: one full state "
                         "dict) and this job shards its model (HTJ_SHARDING): resume it with "
                         "spec.training.sharding None, or start a new checkpoint directory")
    if state.get("sharded"):  # DCP: every rank loads its own chunks, resharded to its model
        from hetero_worker.ckpt.sharded import check_sharded_dir, load_sharded  # noqa: PLC0415
        load_sharded(check_sharded_dir(directory, state["sharded"]), model=model,
                     optimizer=optimizer)
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
