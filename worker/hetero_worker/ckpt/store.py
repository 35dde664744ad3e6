"""Where checkpoints lie, how a complete one is told from a broken one, and how many stay (issue 20).

A checkpoint directory (``HTJ_CHECKPOINT_DIR``) holds one directory per checkpoint::

    step-00000120-1f3a9c0e5b7d2a64/
        checkpoint.pt        the state (hetero_worker.ckpt.files; format 2, or 3 with sharded/)
        sharded-<id>/        the DCP directory of a sharded (Group) checkpoint
        MANIFEST.json        written last: step, id, time, every file with its size and SHA-256
    .step-00000140-....tmp/  a save in progress, or one that died: never read

A save writes everything into the ``.tmp`` directory, fsyncs it, records each file's size and
SHA-256 by reading it back, writes ``MANIFEST.json``, renames the directory into place (atomic on
one file system) and verifies it once more against its manifest.  Only then are checkpoints
beyond the newest ``keep`` (``HTJ_CHECKPOINT_KEEP``, default 2) deleted, so a kill at any point
leaves every earlier checkpoint intact, and a truncated or corrupt newest one (a full disk, a
storage fault, a copy cut short) still leaves an older one to resume from.

**The last good checkpoint is never lost** (issue 32, F6).  A checkpoint that fails verification
(files missing, truncated or not matching their SHA-256; a ``step-`` directory without a manifest)
is *quarantined*: renamed to ``step-<N>-<id>.corrupt`` (with ``QUARANTINED.txt`` saying why), never
read, never counted toward ``keep`` and never deleted (a person looks at it and removes it).
Retention keeps the newest ``keep`` checkpoints that verify: rank 0 verifies each one it keeps
(those it wrote and verified in this process are not read again), so after a fall-back from a
corrupt step 200 to step 100, saving step 150 keeps 150 and 100, and 200 lies aside.  A good
checkpoint newer than the one just saved (one rank could not read it) is neither counted nor
deleted.

**Owner** (issue 32, F9).  Every manifest records the job's UID and the gang's restart generation
(:mod:`hetero_worker.ckpt.ownership`); rank 0 neither publishes nor prunes where a manifest of the
same job carries a newer generation.

A directory without a manifest, or whose files do not match it, is not a checkpoint.  On resume
every rank verifies candidates against their manifests (sizes of every file; the checksums are
shared out over the ranks, so a shared volume is read about once) and
:mod:`hetero_worker.ckpt.agreement` picks the newest checkpoint every rank can read.

A ``checkpoint.pt`` directly in the directory (the layout before this one) is still read, as the
oldest candidate.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero_worker.ckpt.files import CHECKPOINT_FILE, FORMATS, load_file
from hetero_worker.ckpt.ownership import Owner, check_owner, of_another_job
from hetero_worker.runtime.ranklog import log

STEP_PREFIX = "step-"
MANIFEST = "MANIFEST.json"
MANIFEST_FORMAT = 1
CHUNK = 4 * 2**20
QUARANTINE_SUFFIX = ".corrupt"
"""Suffix of a quarantined checkpoint directory (:func:`quarantine`): never a candidate."""
QUARANTINE_NOTE = "QUARANTINED.txt"
"""Why a checkpoint was quarantined, written inside it."""
_VERIFIED: set[tuple[Any, ...]] = set()
""":func:`_verified_key` of the checkpoints this process verified: retention does not read them
again while no file of theirs changed size or modification time."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Candidate:
    """A checkpoint found in a directory.

    Attributes:
        path: its directory (a legacy one: the checkpoint directory itself).
        step: its step (None for a legacy file before it is read).
        checkpoint_id: its id.
        saved_ns: when rank 0 published it (orders two checkpoints of one step).
        legacy: a ``checkpoint.pt`` of the old layout, without a manifest.
        manifest: the manifest, when it could be read.
        error: why it is no checkpoint (manifest missing or unreadable), ``""`` otherwise.
    """

    path: Path
    step: int | None
    checkpoint_id: str
    saved_ns: int = 0
    legacy: bool = False
    manifest: dict[str, Any] | None = None
    error: str = ""

    @property
    def key(self) -> tuple[int, int, str]:
        """Order of candidates, the same on every rank: step, publication time, id."""
        return (-1 if self.step is None else self.step, self.saved_ns, self.checkpoint_id)

    @property
    def file(self) -> Path:
        """Its ``checkpoint.pt``."""
        return self.path / CHECKPOINT_FILE


