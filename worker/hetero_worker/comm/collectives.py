"""The collectives' shared mechanics, each written once.

* "flatten -> reduce -> copy back" (:func:`flat_reduce_`), on torch's own bucket helpers
  ``torch._utils._flatten_dense_tensors`` / ``_unflatten_dense_tensors`` (what DDP's legacy path
  and ``torch.distributed`` coalesced ops use), in a chosen wire dtype;
* Gloo through a host copy (:func:`host_copy`, :func:`gloo_collective_`): Gloo reduces CPU
  tensors, so a CUDA tensor goes to the host and back;
* an extra tensor reduced along with the payload (:func:`with_extra`, :func:`split_extra_`): one
  collective instead of two, the extra (e.g. a rank's statistics) split off afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
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


@contextlib.contextmanager
def host_copy(tensor: torch.Tensor, *, needed: bool = True) -> Iterator[torch.Tensor]:
    """``tensor`` itself when on the CPU (or when ``needed`` is False), else a host copy whose
    contents are copied back into ``tensor`` when the block ends (Gloo runs on host tensors)."""
    if not needed or tensor.device.type == "cpu":
        yield tensor
        return
    host = tensor.cpu()
    yield host
    tensor.copy_(host)


def gloo_collective_(tensor: torch.Tensor, collective: Callable[[torch.Tensor], Any], *,
                     gloo: bool = True) -> None:
    """Run ``collective`` on ``tensor`` in place; on a Gloo group (``gloo``) a CUDA tensor goes
    through a host copy."""
    with host_copy(tensor, needed=gloo) as t:
        collective(t)


def with_extra(flat: torch.Tensor, extra: torch.Tensor | None) -> torch.Tensor:
    """``flat`` with ``extra`` (any shape) appended in ``flat``'s dtype and device: the wire of one
    collective; ``flat`` itself when there is no extra."""
    if extra is None:
        return flat
    return torch.cat([flat, extra.to(flat.device, flat.dtype).reshape(-1)])


def split_extra_(wire: torch.Tensor, n: int, flat: torch.Tensor, extra: torch.Tensor | None) -> None:
    """After the collective: the first ``n`` elements of ``wire`` back into ``flat`` (when
    ``wire`` is a copy), the rest into ``extra`` (in its own dtype)."""
    if wire is not flat:
        flat.copy_(wire[:n])
    if extra is not None:
        extra.copy_(wire[n:].reshape(extra.shape).to(extra.dtype))


def broadcast_from_rank0_(tensor: torch.Tensor) -> None:
    """Broadcast ``tensor`` from rank 0 over the (Gloo) default group; CUDA through the host."""
    gloo_collective_(tensor, lambda t: dist.broadcast(t, src=0))
