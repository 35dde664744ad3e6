"""Agreement across ranks: the one module every "all ranks learn the same answer" goes through.

* :func:`agreed_token`: rank 0 draws a random id, every rank gets it (a checkpoint's id);
* :func:`gather_records` / :func:`gather_errors`: every rank's fixed-size byte record (UTF-8 text,
  JSON) on every rank, one all-gather of ``uint8`` tensors (no pickling between ranks): the save
  agreements (did every rank's part of a checkpoint succeed) and the resume findings;
* :func:`agree_any`: True on every rank when any rank passes True (the fp16 skip decision);
* :func:`start_max`: an asynchronous element-wise ``MAX`` all-reduce of a few integers, waited for
  later (the SIGTERM stop agreement overlaps a step).

Every function takes the process group to agree over (None: the default group) and works in a
lone process without ``torch.distributed`` (the answer is its own).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

ERROR_BYTES = 512
"""Size of one rank's error record in :func:`gather_errors` (UTF-8, cut to fit, zero padded)."""


def agreed_token(group: Any = None) -> str:
    """A random 16-hex-digit id drawn by rank 0 of ``group``, the same on every rank (collective:
    one 16-byte broadcast)."""
    chosen = secrets.token_hex(8)
    if not dist.is_initialized():
        return chosen
    buf = torch.frombuffer(bytearray(chosen.encode()), dtype=torch.uint8).clone()
    dist.broadcast(buf, src=0, group=group)
    return bytes(buf.tolist()).decode()


def gather_records(record: bytes, size: int, group: Any = None) -> list[bytes]:
    """Every rank's ``record`` on every rank, ordered by rank (collective: one all-gather of
    ``size`` bytes per rank).

    Args:
        record: this rank's bytes, at most ``size``.
        size: the fixed record size, the same on every rank.
        group: the process group (None: the default group).

    Returns:
        The records with their zero padding stripped.

    Raises:
        ValueError: ``record`` is longer than ``size``.
    """
    if len(record) > size:
        raise ValueError(f"a record of {len(record)} bytes does not fit {size}")
    if not dist.is_initialized():
        return [record]
    buf = torch.zeros(size, dtype=torch.uint8)
    if record:
        buf[:len(record)] = torch.frombuffer(bytearray(record), dtype=torch.uint8)
    gathered = [torch.empty_like(buf) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, buf, group=group)
    return [bytes(g.tolist()).rstrip(b"\0") for g in gathered]


def gather_errors(error: str, group: Any = None) -> list[tuple[int, str]]:
    """Every rank's error (``""``: fine) on every rank; returns the failing ``(rank, error)``
    pairs, ordered by rank (collective; the text is cut to :data:`ERROR_BYTES` bytes)."""
    encoded = error.encode()[:ERROR_BYTES]
    texts = [r.decode(errors="replace") for r in gather_records(encoded, ERROR_BYTES, group)]
    if not dist.is_initialized():
        return [(0, texts[0])] if texts[0] else []
    return [(rank, text) for rank, text in enumerate(texts) if text]


def agree_any(flag: bool, group: Any = None) -> bool:
    """True on every rank of ``group`` when any rank passes True (collective: one 4-byte SUM
    all-reduce)."""
    summed = torch.tensor([1.0 if flag else 0.0])
    if dist.is_initialized():
        dist.all_reduce(summed, group=group)
    return bool(summed.item() > 0)


class PendingMax:
    """An element-wise ``MAX`` over every rank started by :func:`start_max`; :meth:`wait` gives the
    answer (the same on every rank)."""

    def __init__(self, values: torch.Tensor, work: Any) -> None:
        self._values, self._work = values, work

    def wait(self) -> list[int]:
        """Block until every rank's values are in; the element-wise maximum."""
        if self._work is not None:
            self._work.wait()
        return [int(v) for v in self._values.tolist()]


def start_max(values: Sequence[int], group: Any = None) -> PendingMax:
    """Start an asynchronous element-wise ``MAX`` all-reduce of ``values`` (int64) over ``group``
    (collective: every rank starts it at the same point); a minimum is agreed by negating."""
    tensor = torch.tensor(list(values), dtype=torch.int64)
    work = (dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group, async_op=True)
            if dist.is_initialized() else None)
    return PendingMax(tensor, work)
