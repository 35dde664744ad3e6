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
directory beside it (:mod:`hetero_worker.shardckpt` writes, checks and loads it).

:func:`load_checkpoint` is collective: rank 0's reading decides the resume step and every rank
confirms it (:func:`hetero_worker.agreement.agree_on_resume`) before anything is restored.
"""

from __future__ import annotations

import hashlib
import os
import random
import secrets
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hetero_worker.agreement import Finding, agree_on_resume

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT = 2
"""Version of the file layout; 1 (before weights-only loading) held NumPy objects."""
SHARDED_FORMAT = 3
"""A manifest whose model and optimizer state lie in a DCP directory beside it (``sharded``:
:mod:`hetero_worker.shardckpt`, Group sharding); everything else as :data:`FORMAT`."""
FORMATS = (FORMAT, SHARDED_FORMAT)
PLAN_KEYS = ("world_size", "planned_split", "devices")
"""What identifies a plan: a checkpoint's per-rank state is reused only when all of them match."""


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save`` to a temp file beside ``path``, fsync, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_file(path: str | Path) -> dict[str, Any]:
    """``torch.load(path, map_location="cpu", weights_only=True)``: tensors and plain types only.

    Raises:
        OSError: unreadable file.
        pickle.UnpicklingError, RuntimeError: not a checkpoint, truncated, or holding objects
            that weights-only loading refuses (e.g. a format-1 file with NumPy state).
    """
    return torch.load(path, map_location="cpu", weights_only=True)


def rng_state() -> dict[str, Any]:
    """This process's RNG states as tensors and plain types (weights-only loadable).

    Returns:
        ``torch``: CPU generator state (uint8 tensor); ``python``: ``random.getstate()`` (a tuple
        of ints); ``numpy`` (if installed): MT19937 ``keys`` as an int64 tensor ``[624]`` plus
        ``pos``, ``has_gauss``, ``cached_gaussian``; ``cuda`` (if CUDA is initialised): one uint8
        tensor per device.
    """
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
    except ImportError:  # numpy is optional for the worker
        return state
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state["numpy"] = {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)),
                      "pos": int(pos), "has_gauss": int(has_gauss),
                      "cached_gaussian": float(cached)}
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    python = state["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np
        saved = state["numpy"]
        np.random.set_state((saved["kind"], saved["keys"].numpy().astype(np.uint32), saved["pos"],
                             saved["has_gauss"], saved["cached_gaussian"]))


def fresh_rng(seed: int, step: int, rank: int) -> None:
    """Seed torch, CUDA, Python and NumPy from ``(seed, step, rank)``: a rank of a new plan.

    Different for every rank and every resume step, identical when the same plan resumes the
    same step twice (reproducible restarts).
    """
    digest = hashlib.sha256(f"heterotrain-rng/{seed}/{step}/{rank}".encode()).digest()
    derived = int.from_bytes(digest[:8], "little") >> 1  # torch.manual_seed takes < 2**63
    torch.manual_seed(derived)
    random.seed(derived)
    try:
        import numpy as np
        np.random.seed(derived % (2**32))
    except ImportError:
        pass


def same_plan(saved: Mapping[str, Any] | None, current: Mapping[str, Any] | None) -> bool:
    """True when ``saved`` and ``current`` plans agree on every :data:`PLAN_KEYS` entry.

    ``current is None`` (a caller without a plan, e.g. a single process) counts as the same plan
    when the world size matches.
    """
    if saved is None:
        return False
    if current is None:
        world = dist.get_world_size() if dist.is_initialized() else 1
        return saved.get("world_size") == world
    return all(_plain(saved.get(k)) == _plain(current.get(k)) for k in PLAN_KEYS)


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively (plans compare equal however they were built)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def gather_to_rank0(mine: Any) -> list[Any] | None:
    """Every rank's ``mine`` on rank 0 (ordered by rank), None elsewhere; collective."""
    if not dist.is_initialized():
        return [mine]
    rank = dist.get_rank()
    out: list[Any] | None = [None] * dist.get_world_size() if rank == 0 else None
    dist.gather_object(mine, out, dst=0)
    return out


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
            (plain types; :func:`hetero_worker.resume.plan_of`).
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


def manifest(*, checkpoint_id: str, step: int, model: torch.nn.Module | None,
             optimizer: torch.optim.Optimizer | None, scaler: Any, sampler: Any,
             plan: Mapping[str, Any] | None, ranks: list[Any],
             extra: Mapping[str, Any] | None = None,
             sharded: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The checkpoint file's content (rank 0): :data:`FORMAT` with ``model`` and ``optimizer``
    state dicts, or :data:`SHARDED_FORMAT` with both None and ``sharded`` naming the DCP
    directory (:mod:`hetero_worker.shardckpt`). Tensors and plain types only."""
    plan = dict(plan) if plan else {"world_size": len(ranks)}
    return {
        "format": SHARDED_FORMAT if sharded else FORMAT, "checkpoint_id": checkpoint_id,
        "step": int(step),
        "model": model.state_dict() if model is not None else None,
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "data": sampler.state_dict() if sampler is not None else None,
        "plan": {k: plan.get(k) for k in PLAN_KEYS},
        "split": plan.get("split"), "layout": plan.get("layout"),
        "compression": plan.get("compression"),
        "ranks": ranks, "extra": dict(extra or {}),
        "sharded": dict(sharded) if sharded else None,
    }


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
            from hetero_worker.shardckpt import check_sharded_dir  # noqa: PLC0415 (DCP import)
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
        hetero_worker.agreement.ResumeDisagreement: some rank found another step or checkpoint
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
        from hetero_worker.shardckpt import check_sharded_dir, load_sharded  # noqa: PLC0415
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
