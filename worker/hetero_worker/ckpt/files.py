"""The checkpoint file format shared by both backends: its constants, atomic writes, weights-only
reads, RNG state, the manifest, the plan it was taken under."""

from __future__ import annotations

import hashlib
import os
import random
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

CHECKPOINT_FILE = "checkpoint.pt"
FORMAT = 2
"""Version of the file layout; 1 (before weights-only loading) held NumPy objects."""
SHARDED_FORMAT = 3
"""A manifest whose model and optimizer state lie in a DCP directory beside it (``sharded``:
:mod:`hetero_worker.ckpt.sharded`, Group sharding); everything else as :data:`FORMAT`."""
FORMATS = (FORMAT, SHARDED_FORMAT)
PIPELINE_KEY = "pipeline"
"""A pipelined job's checkpoint: its stage cut and the stages' optimizer states
(:mod:`hetero_worker.ckpt.stagestate`)."""
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


def gather_to_rank0(mine: Any, group: Any = None) -> list[Any] | None:
    """Every rank's ``mine`` on rank 0 (ordered by rank), None elsewhere; collective over
    ``group`` (None: the default group; a group of every rank, such as the checkpoint group)."""
    if not dist.is_initialized():
        return [mine]
    rank = dist.get_rank()
    out: list[Any] | None = [None] * dist.get_world_size(group) if rank == 0 else None
    dist.gather_object(mine, out, dst=0, group=group)
    return out


def manifest(*, checkpoint_id: str, step: int, model: torch.nn.Module | None,
             optimizer: torch.optim.Optimizer | None, scaler: Any, sampler: Any,
             plan: Mapping[str, Any] | None, ranks: list[Any],
             extra: Mapping[str, Any] | None = None,
             sharded: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The checkpoint file's content (rank 0): :data:`FORMAT` with ``model`` and ``optimizer``
    state dicts, or :data:`SHARDED_FORMAT` with both None and ``sharded`` naming the DCP
    directory (:mod:`hetero_worker.ckpt.sharded`). Tensors and plain types only."""
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


def refuse_pipeline_checkpoint(state: Mapping[str, Any]) -> None:
    """A data-parallel job's check: raise when ``state`` is a pipelined job's checkpoint.

    Raises:
        ValueError: ``state`` holds stage states (every rank reads the same file, so every rank
            raises alike).
    """
    if state.get(PIPELINE_KEY):
        raise ValueError(f"the checkpoint of step {state.get('step')} was written by a pipelined "
                         "job (optimizer state per stage): it resumes under a pipeline plan only; "
                         "point spec.training.checkpoint.path at a new directory")
