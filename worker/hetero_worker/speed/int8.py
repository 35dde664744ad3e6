"""Int8 compression with error feedback: per-chunk absmax int8, all-gathered with fp32 scales and
summed decoded."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from hetero_worker.speed.codec import (copy_exact, flat_tensors, log_state_reset, order_permutation,
                                       ring_allgather_bytes, unflatten_into)

INT8_CHUNK = 4096
"""Elements per int8 scale; 4 bytes of scale per 4096 bytes of payload (0.1 %)."""


class Int8Compression:
    """Per-chunk absmax int8 quantisation with error feedback, pipelined in pieces.

    Each leader quantises ``g + e`` (its gradient plus the error left from earlier steps) to int8
    with one fp32 scale per :data:`INT8_CHUNK` elements, keeps ``e = (g + e) - decode(q)``,
    all-gathers ``q`` and the scales, and sums the decoded tensors of all leaders.  The vector is
    cut into pieces of ``piece_chunks`` chunks; each piece's all-gather is started asynchronously
    as soon as it is quantised and decoded as soon as it arrives, so quantisation and decoding
    overlap the transfer on the slow link.  Per piece one int8 buffer carries
    ``[exact (last piece only) | scales | q]`` (fp32 parts viewed as bytes).

    Finiteness (issue 21): the new error ``(g + e) - decode(q)`` is computed into the call's own
    copy of the gradient, never into the stored buffer, and becomes the stored error only when it
    is finite.  A non-finite gradient (an fp16 loss-scaler overflow) therefore leaves the error as
    it was; its chunks decode to non-finite values on every leader (absmax scale inf or NaN), so
    the scaler's agreement skips the step everywhere.  With :attr:`transactional` (the job has a
    loss scaler, so a step can be skipped) the new error is held until :meth:`end_step` says
    whether the step was applied: a step skipped because *another* bucket overflowed leaves this
    bucket's error as it was too.  Holding costs a second error buffer per bucket between the
    reduction and the optimizer step (4 bytes per gradient element on a leader).

    Args:
        chunk: elements per scale.
        piece_chunks: chunks per pipelined piece.

    Attributes:
        transactional: hold the new error until :meth:`end_step` (set by the reducer when the
            job has a loss scaler); otherwise a finite new error is stored at once.
    """

    def __init__(self, chunk: int = INT8_CHUNK, piece_chunks: int = 64) -> None:
        self.chunk = chunk
        self.piece = chunk * piece_chunks
        self.error: torch.Tensor | None = None
        self.keys: tuple[int, ...] | None = None  # parameter of each tensor, in error's order
        self._new_keys: tuple[int, ...] | None = None
        self.restored = False  # error came from a checkpoint and was not used yet
        self.bytes_sent = 0
        self.transactional = False
        self._pending: torch.Tensor | None = None  # the step's new error, until end_step

    def align_(self, keys: Sequence[int]) -> None:
        """Say which parameter each tensor of the next call is (DDP reorders a bucket's tensors
        when it rebuilds buckets); the error buffer is permuted to that order on the call."""
        keys = tuple(keys)
        if self.keys is None or self.error is None:
            self.keys = keys
        elif keys != self.keys:
            self._new_keys = keys

    def end_step(self, *, applied: bool, scale_ratio: float = 1.0) -> None:
        """The optimizer step of the last reduction was taken (``applied``) or skipped.

        Applied: the held new error becomes the error; skipped: it is dropped and the error stays
        as it was.  ``scale_ratio`` (new loss scale / old, a power of two) rescales the stored
        error: it holds residuals of *scaled* gradients, and the next gradients come at the new
        scale.
        """
        if self._pending is not None and applied:
            self.error = self._pending
        self._pending = None
        if scale_ratio != 1.0 and self.error is not None:
            self.error.mul_(scale_ratio)

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
        flat = flat_tensors(tensors, torch.float32)
        n = flat.numel()
        if self._new_keys is not None:
            self._reorder_error(tensors)
        if self.error is None or self.error.numel() != n:
            if self.restored and self.error is not None:  # never load it into another layout
                log_state_reset(f"int8 error buffer of {self.error.numel()} elements for a "
                                f"bucket of {n}")
            self.error = torch.zeros_like(flat)
        self.restored = False
        self._pending = None
        value = flat.add_(self.error)  # flat is our own copy: g + e in place
        world = dist.get_world_size(group)
        pieces = [(lo, min(lo + self.piece, n)) for lo in range(0, n, self.piece)]
        inflight = []
        for index, (lo, hi) in enumerate(pieces):
            q, scales = quantize_int8(value[lo:hi], self.chunk)
            value[lo:hi].sub_(dequantize_int8(q, scales, self.chunk))  # -> the new error, in flat
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
                copy_exact(sum(out[:exact_bytes].view(torch.float32) for out in outs), exact)
        self.bytes_sent += ring_allgather_bytes(self.payload_bytes(n), world)
        unflatten_into(total, tensors)
        if bool(torch.isfinite(value).all()):  # never store a non-finite error
            if self.transactional:
                self._pending = value
            else:
                self.error = value


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
