"""State the user hands the trainer's checkpoints besides model and optimizer (issue 22).

``t.track(name, obj)`` registers anything with ``state_dict()`` and ``load_state_dict(state)``
(``torch.distributed.checkpoint.stateful.Stateful``: an LR scheduler, a step or token counter, a
data iterator's position) once, like the ``states`` torchtitan's ``CheckpointManager`` is built
with. Every checkpoint then holds ``obj.state_dict()`` under ``extra["tracked"][name]`` (in
``checkpoint.pt``, for both backends) and :meth:`~hetero_worker.trainer.Trainer.resume` calls
``obj.load_state_dict(saved)`` before the first step.

The state is **job-wide** (the same on every rank, as a scheduler's is): rank 0's is written and
every rank gets it back, under the same plan or a new one. It must be weights-only loadable, since
every rank loads checkpoints with ``torch.load(weights_only=True)`` (a file on a shared volume can
run no code): tensors, ``bool``/``int``/``float``/``str``/``None``, and lists, tuples and dicts
(``str`` or ``int`` keys) of them. Anything else is refused when it is tracked and when it is
saved, on every rank alike (so no rank waits in a collective for one that raised), naming where it
is and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["check_plain", "check_stateful", "restore", "states"]

PLAIN_SCALARS = (bool, int, float, str, type(None))
"""Leaf types a tracked state may hold besides tensors (all weights-only loadable)."""


def check_stateful(name: Any, obj: Any) -> None:
    """Refuse what :meth:`Trainer.track` cannot save and restore.

    Raises:
        TypeError: ``name`` is not a non-empty ``str``, or ``obj`` lacks a callable
            ``state_dict`` or ``load_state_dict``.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"Trainer.track(name, obj): name must be a non-empty str, got {name!r}")
    missing = [m for m in ("state_dict", "load_state_dict") if not callable(getattr(obj, m, None))]
    if missing:
        raise TypeError(
            f"Trainer.track({name!r}, {type(obj).__name__}): it has no "
            f"{' and no '.join(m + '()' for m in missing)}; track objects with state_dict() and "
            "load_state_dict(state) (torch.distributed.checkpoint's Stateful protocol: an LR "
            "scheduler, or give your counter these two methods)")


def check_plain(name: str, value: Any, where: str = "") -> None:
    """Raise unless ``value`` is tensors and plain types only (weights-only loadable).

    Raises:
        TypeError: names the first offending value's path and type, and the fix.
    """
    if isinstance(value, (torch.Tensor, *PLAIN_SCALARS)):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_plain(name, item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise TypeError(f"{_says(name)}: key {key!r} at {where or 'the top'} is a "
                                f"{type(key).__name__}; {_fix()}")
            check_plain(name, item, f"{where}[{key!r}]")
        return
    raise TypeError(f"{_says(name)} holds a {type(value).__module__}.{type(value).__qualname__} at "
                    f"{where or 'the top'}; {_fix()}")


def _says(name: str) -> str:
    return f"tracked state {name!r}: its state_dict()"


def _fix() -> str:
    return ("checkpoints hold tensors, bool/int/float/str/None and lists, tuples and dicts of them "
            "only (every rank loads them with weights_only=True): convert it in state_dict() "
            "(e.g. to a list or a tensor) and back in load_state_dict()")


def states(tracked: Mapping[str, Any]) -> dict[str, Any]:
    """Every tracked object's ``state_dict()``, checked (call on every rank before a save).

    Raises:
        TypeError: a state holds something weights-only loading refuses (:func:`check_plain`).
    """
    out = {}
    for name, obj in tracked.items():
        state = obj.state_dict()
        check_plain(name, state)
        out[name] = state
    return out


def restore(tracked: Mapping[str, Any],
            saved: Mapping[str, Any] | None) -> tuple[list[str], list[str]]:
    """Load each tracked object's saved state (``extra["tracked"]`` of a checkpoint).

    Returns:
        ``(missing, unused)``: tracked names the checkpoint has no state for (they keep their
        current state) and saved names nothing tracks now (not applied).
    """
    saved = dict(saved or {})
    missing = [name for name in tracked if name not in saved]
    for name, obj in tracked.items():
        if name in saved:
            obj.load_state_dict(saved[name])
    return missing, sorted(name for name in saved if name not in tracked)
