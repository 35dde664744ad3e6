"""Per-architecture mixed precision and cross-rank agreement on skipped steps.

The planner resolves ``HTJ_PRECISION`` per rank from the compute capability (bf16 needs >= 8.0;
fp16 with a loss scaler on 7.x; fp32 below; see docs gpu-facts "Driver and CUDA"), or a job
forces one. This module only applies it: autocast to that dtype, plus a gradient scaler for fp16.

Inf/NaN agreement: a ``GradScaler`` decides per rank whether to skip the optimizer step. If one
rank skips and another does not, the replicas silently diverge. :class:`AgreeingGradScaler`
all-reduces the found-inf flag after unscaling (as torch's own FSDP ``ShardedGradScaler`` does),
so when any rank finds inf/NaN every rank skips the step and lowers its scale identically.

In a mixed job (bf16 on an A100 next to fp16 on a V100) *every* rank uses a scaler: gradients
are summed across ranks, so they must all carry the same loss scale (a bf16 rank's unscaled
gradient added to an fp16 rank's scaled one would be wrong), and every rank must join the
found-inf all-reduce or the collectives mismatch and the job hangs. Scaling a bf16 or fp32 loss
is exact up to rounding (powers of two) and the scales stay identical because the skip decision
is agreed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hetero_worker.comm.agree import agree_any

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


def agree_found_inf(found_inf: bool, process_group: Any = None) -> bool:
    """True when any rank of ``process_group`` passes True (one 4-byte all-reduce; collective;
    :func:`hetero_worker.comm.agree.agree_any`)."""
    return agree_any(found_inf, process_group)


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
        local = any(found.item() > 0 for found in per_device.values())
        self.last_found_inf = agree_found_inf(local, self.process_group)
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

    def make_scaler(self, *, job_has_fp16: bool = False,
                    process_group: Any = None) -> AgreeingGradScaler | None:
        """An :class:`AgreeingGradScaler` when this rank or any rank of the job uses fp16.

        Args:
            job_has_fp16: True when some rank of the job runs fp16 (then every rank scales).
            process_group: group the skip decision is agreed over (default: the whole job).

        Returns:
            The scaler, or None when no rank needs one (bf16/fp32 need no loss scaling).
        """
        if self.precision != "fp16" and not job_has_fp16:
            return None
        return AgreeingGradScaler(self.device_type, process_group=process_group)
