"""Experiment tracking per GPU type (``spec.training.tracking``, ``HTJ_TRACKING``, or the Trainer's
``tracking=``; docs/tracking.md): TensorBoard, Weights & Biases and MLflow, each through its own
library, all writing the same series (:mod:`hetero_worker.tracking.series`).

Who writes what:

* rank 0, the job: ``job/loss`` (rank 0's local mean loss), ``job/samples_per_s`` (the global
  batch over rank 0's step time; every rank's step ends at the same gradient sync),
  ``job/global_batch``, and once the run's metadata (the plan: every rank's GPU type, group, node,
  local batch; the GPU mix);
* the first rank of each GPU type (lowest rank of that ``gpu_product`` in the topology):
  ``gpu_type/<GPU>/...`` with ``<GPU>`` the product, spaces and odd characters as ``-``
  (``Tesla T4`` -> ``Tesla-T4``): ``samples_per_s`` (that type's share of the global batch over the
  step time), ``compute_samples_per_s_per_gpu`` (this rank's samples over its compute time: the
  device's own speed), ``batch_share`` (0..1 of the global batch on that type), ``local_batch``,
  ``step_s``, ``compute_s`` and ``comm_wait_s`` (the step time split as
  :mod:`hetero_worker.stepping` measures it: time blocked in gradient synchronisation, waiting for
  slower ranks included, and the rest), ``loss`` (this rank's local mean loss), ``ranks``.

Each writing rank has one run per backend named ``rank-<R>-<GPU>`` (TensorBoard: a log-dir
subfolder; W&B: a run in the job's group; MLflow: a run, a child of rank 0's), the job's global step
as the step. Other ranks write nothing. W&B's group and MLflow's experiment and parent run are
chosen by rank 0 and broadcast once over the default (Gloo) group while the Trainer is built, so
the ranks never race to create them; rank 0's failure to start a backend fails every rank.
Where the files go: :func:`log_dir` (TensorBoard), :func:`~hetero_worker.tracking.wandb_writer.
wandb_dir` (W&B); MLflow's is the spec's ``trackingUri``.

A backend that fails while training (a full disk, a tracking server gone) is dropped with one log
line and training goes on; one that cannot start (library missing, server unreachable) stops the
rank with an error naming the extra to install or the failure.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hetero_worker.runtime.ranklog import log
from hetero_worker.tracking.series import EXTRAS, RunInfo, gpu_tag, step_scalars
from hetero_worker.tracking.tensorboard_writer import TensorBoardWriter, log_dir
from heterotrain_common.contract import Contract
from heterotrain_common.tracking import parse_tracking

__all__ = ["EXTRAS", "Tracker", "from_contract", "gpu_tag", "log_dir", "with_tracking"]


def with_tracking(contract: Contract, tracking: Mapping[str, Any] | None) -> Contract:
    """``contract`` with the Trainer's ``tracking`` (the spec's form, e.g.
    ``{"wandb": {"project": "digits"}}``) over the spec's: a backend named in both takes the
    Trainer's settings; None: ``contract`` unchanged.

    Raises:
        heterotrain_common.tracking.TrackingError: an invalid setting (named, under
            ``Trainer(tracking=...)``).
    """
    if tracking is None:
        return contract
    merged = {**(contract.run.tracking or {}), **parse_tracking(tracking, "Trainer(tracking=...)")}
    return dataclasses.replace(contract, run=dataclasses.replace(contract.run, tracking=merged))


class Tracker:
    """One rank's tracking: what rank 0 and the first rank of its GPU type write, to every backend
    the contract names.

    Args:
        contract: the rank's contract (tracking settings, topology, rank).
        writer_factory: TensorBoard's writer, ``factory(log_dir: str) -> writer`` with
            ``add_scalar``, ``add_text``, ``flush`` and ``close``; default
            :class:`torch.utils.tensorboard.SummaryWriter`.

    Attributes:
        info: the rank's :class:`~hetero_worker.tracking.series.RunInfo`.
        is_job: this rank writes the job's series (rank 0).
        is_type_leader: this rank writes its GPU type's series.
        directory: this rank's TensorBoard directory, None when it writes none.
        writers: the open backends by name (``tensorboard``, ``wandb``, ``mlflow``).

    Raises:
        RuntimeError: a backend's library is missing (names the extra to install), or rank 0
            could not start a backend (on every rank).
    """

    def __init__(self, contract: Contract, *, writer_factory: Any = None) -> None:
        self.contract = contract
        info = self.info = RunInfo.of(contract)
        self.product, self.tag, self.type_ranks = info.product, f"gpu_type/{info.tag}", info.type_ranks
        self.is_job, self.is_type_leader = info.is_job, info.is_type_leader
        tracking = contract.run.tracking or {}
        base = log_dir(contract)
        if info.is_job and "tensorboard" in tracking and base is None:
            log("spec.training.tracking.tensorboard has no logDir and the job has neither a run "
                "dir nor spec.training.checkpoint.path: no TensorBoard files are written; set "
                "spec.training.tracking.tensorboard.logDir", rank=info.rank)
        self.directory = base / info.run_name if base is not None and info.writes else None
        self.writers: dict[str, Any] = {}
        wandb_on = "wandb" in tracking and tracking["wandb"]["mode"] != "disabled"
        shared = wandb_on or "mlflow" in tracking
        if info.is_job:
            try:
                session = self._open(tracking, base, writer_factory, _rank0_session(info, tracking))
            except BaseException as exc:
                if shared:
                    _share({"error": f"{type(exc).__name__}: {exc}"}, contract)
                self.close()
                raise
            if shared:
                _share(session, contract)
        elif _distributed(contract):
            session = _share(None, contract) if shared else {}
            if "error" in session:
                raise RuntimeError(f"rank 0 could not start experiment tracking: {session['error']}")
            if info.writes:
                self._open(tracking, base, writer_factory, session)
        elif info.writes:  # no process group (a test, a tool): this rank decides alone
            self._open(tracking, base, writer_factory, _rank0_session(info, tracking))

    def _open(self, tracking: Mapping[str, Any], base: Path | None, writer_factory: Any,
              session: dict[str, Any]) -> dict[str, Any]:
        """Open this rank's writers; returns ``session`` with rank 0's MLflow run as the parent."""
        info = self.info
        if base is not None:
            self.writers["tensorboard"] = TensorBoardWriter(info, base, writer_factory=writer_factory)
        if "wandb" in tracking and tracking["wandb"]["mode"] != "disabled":
            from hetero_worker.tracking.wandb_writer import WandbWriter, wandb_dir  # noqa: PLC0415

            self.writers["wandb"] = WandbWriter(info, tracking["wandb"], group=session["wandb_group"],
                                                directory=wandb_dir(self.contract))
        if "mlflow" in tracking:
            from hetero_worker.tracking.mlflow_writer import MlflowWriter  # noqa: PLC0415

            writer = MlflowWriter(info, tracking["mlflow"], experiment=session["mlflow_experiment"],
                                  parent_run_id=session.get("mlflow_parent_run"))
            self.writers["mlflow"] = writer
            if info.is_job:
                session = {**session, "mlflow_parent_run": writer.run_id}
        return session

    @property
    def active(self) -> bool:
        """True when this rank writes anything."""
        return bool(self.writers)

    def observe_step(self, step: int, *, step_s: float, compute_s: float, comm_wait_s: float,
                     samples: int, loss: float | None, local_batches: Sequence[int]) -> None:
        """Write one optimizer step's series to every backend (nothing on a rank that writes
        nothing). See :func:`~hetero_worker.tracking.series.step_scalars` for the arguments;
        ``step`` is the job's global step after this step (1-based)."""
        if not self.writers:
            return
        scalars = step_scalars(self.info, step_s=step_s, compute_s=compute_s,
                               comm_wait_s=comm_wait_s, samples=samples, loss=loss,
                               local_batches=local_batches)
        for name, writer in list(self.writers.items()):
            try:
                writer.write(step, scalars)
            except Exception as exc:  # noqa: BLE001 - tracking never stops training
                log(f"experiment tracking: {name} failed at step {step} and is dropped for the rest "
                    f"of the run ({type(exc).__name__}: {exc})", rank=self.info.rank)
                del self.writers[name]
                _close_quietly(writer)

    def close(self) -> None:
        """Flush and close every backend's run (idempotent)."""
        writers, self.writers = self.writers, {}
        for writer in writers.values():
            writer.close()


