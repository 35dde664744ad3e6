"""What each rank holds of every parameter, by the parameter's original name, under any sharding
mode: the one view that lets a checkpoint of one layout resume in another (issue 29, item 2).

A :class:`Piece` is a contiguous range ``[lo, hi)`` of one parameter's elements in its flat
(row-major) order, held by this rank, with a 1-D view of where it lives:

* **None** (replicated): every parameter whole, ``[0, numel)``;
* **Group** (FSDP2, :mod:`hetero_worker.memory.group`): the ``DTensor``'s local rows, dim-0 chunk
  ``[r0, r1)`` of a ``[R, ...]`` parameter is the flat range ``[r0 * row, r1 * row)``;
* **Full** (:mod:`hetero_worker.memory.full`): a unit's flat buffer is cut into one slice per rank;
  the slice ``[lo_r, hi_r)`` meets parameter ``i`` (at ``[start_i, end_i)`` of the buffer) in at
  most one range, so a rank holds at most one piece of each parameter (often none).

The optimizer's state follows its parameter: a state tensor with as many elements as the
optimizer's parameter (AdamW's ``exp_avg``, ``exp_avg_sq``) is cut like it, a smaller one (``step``)
is the same for every piece of that parameter. So state saved under one mode is put into another
by name and range: :func:`fill_from_full` from one full state dict (a checkpoint taken without
sharding, case 62), :mod:`hetero_worker.ckpt.flatdcp` from DCP's files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Piece", "apply_hyperparameters", "fill_from_full", "held_pieces", "init_optimizer_state",
           "local_flat", "optimizer_fqns", "parameter_names", "persistent_buffers", "state_slice"]


@dataclass(frozen=True)
class Piece:
    """One parameter's range of elements held by this rank.

    Attributes:
        name: the parameter's original qualified name (``blocks.0.a.weight``).
        shape: the full parameter's shape.
        lo, hi: the flat range of the full parameter held here, ``0 <= lo < hi <= numel``.
        owner: the parameter the optimizer sees (the parameter itself, its ``DTensor``, or the
            Full unit's ``htj_shard``).
        at: where the range starts in ``owner``'s local flat elements.
    """

    name: str
    shape: torch.Size
    lo: int
    hi: int
    owner: torch.nn.Parameter
    at: int

    @property
    def numel(self) -> int:
        """Elements of the full parameter."""
        return int(torch.Size(self.shape).numel())

    def view(self, local: torch.Tensor) -> torch.Tensor:
        """This piece's 1-D view of ``local`` (``owner``'s local tensor, or a state tensor with as
        many elements)."""
        return local_flat(local)[self.at:self.at + self.hi - self.lo]

    @property
    def param(self) -> torch.Tensor:
        """The held elements of the parameter (a 1-D view: writing it writes the model)."""
        return self.view(self.owner)


def persistent_buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's buffers that its ``state_dict`` holds (BatchNorm's running statistics), by
    name; the same on every rank under every mode (no mode shards buffers)."""
    names = {n for n, _ in module.named_buffers()}
    return {n: b for n, b in module.state_dict(keep_vars=True).items() if n in names}


