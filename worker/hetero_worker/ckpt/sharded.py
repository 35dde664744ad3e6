"""Sharded checkpoints under ``Group`` sharding, with ``torch.distributed.checkpoint`` (issue 12).

Under Group sharding (:mod:`hetero_worker.memory.group`) each GPU-type group holds the whole model
state, sharded by FSDP2 inside the group; the groups are replicas of each other. A checkpoint
directory then holds:

* ``step-<N>-<id>/`` (:mod:`hetero_worker.ckpt.store`), one per kept checkpoint, holding
  ``checkpoint.pt``: the manifest, format :data:`hetero_worker.ckpt.files.SHARDED_FORMAT`, read with
  ``torch.load(weights_only=True)``: step, checkpoint id, the job's global data position, the plan
  it was taken under, per-rank RNG, and ``sharded``: the directory holding model and optimizer
  state, the ranks that wrote it; ``sharded-<id>/``: model and optimizer state in DCP's layout
  (``.metadata`` plus one ``__<r>_0.distcp`` file per writing rank), written by **one** group;
  and ``MANIFEST.json``, every file's size and SHA-256 (DCP's files included);
* ``.step-<N>-<id>.tmp/``: a save in progress, or one that died; never read.

**Who writes.** The groups' FSDP2 ``DTensor`` s live on different one-dimensional meshes (each
group's process group), so one world-wide ``dcp.save`` would see every group's chunks: DCP
deduplicates write items only by ``(fqn, offset)``, and groups of different sizes give chunks of
the same offset with different lengths, which overlap (DCP's global-plan validation refuses
overlapping chunks; ``default_planner._validate_global_plan``). So the largest group
(:func:`saver_ranks`; fewest bytes per rank) calls ``dcp.save`` with its own process group, and
the other groups, holding the same state, write nothing. Its ranks each write their shard;
their ``DTensor`` placements go into DCP's metadata as global offsets.

**Resharding on load** is DCP's: every rank builds the state dict of its *current* model and
optimizer (``get_state_dict``: ``DTensor`` s of its current group's mesh, or plain tensors without
sharding), ``dcp.load`` fills each rank's own chunks from whatever chunks were saved (over the
default Gloo group), and ``set_state_dict`` puts them back. So a checkpoint taken with groups
[A100] [T4, T4] resumes on [A100] [T4], or onto a job without sharding.

**Atomic, agreed.** The writing group saves into ``.step-<N>-<id>.tmp/sharded-<id>``; once every
writer has succeeded (all ranks agree, :func:`hetero_worker.comm.agree.gather_errors`), rank 0 writes ``checkpoint.pt`` beside
it, records every file's size and SHA-256 in ``MANIFEST.json``, renames the directory into place
and verifies it; checkpoints beyond the newest ``keep`` go after that. A kill at any point leaves
the earlier checkpoints complete. On resume every rank verifies candidates against their
manifests and :func:`hetero_worker.ckpt.agreement.agree_on_newest` picks the newest every rank can
read (an unreadable newest one is passed over), before anything is loaded. The agreements run on
the checkpoint process group (``ckpt_group``), and DCP's own coordination among the writers on a
Gloo group of the writing ranks (:func:`writers_group`), both with the checkpoint's timeout, not the
training collectives'.

**No pickle from the volume.** DCP (torch 2.13) unpickles two things from the files:
``FileSystemReader.read_metadata`` reads ``.metadata`` with plain ``pickle.load``, and
``DefaultLoadPlanner.load_bytes`` reads non-tensor values (the optimizer's ``param_groups``) with
``torch.load`` with weights-only loading off; either would run code put in a file on a shared volume.
:class:`SafeFileSystemReader` reads ``.metadata`` with an unpickler that builds only DCP's own
metadata classes, ``torch.Size``, dtypes, layouts and paths (:data:`METADATA_GLOBALS`) and refuses
any other global; :class:`SafeLoadPlanner` reads values with ``torch.load(weights_only=True)``.
Tensors are already read with ``weights_only=True`` by DCP. What DCP exchanges between ranks
(plans, with ``gather_object``) is pickled in memory between the job's own ranks, as
``checkpoint.save_checkpoint`` does with RNG states; nothing of it comes from a file.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from hetero_worker.ckpt import files, store
from hetero_worker.ckpt.ownership import Owner
from hetero_worker.ckpt.saving import CheckpointSaveError, discard_tmp
from hetero_worker.comm import agree
from heterotrain_common import defaults

__all__ = ["METADATA_GLOBALS", "SafeFileSystemReader", "SafeLoadPlanner", "check_sharded_dir",
           "load_metadata", "load_sharded", "save_sharded_checkpoint", "saver_ranks"]

DIR_PREFIX = "sharded-"
TMP_SUFFIX = ".tmp"
METADATA_FILE = ".metadata"
"""DCP's metadata file name inside a checkpoint directory (``filesystem._metadata_fn``)."""

METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset({
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "StorageMeta", "MetadataIndex", "ChunkStorageMetadata", "TensorProperties",
        "TensorStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"), ("pathlib._local", "PosixPath"),
    ("pathlib._local", "WindowsPath"),
})
"""The globals DCP's ``.metadata`` pickle references (found by unpickling torch 2.13's own
files with a recording ``find_class``); torch dtypes (``torch.float32``, ...) are allowed besides."""