def dir_name(step: int, checkpoint_id: str) -> str:
    return f"{STEP_PREFIX}{step:08d}-{checkpoint_id}"


def tmp_dir(directory: Path, step: int, checkpoint_id: str) -> Path:
    return directory / f".{dir_name(step, checkpoint_id)}.tmp"


def _files(root: Path) -> Iterator[Path]:
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != MANIFEST:
            yield path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for path in _files(root):
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
    for sub in sorted({p.parent for p in _files(root)} | {root}, key=lambda p: -len(p.parts)):
        fsync_dir(sub)


def write_manifest(tmp: Path, *, step: int, checkpoint_id: str, fmt: int,
                   owner: Owner | None = None) -> dict[str, Any]:
    """fsync everything under ``tmp``, read each file back for its size and SHA-256, and write
    ``MANIFEST.json`` (last, atomically) with ``owner``'s job UID and restart generation
    (None: ``Owner()``). Returns the manifest."""
    _fsync_tree(tmp)
    manifest = {"manifest": MANIFEST_FORMAT, "step": int(step), "checkpoint_id": checkpoint_id,
                "format": fmt, "saved_ns": time.time_ns(), **(owner or Owner()).fields(),
                "files": [{"path": str(p.relative_to(tmp)), "size": p.stat().st_size,
                           "sha256": sha256(p)} for p in _files(tmp)]}
    part = tmp / f".{MANIFEST}.part"
    with open(part, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, tmp / MANIFEST)
    fsync_dir(tmp)
    return manifest


def publish(tmp: Path, directory: Path, step: int, checkpoint_id: str) -> Path:
    """Rename the finished ``tmp`` into place (atomic) and make the rename durable."""
    final = directory / dir_name(step, checkpoint_id)
    os.replace(tmp, final)
    fsync_dir(directory)
    return final


def owners(directory: str | Path) -> list[tuple[Owner, str]]:
    """The owner recorded in each manifest of ``directory``, with its checkpoint's name."""
    return [(Owner.from_manifest(c.manifest), c.path.name) for c in candidates(directory)
            if c.manifest is not None]


def publish_verified(directory: Path, tmp: Path, *, step: int, checkpoint_id: str, fmt: int,
                     keep: int, owner: Owner | None = None) -> Path:
    """Rank 0: check the owner, manifest, rename into place, verify, check the owner again, then
    prune to the newest ``keep`` good checkpoints.

    Args:
        owner: this gang's job UID and restart generation (None: from ``HTJ_JOB_UID`` and
            ``HTJ_RESTART_GENERATION``, :meth:`Owner.from_env`).

    Returns:
        The published checkpoint's ``checkpoint.pt``.

    Raises:
        hetero_worker.ckpt.ownership.SupersededError: a newer restart generation of the job owns
            ``directory`` (nothing published, or, when it appeared meanwhile, nothing pruned).
        OSError: the checkpoint does not read back as written (it is quarantined; the previous
            ones are kept).
    """
    owner = Owner.from_env() if owner is None else owner
    check_owner(str(directory), owner, owners(directory))
    write_manifest(tmp, step=step, checkpoint_id=checkpoint_id, fmt=fmt, owner=owner)
    final = publish(tmp, directory, step, checkpoint_id)
    found = next(c for c in candidates(directory) if c.path == final)
    problem = verify(found)
    if problem:
        quarantine(found, f"did not verify right after writing: {problem}")
        raise OSError(f"checkpoint of step {step} did not verify after writing: {problem}")
    _VERIFIED.add(_verified_key(found))
    check_owner(str(directory), owner, owners(directory))
    prune(directory, keep, current=final, owner=owner)
    return final / CHECKPOINT_FILE


