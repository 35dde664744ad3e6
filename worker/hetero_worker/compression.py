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
* :class:`~hetero_worker.powersgd.PowerSGDCompression` (in ``powersgd.py``) - low rank with error
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
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from hetero_worker import contract

from hetero_worker.flatbuf import copy_back_, flatten

COMPRESSION_ENV = contract.COMPRESSION
"""Per-job codec, spec ``training.compression.mode`` (name and parsing: :mod:`hetero_worker.contract`)."""
POWERSGD_RANK_ENV = contract.POWERSGD_RANK
"""Spec ``training.compression.powerSGDRank`` (default 16)."""
MODES: tuple[str, ...] = contract.COMPRESSIONS
INT8_CHUNK = 4096
"""Elements per int8 scale; 4 bytes of scale per 4096 bytes of payload (0.1 %)."""


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


def _flat(tensors: Sequence[torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
    """Concatenate as 1-D in ``dtype`` (default: float64 if any tensor is float64, else float32)."""
    if dtype is None:
        dtype = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
    return flatten(tensors, dtype)


def _unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    copy_back_(flat, tensors)


def _copy_exact(summed: torch.Tensor, exact: torch.Tensor | None) -> None:
    if exact is not None:
        exact.copy_(summed.to(exact.dtype))


class NoCompression:
    """Full-precision SUM all-reduce of the flattened tensors (the baseline; fp64 stays fp64)."""

    def __init__(self) -> None:
        self.bytes_sent = 0

    def allreduce_(self, tensors: Sequence[torch.Tensor], group: dist.ProcessGroup | None, *,
                   exact: torch.Tensor | None = None) -> None:
        """SUM-reduce in place; one all-reduce (``exact`` appended)."""
        flat = _flat(tensors)
        n = flat.numel()
        wire = flat if exact is None else torch.cat([flat, exact.to(flat.dtype)])
        dist.all_reduce(wire, group=group)
        self.bytes_sent += ring_allreduce_bytes(n * flat.element_size(), dist.get_world_size(group))
        _unflatten_into(wire[:n], tensors)
        _copy_exact(wire[n:], exact)


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
        flat = _flat(tensors, self.dtype)
        dist.all_reduce(flat, group=group)
        self.bytes_sent += ring_allreduce_bytes(flat.numel() * 2, dist.get_world_size(group))
        _unflatten_into(flat, tensors)


class Int8Compression:
    """Per-chunk absmax int8 quantisation with error feedback, pipelined in pieces.

    Each leader quantises ``g + e`` (its gradient plus the error left from earlier steps) to int8
    with one fp32 scale per :data:`INT8_CHUNK` elements, keeps ``e = (g + e) - decode(q)``,
    all-gathers ``q`` and the scales, and sums the decoded tensors of all leaders.  The vector is
    cut into pieces of ``piece_chunks`` chunks; each piece's all-gather is started asynchronously
    as soon as it is quantised and decoded as soon as it arrives, so quantisation and decoding
    overlap the transfer on the slow link.  Per piece one int8 buffer carries
    ``[exact (last piece only) | scales | q]`` (fp32 parts viewed as bytes).

    Args:
        chunk: elements per scale.
        piece_chunks: chunks per pipelined piece.
    """

    def __init__(self, chunk: int = INT8_CHUNK, piece_chunks: int = 64) -> None:
        self.chunk = chunk
        self.piece = chunk * piece_chunks
        self.error: torch.Tensor | None = None
        self.keys: tuple[int, ...] | None = None  # parameter of each tensor, in error's order
        self._new_keys: tuple[int, ...] | None = None
        self.restored = False  # error came from a checkpoint and was not used yet
        self.bytes_sent = 0

    def align_(self, keys: Sequence[int]) -> None:
        """Say which parameter each tensor of the next call is (DDP reorders a bucket's tensors
        when it rebuilds buckets); the error buffer is permuted to that order on the call."""
        keys = tuple(keys)
        if self.keys is None or self.error is None:
            self.keys = keys
        elif keys != self.keys:
            self._new_keys = keys

    def state_dict(self) -> dict[str, object]:
        """Error-feedback state for a checkpoint (this leader's own; tensors and plain types)."""
        return {"kind": "int8", "chunk": self.chunk,
                "keys": None if self.keys is None else list(self.keys),
                "error": None if self.error is None else self.error.detach().cpu().clone()}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Continue with a saved error buffer (its length is checked on the next call).

        Raises:
            ValueError: the state is not an int8 state of the same chunk size.
        """
        if state.get("kind") != "int8" or state.get("chunk") != self.chunk:
            raise ValueError(f"not an int8 codec state with chunk {self.chunk}: "
                             f"{state.get('kind')}, chunk {state.get('chunk')}")
        error = state.get("error")
        self.error = None if error is None else error.clone()  # type: ignore[union-attr]
        keys = state.get("keys")
        self.keys = None if keys is None else tuple(keys)  # type: ignore[arg-type]
        self.restored = self.error is not None

    def _reorder_error(self, tensors: Sequence[torch.Tensor]) -> None:
        """Permute the error buffer from ``keys`` order to the announced new order."""
        new, self._new_keys = self._new_keys, None
        assert new is not None and self.keys is not None and self.error is not None
        perm = order_permutation(self.keys, new)
        numels = [t.numel() for t in tensors]
        if perm is None or len(numels) != len(perm) or sum(numels) != self.error.numel():
            log_state_reset(f"int8 error buffer for parameters {list(self.keys)} given "
                            f"{list(new)}")
            self.error, self.keys, self.restored = None, new, False
            return
        old_numels = [0] * len(perm)
        for i, j in enumerate(perm):
            old_numels[j] = numels[i]
        pieces = list(torch.split(self.error, old_numels))
        self.error = torch.cat([pieces[j] for j in perm]) if pieces else self.error
        self.keys = new

    def payload_bytes(self, numel: int) -> int:
        """Bytes one leader contributes per step: 1 per element plus 4 per chunk."""
        return numel + 4 * math.ceil(numel / self.chunk)

    def allreduce_(self, tensors: Sequence[torch.Tensor], group: dist.ProcessGroup | None, *,
                   exact: torch.Tensor | None = None) -> None:
        """SUM-reduce in place; one asynchronous all-gather per piece (``exact`` in the last)."""
        flat = _flat(tensors, torch.float32)
        n = flat.numel()
        if self._new_keys is not None:
            self._reorder_error(tensors)
        if self.error is None or self.error.numel() != n:
            if self.restored and self.error is not None:  # never load it into another layout
                log_state_reset(f"int8 error buffer of {self.error.numel()} elements for a "
                                f"bucket of {n}")
            self.error = torch.zeros_like(flat)
        self.restored = False
        value = flat.add_(self.error)  # flat is our own copy: g + e in place
        world = dist.get_world_size(group)
        pieces = [(lo, min(lo + self.piece, n)) for lo in range(0, n, self.piece)]
        inflight = []
        for index, (lo, hi) in enumerate(pieces):
            q, scales = quantize_int8(value[lo:hi], self.chunk)
            self.error[lo:hi] = value[lo:hi] - dequantize_int8(q, scales, self.chunk)
            head = [scales] if exact is None or index < len(pieces) - 1 else [exact.float(), scales]
            buf = torch.cat([h.contiguous().view(torch.int8) for h in head] + [q])
            outs = [torch.empty_like(buf) for _ in range(world)]
            work = dist.all_gather(outs, buf, group=group, async_op=True)
            inflight.append((work, outs, lo, hi, scales.numel(), 4 * (len(head) - 1) * (
                exact.numel() if exact is not None else 0)))
        total = torch.zeros_like(flat)
        for work, outs, lo, hi, n_scales, exact_bytes in inflight:
            work.wait()
            for out in outs:
                scales = out[exact_bytes:exact_bytes + 4 * n_scales].view(torch.float32)
                total[lo:hi] += dequantize_int8(out[exact_bytes + 4 * n_scales:], scales, self.chunk)
            if exact_bytes:
                _copy_exact(sum(out[:exact_bytes].view(torch.float32) for out in outs), exact)
        self.bytes_sent += ring_allgather_bytes(self.payload_bytes(n), world)
        _unflatten_into(total, tensors)


def order_permutation(old: Sequence[int], new: Sequence[int]) -> list[int] | None:
    """For each key of ``new``, its position in ``old``; None unless both hold the same distinct
    keys (then state kept in ``old`` order is ``[state[j] for j in result]`` in ``new`` order)."""
    position = {k: i for i, k in enumerate(old)}
    if len(position) != len(old) or len(new) != len(old) or set(new) != set(position):
        return None
    return [position[k] for k in new]


def log_state_reset(reason: str) -> None:
    """Say on stderr that compression state was discarded (``compression_state_reset``)."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    print(f"heterotrain: rank {rank}: compression_state_reset: {reason}; error feedback starts "
          "from zero", file=sys.stderr, flush=True)


def quantize_int8(x: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Absmax int8 per chunk.

    Args:
        x: ``[N]`` float32.
        chunk: elements per scale.

    Returns:
        ``q``: ``[N]`` int8 in -127..127; ``scales``: ``[ceil(N / chunk)]`` float32 (absmax / 127).
    """
    n = x.numel()
    pad = (-n) % chunk
    padded = torch.nn.functional.pad(x, (0, pad)).view(-1, chunk)
    scales = padded.abs().amax(dim=1) / 127.0
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(padded / safe[:, None]).clamp_(-127, 127).to(torch.int8)
    return q.view(-1)[:n].contiguous(), scales


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor, chunk: int) -> torch.Tensor:
    """Inverse of :func:`quantize_int8`: ``[N]`` int8 and scales -> ``[N]`` float32."""
    n = q.numel()
    pad = (-n) % chunk
    padded = torch.nn.functional.pad(q.to(torch.float32), (0, pad)).view(-1, chunk)
    return (padded * scales[:, None]).view(-1)[:n]


@dataclass(frozen=True, kw_only=True, slots=True)
class CompressionConfig:
    """The per-job choice (spec ``training.compression``).

    Attributes:
        mode: one of :data:`MODES` (lower case).
        powersgd_rank: rank of the PowerSGD factors (>= 1; default 16, as the CRD's: rank 4
            trained the speed benchmark's MLP to a loss 4.5-6.7 % above uncompressed (3 seeds,
            3 runs), rank 16 within 1.4 %, at about 1/22 of fp32's bytes; docs/speed.md).
        powersgd_start_iter: PowerSGD's uncompressed warm-up, in steps (torch's
            ``start_powerSGD_iter``; 0 compresses from the first step).
    """

    mode: str = "none"
    powersgd_rank: int = 16
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
        return cls(mode=contract.compression_mode(env), powersgd_rank=contract.powersgd_rank(env))

    @classmethod
    def from_contract(cls, parsed: contract.Contract) -> CompressionConfig:
        """The codec settings of a parsed contract (what ``init(environ=...)`` read)."""
        return cls(mode=parsed.compression, powersgd_rank=parsed.powersgd_rank)


def make_codec(config: CompressionConfig, *, seed: int = 0) -> InterGroupCodec:
    """Build the codec for ``config``; ``seed`` fixes PowerSGD's initial factors (same on all leaders)."""
    if config.mode == "none":
        return NoCompression()
    if config.mode in ("fp16", "bf16"):
        return CastCompression(torch.float16 if config.mode == "fp16" else torch.bfloat16)
    if config.mode == "int8":
        return Int8Compression()
    from hetero_worker.powersgd import PowerSGDCompression
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
    from hetero_worker.powersgd import powersgd_payload_elems
    p_elems, q_elems = powersgd_payload_elems(shapes, config.powersgd_rank)
    return ring_allreduce_bytes(4 * p_elems, leaders) + ring_allreduce_bytes(4 * q_elems, leaders)
