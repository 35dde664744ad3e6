"""Rank 0's training progress: read its Prometheus endpoint, write ``status.progress``.

The one place that scrapes rank 0 (worker metric names in docs/internal-api.md).  Reads are
throttled per job (``intervals.progress_s``, ``HTJ_PROGRESS_INTERVAL_S``) and bounded: 2 s, no
redirects followed (an endpoint that redirects is not a HeteroTrain worker's, and following it
would let a pod send the operator anywhere), at most :data:`MAX_BODY_BYTES` read.  An unreachable endpoint only means no progress
update this time; an answer that is not a worker's metrics (a redirect, an error status, an
oversized body, text Prometheus' parser refuses) is a Warning Event on the job
(:meth:`ProgressReader.take_warnings`), never an aborted reconcile.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from hetero_operator.api import conditions as c
from hetero_operator.api.labels import ANNOTATION_LOCAL_PORTS, LABEL_RANK, LOCAL_POD_IP
from heterotrain_common import metricnames as mn

MetricsUrlFn = Callable[[Mapping[str, Any], int], "str | None"]
READ_TIMEOUT_S = 2.0
MAX_BODY_BYTES = 4 * 2**20
"""A worker's ``/metrics`` is a few KiB; a body above this is not read (bytes)."""
METRICS_UNREADABLE = "MetricsUnreadable"
"""Reason of the Warning Event for an answer that is not a worker's metrics."""


def default_metrics_url(pod: Mapping[str, Any], port: int) -> str | None:
    """``http://<podIP>:<port>/metrics`` of a running pod, ``None`` before it has an IP.

    A pod of the local kubelet (``heterotrain cluster``: pod IP 127.0.0.1, which no real kubelet
    reports) listens where its annotation
    :data:`~hetero_operator.api.labels.ANNOTATION_LOCAL_PORTS` says: the kubelet remaps the ports
    several pods on 127.0.0.1 would all bind.  Elsewhere the annotation is ignored.
    """
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or not port:
        return None
    if ip == LOCAL_POD_IP:
        ann = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_LOCAL_PORTS)
        try:
            real = json.loads(ann).get(str(port)) if ann else None
        except (ValueError, AttributeError):
            real = None
        if isinstance(real, int) and 0 < real < 65536:
            port = real
    return f"http://{ip}:{port}/metrics"


@dataclass(frozen=True, kw_only=True, slots=True)
class MetricsRead:
    """One read of an endpoint: its text, or why there is none.

    Attributes:
        text: the body (UTF-8, undecodable bytes replaced); None when not read.
        problem: one sentence when the endpoint answered but not as a worker's metrics
            (a redirect, an error status, an oversized body); ``""`` when fine or unreachable.
    """

    text: str | None
    problem: str = ""


async def read_metrics(url: str) -> MetricsRead:
    """GET ``url`` within :data:`READ_TIMEOUT_S`, no redirects, at most :data:`MAX_BODY_BYTES`."""
    try:
        timeout = aiohttp.ClientTimeout(total=READ_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            async with session.get(url, allow_redirects=False) as resp:
                if 300 <= resp.status < 400:
                    return MetricsRead(text=None, problem=(
                        f"{url} answered HTTP {resp.status} redirecting to "
                        f"{resp.headers.get('Location', '?')}; redirects are not followed"))
                if resp.status != 200:
                    return MetricsRead(text=None, problem=f"{url} answered HTTP {resp.status}")
                body = bytearray()
                async for chunk in resp.content.iter_chunked(64 * 1024):
                    body += chunk
                    if len(body) > MAX_BODY_BYTES:
                        return MetricsRead(text=None, problem=(
                            f"{url} sent more than {MAX_BODY_BYTES // 2**20} MiB; not read"))
                return MetricsRead(text=body.decode("utf-8", errors="replace"))
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return MetricsRead(text=None)


async def fetch_metrics(url: str) -> str | None:
    """The ``/metrics`` text at ``url`` (:func:`read_metrics`), ``None`` when unreadable."""
    return (await read_metrics(url)).text


def parse_problem(url: str, exc: Exception) -> str:
    """The sentence for metrics text Prometheus' parser refused."""
    return f"{url} is not Prometheus text ({type(exc).__name__}: {str(exc)[:120]})"


class ReadWarnings:
    """Problems of a reader's last reads per job, kept until the reconciler posts them."""

    def __init__(self) -> None:
        self._warnings: dict[tuple[str, str], list[str]] = {}

    def warn(self, namespace: str, name: str, problem: str) -> None:
        """Keep ``problem`` for the job's next :meth:`take_warnings`."""
        if problem:
            self._warnings.setdefault((namespace, name), []).append(problem)

    def take_warnings(self, namespace: str, name: str) -> list[str]:
        """The problems of the job's last reads (and forgets them)."""
        return self._warnings.pop((namespace, name), [])


class ProgressReader(ReadWarnings):
    """Reads rank 0's metrics at most every ``interval_s`` per job.

    Args:
        metrics_url: where rank 0's metrics are (a test kubelet maps ports).
        interval_s: least time between two reads of one job, seconds.
    """

    def __init__(self, metrics_url: MetricsUrlFn, interval_s: float) -> None:
        super().__init__()
        self.metrics_url, self.interval_s = metrics_url, interval_s
        self._read_at: dict[tuple[str, str], float] = {}
        self.last: dict[tuple[str, str], Progress] = {}
        """The last progress read per job (the reconciler posts a checkpoint fallback from it)."""

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted job's memory."""
        self._read_at.pop((namespace, name), None)
        self.last.pop((namespace, name), None)
        self.take_warnings(namespace, name)

    async def read(self, namespace: str, name: str, pods: list[dict[str, Any]], *, metrics_port: int,
                   global_batch: int, now_s: float) -> dict[str, Any]:
        """``{"progress": ...}`` from rank 0's metrics when due and readable, else ``{}``."""
        key = (namespace, name)
        if now_s - self._read_at.get(key, -1e18) < self.interval_s:
            return {}
        rank0 = next((p for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_RANK) == "0"), None)
        url = self.metrics_url(rank0, metrics_port) if rank0 else None
        if url is None:
            return {}
        self._read_at[key] = now_s
        read = await read_metrics(url)
        self.warn(namespace, name, read.problem)
        if read.text is None:
            return {}
        try:
            progress = parse_progress(read.text, global_batch)
        except Exception as exc:  # noqa: BLE001 - not a worker's metrics: a warning, not an error
            self.warn(namespace, name, parse_problem(url, exc))
            return {}
        if progress is None:
            return {}
        self.last[key] = progress
        return {"progress": progress_status(progress, now_s, global_batch)}


