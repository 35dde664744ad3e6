"""TensorBoard event files through :class:`torch.utils.tensorboard.SummaryWriter` (needs the
``tensorboard`` package): one TensorBoard run per writing rank, ``<log dir>/rank-<R>-<GPU>``, the
job's global step as TensorBoard's step, the plan as text ``run/plan`` on rank 0."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hetero_worker.tracking.series import RunInfo, missing_extra
from heterotrain_common.contract import Contract


def log_dir(contract: Contract) -> Path | None:
    """Where TensorBoard files go: ``tensorboard.logDir`` when given, else ``<run dir>/tensorboard``
    under ``heterotrain run``, else ``<checkpoint dir>/tensorboard/<job>`` in a pod; None: nowhere
    (no TensorBoard, or none of them)."""
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


class TensorBoardWriter:
    """One rank's TensorBoard run.

    Args:
        info: the rank's run info (a writing rank).
        base: the log dir (:func:`log_dir`).
        writer_factory: ``factory(directory: str) -> writer`` with TensorBoard's
            ``add_scalar``, ``add_text``, ``flush`` and ``close``; default ``SummaryWriter``.

    Attributes:
        directory: this rank's event-file directory.

    Raises:
        RuntimeError: TensorBoard is not installed (names the extra to install).
    """

    def __init__(self, info: RunInfo, base: Path, *, writer_factory: Any = None) -> None:
        if writer_factory is None:
            try:
                from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415
            except ImportError as exc:
                raise missing_extra("tensorboard", exc) from None
            writer_factory = SummaryWriter
        self.directory = base / info.run_name
        self.directory.mkdir(parents=True, exist_ok=True)
        self._writer: Any = writer_factory(str(self.directory))
        if info.is_job:
            self._writer.add_text("run/plan", info.plan_markdown(), 0)

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        """One step's series, each as a scalar at ``step``."""
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, step)

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.flush()
        self._writer.close()
