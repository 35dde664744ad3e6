"""One helper for "flatten -> reduce -> copy back", used by sync, speed, stealing and compression.

Built on torch's own bucket helpers ``torch._utils._flatten_dense_tensors`` /
``_unflatten_dense_tensors`` (what DDP's legacy path and ``torch.distributed`` coalesced ops use).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def flatten(tensors: Sequence[torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new 1-D tensor holding ``tensors`` back to back, on their (common) device.

    Args:
        tensors: dense tensors of any shapes, all on one device.
        dtype: element type of the result (default: the first tensor's; each tensor is converted).

    Returns:
        ``[sum(t.numel())]`` tensor; never a view of the inputs.

    Raises:
        ValueError: ``tensors`` is empty.
    """
    if not tensors:
        raise ValueError("nothing to flatten")
    dtype = dtype or tensors[0].dtype
    parts = [t.detach() if t.dtype == dtype else t.detach().to(dtype) for t in tensors]
    return _flatten_dense_tensors(parts)


def copy_back_(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy consecutive slices of ``flat`` into ``tensors`` (converting dtype and device)."""
    for tensor, part in zip(tensors, _unflatten_dense_tensors(flat[:sum(t.numel() for t in tensors)],
                                                             list(tensors)), strict=True):
        tensor.copy_(part)


def flat_reduce_(tensors: Sequence[torch.Tensor], reduce: Callable[[torch.Tensor], Any], *,
                 dtype: torch.dtype | None = None) -> torch.Tensor:
    """Flatten ``tensors``, run ``reduce(flat)`` (in place on ``flat``), copy the result back.

    Args:
        tensors: updated in place.
        reduce: e.g. a SUM all-reduce over the job's groups.
        dtype: wire dtype (default: the first tensor's).

    Returns:
        The reduced flat buffer.
    """
    flat = flatten(tensors, dtype)
    reduce(flat)
    copy_back_(flat, tensors)
    return flat


def broadcast_from_rank0_(tensor: torch.Tensor) -> None:
    """Broadcast ``tensor`` from rank 0 over the (Gloo) default group; CUDA through the host."""
    if tensor.device.type == "cpu":
        dist.broadcast(tensor, src=0)
        return
    host = tensor.cpu()
    dist.broadcast(host, src=0)
    tensor.copy_(host)