@dataclass(frozen=True, kw_only=True, slots=True)
class Progress:
    """Rank 0's training progress.

    Attributes:
        step: the job's optimizer steps completed (``htj_resumed_step + htj_steps_total``: a
            resumed process counts from its checkpoint's step).
        total_steps: the steps the job takes in all (``htj_planned_steps``); None when the script
            has not said.
        samples_per_s: global throughput, samples/s: rank 0's last-step throughput
            (``htj_throughput_samples_per_second``) scaled by global / local batch (ranks step
            together, so every rank's step time is the global step time).
        loss: last loss (``htj_loss``), ``None`` when absent.
        efficiency: ``htj_job_efficiency_ratio`` (job samples/s over the sum of the ranks'
            compute-only samples/s), ``None`` before rank 0 exported it.
        prediction_ratio: ``htj_job_prediction_ratio`` (measured / the planner's predicted
            samples/s), ``None`` without a prediction.
    """

    step: int
    total_steps: int | None = None
    samples_per_s: float
    loss: float | None = None
    efficiency: float | None = None
    prediction_ratio: float | None = None
    resumed_step: int = 0
    checkpoint_fallbacks: int = 0
    """``htj_checkpoint_fallbacks_total``: rank 0 resumed past an unreadable newer checkpoint."""
    checkpoints_not_resumed: int = 0
    """``htj_checkpoints_not_resumed``: other jobs' checkpoints rank 0 started beside (issue 33)."""


def parse_progress(metrics_text: str, global_batch: int) -> Progress | None:
    """Read rank 0's ``/metrics`` text; ``None`` when it has no ``htj_steps_total`` yet."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in (mn.STEPS_TOTAL, mn.THROUGHPUT_SAMPLES_PER_SECOND,
                               mn.LOCAL_BATCH_SIZE, mn.LOSS, mn.JOB_EFFICIENCY_RATIO,
                               mn.JOB_PREDICTION_RATIO, mn.PLANNED_STEPS, mn.RESUMED_STEP,
                               mn.CHECKPOINT_FALLBACKS_TOTAL, mn.CHECKPOINTS_NOT_RESUMED):
                values[sample.name] = sample.value
    if mn.STEPS_TOTAL not in values:
        return None
    local = values.get(mn.LOCAL_BATCH_SIZE) or 0
    rate = values.get(mn.THROUGHPUT_SAMPLES_PER_SECOND, 0.0)
    scale = global_batch / local if local > 0 else 1.0
    total = values.get(mn.PLANNED_STEPS)
    return Progress(step=int(values.get(mn.RESUMED_STEP, 0) + values[mn.STEPS_TOTAL]),
                    total_steps=None if total is None else int(total), samples_per_s=rate * scale,
                    loss=values.get(mn.LOSS), efficiency=values.get(mn.JOB_EFFICIENCY_RATIO),
                    prediction_ratio=values.get(mn.JOB_PREDICTION_RATIO),
                    resumed_step=int(values.get(mn.RESUMED_STEP, 0)),
                    checkpoint_fallbacks=int(values.get(mn.CHECKPOINT_FALLBACKS_TOTAL, 0)),
                    checkpoints_not_resumed=int(values.get(mn.CHECKPOINTS_NOT_RESUMED, 0)))


def progress_status(progress: Progress, now_s: float, global_batch: int = 0) -> dict[str, Any]:
    """``status.progress`` (decimals as strings: no floats in the API object).

    Args:
        progress: rank 0's reading.
        now_s: epoch seconds of the reading.
        global_batch: samples per step; with ``totalSteps`` and a throughput it gives ``eta``
            (the steps left at the last step's rate), else no ``eta``; none once every step is
            done (a reading taken at the last step must not leave ``eta: 0s`` on a finished job).
    """
    out: dict[str, Any] = {"step": progress.step, "samplesPerSecond": f"{progress.samples_per_s:.1f}",
                           "updateTime": c.now_iso(now_s)}
    if progress.total_steps is not None:
        out["totalSteps"] = progress.total_steps
        if global_batch > 0 and progress.samples_per_s > 0 and progress.step < progress.total_steps:
            left_s = max(0, progress.total_steps - progress.step) * global_batch / progress.samples_per_s
            out["eta"] = duration_text(left_s)
    if progress.loss is not None:
        out["loss"] = f"{progress.loss:.4f}"
    if progress.efficiency is not None:
        out["efficiency"] = f"{progress.efficiency:.3f}"
    if progress.prediction_ratio is not None:
        out["predictionRatio"] = f"{progress.prediction_ratio:.3f}"
    return out


def duration_text(seconds: float) -> str:
    """``"1h02m"``, ``"4m05s"``, ``"12s"``: seconds as kubectl prints ages."""
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"