def _close_quietly(writer: Any) -> None:
    try:
        writer.close()
    except Exception:  # noqa: BLE001 - it already failed once; its error was logged
        pass


def _rank0_session(info: RunInfo, tracking: Mapping[str, Any]) -> dict[str, Any]:
    """What rank 0 decides for every rank: W&B's group, MLflow's experiment id."""
    session: dict[str, Any] = {}
    if "wandb" in tracking:
        from hetero_worker.tracking.wandb_writer import group_name  # noqa: PLC0415

        session["wandb_group"] = group_name(info, uuid.uuid4().hex)
    if "mlflow" in tracking:
        from hetero_worker.tracking.mlflow_writer import experiment_id  # noqa: PLC0415

        session["mlflow_experiment"] = experiment_id(tracking["mlflow"])
    return session


def _distributed(contract: Contract) -> bool:
    """True when the ranks share a process group (the job's, of more than one rank)."""
    return dist.is_initialized() and contract.dist.world_size > 1


def _share(session: dict[str, Any] | None, contract: Contract) -> dict[str, Any]:
    """Rank 0's ``session`` on every rank (a broadcast over the default Gloo group; without a
    process group, or alone, the rank's own)."""
    if not _distributed(contract):
        return session or {}
    box = [session]
    dist.broadcast_object_list(box, src=0)
    return box[0] or {}


def from_contract(contract: Contract) -> Tracker | None:
    """The rank's :class:`Tracker`, None when the contract asks for no tracking."""
    return Tracker(contract) if contract.run.tracking else None