def local_flat(tensor: torch.Tensor) -> torch.Tensor:
    """The rank's own elements of ``tensor`` as a 1-D view (a ``DTensor``'s local tensor)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.detach().view(-1)


def held_pieces(module: torch.nn.Module, shard_sync: Any = None) -> list[Piece]:
    """Every :class:`Piece` this rank holds, in parameter order.

    Args:
        module: the unwrapped model (plain or FSDP2 parameters).
        shard_sync: the model part's sharded sync; a
            :class:`~hetero_worker.memory.full.FullShardSync` (its ``units``) means Full sharding.

    Raises:
        ValueError: a ``DTensor`` parameter sharded other than on dim 0 (FSDP2's ``Shard(0)``).
    """
    units = getattr(shard_sync, "units", None)
    if units is not None:
        return _full_pieces(units)
    out: list[Piece] = []
    for name, p in module.named_parameters():
        if hasattr(p, "__create_chunk_list__") and hasattr(p, "to_local"):  # DTensor (FSDP2)
            chunk = p.__create_chunk_list__()[0]
            if any(int(o) for o in list(chunk.offsets)[1:]):
                raise ValueError(f"{name} is sharded on another dim than 0 ({chunk}); only "
                                 "FSDP2's dim-0 shards resume across layouts")
            row = int(torch.Size(p.shape[1:]).numel())
            lo = int(chunk.offsets[0]) * row if len(p.shape) else 0
            n = int(torch.Size(chunk.sizes).numel())
        else:
            lo, n = 0, p.numel()
        if n:
            out.append(Piece(name=name, shape=torch.Size(p.shape), lo=lo, hi=lo + n, owner=p, at=0))
    return out


def _full_pieces(units: Sequence[Any]) -> list[Piece]:
    """The pieces of Full sharding's units (:class:`hetero_worker.memory.full.FlatUnit`)."""
    out: list[Piece] = []
    for unit in units:
        mine_lo = unit.offsets[unit.rank]
        mine_hi = mine_lo + unit.sizes[unit.rank]
        start = 0
        for name, shape, n in zip(unit.names, unit.shapes, unit.numels, strict=True):
            a, b = max(start, mine_lo), min(start + n, mine_hi)
            if a < b:
                out.append(Piece(name=name, shape=torch.Size(shape), lo=a - start, hi=b - start,
                                 owner=unit.shard, at=a - mine_lo))
            start += n
    return out


def state_slice(piece: Piece, value: Any) -> torch.Tensor | None:
    """The piece's view of one optimizer-state value, or None when the value is not cut like the
    parameter (a scalar ``step``, or not a tensor)."""
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return None
    local = local_flat(value)
    return piece.view(value) if local.numel() == local_flat(piece.owner).numel() else None


def init_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Give every parameter its optimizer state (a step with learning rate 0, torch's own
    ``_init_optim_state``; nothing when the state exists), so a load can fill it in place."""
    from torch.distributed.checkpoint.state_dict import _init_optim_state  # noqa: PLC0415
    _init_optim_state(optimizer)


def parameter_names(module: torch.nn.Module, shard_sync: Any = None) -> list[str]:
    """Every parameter's original name, held here or not (Full: the units' names)."""
    units = getattr(shard_sync, "units", None)
    if units is not None:
        return [n for unit in units for n in unit.names]
    return [n for n, _ in module.named_parameters()]


def optimizer_fqns(module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The names of the optimizer's parameters in its ``state_dict`` order (the integer ids of
    ``param_groups``); ``""`` for a parameter that is not the module's."""
    names = {id(p): n for n, p in module.named_parameters()}
    return [names.get(id(p), "") for g in optimizer.param_groups for p in g["params"]]


def fill_from_full(pieces: Iterable[Piece], optimizer: torch.optim.Optimizer | None,
                   model_state: Mapping[str, torch.Tensor],
                   optim_state: Mapping[str, Any] | None, fqns: Sequence[str] | None,
                   names: Iterable[str] = (),
                   buffers: Mapping[str, torch.Tensor] | None = None) -> None:
    """Put one full (unsharded) state dict into the held pieces, in place (no collective).

    Args:
        pieces: :func:`held_pieces` of the current model.
        optimizer: the current optimizer (its state is created first; None: model only).
        model_state: the full model state dict (``model.state_dict()`` of a replica).
        optim_state: the full optimizer state dict (integer ids), or None.
        fqns: the saved optimizer's parameter names by id (:func:`optimizer_fqns` at save time);
            None (a checkpoint written before they were recorded): the keys of ``model_state``
            that are parameters (``names``), in order: an optimizer over ``model.parameters()``.
        names: every parameter name of the model (:func:`parameter_names`), for ``fqns`` None.
        buffers: the model's buffers (:func:`persistent_buffers`), set from ``model_state``.

    Raises:
        KeyError: a held parameter is missing from ``model_state`` (names the key).
        ValueError: a saved tensor's size differs from the parameter's.
    """
    pieces = list(pieces)
    with torch.no_grad():
        for name, buffer in (buffers or {}).items():
            if name in model_state:
                buffer.copy_(model_state[name])
        for piece in pieces:
            full = model_state[piece.name]
            if full.numel() != piece.numel:
                raise ValueError(f"checkpoint's {piece.name} has {full.numel()} elements, the "
                                 f"model's {piece.numel}")
            piece.param.copy_(full.reshape(-1)[piece.lo:piece.hi])
    if optimizer is None or not optim_state or not optim_state.get("state"):
        return
    init_optimizer_state(optimizer)
    known = set(names)
    order = list(fqns) if fqns is not None else [n for n in model_state if n in known]
    by_name = {n: optim_state["state"].get(i) for i, n in enumerate(order) if n}
    with torch.no_grad():
        for piece in pieces:
            saved = by_name.get(piece.name)
            if saved is None:
                continue
            for key, value in optimizer.state[piece.owner].items():
                if key not in saved:
                    continue
                mine = state_slice(piece, value)
                if mine is not None:
                    mine.copy_(saved[key].reshape(-1)[piece.lo:piece.hi])
                elif isinstance(value, torch.Tensor):
                    value.copy_(saved[key])
    apply_hyperparameters(optimizer, optim_state.get("param_groups") or [])


def apply_hyperparameters(optimizer: torch.optim.Optimizer,
                          groups: Sequence[Mapping[str, Any]]) -> None:
    """Set the saved hyperparameters (``lr``, ``betas``, ...; not ``params``) of group ``i`` on
    the current optimizer's group ``i``, for every group both have."""
    for mine, saved in zip(optimizer.param_groups, groups, strict=False):
        for key, value in saved.items():
            if key != "params" and key in mine:
                mine[key] = value
