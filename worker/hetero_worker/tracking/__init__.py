"""Experiment tracking per GPU type (``spec.training.tracking``, ``HTJ_TRACKING``; docs/tracking.md).

Who writes what, each through one :class:`torch.utils.tensorboard.SummaryWriter` per writing rank:

* rank 0, the job: ``job/loss`` (rank 0's local mean loss), ``job/samples_per_s`` (the global
  batch over rank 0's step time; every rank's step ends at the same gradient sync),
  ``job/global_batch``, and once the run's metadata as text (``run/plan``: every rank's GPU type,
  group, local batch; the GPU mix);
* the first rank of each GPU type (lowest rank of that ``gpu_product`` in the topology): tags
  ``gpu_type/<GPU>/...`` with ``<GPU>`` the product, spaces and odd characters as ``-``
  (``Tesla T4`` -> ``Tesla-T4``): ``samples_per_s`` (that type's share of the global batch over the
  step time), ``compute_samples_per_s_per_gpu`` (this rank's samples over its compute time: the
  device's own speed), ``batch_share`` (0..1 of the global batch on that type), ``local_batch``,
  ``step_s``, ``compute_s`` and ``comm_wait_s`` (the step time split as
  :mod:`hetero_worker.stepping` measures it: time blocked in gradient synchronisation, waiting for
  slower ranks included, and the rest), ``loss`` (this rank's local mean loss), ``ranks``.

Every rank writes under ``<log dir>/rank-<R>-<GPU>`` (a TensorBoard "run" each), with the global
step as TensorBoard's step. The log dir is ``tensorboard.logDir`` when given, else
``<run dir>/tensorboard`` under ``heterotrain run`` (``HTJ_RUN_DIR``), else
``<checkpoint dir>/tensorboard/<job>`` in a pod; with none of them tracking is off and rank 0 says
so. Ranks that are neither rank 0 nor a GPU type's first write nothing.

W&B and MLflow (``wandb``, ``mlflow`` in the spec) are parsed and carried, not yet written: rank 0
says so once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hetero_worker.runtime.ranklog import log
from heterotrain_common.contract import Contract

EXTRA_HINT = "pip install 'heterotrain[tracking]' (tensorboard==2.21.0)"
"""What to install when ``spec.training.tracking.tensorboard`` is set without TensorBoard."""


def gpu_tag(product: str) -> str:
    """``"Tesla T4"`` -> ``"Tesla-T4"``: a GPU product as one TensorBoard tag segment (letters,
    digits, ``._-``; runs of anything else become one ``-``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", product).strip("-") or "unknown"


def log_dir(contract: Contract) -> Path | None:
    """Where TensorBoard files go (see the module docstring); None: nowhere (tracking off)."""
    tb = (contract.run.tracking or {}).get("tensorboard")
    if tb is None:
        return None
    if tb.get("logDir"):
        return Path(tb["logDir"])
    if contract.run.dir:
        return Path(contract.run.dir) / "tensorboard"
    if contract.checkpoint.dir:
        return Path(contract.checkpoint.dir) / "tensorboard" / contract.dist.job_name
    return None


class Tracker:
    """One rank's tracking: what rank 0 and the first rank of its GPU type write.

    Args:
        contract: the rank's contract (tracking settings, topology, rank).
        writer_factory: ``factory(log_dir: str) -> writer`` with TensorBoard's
            ``add_scalar(tag, value, step)``, ``add_text(tag, text, step)``, ``flush()`` and
            ``close()``; default :class:`torch.utils.tensorboard.SummaryWriter`.

    Attributes:
        is_job: this rank writes the job's series (rank 0).
        is_type_leader: this rank writes its GPU type's series.
        directory: this rank's event-file directory, None when it writes nothing.

    Raises:
        RuntimeError: TensorBoard is asked for and not installed (names the extra to install).
    """

    def __init__(self, contract: Contract, *, writer_factory: Any = None) -> None:
        self.contract = contract
        rank = contract.dist.rank
        self.product = contract.device.product
        self.tag = f"gpu_type/{gpu_tag(self.product)}"
        same_type = [e.rank for e in contract.topology if e.gpu_product == self.product]
        self.type_ranks = tuple(same_type) or (rank,)
        self.is_job = rank == 0
        self.is_type_leader = rank == min(self.type_ranks)
        base = log_dir(contract)
        tracking = contract.run.tracking or {}
        if self.is_job and "tensorboard" in tracking and base is None:
            log("spec.training.tracking.tensorboard has no logDir and the job has neither a run "
                "dir nor spec.training.checkpoint.path: no TensorBoard files are written; set "
                "spec.training.tracking.tensorboard.logDir", rank=rank)
        if self.is_job and ({"wandb", "mlflow"} & set(tracking)):
            log("spec.training.tracking: wandb and mlflow are not written by this worker yet "
                "(docs/tracking.md); TensorBoard is", rank=rank)
        writes = base is not None and (self.is_job or self.is_type_leader)
        self.directory = base / f"rank-{rank}-{gpu_tag(self.product)}" if writes else None
        self._writer: Any = None
        if self.directory is not None:
            if writer_factory is None:
                try:
                    from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415
                except ImportError as exc:
                    raise RuntimeError("spec.training.tracking.tensorboard needs TensorBoard: "
                                       f"{EXTRA_HINT} ({exc})") from None
                writer_factory = SummaryWriter
            self.directory.mkdir(parents=True, exist_ok=True)
            self._writer = writer_factory(str(self.directory))
            if self.is_job:
                self._writer.add_text("run/plan", self._plan_text(), 0)

    @property
    def active(self) -> bool:
        """True when this rank writes anything."""
        return self._writer is not None

    def _plan_text(self) -> str:
        """The run's metadata as a Markdown table: job, GPU mix, every rank's type and batch."""
        c = self.contract
        mix: dict[str, int] = {}
        for e in c.topology:
            mix[e.gpu_product] = mix.get(e.gpu_product, 0) + 1
        lines = [f"job `{c.dist.job_name}`, {c.dist.world_size} ranks, GPU mix: "
                 + ", ".join(f"{n} x {p}" for p, n in mix.items()), "",
                 "| rank | group | node | GPU | local batch |", "|---|---|---|---|---|"]
        lines += [f"| {e.rank} | {e.group} | {e.node} | {e.gpu_product} | {e.local_batch} |"
                  for e in c.topology]
        return "\n".join(lines)

    def observe_step(self, step: int, *, step_s: float, compute_s: float, comm_wait_s: float,
                     samples: int, loss: float | None, local_batches: Sequence[int]) -> None:
        """Write one optimizer step's series (nothing on a rank that writes nothing).

        Args:
            step: the job's global step after this step (1-based), TensorBoard's step.
            step_s, compute_s, comm_wait_s: the step's wall time and its split, seconds.
            samples: samples this rank processed in the step.
            loss: this rank's local mean loss (None: not written).
            local_batches: every rank's samples per step now (the split in use), rank order.
        """
        w = self._writer
        if w is None:
            return
        global_batch = sum(local_batches)
        if self.is_job:
            if loss is not None:
                w.add_scalar("job/loss", float(loss), step)
            if step_s > 0:
                w.add_scalar("job/samples_per_s", global_batch / step_s, step)
            w.add_scalar("job/global_batch", global_batch, step)
        if self.is_type_leader:
            type_batch = sum(local_batches[r] for r in self.type_ranks if r < len(local_batches))
            t = self.tag
            if step_s > 0:
                w.add_scalar(f"{t}/samples_per_s", type_batch / step_s, step)
            if compute_s > 0:
                w.add_scalar(f"{t}/compute_samples_per_s_per_gpu", samples / compute_s, step)
            if global_batch > 0:
                w.add_scalar(f"{t}/batch_share", type_batch / global_batch, step)
            for name, value in (("local_batch", samples), ("step_s", step_s),
                                ("compute_s", compute_s), ("comm_wait_s", comm_wait_s),
                                ("ranks", len(self.type_ranks))):
                w.add_scalar(f"{t}/{name}", value, step)
            if loss is not None:
                w.add_scalar(f"{t}/loss", float(loss), step)

    def close(self) -> None:
        """Flush and close the event file (idempotent)."""
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


def from_contract(contract: Contract) -> Tracker | None:
    """The rank's :class:`Tracker`, None when the contract asks for no tracking."""
    tracking: Mapping[str, Any] = contract.run.tracking or {}
    return Tracker(contract) if tracking else None
