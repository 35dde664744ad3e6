"""Per-architecture mixed precision and cross-rank agreement on skipped steps.

The planner resolves ``HTJ_PRECISION`` per rank from the compute capability (bf16 needs >= 8.0;
fp16 with a loss scaler on 7.x; fp32 below; see docs gpu-facts "Driver and CUDA"), or a job
forces one. This module only applies it: autocast to that dtype, plus a gradient scaler for fp16.

Inf/NaN agreement: a ``GradScaler`` decides per rank whether to skip the optimizer step. If one
rank skips and another does not, the replicas silently diverge. :class:`AgreeingGradScaler`
all-reduces the found-inf flag after unscaling (as torch's own FSDP ``ShardedGradScaler`` does),
so when any rank finds inf/NaN every rank skips the step and lowers its scale identically.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}


def precision_for_capability(compute_capability: str) -> str:
    """The default precision for a CUDA compute capability ``"major.minor"``.

    ``bf16`` for >= 8.0, ``fp16`` for 7.x, ``fp32`` below or for ``""`` (CPU). Source: docs
    gpu-facts (bf16 needs 8.0; do not trust ``torch.cuda.is_bf16_supported()`` alone).
    """
    if not compute_capability:
        return "fp32"
    major = int(compute_capability.split(".")[0])
    return "bf16" if major >= 8 else "fp16" if major == 7 else "fp32"


class AgreeingGradScaler(torch.amp.GradScaler):
    """A ``torch.amp.GradScaler`` whose skip decision is the same on every rank.

    Args:
        device: ``"cuda"`` or ``"cpu"``.
        process_group: group to agree over (default: the whole job).
        **kwargs: passed to ``torch.amp.GradScaler``.

    Attributes:
        last_found_inf: after :meth:`unscale_`, True when any rank found inf/NaN (the step will
            be skipped everywhere).
    """

    def __init__(self, device: str = "cuda", *, process_group: Any = None, **kwargs: Any) -> None:
        super().__init__(device, **kwargs)
        self.process_group = process_group
        self.last_found_inf = False

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale as usual, then OR the found-inf flag over all ranks into every device entry."""
        super().unscale_(optimizer)
        if not self.is_enabled():
            return
        per_device = self._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        flag = torch.zeros(1, dtype=torch.float32)
        for found in per_device.values():
            flag += found.detach().to("cpu", torch.float32)
        if dist.is_initialized():
            dist.all_reduce(flag, group=self.process_group)
        self.last_found_inf = bool(flag.item() > 0)
        for found in per_device.values():
            found.fill_(1.0 if self.last_found_inf else 0.0)


@dataclass(frozen=True, kw_only=True, slots=True)
class PrecisionPolicy:
    """How one rank computes.

    Attributes:
        precision: ``bf16``, ``fp16`` or ``fp32``.
        device_type: ``"cuda"`` or ``"cpu"`` (autocast's device type).
    """

    precision: str
    device_type: str

    def __post_init__(self) -> None:
        if self.precision not in _DTYPES:
            raise ValueError(f"precision must be one of {', '.join(_DTYPES)}, got {self.precision!r}")

    @property
    def dtype(self) -> torch.dtype | None:
        """The autocast dtype, None for fp32 (no autocast)."""
        return _DTYPES[self.precision]

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Autocast region for forward and loss (no-op for fp32)."""
        if self.dtype is None:
            yield
            return
        with torch.autocast(self.device_type, dtype=self.dtype):
            yield

    def make_scaler(self, process_group: Any = None) -> AgreeingGradScaler | None:
        """An :class:`AgreeingGradScaler` for fp16, None otherwise (bf16/fp32 need no scaling)."""
        if self.precision != "fp16":
            return None
        return AgreeingGradScaler(self.device_type, process_group=process_group)
