"""Weights & Biases runs through the ``wandb`` library: one W&B run per writing rank, named
``rank-<R>-<GPU>`` and tagged with its GPU type, all of a job's runs in one W&B group (W&B's
grouping of distributed training runs); the run's config is :meth:`RunInfo.metadata` (plan, GPU mix).

``mode`` is W&B's own: ``offline`` (the default) writes the run to local files only
(``wandb sync DIR`` uploads them later), ``online`` streams to W&B with the API key from
``WANDB_API_KEY`` (the operator sets it from ``spec.training.tracking.wandb.secretRef``),
``disabled`` writes nothing. The files go to ``WANDB_DIR`` when set, else ``<run dir>/wandb`` under
``heterotrain run``, else ``<checkpoint dir>/wandb/<job>/wandb`` in a pod.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hetero_worker.tracking.series import RunInfo, missing_extra
from heterotrain_common.contract import Contract


def wandb_dir(contract: Contract) -> Path | None:
    """The ``dir`` given to ``wandb.init`` (W&B writes under ``<dir>/wandb``); None: W&B's own
    choice (``WANDB_DIR`` when set, else the working directory)."""
    if os.environ.get("WANDB_DIR"):
        return None
    if contract.run.dir:
        return Path(contract.run.dir)
    if contract.checkpoint.dir:
        return Path(contract.checkpoint.dir) / "wandb" / contract.dist.job_name
    return None


def group_name(info: RunInfo, nonce: str) -> str:
    """The W&B group of a job's runs: ``<job>-<uid prefix>`` for a job with a ``metadata.uid`` (its
    restarts land in the same group), else ``<job>-<nonce>`` (one ``heterotrain run``)."""
    return f"{info.job}-{(info.job_uid or nonce)[:8]}"


class WandbWriter:
    """One rank's W&B run.

    Args:
        info: the rank's run info (a writing rank).
        settings: ``spec.training.tracking.wandb`` in normal form (``project``, ``mode``).
        group: the job's W&B group (the same on every rank: rank 0 picks it).
        directory: see :func:`wandb_dir`.

    Attributes:
        run: the ``wandb`` run.

    Raises:
        RuntimeError: wandb is not installed (names the extra to install).
    """

    def __init__(self, info: RunInfo, settings: Mapping[str, Any], *, group: str,
                 directory: Path | None) -> None:
        try:
            import wandb  # noqa: PLC0415
        except ImportError as exc:
            raise missing_extra("wandb", exc) from None
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
        tags = [info.tag, "job"] if info.is_job else [info.tag]
        self.run: Any = wandb.init(
            project=settings["project"], mode=settings["mode"],
            dir=str(directory) if directory is not None else None, group=group,
            name=info.run_name, job_type="train", tags=tags, config=info.metadata(),
            reinit="create_new",  # beside a run the script itself may have open
            settings=wandb.Settings(console="off"))  # the rank's log stays the pod's log

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        """One step's series as one W&B history row at ``step`` (the job's global step)."""
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        """Finish the run (W&B's service writes what it holds)."""
        self.run.finish()
