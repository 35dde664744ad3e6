"""Atomic checkpoints that every rank can resume from.

Rank 0 writes ``<dir>/checkpoint.pt`` through a temp file in the same directory, ``fsync`` and
``os.replace``: a rank killed mid-write leaves the previous checkpoint intact, never half a file.
The file holds the model, optimizer, gradient scaler, sampler position (epoch, cursor, split), the
global step and the RNG states of *every* rank (gathered to rank 0), so a resumed run continues at
the same step with bit-identical parameters to an uninterrupted one on CPU. Every rank reads the
same file on resume (a shared volume in a cluster, the local disk in ``heterotrain run``).
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

CHECKPOINT_FILE = "checkpoint.pt"


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


def rng_state() -> dict[str, Any]:
    """This process's RNG states: torch CPU, CUDA (if used), Python ``random``, NumPy."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
        state["numpy"] = np.random.get_state()
    except ImportError:  # numpy is optional for the worker
        pass
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np
        np.random.set_state(state["numpy"])


def _gather_rng_states() -> list[dict[str, Any]]:
    mine = rng_state()
    if not dist.is_initialized():
        return [mine]
    states: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(states, mine)
    return states


def save_checkpoint(directory: str | Path, *, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scaler: Any = None, sampler: Any = None,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write a checkpoint; collective: call on every rank at the same step.

    Args:
        directory: checkpoint directory (created if missing).
        step: optimizer steps taken so far (the step to resume *after*).
        model: the (possibly DDP-wrapped) model; its ``state_dict`` is saved.
        optimizer, scaler, sampler: saved when given (``state_dict()`` each).
        extra: more JSON-like state (e.g. the current batch split).

    Returns:
        The checkpoint path (written by rank 0; the others return it after the barrier).
    """
    path = Path(directory) / CHECKPOINT_FILE
    rngs = _gather_rng_states()
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        save_atomic({
            "step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "sampler": sampler.state_dict() if sampler is not None else None,
            "rng": rngs, "extra": extra or {},
        }, path)
    if dist.is_initialized():
        dist.barrier()
    return path


def load_checkpoint(directory: str | Path, *, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, scaler: Any = None,
                    sampler: Any = None) -> dict[str, Any] | None:
    """Restore from ``<directory>/checkpoint.pt`` if it exists; call on every rank.

    Returns:
        The checkpoint dict (``step``, ``extra``, …) or None when there is no checkpoint.

    Raises:
        ValueError: the checkpoint holds RNG states for another world size.
    """
    path = Path(directory) / CHECKPOINT_FILE
    if not path.exists():
        return None
    # Our own file: it holds NumPy/Python RNG states, which weights_only loading refuses.
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    if sampler is not None and state["sampler"] is not None:
        sampler.load_state_dict(state["sampler"])
    rank = dist.get_rank() if dist.is_initialized() else 0
    if len(state["rng"]) <= rank:
        raise ValueError(f"checkpoint {path} has RNG states for {len(state['rng'])} ranks; "
                         f"this is rank {rank}")
    set_rng_state(state["rng"][rank])
    return state
