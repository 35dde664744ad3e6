"""``Full`` sharding: model state sharded over all ranks, each rank's slice proportional to its
memory (issue 12; ZeRO-3 / FSDP semantics with uneven shards across GPU types).

FSDP2 shards every parameter evenly (``torch.chunk`` on dim 0), so it cannot give an A100 eight
times a T4's share; this module does the uneven part itself, on PyTorch's own pieces:

* **Units.** Each instance of the user's block class (``t.wrap(model, block=MyBlock)``) is one
  unit; the parameters outside every block (embeddings, head, final norm) form the root unit.
* **Flat shards.** A unit's parameters, flattened and concatenated (``N`` elements), are cut into
  one contiguous slice per rank of :func:`slice_sizes` (``N x share_r``, largest remainders).
  Rank r keeps only its slice, as one ``nn.Parameter`` ``htj_shard`` registered on the unit; the
  optimizer sees only these, so its state is sharded the same way. The original parameters are
  removed from the modules.
* **Gather for forward, free after.** A unit's forward gathers its full parameters
  (``all_gather`` of slices padded to the largest one; Gloo all-gathers equal sizes only), binds
  them, each in its own storage, as the modules' attributes (``linear.weight``), runs, and
  unbinds them.  A block's
  forward runs under ``torch.utils.checkpoint`` (non-reentrant, RNG preserved), so nothing of the
  gathered block is kept for backward: backward re-gathers and recomputes the block, the way
  activation checkpointing does.  Of the root unit, what autograd saves (a head ``Linear``'s
  weight; an ``Embedding`` saves only its indices) stays from forward to backward, the rest is
  freed after forward.
* **Reduce-scatter in backward.** The gather is a ``torch.autograd.Function`` whose backward sums
  the full gradient over all ranks and hands each rank its slice (``reduce_scatter_tensor`` of the
  padded layout), accumulated into ``htj_shard.grad``.  Rank r's loss carries the weight
  ``b_r / B`` (:attr:`FullShardSync.loss_factor`), so the summed slice is the single-process
  full-batch gradient.

Communicator rule: every collective runs on the Gloo world group; on a GPU the slices go through
CPU tensors (whatever crosses GPU types goes over Gloo), as :class:`~hetero_worker.memory.group.GroupShardSync`
does.  All ranks must run the same units in the same order (the same number of micro-batches:
:meth:`FullShardSync.micro_count`); a data-dependent branch that skips a block on one rank only
would leave the others waiting in a collective.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from heterotrain_common.split import split_batch

__all__ = ["FullShardSync", "FlatUnit", "full_state_dict", "shard_full", "slice_sizes"]

SHARD_NAME = "htj_shard"
"""Name of the rank's flat slice parameter on each unit module."""


def slice_sizes(numel: int, shares_ppm: Sequence[int]) -> list[int]:
    """Cut ``numel`` elements into one slice per rank, proportional to ``shares_ppm``.

    Largest remainders by :func:`heterotrain_common.split.split_batch`, the splitter the planner
    uses for the shares themselves.

    Args:
        numel: elements of a unit's flat parameters (>= 0).
        shares_ppm: each rank's share, parts per million, rank order (sum > 0).

    Returns:
        Slice lengths, ``sum == numel``; e.g. ``slice_sizes(54, [500000, 250000, 125000, 125000])
        == [27, 13, 7, 7]``.

    Raises:
        ValueError: the shares sum to 0 or one is negative.
    """
    total = sum(shares_ppm)
    if total <= 0 or min(shares_ppm) < 0:
        raise ValueError(f"shares must be >= 0 and sum to more than 0, got {list(shares_ppm)}")
    return split_batch(numel, shares_ppm, min_batch=0)


@dataclass
class CommStats:
    """What the collectives of :class:`FlatUnit` cost on this rank.

    Attributes:
        comm_s: wall seconds inside gathers and reduce-scatters since the last take.
        cross_group_bytes: bytes of slices held by ranks of *other* groups that this rank
            received (gathers) or summed (reduce-scatters): the traffic across GPU types.
    """

    comm_s: float = 0.0
    cross_group_bytes: int = 0