# --- reading DCP files without running code from them --------------------------------------

class _MetadataUnpickler(pickle.Unpickler):
    """Builds only :data:`METADATA_GLOBALS` and torch dtypes ("Restricting Globals", Python's
    ``pickle`` documentation); any other global raises ``pickle.UnpicklingError``."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(
            f"DCP metadata refers to {module}.{name}, which a checkpoint's metadata never holds: "
            "refused (the file may have been written to run code)")


def load_metadata(path: str | os.PathLike[str]) -> Metadata:
    """Read a DCP ``.metadata`` file, building only DCP's metadata types.

    Raises:
        pickle.UnpicklingError: the file refers to any other global (e.g. ``os.system``).
        OSError: unreadable.
    """
    with open(path, "rb") as f:
        metadata = _MetadataUnpickler(f).load()
    if not isinstance(metadata, Metadata):
        raise pickle.UnpicklingError(f"{path} holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


class SafeFileSystemReader(FileSystemReader):
    """DCP's ``FileSystemReader`` whose ``.metadata`` is read by :func:`load_metadata`.

    Tensor data is read by the parent with ``torch.load(weights_only=True)`` (torch 2.13
    ``filesystem.py``, ``read_data``).
    """

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        metadata = load_metadata(self._get_metadata_path(rank))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner reading non-tensor values with ``weights_only=True``."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._nested_dict import set_element  # noqa: PLC0415
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


# --- who writes, agreement --------------------------------------------------------------------

def saver_ranks(groups: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The group that writes a sharded checkpoint: the largest (least state per rank), ties to
    the one with the lowest rank.

    Args:
        groups: the layout's groups of global ranks (each group one replica of the state).
    """
    best = min(groups, key=lambda g: (-len(g), min(g)))
    return tuple(sorted(best))


_WRITERS_GROUPS: dict[tuple[Any, tuple[int, ...], float], Any] = {}


def writers_group(writers: tuple[int, ...], timeout_s: float) -> Any:
    """A Gloo group of the writing ranks with the checkpoint timeout, made once per default group
    (collective the first time: every rank calls it from the save, at the same point)."""
    from datetime import timedelta  # noqa: PLC0415

    key = (dist.distributed_c10d._get_default_group() if dist.is_initialized() else None, writers, timeout_s)
    if key not in _WRITERS_GROUPS:
        _WRITERS_GROUPS[key] = dist.new_group(ranks=list(writers), backend="gloo",
                                              timeout=timedelta(seconds=timeout_s))
    return _WRITERS_GROUPS[key]


def _raise_if_failed(failures: list[tuple[int, str]], what: str) -> None:
    if failures:
        detail = "; ".join(f"rank {r}: {e}" for r, e in failures)
        raise CheckpointSaveError(f"{what} failed on every rank's account ({detail}); the "
                                  "previous checkpoint is kept")


# --- save ------------------------------------------------------------------------------------

