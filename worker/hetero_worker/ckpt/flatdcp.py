"""Checkpoints of uneven shards with ``torch.distributed.checkpoint`` (DCP), by parameter name and
element range, so that any layout reads them (issue 29, item 2).

DCP reshards by *chunks*: each saved tensor is stored as boxes (offsets and sizes per dimension)
and a load reads, for every box a rank needs, the overlapping parts of the saved boxes. FSDP2's
``DTensor`` s describe their boxes themselves (``Shard(0)``: whole rows); Full sharding's slices
(:mod:`hetero_worker.memory.full`) are ranges of a unit's flat buffer that start and end inside
rows, which no box of a parameter's own shape describes. So this module saves every parameter and
every optimizer-state tensor cut like it as a **1-D tensor of the parameter's element count**
under the names DCP uses for a whole model (``model.<name>``, ``optim.state.<name>.<key>``;
``optim.param_groups.<i>.<hyperparameter>`` as values), each rank writing its
:class:`~hetero_worker.ckpt.pieces.Piece` s as chunks ``[lo, hi)``
(:class:`FlatSavePlanner`). DCP's global plan checks that the chunks cover each tensor exactly once.

Reading (:func:`load_pieces`, :class:`FlatLoadPlanner`) asks DCP for the box that holds each held
piece: the range itself from a 1-D saved tensor; from a tensor saved in its own shape (a Group
checkpoint, FSDP2's layout) the rows ``[lo // row, ceil(hi / row))``, read into a buffer and cut.
So a Full checkpoint resumes under None, Group or Full with other shares or ranks, and a Group
checkpoint resumes under Full. ``.metadata`` and values are read without unpickling code
(:class:`hetero_worker.ckpt.sharded.SafeFileSystemReader`, :class:`~hetero_worker.ckpt.sharded.SafeLoadPlanner`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (ChunkStorageMetadata, MetadataIndex,
                                                   TensorProperties, TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadPlan, SavePlan, TensorWriteData, WriteItem,
                                                  WriteItemType)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from hetero_worker.ckpt.pieces import Piece, init_optimizer_state, state_slice
from hetero_worker.ckpt.sharded import METADATA_FILE, SafeFileSystemReader, SafeLoadPlanner, load_metadata

__all__ = ["FlatLoadPlanner", "FlatSavePlanner", "load_pieces", "save_pieces"]

LAYOUT = "flat"
"""The manifest's ``sharded["layout"]`` of a checkpoint written here."""


@dataclasses.dataclass
class _Chunk:
    """A 1-D chunk to write: ``data`` holds elements ``[lo, lo + numel(data))`` of ``numel``."""

    data: torch.Tensor
    lo: int
    numel: int


class FlatSavePlanner(DefaultSavePlanner):
    """DCP's default save planner plus 1-D chunks of uneven shards.

    Args:
        chunks: key -> :class:`_Chunk` (this rank's range of the key's 1-D tensor); the values of
            the state dict given to ``dcp.save`` (scalars, hyperparameters) are planned as usual,
            identical ones of several ranks written once.
    """

    def __init__(self, chunks: Mapping[str, _Chunk]) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.chunks = dict(chunks)

    def create_local_plan(self) -> SavePlan:
        plan = super().create_local_plan()
        items = [WriteItem(index=MetadataIndex(key, torch.Size([c.lo])), type=WriteItemType.SHARD,
                           tensor_data=TensorWriteData(
                               chunk=ChunkStorageMetadata(offsets=torch.Size([c.lo]),
                                                          sizes=torch.Size([c.data.numel()])),
                               properties=TensorProperties.create_from_tensor(c.data),
                               size=torch.Size([c.numel])))
                 for key, c in self.chunks.items()]
        self.plan = dataclasses.replace(plan, items=[*plan.items, *items])
        return self.plan

    def resolve_data(self, write_item: WriteItem) -> Any:
        chunk = self.chunks.get(write_item.index.fqn)
        if chunk is None:
            return super().resolve_data(write_item)
        data = chunk.data.detach()  # own storage: torch.save of a view writes the whole buffer
        return data.to("cpu") if data.device.type != "cpu" else data.clone()


def save_pieces(path: str | Path, pieces: Iterable[Piece], optimizer: torch.optim.Optimizer, *,
                process_group: Any = None, buffers: Mapping[str, torch.Tensor] | None = None,
                ) -> None:
    """Write this rank's pieces of the model and optimizer state into a DCP directory
    (collective over ``process_group``: every rank of it calls this).

    ``buffers`` (:func:`hetero_worker.ckpt.pieces.persistent_buffers`) are written whole as
    ``model.<name>`` by the rank that gives them (rank 0: DDP's and the sharded syncs' buffers are
    rank 0's).

    Raises:
        torch.distributed.checkpoint.api.CheckpointException: a rank failed to write.
        ValueError: DCP's global plan refused the chunks (they do not cover a tensor once).
    """
    chunks: dict[str, _Chunk] = {}
    plain: dict[str, Any] = {f"model.{n}": b.detach().cpu() for n, b in (buffers or {}).items()}
    for piece in pieces:
        chunks[f"model.{piece.name}"] = _Chunk(piece.param, piece.lo, piece.numel)
        for key, value in optimizer.state.get(piece.owner, {}).items():
            name = f"optim.state.{piece.name}.{key}"
            mine = state_slice(piece, value)
            if mine is not None:
                chunks[name] = _Chunk(mine, piece.lo, piece.numel)
            else:  # the same on every rank holding a piece of this parameter: written once
                plain[name] = value.detach().cpu() if isinstance(value, torch.Tensor) else value
    for i, group in enumerate(optimizer.param_groups):
        plain.update({f"optim.param_groups.{i}.{k}": v for k, v in group.items() if k != "params"})
    dcp.save(plain, storage_writer=FileSystemWriter(path, sync_files=True),
             planner=FlatSavePlanner(chunks), process_group=process_group)


