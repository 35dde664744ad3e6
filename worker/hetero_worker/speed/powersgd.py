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

Finiteness (issue 21): ``P^T = Q^T E^T + Q^T G^T`` is computed without touching the error buffer;
the all-reduced ``P`` buffer is the same on every leader, and a non-finite gradient on any leader
makes it non-finite (``inf * q`` and ``0 * inf`` are never finite).  Then every leader skips the
``Q`` round together, outputs NaN (the loss scaler's agreement skips the step on every rank) and
keeps its state as it was: errors, ``Q`` factors and the iteration counter.  Only a finite ``P``
turns ``M = G + E`` into the new error in place.  The codec reduces the whole step in one
exchange (:class:`hetero_worker.speed.controller.CodecReducer`), so a finite exchange is an applied
step; :meth:`PowerSGDCompression.end_step` rescales the errors when the loss scale changes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from hetero_worker.comm.collectives import copy_back_, flatten
from hetero_worker.runtime.checks import at_least
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
        self.rank = at_least(rank, 1, "rank")
        self.seed = seed
        self.start_iter = start_iter
        self.iteration = 0
        self.bytes_sent = 0
        self.errors: list[torch.Tensor] | None = None
        self.qs: list[torch.Tensor | None] = []
        self.keys: tuple[int, ...] | None = None  # parameter of each tensor, in errors' order
        self.restored = False  # state came from a checkpoint and was not used yet
        self.transactional = False  # the job has a loss scaler (set by the reducer)
        self._exchanged = False  # a finite exchange updated the state since the last end_step

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

    def end_step(self, *, applied: bool, scale_ratio: float = 1.0) -> None:
        """The optimizer step of the last exchange was taken (``applied``) or skipped.

        A non-finite exchange already left the state as it was.  A skipped step after a finite
        exchange cannot happen while the codec reduces the whole step at once; should it, the
        state (updated in place) is discarded, so it is at least never that of a step that did not
        happen (``compression_state_reset``).  ``scale_ratio`` (new loss scale / old) rescales the
        errors, which hold residuals of scaled gradients.
        """
        if not applied and self._exchanged and self.errors is not None:
            log_state_reset("PowerSGD state of a step that was skipped after a finite exchange")
            self.errors, self.qs = None, []
        self._exchanged = False
        if scale_ratio != 1.0 and self.errors is not None:
            for e in self.errors:
                e.mul_(scale_ratio)

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
        reset when the list of shapes differs from the previous call's.  A non-finite ``P`` (some
        leader's gradient was not finite) leaves every tensor NaN and the state as it was.
        """
        self.iteration += 1
        if self.iteration <= self.start_iter:  # warm-up: plain SUM, no error feedback
            self._plain_allreduce(tensors, group, exact)
            if not all(bool(torch.isfinite(t).all()) for t in tensors):
                self.iteration -= 1  # the same on every leader (the summed tensors)
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
        mats = [self.errors[i].view(_matrix_shape(tensors[i].shape)) for i in comp]
        # P^T = Q^T M^T = Q^T E^T + Q^T G^T ([r, n]), M not formed yet: the error buffer stays
        # as it was until the all-reduced P is known to be finite.  The narrow factor is the left
        # operand: ``M @ Q`` and ``M.T @ P`` with r = 4 hit slow BLAS paths on CPU (1.3 ms and
        # 12 ms for 1024 x 1024, one thread, MKL in torch 2.13) where these take 0.3 ms each.
        pts = [torch.mm(self.qs[i].T, m.T).addmm_(  # type: ignore[union-attr]
            self.qs[i].T, tensors[i].detach().reshape(m.shape).T.to(m.dtype))  # type: ignore[union-attr]
            for i, m in zip(comp, mats)]
        extra = [] if exact is None else [exact.to(torch.float32).reshape(-1)]
        device = tensors[0].device if tensors else torch.device("cpu")
        buf = torch.cat([pt.reshape(-1) for pt in pts]
                        + [tensors[i].detach().to(torch.float32).reshape(-1) for i in plain]
                        + [e.to(device) for e in extra] + [torch.zeros(0, device=device)])
        dist.all_reduce(buf, group=group)
        self.bytes_sent += ring_allreduce_bytes(4 * (buf.numel() - sum(e.numel() for e in extra)), world)
        if not bool(torch.isfinite(buf).all()):  # the same verdict on every leader
            self._not_finite(tensors, exact, buf)
            return
        for i, m in zip(comp, mats):  # M = G + E, in the error buffer (no full-size temporary)
            m.add_(tensors[i].detach().reshape(m.shape).to(m.dtype))
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

    def _not_finite(self, tensors: Sequence[torch.Tensor], exact: torch.Tensor | None,
                    buf: torch.Tensor) -> None:
        """A non-finite exchange: NaN out (the step is skipped), state and iteration as they were."""
        self.iteration -= 1
        for t in tensors:
            t.fill_(float("nan"))
        if exact is not None:
            exact.copy_(buf[buf.numel() - exact.numel():].view_as(exact))

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
        if not bool(torch.isfinite(qbuf).all()):  # fp32 overflow of finite inputs (same verdict
            for i, m in zip(comp, mats):           # everywhere): back to E, up to rounding
                m.sub_(tensors[i].detach().reshape(m.shape).to(m.dtype))
            self.iteration -= 1
            for t in tensors:
                t.fill_(float("nan"))
            return
        self._exchanged = True
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
