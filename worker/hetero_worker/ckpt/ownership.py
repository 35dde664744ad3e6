"""Who owns a checkpoint directory: the job's UID and the gang's restart generation (issue 32, F9).

A forced delete of the pods on a partitioned node lets the operator start a new gang (restart
generation ``g + 1``) while the old gang (``g``) may still be running behind the partition, both
writing one ``HTJ_CHECKPOINT_DIR``.  Every manifest (:mod:`hetero_worker.ckpt.store`) therefore
records the job's UID (``HTJ_JOB_UID``, the HeteroTrainingJob's ``metadata.uid``) and the gang's
restart generation (``HTJ_RESTART_GENERATION``).  Before rank 0 publishes a checkpoint, and again
before it prunes old ones, it reads the manifests there: when one of the same job carries a newer
generation, the directory belongs to the newer gang, and this one neither publishes (its data is
removed) nor prunes; every rank raises :class:`SupersededError`'s message naming both generations
(:class:`hetero_worker.ckpt.saving.CheckpointSaveError` with ``superseded`` set), which a periodic
save never retries.

Checkpoints of another job UID are not ordered by generation: a new job may write into an old
job's directory.  A checkpoint belongs to its job (issue 33): on resume, a job with a UID takes only
the checkpoints its own UID wrote, plus those of ``HTJ_RESUME_FROM``
(``spec.training.checkpoint.resumeFrom``: another job's name or UID, or :data:`ANY_JOB`)
(:class:`ResumeFilter`).  A job re-applied under its name is a new job (a new UID): it starts at
step 0 beside the old job's checkpoints, and rank 0 says whose they are and which field to set
(:meth:`ResumeFilter.passed_over`).  Without a UID (``heterotrain run``, whose run directory is
its own and which resumes with ``--resume RUNDIR``; a plain script) every checkpoint is its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from heterotrain_common import contract
from heterotrain_common.envnames import JOB_NAME, JOB_UID, RESTART_GENERATION, RESUME_FROM

SUPERSEDED = "superseded by a newer restart generation"
"""Fixed phrase of :class:`SupersededError`'s message: the agreed save error carries it to every
rank as text, and :class:`hetero_worker.ckpt.saving.CheckpointSaveError` tells the case by it."""

ANY_JOB = "AnyJob"
"""``spec.training.checkpoint.resumeFrom`` value: resume the newest checkpoint in the path whichever
job wrote it (the behaviour before checkpoints belonged to their job)."""
RESUME_FROM_FIELD = "spec.training.checkpoint.resumeFrom"
"""The field a user sets to resume another job's checkpoints (named in the fresh-start line)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Owner:
    """The writer of a checkpoint.

    Attributes:
        job_uid: the HeteroTrainingJob's ``metadata.uid`` (``HTJ_JOB_UID``); ``""`` when unset
            (``heterotrain run``, a plain script): such checkpoints are ordered among themselves.
        generation: the gang's restart generation, 0 for the first start
            (``HTJ_RESTART_GENERATION``).
        job_name: the job's name (``HTJ_JOB_NAME``), so that ``resumeFrom`` may name a job;
            ``""`` when unknown (a manifest written before this field).
    """

    job_uid: str = ""
    generation: int = 0
    job_name: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Owner:
        """Read ``HTJ_JOB_UID``, ``HTJ_RESTART_GENERATION`` and ``HTJ_JOB_NAME`` (unset: ``""``,
        0 and ``""``).

        Raises:
            heterotrain_common.envread.ContractError: a malformed generation, naming the variable.
        """
        env = os.environ if environ is None else environ
        return cls(job_uid=contract.read_var(env, JOB_UID),
                   generation=contract.read_var(env, RESTART_GENERATION),
                   job_name=str(env.get(JOB_NAME) or ""))

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> Owner:
        """The owner a manifest records (a manifest written before this field: ``""``, 0)."""
        return cls(job_uid=str(manifest.get("job_uid") or ""),
                   generation=int(manifest.get("restart_generation") or 0),
                   job_name=str(manifest.get("job_name") or ""))

    def fields(self) -> dict[str, Any]:
        """The manifest fields: ``job_uid``, ``restart_generation`` and ``job_name``."""
        return {"job_uid": self.job_uid, "restart_generation": self.generation,
                "job_name": self.job_name}

    def text(self) -> str:
        """``job "digits" (UID 0b6d...)`` for messages; ``an unknown job`` without either."""
        if not self.job_uid and not self.job_name:
            return "an unknown job (a checkpoint written without HTJ_JOB_UID)"
        name = f'job "{self.job_name}"' if self.job_name else "a job"
        return f"{name} (UID {self.job_uid})" if self.job_uid else name


class SupersededError(OSError):
    """A newer restart generation of the same job owns the checkpoint directory: this gang is
    stale (its pods were replaced) and must neither publish nor prune there.

    Attributes:
        mine: this gang's owner.
        newer: the newest owner found, with the checkpoint directory it wrote (``where``).
    """

    def __init__(self, directory: str, mine: Owner, newer: Owner, where: str) -> None:
        self.mine, self.newer, self.where = mine, newer, where
        job = f"job UID {mine.job_uid}" if mine.job_uid else "this job (no HTJ_JOB_UID)"
        super().__init__(
            f"{SUPERSEDED}: restart generation {newer.generation} of {job} owns the directory "
            f"({where}), and this gang is restart generation {mine.generation}: it neither "
            "publishes nor prunes there (a stale gang whose pods were replaced: stop it)")
        self.directory = directory