@dataclasses.dataclass
class _Target:
    """A box of a saved tensor to read into ``buffer``, then ``buffer``'s flat elements
    ``[skip, skip + numel(dest))`` into ``dest`` (no copy when ``buffer is dest``)."""

    offsets: torch.Size
    sizes: torch.Size
    buffer: torch.Tensor
    dest: torch.Tensor
    skip: int


def _target(stored: TensorStorageMetadata, key: str, piece: Piece, dest: torch.Tensor) -> _Target:
    """The box of ``stored`` that holds ``piece``'s range, whatever shape it was saved in.

    Raises:
        ValueError: the saved tensor has another element count than the parameter.
    """
    size = torch.Size(stored.size)
    if size.numel() != piece.numel:
        raise ValueError(f"checkpoint's {key} has {size.numel()} elements, the model's "
                         f"{piece.name} {piece.numel}")
    if len(size) == 1:  # saved flat (or a 1-D parameter): the range itself
        return _Target(torch.Size([piece.lo]), torch.Size([piece.hi - piece.lo]), dest, dest, 0)
    row = int(torch.Size(size[1:]).numel())
    r0, r1 = piece.lo // row, -(-piece.hi // row)
    buffer = torch.empty((r1 - r0, *size[1:]) if len(size) else (), dtype=stored.properties.dtype)
    offsets = torch.Size([r0] + [0] * (len(size) - 1)) if len(size) else torch.Size([])
    return _Target(offsets, torch.Size(buffer.shape), buffer, dest, piece.lo - r0 * row)


class FlatLoadPlanner(SafeLoadPlanner):
    """DCP's load planner (weights-only values) plus boxes read into held pieces.

    Args:
        targets: key -> :class:`_Target`; the state dict given to ``dcp.load`` holds the rest
            (scalars, hyperparameters).
    """

    def __init__(self, targets: Mapping[str, _Target]) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.targets = dict(targets)

    def create_local_plan(self) -> LoadPlan:
        plan = super().create_local_plan()
        items = [item for key, t in self.targets.items()
                 for item in create_read_items_for_chunk_list(
                     key, self.metadata.state_dict_metadata[key],
                     [ChunkStorageMetadata(offsets=t.offsets, sizes=t.sizes)])]
        return dataclasses.replace(plan, items=[*plan.items, *items])

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        target = self.targets.get(index.fqn)
        return target.buffer if target is not None else super().lookup_tensor(index)


def load_pieces(path: str | Path, pieces: Iterable[Piece], optimizer: torch.optim.Optimizer,
                buffers: Mapping[str, torch.Tensor] | None = None) -> None:
    """Fill the held pieces of the model and optimizer state from a DCP directory written by
    :func:`save_pieces` or by FSDP2's layout (:func:`hetero_worker.ckpt.sharded.save_sharded_checkpoint`);
    collective over the default group (every rank calls it).

    The optimizer's state is created first (a learning-rate-0 step) and filled in place;
    hyperparameters of group ``i`` are set on the current group ``i``; ``buffers`` saved whole
    (``model.<name>``) are copied back.

    Raises:
        pickle.UnpicklingError: the ``.metadata`` refers to anything but DCP's own types.
        ValueError: a saved tensor's element count differs from the model's parameter.
        torch.distributed.checkpoint.api.CheckpointException: a rank failed to read.
    """
    path = Path(path)
    stored = load_metadata(path / METADATA_FILE).state_dict_metadata
    if any(k.startswith("optim.state.") for k in stored):
        init_optimizer_state(optimizer)
    targets: dict[str, _Target] = {}
    plain: dict[str, Any] = {}
    scalars: list[tuple[torch.Tensor, str]] = []
    with torch.no_grad():
        for piece in pieces:
            key = f"model.{piece.name}"
            if key not in stored:
                raise ValueError(f"the checkpoint in {path} has no {key}: it was taken of another "
                                 "model")
            targets[key] = _target(stored[key], key, piece, piece.param)
            for name, value in optimizer.state.get(piece.owner, {}).items():
                key = f"optim.state.{piece.name}.{name}"
                if key not in stored:
                    continue
                mine = state_slice(piece, value)
                if mine is not None:
                    targets[key] = _target(stored[key], key, piece, mine)
                elif isinstance(value, torch.Tensor):
                    md = stored[key]
                    plain[key] = torch.empty(md.size, dtype=md.properties.dtype)
                    scalars.append((value, key))
        for name, buffer in (buffers or {}).items():
            key = f"model.{name}"
            if key in stored and isinstance(stored[key], TensorStorageMetadata):
                plain[key] = torch.empty(stored[key].size, dtype=stored[key].properties.dtype)
                scalars.append((buffer, key))
        hyper = {f"optim.param_groups.{i}.{k}": (group, k)
                 for i, group in enumerate(optimizer.param_groups) for k in group if k != "params"}
        plain.update({key: None for key in hyper if key in stored})
        dcp.load(plain, storage_reader=SafeFileSystemReader(path), planner=FlatLoadPlanner(targets))
        for t in targets.values():
            if t.buffer is not t.dest:
                t.dest.copy_(t.buffer.reshape(-1)[t.skip:t.skip + t.dest.numel()])
        for value, key in scalars:
            value.copy_(plain[key])
        for key, (group, k) in hyper.items():
            if key in plain:
                group[k] = plain[key]
