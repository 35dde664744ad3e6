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

Checkpoints of another job UID (a job deleted and created again under its name, resuming from the
old job's directory) are not ordered by generation: a new job may take an old job's directory over.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from heterotrain_common import contract
from heterotrain_common.envnames import JOB_UID, RESTART_GENERATION

SUPERSEDED = "superseded by a newer restart generation"
"""Fixed phrase of :class:`SupersededError`'s message: the agreed save error carries it to every
rank as text, and :class:`hetero_worker.ckpt.saving.CheckpointSaveError` tells the case by it."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Owner:
    """The writer of a checkpoint.

    Attributes:
        job_uid: the HeteroTrainingJob's ``metadata.uid`` (``HTJ_JOB_UID``); ``""`` when unset
            (``heterotrain run``, a plain script): such checkpoints are ordered among themselves.
        generation: the gang's restart generation, 0 for the first start
            (``HTJ_RESTART_GENERATION``).
    """

    job_uid: str = ""
    generation: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Owner:
        """Read ``HTJ_JOB_UID`` and ``HTJ_RESTART_GENERATION`` (unset: ``""`` and 0).

        Raises:
            heterotrain_common.envread.ContractError: a malformed generation, naming the variable.
        """
        env = os.environ if environ is None else environ
        return cls(job_uid=contract.read_var(env, JOB_UID),
                   generation=contract.read_var(env, RESTART_GENERATION))

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> Owner:
        """The owner a manifest records (a manifest written before this field: ``""``, 0)."""
        return cls(job_uid=str(manifest.get("job_uid") or ""),
                   generation=int(manifest.get("restart_generation") or 0))

    def fields(self) -> dict[str, Any]:
        """The manifest fields: ``job_uid`` and ``restart_generation``."""
        return {"job_uid": self.job_uid, "restart_generation": self.generation}


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