@dataclass(eq=False)
class FlatUnit:
    """One unit's parameters as a flat buffer sharded in contiguous slices over the ranks.

    Attributes:
        module: the unit's module (a block instance, or the root).
        bindings: ``(module, attribute)`` where each parameter lived, with its index in ``shapes``.
        names: qualified names of the parameters (``blocks.0.linear.weight``), by index.
        shapes: parameter shapes, by index.
        sizes: slice length per rank (:func:`slice_sizes`), ``sum == numel``.
        rank: this rank; its slice is ``[offsets[rank], offsets[rank] + sizes[rank])``.
        group: the Gloo process group of all ranks (None: the default group).
        device: where the parameters live (``cpu`` or ``cuda:i``).
        cross: per rank, True when that rank is in another group (another GPU type or node).
        stats: shared :class:`CommStats`.
        shard: this rank's slice, ``[sizes[rank]]`` (an ``nn.Parameter``, registered on ``module``).
    """

    module: torch.nn.Module
    bindings: list[tuple[torch.nn.Module, str, int]]
    names: list[str]
    shapes: list[torch.Size]
    sizes: list[int]
    rank: int
    group: Any
    device: torch.device
    cross: list[bool]
    stats: CommStats
    shard: torch.nn.Parameter = field(init=False)

    @property
    def numels(self) -> list[int]:
        """Elements per parameter, by index."""
        return [s.numel() for s in self.shapes]

    @property
    def offsets(self) -> list[int]:
        """Start of each rank's slice in the flat buffer."""
        out, at = [], 0
        for n in self.sizes:
            out.append(at)
            at += n
        return out

    def gather(self) -> torch.Tensor:
        """The full flat parameters ``[numel]`` on :attr:`device` (collective, no autograd)."""
        start = time.perf_counter()
        pad = max(self.sizes)
        mine = self.shard.detach().to("cpu")
        send = torch.zeros(pad, dtype=mine.dtype)
        send[:mine.numel()] = mine
        out = torch.empty(pad * len(self.sizes), dtype=mine.dtype)
        dist.all_gather_single(out, send, group=self.group)  # Gloo: equal sizes, hence the pad
        rows = out.view(len(self.sizes), pad)
        full = torch.cat([rows[r, :n] for r, n in enumerate(self.sizes)])
        self._account(start, full.element_size())
        return full.to(self.device)

    def reduce(self, grad_full: torch.Tensor) -> torch.Tensor:
        """Sum ``grad_full`` ``[numel]`` over all ranks; return this rank's slice ``[sizes[rank]]``
        on :attr:`device` (collective)."""
        start = time.perf_counter()
        pad = max(self.sizes)
        grad = grad_full.detach().to("cpu")
        rows = torch.zeros(len(self.sizes), pad, dtype=grad.dtype)
        for r, (lo, n) in enumerate(zip(self.offsets, self.sizes, strict=True)):
            rows[r, :n] = grad[lo:lo + n]
        out = torch.empty(pad, dtype=grad.dtype)
        dist.reduce_scatter_single(out, rows.view(-1), group=self.group)
        self._account(start, grad.element_size())
        mine = out[:self.sizes[self.rank]]
        if self.device.type == "cpu":  # own storage: a view would keep the padded buffer alive
            return mine.clone() if mine.numel() < pad else mine
        return mine.to(self.device)

    def _account(self, start: float, element_bytes: int) -> None:
        self.stats.comm_s += time.perf_counter() - start
        self.stats.cross_group_bytes += element_bytes * sum(
            n for n, other in zip(self.sizes, self.cross, strict=True) if other)

    def gather_pieces(self) -> list[torch.Tensor]:
        """The full parameters, each in its own storage, by index (collective, no autograd).

        Separate storages let autograd keep only the parameters an op saves for backward (a
        ``Linear``'s weight) and free the rest (an ``Embedding`` saves only its indices).
        """
        full = self.gather()
        pieces = full.split(self.numels)
        if len(pieces) > 1:
            pieces = tuple(p.clone() for p in pieces)
        return [p.view(shape) for p, shape in zip(pieces, self.shapes, strict=True)]

    def bind(self, pieces: Sequence[torch.Tensor]) -> None:
        """Make the modules' attributes the gathered ``pieces`` (autograd flows to the slice)."""
        for module, attr, i in self.bindings:
            setattr(module, attr, pieces[i])

    def unbind(self) -> None:
        """Replace the views by empty placeholders (the gathered buffer can be freed)."""
        empty = torch.empty(0, dtype=self.shard.dtype, device=self.device)
        for module, attr, _ in self.bindings:
            setattr(module, attr, empty)