def _verified_key(c: Candidate) -> tuple[Any, ...]:
    """Path, publication time, id, and every file's size and modification time (a file written
    over after its verification is verified again)."""
    stats = []
    for entry in (c.manifest or {}).get("files", []):
        try:
            st = (c.path / str(entry["path"])).stat()
            stats.append((st.st_size, st.st_mtime_ns))
        except OSError:
            stats.append(None)
    return (str(c.path), c.saved_ns, c.checkpoint_id, tuple(stats))


def quarantine(candidate: Candidate, reason: str) -> Path:
    """Rename a checkpoint that failed verification aside (``<name>.corrupt``, or
    ``<name>.<ns>.corrupt`` when that exists), write ``QUARANTINED.txt`` with ``reason`` (best
    effort: the disk may be full) and say so on stderr. Rank 0. Returns the new path.

    Raises:
        OSError: the rename failed (the checkpoint stays where it was).
    """
    target = candidate.path.with_name(candidate.path.name + QUARANTINE_SUFFIX)
    if target.exists():
        target = candidate.path.with_name(f"{candidate.path.name}.{time.time_ns()}{QUARANTINE_SUFFIX}")
    os.replace(candidate.path, target)
    fsync_dir(target.parent)
    try:
        (target / QUARANTINE_NOTE).write_text(f"{reason}\n", encoding="utf-8")
    except OSError:
        pass
    log(rank=0, message=f"checkpoint_quarantined: step {candidate.step} (checkpoint {candidate.checkpoint_id}) "
         f"moved to {target}: {reason}; it is not read, not counted toward HTJ_CHECKPOINT_KEEP and "
         "not deleted: remove it once examined")
    return target


def read_manifest(path: Path) -> dict[str, Any]:
    """``MANIFEST.json`` of a checkpoint directory.

    Raises:
        OSError, ValueError: missing, unreadable or not a manifest.
    """
    data = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("manifest") != MANIFEST_FORMAT or not isinstance(
            data.get("files"), list):
        raise ValueError(f"{path / MANIFEST} is not a checkpoint manifest")
    return data


def verify(candidate: Candidate, *, share: tuple[int, int] = (0, 1)) -> str:
    """Check a checkpoint against its manifest: every file there with its size, and the SHA-256 of
    this rank's share of the files (``share = (rank, world)``: file i is checked by rank
    ``i % world``; ``(0, 1)`` checks all).

    Returns:
        ``""`` when it passes, else why not (one line).
    """
    if candidate.legacy:  # no manifest: readable means loadable (weights only)
        try:
            state = load_file(candidate.file)
        except Exception as exc:  # noqa: BLE001 - the reason goes to the agreement
            return f"{type(exc).__name__}: {exc}"[:300]
        return "" if isinstance(state, dict) and state.get("format") in FORMATS else (
            f"{candidate.file} is not a checkpoint of format {' or '.join(map(str, FORMATS))}")
    if candidate.manifest is None:
        return candidate.error or f"{candidate.path / MANIFEST} is missing"
    rank, world = share
    for i, entry in enumerate(candidate.manifest["files"]):
        path = candidate.path / str(entry["path"])
        if ".." in Path(str(entry["path"])).parts:
            return f"manifest names {entry['path']!r} outside the checkpoint"
        try:
            size = path.stat().st_size
        except OSError as exc:
            return f"{path}: {type(exc).__name__}: {exc}"
        if size != int(entry["size"]):
            return f"{path} has {size} bytes, the manifest says {entry['size']} (truncated or replaced)"
        if i % world == rank:
            try:
                digest = sha256(path)
            except OSError as exc:
                return f"{path}: {type(exc).__name__}: {exc}"
            if digest != entry["sha256"]:
                return f"{path} does not match its SHA-256 in the manifest (corrupt)"
    return ""


