"""Gradient compression for the inter-group (group leaders') link.

Only the leaders' all-reduce of a hierarchical sync goes through a codec here; reductions inside a
group stay in full precision.  Every codec takes the leader's gradients *after* the group reduction,
so the per-rank weighting by local batch (``loss * local_batch / global_batch``, SUM reduction) is
already applied: compression never changes the weighting, only the precision of the sum.

Codecs (all reduce with SUM over ``group``, in place):

* :class:`NoCompression` - one fp32 all-reduce of the flattened gradients.
* :class:`CastCompression` - fp16 or bf16 all-reduce (gloo sums both on CPU in torch 2.13).
* :class:`Int8Compression` - per-chunk absmax int8 with error feedback; leaders all-gather the int8
  payload plus fp32 scales and each sums the decoded tensors (int8 cannot be summed on the wire
  without overflow).  Error feedback: Seide et al. 2014, Karimireddy et al. 2019 (EF-SGD).
* :class:`~hetero_worker.speed.powersgd.PowerSGDCompression` (in ``powersgd.py``) - low rank with error
  feedback.

Stateful codecs (int8, PowerSGD) have ``state_dict``/``load_state_dict`` (checkpoints, tensors and
plain types only) and ``align_(parameter indices)``: DDP reorders a bucket's tensors when it
rebuilds buckets (after the first iteration, and again after every restart), so error feedback is
kept per parameter and permuted along; state for other parameters is discarded and said
(``compression_state_reset`` on stderr).

Each codec counts the bytes it puts on the inter-group link under the ring model gloo uses
(``bytes_sent``, per leader): all-reduce of ``B`` bytes over ``k`` leaders sends
``2 (k - 1) / k * B``; all-gather of ``B`` bytes per leader sends ``(k - 1) * B``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from hetero_worker.speed.codec import (CastCompression, InterGroupCodec, NoCompression,
                                       ring_allgather_bytes, ring_allreduce_bytes)
from hetero_worker.speed.int8 import INT8_CHUNK, Int8Compression
from hetero_worker.speed.powersgd import PowerSGDCompression, powersgd_payload_elems
from heterotrain_common import contract, defaults, envnames

MODES: tuple[str, ...] = envnames.COMPRESSIONS


@dataclass(frozen=True, kw_only=True, slots=True)
class CompressionConfig:
    """The per-job choice (spec ``training.compression``).

    Attributes:
        mode: one of :data:`MODES` (lower case).
        powersgd_rank: rank of the PowerSGD factors (>= 1; default
            :data:`heterotrain_common.defaults.POWERSGD_RANK`, as the CRD's).
        powersgd_start_iter: PowerSGD's uncompressed warm-up, in steps (torch's
            ``start_powerSGD_iter``; 0 compresses from the first step).
    """

    mode: str = "none"
    powersgd_rank: int = defaults.POWERSGD_RANK
    powersgd_start_iter: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"compression.mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.powersgd_rank < 1:
            raise ValueError(f"compression.powersgd_rank must be >= 1, got {self.powersgd_rank}")
        if self.powersgd_start_iter < 0:
            raise ValueError("compression.powersgd_start_iter must be >= 0, "
                             f"got {self.powersgd_start_iter}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CompressionConfig:
        """Read ``HTJ_COMPRESSION`` (spec spelling ``Int8`` or ``int8``; unset = none) and
        ``HTJ_POWERSGD_RANK``.

        Raises:
            ValueError: unknown mode or a rank that is not a positive integer.
        """
        env = os.environ if environ is None else environ
        return cls(mode=contract.read_var(env, envnames.COMPRESSION),
                   powersgd_rank=contract.read_var(env, envnames.POWERSGD_RANK))

    @classmethod
    def from_contract(cls, parsed: contract.Contract) -> CompressionConfig:
        """The codec settings of a parsed contract (what ``init(environ=...)`` read)."""
        return cls(mode=parsed.comm.compression, powersgd_rank=parsed.comm.powersgd_rank)


def make_codec(config: CompressionConfig, *, seed: int = 0) -> InterGroupCodec:
    """Build the codec for ``config``; ``seed`` fixes PowerSGD's initial factors (same on all leaders)."""
    if config.mode == "none":
        return NoCompression()
    if config.mode in ("fp16", "bf16"):
        return CastCompression(torch.float16 if config.mode == "fp16" else torch.bfloat16)
    if config.mode == "int8":
        return Int8Compression()
    return PowerSGDCompression(rank=config.powersgd_rank, seed=seed,
                               start_iter=config.powersgd_start_iter)


def theoretical_bytes(config: CompressionConfig, shapes: Sequence[torch.Size], leaders: int) -> int:
    """Bytes one leader sends per step under ``config`` for gradients of ``shapes`` (closed form).

    Used by tests to check the counted ``bytes_sent``.
    """
    numel = sum(math.prod(s) for s in shapes)
    if config.mode == "none":
        return ring_allreduce_bytes(4 * numel, leaders)
    if config.mode in ("fp16", "bf16"):
        return ring_allreduce_bytes(2 * numel, leaders)
    if config.mode == "int8":
        return ring_allgather_bytes(numel + 4 * math.ceil(numel / INT8_CHUNK), leaders)
    p_elems, q_elems = powersgd_payload_elems(shapes, config.powersgd_rank)
    return ring_allreduce_bytes(4 * p_elems, leaders) + ring_allreduce_bytes(4 * q_elems, leaders)
