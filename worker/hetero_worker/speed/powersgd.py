"""PowerSGD (rank-r gradient compression with error feedback) over a process group.

Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
Optimization", NeurIPS 2019 (arXiv:1905.13336), Algorithm 1 with one power iteration per step,
warm-started ``Q`` and error feedback.  We implement it as plain functions over tensors and a process
group instead of torch's DDP comm hook, because that hook is tied to DDP buckets over the whole
world and failed on CPU/gloo in torch 2.13 (see docs/speed.md); here it runs on the group leaders'
link only.

Per step, for each gradient viewed as ``M: [n, m]`` (first dim by the rest):
``P = (M + E) Q``; all-reduce ``P`` (SUM); orthonormalise ``P``; ``Q = (M + E)^T P``; all-reduce
``Q``; ``M_hat = P Q^T``; ``E = (M + E) - M_hat``.  Tensors where the factors are not smaller than
the matrix (biases, tiny layers) travel uncompressed inside the ``P`` all-reduce, so a step costs two
all-reduces in total.

State (checkpointed by :mod:`hetero_worker.ckpt.resume`): the iteration counter (an optional uncompressed
warm-up of ``start_iter`` calls, torch's ``start_powerSGD_iter``), this leader's error feedback and
the warm-started ``Q`` factors, kept per parameter (:meth:`PowerSGDCompression.align_`); never the
process group, which the caller passes on every call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from hetero_worker.comm.collectives import copy_back_, flatten
from hetero_worker.speed.codec import log_state_reset, order_permutation, ring_allreduce_bytes


def _matrix_shape(shape: torch.Size) -> tuple[int, int]:
    n = shape[0] if len(shape) else 1
    return n, (shape.numel() // n if n else 0)


def compressible(shape: torch.Size, rank: int) -> bool:
    """True when a rank-``rank`` factorisation of ``shape`` sends fewer elements than the tensor."""
    if len(shape) < 2:
        return False
    n, m = _matrix_shape(shape)
    r = min(rank, n, m)
    return (n + m) * r < n * m


def powersgd_payload_elems(shapes: Sequence[torch.Size], rank: int) -> tuple[int, int]:
    """Elements of the two all-reduces per step: (P factors + uncompressed tensors, Q factors)."""
    p_elems = q_elems = 0
    for shape in shapes:
        if compressible(shape, rank):
            n, m = _matrix_shape(shape)
            r = min(rank, n, m)
            p_elems += n * r
            q_elems += m * r
        else:
            p_elems += shape.numel()
    return p_elems, q_elems


def orthonormalize_(p: torch.Tensor) -> torch.Tensor:
    """Orthonormalise the columns of ``p: [n, r]`` in place (reduced QR); returns ``p``."""
    q, _ = torch.linalg.qr(p, mode="reduced")
    p.copy_(q)
    return p


class PowerSGDCompression:
    """Rank-``rank`` PowerSGD with error feedback, SUM semantics over ``group``.

    Args:
        rank: factor rank r (>= 1).
        seed: seed of the initial ``Q`` factors; must be equal on every leader.
        start_iter: calls reduced uncompressed before compression starts (the warm-up of torch's
            ``PowerSGDState.start_powerSGD_iter``; 0: compress from the first call).

    Attributes:
        iteration: calls of :meth:`allreduce_` so far (warm-up included); checkpointed, so a
            resumed run does not warm up again.
        errors, qs: this leader's error feedback and the warm-started ``Q`` factors
            (:meth:`state_dict`).
    """

    def __init__(self, *, rank: int = 4, seed: int = 0, start_iter: int = 0) -> None:
        if rank < 1:
            raise ValueError(f"rank must be >= 1, got {rank}")
        self.rank = rank
        self.seed = seed
        self.start_iter = start_iter
        self.iteration = 0
        self.bytes_sent = 0
        self.errors: list[torch.Tensor] | None = None
        self.qs: list[torch.Tensor | None] = []
        self.keys: tuple[int, ...] | None = None  # parameter of each tensor, in errors' order
        self.restored = False  # state came from a checkpoint and was not used yet

    def align_(self, keys: Sequence[int]) -> None:
        """Say which parameter each tensor of the next call is; errors and ``Q`` factors are
        permuted to that order (DDP reorders a bucket's tensors when it rebuilds buckets).

        Keys of another set of parameters discard the state (``compression_state_reset``).
        """
        keys = tuple(keys)
        if self.errors is None or self.keys is None:
            self.keys = keys
            return
        if keys == self.keys:
            return
        perm = order_permutation(self.keys, keys)
        if perm is None or len(perm) != len(self.errors):
            log_state_reset(f"PowerSGD state for parameters {list(self.keys)} given {list(keys)}")
            self.errors, self.qs, self.restored = None, [], False
        else:
            self.errors = [self.errors[j] for j in perm]
            self.qs = [self.qs[j] for j in perm]
        self.keys = keys

    def state_dict(self) -> dict[str, object]:
        """Iteration, error feedback and ``Q`` factors for a checkpoint (tensors, plain types).

        The process group is not part of it: the caller passes the live group on every call.
        """
        return {"kind": "powersgd", "rank": self.rank, "iteration": self.iteration,
                "keys": None if self.keys is None else list(self.keys),
                "errors": None if self.errors is None else [e.detach().cpu().clone()
                                                            for e in self.errors],
                "qs": [None if q is None else q.detach().cpu().clone() for q in self.qs]}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        """Continue from :meth:`state_dict`; shapes are checked against the next call's tensors.

        Raises:
            ValueError: not a PowerSGD state of the same factor rank.
        """
        if state.get("kind") != "powersgd" or state.get("rank") != self.rank:
            raise ValueError(f"not a PowerSGD rank-{self.rank} state: {state.get('kind')}, "
                             f"rank {state.get('rank')}")
        self.iteration = int(state["iteration"])  # type: ignore[arg-type]
        errors = state.get("errors")
        self.errors = None if errors is None else [e.clone() for e in errors]  # type: ignore[union-attr]
        self.qs = [None if q is None else q.clone() for q in state.get("qs") or []]  # type: ignore[union-attr]
        keys = state.get("keys")
        self.keys = None if keys is None else tuple(keys)  # type: ignore[arg-type]
        self.restored = self.errors is not None

    def _init_state(self, tensors: Sequence[torch.Tensor]) -> None:
        gen = torch.Generator().manual_seed(self.seed)
        self.errors = [torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in tensors]
        self.qs = []
        for t in tensors:
            if compressible(t.shape, self.rank):
                n, m = _matrix_shape(t.shape)
                q = torch.randn(m, min(self.rank, n, m), generator=gen)  # same on every leader
                self.qs.append(orthonormalize_(q).to(t.device))
            else:
                self.qs.append(None)

    def allreduce_(self, tensors: Sequence[torch.Tensor], group: dist.ProcessGroup | None, *,
                   exact: torch.Tensor | None = None) -> None:
        """SUM-reduce ``tensors`` in place (approximately, rank ``self.rank``) over ``group``.

        ``exact`` (1-D) rides uncompressed in the ``P`` all-reduce.  State (errors, ``Q``) is
        reset when the list of shapes differs from the previous call's.
        """
        self.iteration += 1
        if self.iteration <= self.start_iter:  # warm-up: plain SUM, no error feedback
            self._plain_allreduce(tensors, group, exact)
            return
        if self.errors is None or [e.shape for e in self.errors] != [t.shape for t in tensors]:
            if self.restored:  # never load tensors into another bucket layout
                log_state_reset(f"PowerSGD state for shapes {[list(e.shape) for e in self.errors or []]}"
                                f" does not fit {[list(t.shape) for t in tensors]}")
            self._init_state(tensors)
        self.restored = False
        assert self.errors is not None
        world = dist.get_world_size(group)
        comp = [i for i, q in enumerate(self.qs) if q is not None]
        plain = [i for i, q in enumerate(self.qs) if q is None]
        # M = g + e is accumulated into the error buffer itself (no full-size temporary); the Q
        # round turns it into the new error in place.
        mats = []
        for i in comp:
            self.errors[i].add_(tensors[i].detach())
            mats.append(self.errors[i].view(_matrix_shape(tensors[i].shape)))
        # P^T = Q^T M^T ([r, n]): the narrow factor as the left operand.  ``M @ Q`` and
        # ``M.T @ P`` with r = 4 hit slow BLAS paths on CPU (1.3 ms and 12 ms for 1024 x 1024,
        # one thread, MKL in torch 2.13) where these products take 0.3 ms each.
        pts = [torch.mm(self.qs[i].T, m.T) for i, m in zip(comp, mats)]  # type: ignore[union-attr]
        extra = [] if exact is None else [exact.to(torch.float32).reshape(-1)]
        device = tensors[0].device if tensors else torch.device("cpu")
        buf = torch.cat([pt.reshape(-1) for pt in pts]
                        + [tensors[i].detach().to(torch.float32).reshape(-1) for i in plain]
                        + [e.to(device) for e in extra] + [torch.zeros(0, device=device)])
        dist.all_reduce(buf, group=group)
        self.bytes_sent += ring_allreduce_bytes(4 * (buf.numel() - sum(e.numel() for e in extra)), world)
        offset = 0
        for pt in pts:
            pt.copy_(buf[offset:offset + pt.numel()].view_as(pt))
            offset += pt.numel()
            orthonormalize_(pt.T)  # the columns of P, in place through the view
        for i in plain:
            n = tensors[i].numel()
            tensors[i].copy_(buf[offset:offset + n].view_as(tensors[i]))
            offset += n
        if exact is not None:
            exact.copy_(buf[offset:offset + exact.numel()].view_as(exact))
        self._q_round(tensors, mats, comp, pts, group, world)

    def _plain_allreduce(self, tensors: Sequence[torch.Tensor], group: dist.ProcessGroup | None,
                         exact: torch.Tensor | None) -> None:
        """One uncompressed SUM all-reduce of ``tensors`` (and ``exact``) in their own dtype."""
        flat = flatten(tensors, tensors[0].dtype) if tensors else torch.zeros(0)
        n = flat.numel()
        wire = flat if exact is None else torch.cat([flat, exact.to(flat.dtype).reshape(-1)])
        dist.all_reduce(wire, group=group)
        self.bytes_sent += ring_allreduce_bytes(n * flat.element_size(), dist.get_world_size(group))
        copy_back_(wire[:n], tensors)
        if exact is not None:
            exact.copy_(wire[n:].view_as(exact))

    def _q_round(self, tensors: Sequence[torch.Tensor], mats: list[torch.Tensor], comp: list[int],
                 pts: list[torch.Tensor], group: dist.ProcessGroup | None, world: int) -> None:
        """Second all-reduce (``Q``), then decompress and keep the error; ``mats[k]`` is the
        ``[n, m]`` view of ``errors[comp[k]]`` holding ``M``, ``pts[k]`` the orthonormal ``P^T``."""
        if not comp:
            return
        local_qts = [torch.mm(pt, m) for pt, m in zip(pts, mats)]  # Q^T = P^T M: [r, m]
        qbuf = torch.cat([q.reshape(-1) for q in local_qts])
        dist.all_reduce(qbuf, group=group)
        self.bytes_sent += ring_allreduce_bytes(4 * qbuf.numel(), world)
        offset = 0
        for i, m, pt, qt_local in zip(comp, mats, pts, local_qts):
            qt_sum = qbuf[offset:offset + qt_local.numel()].view_as(qt_local)
            offset += qt_local.numel()
            # Error feedback (paper, Alg. 2): keep what this leader's own projection P P^T M_k
            # missed; the leaders' errors then add up to the residual of the sum exactly.  In
            # place: ``m`` is the error buffer's view.
            m.addmm_(pt.T, qt_local, alpha=-1)
            out = tensors[i]
            if out.dtype == torch.float32 and out.is_contiguous():
                torch.mm(pt.T, qt_sum, out=out.view(m.shape))
            else:
                out.copy_((pt.T @ qt_sum).view_as(out))
            self.qs[i] = qt_sum.T.contiguous()  # warm start of the next step: Q [m, r]