class _Gather(torch.autograd.Function):
    """Forward: the unit's full parameters from the slices, one tensor per parameter. Backward:
    this rank's slice of their gradients summed over all ranks, for ``htj_shard``."""

    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, unit: FlatUnit) -> tuple[torch.Tensor, ...]:  # noqa: ARG004
        ctx.unit = unit
        return tuple(unit.gather_pieces())

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        # unused parameters arrive as zeros (materialized grads)
        flat = torch.cat([g.reshape(-1) for g in grads])
        return ctx.unit.reduce(flat), None


def _run_gathered(unit: FlatUnit, forward: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Gather ``unit``, run ``forward`` with its parameters bound, unbind (views stay alive only
    where autograd saved them)."""
    unit.bind(_Gather.apply(unit.shard, unit))  # a tuple, one tensor per parameter
    try:
        return forward(*args, **kwargs)
    finally:
        unit.unbind()


def _install(unit: FlatUnit, recompute: bool) -> None:
    """Replace ``unit.module.forward`` by its gathered form (checkpointed when ``recompute``)."""
    forward = unit.module.forward

    def gathered(*args: Any, **kwargs: Any) -> Any:
        return _run_gathered(unit, forward, args, kwargs)

    if recompute:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return checkpoint(gathered, *args, use_reentrant=False, **kwargs)
    else:
        wrapped = gathered
    unit.module.forward = wrapped  # type: ignore[method-assign]


def _unit_roots(model: torch.nn.Module, block: type[torch.nn.Module] | None) -> list[tuple[str, torch.nn.Module]]:
    """The outermost instances of ``block`` inside ``model`` (not ``model`` itself), by name."""
    found: list[tuple[str, torch.nn.Module]] = []
    if block is None:
        return found
    for name, sub in model.named_modules():
        if sub is model or not isinstance(sub, block):
            continue
        if any(name.startswith(f"{outer}.") for outer, _ in found):
            continue
        found.append((name, sub))
    return found


def _walk(mod: torch.nn.Module, prefix: str, skip: set[int]) -> Iterator[tuple[str, torch.nn.Module]]:
    """``(qualified name, module)`` of ``mod`` and its descendants, not entering modules in
    ``skip`` (ids)."""
    yield prefix, mod
    for name, child in mod._modules.items():
        if child is not None and id(child) not in skip:
            yield from _walk(child, f"{prefix}.{name}" if prefix else name, skip)


def _collect(root: torch.nn.Module, prefix: str, skip: set[int], owner: dict[int, str],
             ) -> tuple[list[tuple[torch.nn.Module, str, int]], list[str], list[torch.nn.Parameter]]:
    """The parameters of ``root`` outside the modules in ``skip`` (ids), each once.

    Returns:
        ``(bindings, names, params)``: where each parameter is an attribute, with its index.

    Raises:
        RuntimeError: a parameter is shared with another unit (tied across units).
    """
    bindings: list[tuple[torch.nn.Module, str, int]] = []
    names: list[str] = []
    params: list[torch.nn.Parameter] = []
    index: dict[int, int] = {}
    for mod_name, mod in _walk(root, prefix, skip):
        for attr, p in list(mod._parameters.items()):
            if p is None:
                continue
            if owner.setdefault(id(p), prefix) != prefix:
                raise RuntimeError(f"parameter {mod_name}.{attr} is shared between units "
                                   f"{owner[id(p)] or '<root>'} and {prefix or '<root>'}: Full "
                                   "sharding needs each parameter in one unit (name a block class "
                                   "that contains both users, or untie them)")
            if id(p) not in index:
                index[id(p)] = len(params)
                params.append(p)
                names.append(f"{mod_name}.{attr}".lstrip("."))
            bindings.append((mod, attr, index[id(p)]))
    return bindings, names, params


def _make_unit(module: torch.nn.Module, prefix: str, skip: set[int], owner: dict[int, str], *,
               shares_ppm: Sequence[int], rank: int, group: Any, device: torch.device,
               cross: list[bool], stats: CommStats) -> FlatUnit | None:
    """Flatten ``module``'s own parameters into a :class:`FlatUnit` holding this rank's slice.

    Raises:
        RuntimeError: parameters of mixed dtypes, or a frozen parameter, in the unit.
    """
    bindings, names, params = _collect(module, prefix, skip, owner)
    if not params:
        return None
    if len({p.dtype for p in params}) > 1 or not all(p.requires_grad for p in params):
        raise RuntimeError(f"Full sharding flattens each unit ({prefix or '<root>'}) into one "
                           "buffer: its parameters must share one dtype and all require grad")
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    unit = FlatUnit(module=module, bindings=bindings, names=names, shapes=[p.shape for p in params],
                    sizes=slice_sizes(flat.numel(), shares_ppm), rank=rank, group=group,
                    device=device, cross=cross, stats=stats)
    lo = unit.offsets[rank]
    unit.shard = torch.nn.Parameter(flat[lo:lo + unit.sizes[rank]].clone())
    for mod, attr, _ in bindings:
        mod._parameters.pop(attr, None)
    unit.unbind()
    module.register_parameter(SHARD_NAME, unit.shard)
    return unit


def shard_full(model: torch.nn.Module, *, block: type[torch.nn.Module] | None,
               shares_ppm: Sequence[int], rank: int, groups_of_ranks: Sequence[int],
               device: torch.device, group: Any = None) -> list[FlatUnit]:
    """Shard ``model`` in place: every unit keeps only this rank's flat slice.

    Args:
        model: the model on ``device``, parameters equal on every rank.
        block: the repeated block class (each outermost instance is one unit, recomputed in
            backward); None: the whole model is one unit.
        shares_ppm: each rank's share of the state, parts per million, rank order
            (``HTJ_SHARD_PPM``).
        rank: this rank.
        groups_of_ranks: the topology group of each rank (bytes to another group count as
            crossing types).
        device: the rank's device.
        group: the Gloo process group of all ranks (None: the default group, Gloo in this worker).

    Returns:
        The units, root last; ``model.parameters()`` now yields their ``htj_shard`` slices.

    Raises:
        RuntimeError: a parameter shared between units, mixed dtypes or a frozen parameter.
    """
    stats = CommStats()
    cross = [g != groups_of_ranks[rank] for g in groups_of_ranks]
    owner: dict[int, str] = {}
    common = {"shares_ppm": shares_ppm, "rank": rank, "group": group, "device": device,
              "cross": cross, "stats": stats}
    blocks = _unit_roots(model, block)
    units = [_make_unit(mod, name, set(), owner, **common) for name, mod in blocks]
    root = _make_unit(model, "", {id(m) for _, m in blocks}, owner, **common)
    out = [u for u in units if u is not None]
    for unit in out:
        _install(unit, recompute=True)
    if root is not None:
        _install(root, recompute=False)
        out.append(root)
    return out


def full_state_dict(units: Sequence[FlatUnit]) -> dict[str, torch.Tensor]:
    """The full parameters by their original names (collective: every rank calls it).

    Returns:
        ``{qualified name: tensor}`` on each unit's device, e.g. for export or comparison.
    """
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for unit in units:
            pieces = unit.gather().split(unit.numels)
            for name, piece, shape in zip(unit.names, pieces, unit.shapes, strict=True):
                out[name] = piece.view(shape).clone()
    return out


class FullShardSync:
    """The weighting and bookkeeping of ``Full`` sharding (the trainer's ``shard_sync``).

    Gradients are summed inside backward (:class:`FlatUnit` reduce-scatters), so
    :meth:`reduce` only reports; the loss weight makes the sum the full-batch gradient.

    Args:
        units: from :func:`shard_full`.
        local_batches: the split, ``len == world_size``.
        micro_batch_sizes: each rank's ``HTJ_MICRO_BATCH_SIZE`` (0 = whole local batch).
        rank: this rank.
        sync: the trainer's gradient sync; when the speed features gave it a codec reducer
            (``sync.reducer``: rebalancing), :meth:`reduce` merges the rebalancer's stats.

    Attributes:
        inter_group_bytes: bytes across groups since the trainer last read them.
        inter_group_bytes_total: bytes across groups in steps so far (gathers and reduce-scatters
            of :meth:`full_state_dict` not included).
    """

    def __init__(self, *, units: Sequence[FlatUnit], local_batches: Sequence[int],
                 micro_batch_sizes: Sequence[int], rank: int, sync: Any = None) -> None:
        self.units = list(units)
        self.sync = sync
        self.local_batches = list(local_batches)
        self.micro_batch_sizes = list(micro_batch_sizes)
        self.rank = rank
        self.intra_ranks = tuple(range(len(self.local_batches)))
        self.inter_group_bytes = 0
        self.inter_group_bytes_total = 0

    @property
    def loss_factor(self) -> float:
        """``b_r / B``: the reduce-scatter sums, so the weights add up to one."""
        return self.local_batches[self.rank] / sum(self.local_batches)

    def micro_count(self, micro: int) -> int:  # noqa: ARG002 (every rank's own size is known)
        """Micro-batches every rank runs: the most any rank needs (the collectives are the
        world's), ``max_r ceil(b_r / m_r)``; 1 where no rank splits."""
        return max(-(-b // m) if m > 0 else 1
                   for b, m in zip(self.local_batches, self.micro_batch_sizes, strict=True))

    def on_split(self, local_batches: Sequence[int]) -> None:
        """Follow a new split (same call on every rank; the data part's position tells it)."""
        self.local_batches = list(local_batches)

    def take_comm_s(self) -> float:
        """Seconds in gathers and reduce-scatters since the last call."""
        stats = self.units[0].stats if self.units else CommStats()
        secs, stats.comm_s = stats.comm_s, 0.0
        return secs

    def reduce(self, params: Sequence[torch.nn.Parameter]) -> None:  # noqa: ARG002
        """Nothing left to reduce (done in backward); moves the cross-group bytes to
        :attr:`inter_group_bytes`, and merges the rebalancer's pending stats (one slot per rank)
        with one small all-reduce over the Gloo world when the speed features asked for them
        (issue 29: rebalancing under Full; there is no step-wide exchange to carry them)."""
        reducer = getattr(self.sync, "reducer", None)
        stats = reducer.pending if reducer is not None else None
        if stats is not None:
            start = time.perf_counter()
            reducer.pending = None
            merged = stats.float().cpu().clone()
            dist.all_reduce(merged, group=self.units[0].group if self.units else None)
            reducer.merged = merged
            if self.units:
                self.units[0].stats.comm_s += time.perf_counter() - start
        if self.units:
            stats = self.units[0].stats
            self.inter_group_bytes += stats.cross_group_bytes
            self.inter_group_bytes_total += stats.cross_group_bytes
            stats.cross_group_bytes = 0

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """:func:`full_state_dict` of this model's units (collective)."""
        stats = self.units[0].stats if self.units else CommStats()
        before = stats.cross_group_bytes
        out = full_state_dict(self.units)
        stats.cross_group_bytes = before
        return out