def candidates(directory: str | Path | None) -> list[Candidate]:
    """Every checkpoint of ``directory``, newest first (a legacy ``checkpoint.pt`` last).

    Directories whose manifest is missing or unreadable are candidates with an ``error`` (they
    were meant to be checkpoints: a rank says why it could not use them).
    """
    if not directory:
        return []
    root = Path(directory)
    if not root.is_dir():
        return []
    found: list[Candidate] = []
    for entry in root.iterdir():
        if not (entry.name.startswith(STEP_PREFIX) and entry.is_dir()) or entry.name.endswith(
                QUARANTINE_SUFFIX):
            continue
        step_text, _, checkpoint_id = entry.name[len(STEP_PREFIX):].partition("-")
        try:
            manifest = read_manifest(entry)
        except (OSError, ValueError) as exc:
            found.append(Candidate(path=entry, step=int(step_text) if step_text.isdigit() else None,
                                   checkpoint_id=checkpoint_id,
                                   error=f"{entry / MANIFEST}: {type(exc).__name__}: {exc}"[:300]))
            continue
        found.append(Candidate(path=entry, step=int(manifest["step"]),
                               checkpoint_id=str(manifest["checkpoint_id"]),
                               saved_ns=int(manifest.get("saved_ns") or 0), manifest=manifest))
    found.sort(key=lambda c: c.key, reverse=True)
    if (root / CHECKPOINT_FILE).is_file():
        found.append(Candidate(path=root, step=None, checkpoint_id="", legacy=True))
    return found


def prune(directory: Path, keep: int, *, current: Path, owner: Owner | None = None) -> list[Path]:
    """Keep the newest ``keep`` good checkpoints (``current`` always counts), quarantine those
    that fail verification (:func:`quarantine`), delete the older good ones, stale ``.tmp``
    directories, and the legacy layout's files once ``keep`` new checkpoints exist.  A good
    checkpoint newer than ``current`` is left as it is (not counted).  Rank 0, after ``current`` is published and
    verified. Returns what was removed (quarantined ones are not).

    A checkpoint is verified here (sizes and SHA-256 of every file) only while it could be one of
    the ``keep``, and only once per process.  With ``owner``, another job's checkpoints (their
    manifest's job UID) are neither counted nor removed (:func:`of_another_job`, issue 33)."""
    removed: list[Path] = []
    found = [c for c in candidates(directory) if not c.legacy
             and not (owner is not None and of_another_job(c, owner))]
    mine = next((c for c in found if c.path == current), None)
    good: list[Candidate] = []
    for c in found:
        if c.path == current:
            good.append(c)
            continue
        if c.manifest is None:  # meant to be a checkpoint (a step- directory), but is none
            _set_aside(c, c.error or "no manifest")
            continue
        newer = mine is not None and c.key > mine.key  # a fall-back passed it over
        if len(good) >= max(1, keep) and not newer:
            shutil.rmtree(c.path, ignore_errors=True)
            removed.append(c.path)
            continue
        problem = "" if _verified_key(c) in _VERIFIED else verify(c)
        if problem:
            _set_aside(c, problem)
            continue
        _VERIFIED.add(_verified_key(c))
        if not newer:  # a newer good one stays, uncounted: the gang did not resume from it
            good.append(c)
    complete = good
    for entry in directory.iterdir():
        if entry.name.startswith(f".{STEP_PREFIX}") and entry.name.endswith(".tmp") and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    legacy = directory / CHECKPOINT_FILE
    if legacy.is_file() and len(complete) >= keep:  # superseded by `keep` new-layout checkpoints
        legacy.unlink(missing_ok=True)
        removed.append(legacy)
        for entry in directory.iterdir():  # its sharded-<id> directories (the old layout)
            if entry.name.startswith("sharded-") and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
                removed.append(entry)
    return removed


def _set_aside(c: Candidate, reason: str) -> None:
    """:func:`quarantine` during retention: a rename that fails leaves the checkpoint in place
    (never deleted) and does not fail the save that was just published."""
    try:
        quarantine(c, reason)
    except OSError as exc:
        log(rank=0, message=f"checkpoint_quarantine_failed: {c.path} ({reason}) could not be renamed aside: "
             f"{type(exc).__name__}: {exc}; it stays, uncounted")


def newest_file(directory: str | Path) -> Path:
    """The ``checkpoint.pt`` of the newest complete checkpoint in ``directory`` (tests, tools).

    Raises:
        FileNotFoundError: none there.
    """
    for c in candidates(directory):
        if c.legacy or c.manifest is not None:
            return c.file
    raise FileNotFoundError(f"no checkpoint in {directory}")
