"""The codec base: what a codec of the leaders' link is, the ring traffic model, and the two codecs
without state (fp32, fp16/bf16 casts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.distributed as dist

from hetero_worker.comm.collectives import copy_back_, flatten, split_extra_, with_extra
from hetero_worker.runtime.ranklog import log


class InterGroupCodec(Protocol):
    """What a hierarchical sync calls on a group leader instead of a plain all-reduce."""

    bytes_sent: int

    def allreduce_(self, tensors: Sequence[torch.Tensor], group: dist.ProcessGroup | None, *,
                   exact: torch.Tensor | None = None) -> None:
        """SUM-reduce ``tensors`` in place over the leaders in ``group``.

        ``exact`` (1-D float32, e.g. the rebalancer's stats) is SUM-reduced losslessly inside one
        of the codec's collectives; it is not counted in ``bytes_sent``.
        """


def ring_allreduce_bytes(payload_bytes: int, world: int) -> int:
    """Bytes one rank sends in a ring all-reduce of ``payload_bytes`` over ``world`` ranks."""
    return 0 if world <= 1 else round(2 * (world - 1) * payload_bytes / world)


def ring_allgather_bytes(payload_bytes: int, world: int) -> int:
    """Bytes one rank sends in a ring all-gather where each rank contributes ``payload_bytes``."""
    return (world - 1) * payload_bytes


def flat_tensors(tensors: Sequence[torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
    """Concatenate as 1-D in ``dtype`` (default: float64 if any tensor is float64, else float32)."""
    if dtype is None:
        dtype = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
    return flatten(tensors, dtype)


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    copy_back_(flat, tensors)


def copy_exact(summed: torch.Tensor, exact: torch.Tensor | None) -> None:
    if exact is not None:
        exact.copy_(summed.to(exact.dtype))


class NoCompression:
    """Full-precision SUM all-reduce of the flattened tensors (the baseline; fp64 stays fp64)."""

    def __init__(self) -> None:
        self.bytes_sent = 0

    def allreduce_(self, tensors: Sequence[torch.Tensor], group: dist.ProcessGroup | None, *,
                   exact: torch.Tensor | None = None) -> None:
        """SUM-reduce in place; one all-reduce (``exact`` appended)."""
        flat = flat_tensors(tensors)
        n = flat.numel()
        wire = with_extra(flat, exact)
        dist.all_reduce(wire, group=group)
        self.bytes_sent += ring_allreduce_bytes(n * flat.element_size(), dist.get_world_size(group))
        split_extra_(wire, n, flat, exact)
        unflatten_into(flat, tensors)


class CastCompression:
    """All-reduce in a 16-bit float type (fp16 or bf16); no error feedback.

    Args:
        dtype: ``torch.float16`` or ``torch.bfloat16``.
    """

    def __init__(self, dtype: torch.dtype) -> None:
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"dtype must be float16 or bfloat16, got {dtype}")
        self.dtype = dtype
        self.bytes_sent = 0

    def allreduce_(self, tensors: Sequence[torch.Tensor], group: dist.ProcessGroup | None, *,
                   exact: torch.Tensor | None = None) -> None:
        """SUM-reduce in place with a 16-bit all-reduce (2 bytes per element on the wire).

        ``exact`` needs fp32, so it costs one more (tiny) fp32 all-reduce in this mode.
        """
        if exact is not None:
            dist.all_reduce(exact, group=group)
        flat = flat_tensors(tensors, self.dtype)
        dist.all_reduce(flat, group=group)
        self.bytes_sent += ring_allreduce_bytes(flat.numel() * 2, dist.get_world_size(group))
        unflatten_into(flat, tensors)


def order_permutation(old: Sequence[int], new: Sequence[int]) -> list[int] | None:
    """For each key of ``new``, its position in ``old``; None unless both hold the same distinct
    keys (then state kept in ``old`` order is ``[state[j] for j in result]`` in ``new`` order)."""
    position = {k: i for i, k in enumerate(old)}
    if len(position) != len(old) or len(new) != len(old) or set(new) != set(position):
        return None
    return [position[k] for k in new]


def log_state_reset(reason: str) -> None:
    """Say on stderr that compression state was discarded (``compression_state_reset``)."""
    log(f"compression_state_reset: {reason}; error feedback starts from zero")