def save_sharded_checkpoint(directory: str | Path, *, step: int, model: torch.nn.Module,
                            optimizer: torch.optim.Optimizer, groups: Sequence[Sequence[int]],
                            group: Any, rank: int, scaler: Any = None, sampler: Any = None,
                            plan: Mapping[str, Any] | None = None,
                            rank_state: Mapping[str, Any] | None = None,
                            extra: Mapping[str, Any] | None = None,
                            before_publish: Any = None, keep: int = defaults.CHECKPOINT_KEEP,
                            ckpt_group: Any = None, ckpt_timeout_s: float | None = None,
                            owner: Owner | None = None,
                            write_pieces: Callable[[Path, Any], None] | None = None) -> Path:
    """Write a sharded checkpoint; collective: every rank calls it at the same step.

    Args:
        directory: the checkpoint directory (shared by all ranks).
        step: optimizer steps taken so far.
        model: the FSDP2-sharded module (``DTensor`` parameters on this rank's group's mesh).
        optimizer: over ``model``'s parameters.
        groups: the layout's groups of global ranks (replicas of the state).
        group: this rank's group's process group (used by the writing group only).
        rank: this rank's global rank.
        scaler, sampler, plan, rank_state, extra: as
            :func:`hetero_worker.ckpt.checkpoint.save_checkpoint`.
        before_publish: test hook, called on rank 0 after the data is written and before it is
            published (a test kills the rank there).
        keep: verified checkpoints to keep.
        ckpt_group: the checkpoint process group (agreements; None: the default group).
        ckpt_timeout_s: the checkpoint timeout: the writers coordinate DCP's save on a Gloo group of
            their own with it (a slow writer never trips the training timeout of ``group``);
            None: on ``group``.
        owner: the job UID and restart generation the manifest records (None: from the
            environment, :mod:`hetero_worker.ckpt.ownership`).
        write_pieces: under Full sharding, ``(directory, process_group)`` -> writes this rank's
            pieces there as 1-D chunks (:func:`hetero_worker.ckpt.flatdcp.save_pieces`); every
            rank writes (``groups`` is then the one group of all ranks, ``group`` None) and the
            manifest says ``"sharding": "full", "layout": "flat"``.

    Returns:
        The new checkpoint's ``checkpoint.pt``.

    Raises:
        hetero_worker.ckpt.saving.CheckpointSaveError: a writing rank (or rank 0's publication)
            failed, with any exception; raised on every rank with every failing rank's error (a
            ``RuntimeError`` and ``OSError``), rank 0 removes the ``.tmp`` directory, and the
            previous checkpoint stays in place.
    """
    directory = Path(directory)
    checkpoint_id = agree.agreed_token(ckpt_group)
    writers = saver_ranks(groups)
    step_tmp = store.tmp_dir(directory, step, checkpoint_id)
    final = f"{DIR_PREFIX}{checkpoint_id}"
    tmp = step_tmp / final  # complete only once its parent is renamed into place
    error = ""
    if write_pieces is None:
        # Every rank: get_state_dict initialises an optimizer without state by a zero-lr step
        # (torch's _init_optim_state); on the writers alone that would make the replicas differ.
        model_sd, optim_sd = get_state_dict(model, optimizer)
    save_group = group if ckpt_timeout_s is None else writers_group(writers, ckpt_timeout_s)
    if rank in writers:
        try:
            if write_pieces is not None:  # Full: every rank its uneven slices, by parameter name
                write_pieces(tmp, save_group)
            else:
                dcp.save({"model": model_sd, "optim": optim_sd},
                         storage_writer=FileSystemWriter(tmp, sync_files=True),
                         process_group=save_group)
        except (Exception, CheckpointException) as exc:  # noqa: BLE001 - every rank learns it
            # (CheckpointException, DCP's error gathered from its ranks, is a BaseException)
            error = f"writing {tmp}: {type(exc).__name__}: {exc}"[:agree.ERROR_BYTES]
    failures = agree.gather_errors(error, ckpt_group)
    if failures and rank == 0:  # a full disk gets the writers' space back
        discard_tmp(step_tmp)
    _raise_if_failed(failures, f"sharded checkpoint of step {step}")
    ranks = files.gather_to_rank0(
        {"rng": files.rng_state(), **(dict(rank_state) if rank_state else {})}, ckpt_group)
    error = ""
    path = directory / store.dir_name(step, checkpoint_id) / files.CHECKPOINT_FILE
    if ranks is not None:
        try:
            if before_publish is not None:
                before_publish(step)
            if not (tmp / METADATA_FILE).is_file():
                raise FileNotFoundError(f"{tmp / METADATA_FILE} is not visible to rank 0: put "
                                        "HTJ_CHECKPOINT_DIR on a volume shared by all ranks")
            state = files.manifest(
                checkpoint_id=checkpoint_id, step=step, model=None, optimizer=None, scaler=scaler,
                sampler=sampler, plan=plan, ranks=ranks, extra=extra,
                sharded={"dir": final, "writers": list(writers),
                         "sharding": "group" if write_pieces is None else "full",
                         **({} if write_pieces is None else {"layout": "flat"})})
            files.save_atomic(state, step_tmp / files.CHECKPOINT_FILE)
            path = store.publish_verified(directory, step_tmp, step=step,
                                          checkpoint_id=checkpoint_id, fmt=files.SHARDED_FORMAT,
                                          keep=keep, owner=owner)
        except Exception as exc:  # noqa: BLE001
            discard_tmp(step_tmp)
            error = f"publishing {step_tmp}: {type(exc).__name__}: {exc}"[:agree.ERROR_BYTES]
    _raise_if_failed(agree.gather_errors(error, ckpt_group), f"sharded checkpoint of step {step}")
    return path


# --- load ------------------------------------------------------------------------------------

def check_sharded_dir(directory: str | Path, sharded: Mapping[str, Any]) -> Path:
    """The sharded state's directory named by a manifest; checks its ``.metadata`` is there.

    Raises:
        ValueError: the name is not a ``sharded-<id>`` entry of ``directory``.
        FileNotFoundError: the directory or its ``.metadata`` is missing.
    """
    name = str(sharded.get("dir", ""))
    if not name.startswith(DIR_PREFIX) or "/" in name or os.sep in name or ".." in name:
        raise ValueError(f"manifest names sharded state {name!r}, not a {DIR_PREFIX}<id> entry")
    path = Path(directory) / name
    if not (path / METADATA_FILE).is_file():
        raise FileNotFoundError(f"sharded state {path / METADATA_FILE} is missing")
    return path


def load_sharded(path: str | Path, *, model: torch.nn.Module,
                 optimizer: torch.optim.Optimizer) -> None:
    """Load model and optimizer state from a DCP directory into the current (maybe differently
    sharded) model; collective over the default group: every rank calls it.

    Raises:
        torch.distributed.checkpoint.api.CheckpointException: a rank failed to read (every
            rank raises; DCP derives it from ``BaseException``), e.g. the
            ``pickle.UnpicklingError`` of :class:`SafeFileSystemReader`.
    """
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, storage_reader=SafeFileSystemReader(path), planner=SafeLoadPlanner())
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