def newest_owner(owners: Iterable[tuple[Owner, str]], job_uid: str) -> tuple[Owner, str] | None:
    """The owner with the highest generation among ``owners`` of job ``job_uid`` (with where it
    was found), or None when there are none of that job."""
    same = [(o, where) for o, where in owners if o.job_uid == job_uid]
    return max(same, key=lambda pair: pair[0].generation, default=None)


def check_owner(directory: str, mine: Owner, owners: Iterable[tuple[Owner, str]]) -> None:
    """Refuse when ``owners`` (the directory's manifests, with their checkpoint names) hold a
    newer generation of ``mine.job_uid`` than ``mine``.

    Raises:
        SupersededError: naming both generations and the newer one's checkpoint.
    """
    newest = newest_owner(owners, mine.job_uid)
    if newest is not None and newest[0].generation > mine.generation:
        raise SupersededError(directory, mine, newest[0], newest[1])


@dataclass(frozen=True, kw_only=True, slots=True)
class ResumeFilter:
    """Which checkpoints of a directory a job may resume: its own, and ``resume_from``'s.

    Attributes:
        mine: this job (``job_uid`` ``""``: no identity, every checkpoint is its own).
        resume_from: ``spec.training.checkpoint.resumeFrom`` (``HTJ_RESUME_FROM``): a job name or
            UID whose checkpoints it may also resume, :data:`ANY_JOB` for any, ``""`` for none.
    """

    mine: Owner
    resume_from: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ResumeFilter:
        """From ``HTJ_JOB_UID``, ``HTJ_JOB_NAME``, ``HTJ_RESTART_GENERATION`` and ``HTJ_RESUME_FROM``."""
        env = os.environ if environ is None else environ
        return cls(mine=Owner.from_env(env), resume_from=str(env.get(RESUME_FROM) or ""))

    def accepts_owner(self, owner: Owner | None) -> bool:
        """True when a checkpoint written by ``owner`` (None: unknown, a legacy file without a
        manifest) may be resumed."""
        if not self.mine.job_uid or self.resume_from == ANY_JOB:
            return True
        if owner is None:
            return False
        if owner.job_uid == self.mine.job_uid:
            return True
        return bool(self.resume_from) and self.resume_from in (owner.job_uid, owner.job_name)

    def accepts(self, candidate: Any) -> bool:
        """:meth:`accepts_owner` of a :class:`hetero_worker.ckpt.store.Candidate`; a checkpoint
        directory whose manifest cannot be read is kept (its owner is unknown; the resume
        agreement reports it as unreadable and falls back, as before)."""
        if getattr(candidate, "manifest", None) is not None:
            return self.accepts_owner(Owner.from_manifest(candidate.manifest))
        if getattr(candidate, "legacy", False):
            return self.accepts_owner(None)
        return True

    def others(self, candidates: Iterable[Any]) -> list[Any]:
        """The candidates this job may not resume (other jobs'), in the given order."""
        return [c for c in candidates if not self.accepts(c)]

    def passed_over(self, directory: str, candidates: Iterable[Any]) -> str:
        """The line rank 0 logs when the job starts at step 0 (or from an older checkpoint)
        although ``candidates`` hold newer checkpoints of another job; ``""`` when none was
        passed over.  Names the other job, its newest step, and the field to set."""
        others = self.others(candidates)
        if not others:
            return ""
        newest = others[0]
        owner = (Owner.from_manifest(newest.manifest) if getattr(newest, "manifest", None)
                 is not None else None)
        whose = owner.text() if owner is not None else "an unknown job (a legacy checkpoint.pt)"
        value = ANY_JOB  # the name, unless it is this job's own name too: then the UID
        if owner is not None and (owner.job_name or owner.job_uid):
            value = (owner.job_name if owner.job_name and owner.job_name != self.mine.job_name
                     else owner.job_uid or owner.job_name)
        step = f"step {newest.step}" if getattr(newest, "step", None) is not None else "legacy"
        return (f"checkpoint_not_resumed: {directory} holds {len(others)} checkpoint(s) of other "
                f"jobs, the newest ({step}) by {whose}; this is {self.mine.text()}, a new job (a "
                "job re-applied under the same name gets a new UID), so it starts at step 0. To "
                f"continue from them, set {RESUME_FROM_FIELD}: {value}; to keep jobs apart, give "
                "each its own spec.training.checkpoint.path")


def of_another_job(candidate: Any, owner: Owner) -> bool:
    """True when ``candidate`` (a :class:`hetero_worker.ckpt.store.Candidate`) is another job's:
    its manifest records a job UID other than ``owner``'s.  Retention neither counts nor removes
    such checkpoints (a new job writing beside an old job's must not delete them); ``owner``
    without a UID, a legacy file or an unreadable manifest: False (retention as before)."""
    manifest = getattr(candidate, "manifest", None)
    return bool(owner.job_uid) and manifest is not None and (
        Owner.from_manifest(manifest).job_uid != owner.job_uid)
