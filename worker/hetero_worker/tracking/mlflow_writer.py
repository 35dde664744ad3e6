"""MLflow runs through ``mlflow`` (``mlflow-skinny``, the client): one MLflow run per writing rank in
the experiment ``spec.training.tracking.mlflow.experiment``, named ``<job>-rank-<R>-<GPU>``, tagged
``heterotrain.job``, ``heterotrain.rank`` and ``heterotrain.gpu_type``; the runs of the GPU types'
first ranks are children of rank 0's (``mlflow.parentRunId``: MLflow's nested runs), so the
tracking UI shows one job with a run per GPU type. Rank 0's run has the metadata as params (GPU mix,
global batch, each type's ranks, planned batch and price per device-hour, the job's cost per hour;
a price is JSON: ``2.5``, or ``null`` for an unpriced type) and the plan as artifacts ``plan.md``
and ``run.json``.

A ``file:`` URI (or a bare path) is MLflow's file store, which MLflow keeps in maintenance mode
behind ``MLFLOW_ALLOW_FILE_STORE``: naming it in the spec is the opt-in, so the writer sets that
variable for the rank (unless it is set). Other URIs (``http(s)://``, ``databricks``) log
asynchronously (MLflow's ``synchronous=False``), flushed when the run closes; the token comes from
``MLFLOW_TRACKING_TOKEN`` (the operator sets it from the spec's ``secretRef``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

from hetero_worker.tracking.series import RunInfo, missing_extra


def is_file_store(uri: str) -> bool:
    """True for a ``file:`` URI or a plain path (MLflow's file store)."""
    scheme = urlparse(uri).scheme
    return scheme in ("", "file") or len(scheme) == 1  # a Windows drive letter is a path


def _client(uri: str) -> Any:
    try:
        from mlflow.tracking import MlflowClient  # noqa: PLC0415
    except ImportError as exc:
        raise missing_extra("mlflow", exc) from None
    if is_file_store(uri):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return MlflowClient(tracking_uri=uri)


def experiment_id(settings: Mapping[str, Any]) -> str:
    """The id of the experiment ``settings`` name, created when missing (rank 0 calls it once and
    shares the id, so the ranks never race to create it).

    Raises:
        RuntimeError: mlflow is not installed (names the extra to install).
    """
    client = _client(settings["trackingUri"])
    found = client.get_experiment_by_name(settings["experiment"])
    return found.experiment_id if found is not None else client.create_experiment(settings["experiment"])


class MlflowWriter:
    """One rank's MLflow run.

    Args:
        info: the rank's run info (a writing rank).
        settings: ``spec.training.tracking.mlflow`` in normal form (``trackingUri``, ``experiment``).
        experiment: the experiment's id (:func:`experiment_id`, from rank 0).
        parent_run_id: rank 0's run (None on rank 0 itself).

    Attributes:
        run_id: this rank's MLflow run.

    Raises:
        RuntimeError: mlflow is not installed (names the extra to install).
    """

    def __init__(self, info: RunInfo, settings: Mapping[str, Any], *, experiment: str,
                 parent_run_id: str | None) -> None:
        self._client = _client(settings["trackingUri"])
        from mlflow.entities import Metric, Param  # noqa: PLC0415  (installed: _client checked)

        self._metric = Metric
        self._synchronous = is_file_store(settings["trackingUri"])
        tags = {"heterotrain.job": info.job, "heterotrain.rank": str(info.rank),
                "heterotrain.gpu_type": info.product, "heterotrain.gpu_tag": info.tag}
        if info.job_uid:
            tags["heterotrain.job_uid"] = info.job_uid
        if parent_run_id:
            tags["mlflow.parentRunId"] = parent_run_id
        self.run_id: str = self._client.create_run(experiment, run_name=f"{info.job}-{info.run_name}",
                                                   tags=tags).info.run_id
        if info.is_job:
            meta = info.metadata()
            params = {"job": info.job, "world_size": info.world_size,
                      "global_batch": meta["global_batch"], "gpu_mix": info.mix_text(),
                      "cost_per_hour": json.dumps(meta["cost_per_hour"])}
            for tag, t in meta["gpu_types"].items():
                params[f"gpu_type/{tag}/ranks"] = t["ranks"]
                params[f"gpu_type/{tag}/planned_batch"] = t["planned_batch"]
                params[f"gpu_type/{tag}/price_per_hour"] = json.dumps(t["price_per_hour"])
            self._client.log_batch(self.run_id, params=[Param(k, str(v)) for k, v in params.items()])
            self._client.log_text(self.run_id, info.plan_markdown(), "plan.md")
            self._client.log_dict(self.run_id, meta, "run.json")

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        """One step's series as MLflow metrics at ``step`` (one ``log_batch``)."""
        now_ms = int(time.time() * 1000)
        self._client.log_batch(self.run_id, synchronous=self._synchronous, metrics=[
            self._metric(key, float(value), now_ms, step) for key, value in scalars.items()])

    def close(self) -> None:
        """Flush asynchronous logging and mark the run FINISHED."""
        if not self._synchronous:
            import mlflow  # noqa: PLC0415

            mlflow.flush_async_logging()
        self._client.set_terminated(self.run_id)
