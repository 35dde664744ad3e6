"""Prometheus metrics of one worker rank (names fixed in docs/internal-api.md).

Every series carries exactly the labels ``job``, ``rank``, ``group`` and ``gpu_product`` (bounded:
one series per rank and metric); ``htj_gpu_info`` adds the device identity dcgm-exporter labels its
series with (see :data:`GPU_INFO_LABELS`). Units are base units (seconds, bytes, ratios 0..1) and counters end
in ``_total``, per https://prometheus.io/docs/practices/naming/. The metrics live in a dedicated
:class:`prometheus_client.CollectorRegistry`, so a user's own default-registry metrics never mix in.

GPU series come from NVML (:mod:`heterotrain_common.nvml`) and from torch's CUDA caching allocator; on
a CPU-only machine, or a simulated device, they have no samples (the families are still declared).
Importing this module does not import torch.
"""

from __future__ import annotations

import atexit
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from hetero_worker.runtime.ranklog import log
from heterotrain_common import listen
from heterotrain_common import metricnames as mn
from heterotrain_common import nvml, rundir
from heterotrain_common.contract import Contract

LABELS = ("job", "rank", "group", "gpu_product")
STEP_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                  float("inf"))
"""Step-duration histogram buckets in seconds: a tiny CPU step to a large-model GPU step."""
DEVICE_REFRESH_S = 1.0
"""observe_step refreshes the device gauges at most this often (seconds)."""
STATS_WRITE_S = 0.25
"""The run-dir statistics file is rewritten at most this often (seconds)."""

_DOCS: dict[str, tuple[type, str]] = {
    mn.STEPS_TOTAL: (Counter, "Optimizer steps taken (skipped steps included)."),
    mn.SAMPLES_TOTAL: (Counter, "Training samples processed by this rank."),
    mn.SKIPPED_STEPS_TOTAL: (Counter, "Steps skipped because some rank's gradients had inf/NaN."),
    mn.COMPUTE_SECONDS_TOTAL: (Counter, "Time in forward/backward/optimizer (including the "
                                  "simulated device delay), seconds."),
    mn.COMMUNICATION_WAIT_SECONDS_TOTAL: (Counter, "Time blocked in gradient "
                                             "synchronisation, seconds."),
    mn.REBALANCES_TOTAL: (Counter, "Batch-split changes applied on this rank."),
    mn.MEMBERSHIP_GENERATION: (Gauge, "Elastic jobs: the membership generation this rank is in "
                                      "(0 at launch, +1 per shrink; hetero_worker.membership)."),
    mn.MEMBERSHIP_RECOVERY_SECONDS: (Gauge, "Elastic jobs: seconds from the last lost rank to the "
                                            "first step completed after it."),
    mn.STEPS_REDONE_TOTAL: (Counter, "Elastic jobs: interrupted steps redone by the survivors "
                                     "of a lost rank."),
    mn.PIPELINE_STAGE: (Gauge, "Pipelined jobs: this rank's stage, 0 takes the input."),
    mn.PIPELINE_PLANNED_BUBBLE_RATIO: (Gauge, "Pipelined jobs: the schedule's idle share of a "
                                              "step, (stages - 1) / (micro-batches + stages - 1)."),
    mn.PIPELINE_WAIT_RATIO: (Gauge, "Pipelined jobs: share of the last step this rank spent "
                                    "outside its stage's forward and backward and the optimizer "
                                    "(the bubble, activation sends and receives, the stage "
                                    "replicas' gradient reduction), measured."),
    mn.INTER_GROUP_BYTES_TOTAL: (Counter, "Gradient bytes this rank sent between groups."),
    mn.THROUGHPUT_SAMPLES_PER_SECOND: (Gauge, "Samples per second of the last step "
                                          "(local batch / step time)."),
    mn.COMPUTE_THROUGHPUT_SAMPLES_PER_SECOND: (Gauge, "Samples per second of compute time in "
                                                  "the last step: the device's own speed, "
                                                  "communication wait excluded."),
    mn.LOCAL_BATCH_SIZE: (Gauge, "Samples per step on this rank."),
    mn.JOB_EFFICIENCY_RATIO: (Gauge, "Rank 0 only: the job's samples/s over the sum of every "
                                 "rank's compute-only samples/s, 0..1 (share of the devices' "
                                 "standalone capacity turned into training; docs/metrics.md)."),
    mn.JOB_PREDICTED_THROUGHPUT_SAMPLES_PER_SECOND: (Gauge, "Rank 0 only: the planner's "
                                                        "predicted job throughput, samples/s "
                                                        "(absent without a prediction)."),
    mn.JOB_PREDICTION_RATIO: (Gauge, "Rank 0 only: measured job samples/s over the planner's "
                                 "prediction (1 = as predicted; docs/metrics.md)."),
    mn.LOSS: (Gauge, "Training loss of the last step (this rank's local mean)."),
    mn.PLANNED_STEPS: (Gauge, "Optimizer steps the job takes in all, resumed ones included "
                              "(absent while the script has not said)."),
    mn.RESUMED_STEP: (Gauge, "The job step this process resumed at; 0 when it started fresh."),
    mn.CHECKPOINTS_NOT_RESUMED: (Gauge, "Rank 0 only: checkpoints of other jobs in the checkpoint "
                                        "path this process started beside without resuming them "
                                        "(spec.training.checkpoint.resumeFrom); 0 when none."),
    mn.CHECKPOINT_FALLBACKS_TOTAL: (Counter, "Resumes from an older checkpoint because a newer "
                                        "one was unreadable on some rank (truncated, corrupt)."),
    mn.CHECKPOINT_SAVE_FAILURES_TOTAL: (Counter, "Periodic checkpoint saves that failed (a full "
                                           "disk, a storage fault); retried at the next "
                                           "interval, fatal after HTJ_CHECKPOINT_MAX_FAILURES "
                                           "in a row."),
    mn.GPU_UTILIZATION_RATIO: (Gauge, "GPU busy fraction 0..1 from NVML (whole GPUs only)."),
    mn.GPU_MEMORY_USED_BYTES: (Gauge, "Device memory used by all processes, from NVML, bytes."),
    mn.GPU_MEMORY_TOTAL_BYTES: (Gauge, "Device memory, from NVML, bytes."),
    mn.TORCH_MEMORY_ALLOCATED_BYTES: (Gauge, "Memory held by tensors in torch's CUDA caching "
                                         "allocator, bytes."),
    mn.TORCH_MEMORY_RESERVED_BYTES: (Gauge, "Memory reserved by torch's CUDA caching "
                                        "allocator, bytes."),
    mn.TORCH_MEMORY_FRAGMENTATION_RATIO: (Gauge, "1 - allocated / reserved of torch's CUDA "
                                             "caching allocator (reserved but unused share)."),
    mn.MEMORY_PEAK_BYTES: (Gauge, "Peak model state plus activations saved for backward this "
                              "rank held, bytes (counted by hetero_worker.memory.caps; on a simulated "
                              "device the figure its memory cap is enforced on)."),
}
STEP_HISTOGRAM = mn.STEP_DURATION_SECONDS
GPU_INFO = mn.GPU_INFO
GPU_INFO_LABELS = (*LABELS, "UUID", "gpu", "GPU_I_ID", "GPU_I_PROFILE")
"""Labels of :data:`GPU_INFO`: the rank's labels plus the device identity spelled as dcgm-exporter
spells it (parent GPU ``UUID``, NVML index ``gpu``, MIG ``GPU_I_ID``/``GPU_I_PROFILE``, ``""`` on a
whole GPU), so ``DCGM_… * on (UUID, GPU_I_ID) group_right … htj_gpu_info`` attributes DCGM series
to ranks without dcgm-exporter's ``pod`` label."""
METRIC_NAMES = (*_DOCS, STEP_HISTOGRAM, GPU_INFO)
"""Every metric family a worker exports (histogram and counters by their exposed base name)."""


class WorkerMetrics:
    """The metrics of one rank, plus the ``HTJ_RUN_DIR`` statistics file when that is set.

    Call :meth:`observe_step` once per optimizer step; the rest when the event happens. All
    methods are cheap (no device synchronisation) and thread-safe.

    Args:
        contract: the rank's parsed contract (labels, metrics port, device profile).
        registry: registry to use; a fresh :class:`CollectorRegistry` by default.
        environ: where ``HTJ_RUN_DIR`` and ``CUDA_VISIBLE_DEVICES`` are read; by default the
            contract's ``run.dir`` (what ``init(environ=...)`` parsed) and ``os.environ``'s
            ``CUDA_VISIBLE_DEVICES``.
    """

    def __init__(self, contract: Contract, *, registry: CollectorRegistry | None = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self.contract = contract
        self.registry = registry if registry is not None else CollectorRegistry()
        self.labels = {"job": contract.dist.job_name, "rank": str(contract.dist.rank),
                       "group": str(contract.dist.group), "gpu_product": contract.device.product}
        env = os.environ if environ is None else environ
        self._cuda_visible_devices = env.get("CUDA_VISIBLE_DEVICES")
        self._families: dict[str, Any] = {
            name: kind(name, doc, LABELS, registry=self.registry)
            for name, (kind, doc) in _DOCS.items()}
        self._families[STEP_HISTOGRAM] = Histogram(
            STEP_HISTOGRAM, "Wall time of one optimizer step, seconds.", LABELS,
            buckets=STEP_BUCKETS_S, registry=self.registry)
        self._families[GPU_INFO] = Gauge(
            GPU_INFO, "1 for the device this rank runs on, identified as dcgm-exporter labels it "
            "(UUID of the physical GPU, gpu index, GPU_I_ID/GPU_I_PROFILE of a MIG slice); "
            "from NVML, absent on simulated devices.", GPU_INFO_LABELS, registry=self.registry)
        self._identity_done = False
        self._lock = threading.Lock()
        self._server: Any = None
        self._stats_dir = (rundir.run_dir(environ) if environ is not None
                           else Path(contract.run.dir) if contract.run.dir else None)
        self._totals = {"steps": 0, "samples": 0, "skipped_steps": 0, "rebalances": 0,
                        "step_seconds": 0.0, "compute_seconds": 0.0, "comm_wait_seconds": 0.0}
        self._totals.update({first: self._totals[total]  # zero, of the total's type
                             for total, first in rundir.FIRST_STEP_KEYS.items()})
        self._last: dict[str, Any] = {"loss": None, "throughput_samples_per_second": None,
                                      "total_steps": None}
        self._last_device_s = -math.inf
        self._last_write_s = -math.inf
        self._children: dict[str, Any] = {}
        for name, family in self._families.items():  # counters exist at 0 from the start
            if isinstance(family, (Counter, Histogram)):
                self._child(name)
        self.set_local_batch(contract.local_batch)
        self._child(mn.RESUMED_STEP).set(0)
        if self._stats_dir is not None:
            atexit.register(_flush_if_alive, weakref.ref(self))

    def _child(self, name: str) -> Any:
        """This rank's series of ``name``, created (and from then on exported) on first use."""
        child = self._children.get(name)
        if child is None:
            child = self._children[name] = self._families[name].labels(**self.labels)
        return child

    # --- server -------------------------------------------------------------------------------

    def start_server(self, addr: str | None = None) -> int:
        """Serve ``/metrics`` on ``contract.run.metrics_port`` in a daemon thread.

        Args:
            addr: bind address; None: ``MASTER_ADDR``'s loopback address in a one-host job
                (``heterotrain run``), every interface otherwise (:mod:`heterotrain_common.listen`).

        Returns:
            The port served, or 0 when ``HTJ_METRICS_PORT`` is 0 (off) or the port is taken (a
            warning goes to stderr; training goes on without metrics).
        """
        port = self.contract.run.metrics_port
        if port == 0 or self._server is not None:
            return port if self._server is not None else 0
        try:
            addr = listen.server_address(self.contract.dist.master_addr) if addr is None else addr
            self._server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            log(f"metrics port {port} unavailable ({exc}); continuing without metrics",
                rank=self.contract.dist.rank)
            return 0
        return port

    def stop_server(self) -> None:
        """Stop serving (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # --- events -------------------------------------------------------------------------------

    def observe_step(self, step_s: float, compute_s: float, comm_wait_s: float, samples: int,
                     loss: float | None) -> None:
        """Record one optimizer step.

        Args:
            step_s: wall time of the whole step, seconds.
            compute_s: part of it in forward/backward/optimizer, seconds (a simulated device's
                delay counts as compute).
            comm_wait_s: part of it blocked in gradient synchronisation, seconds.
            samples: samples this rank processed in the step (its local batch, or fewer on a
                remainder step).
            loss: this rank's loss (a float or a 0-d tensor); None leaves the gauge unchanged.

        Negative times from clock noise count as 0.
        """
        step_s, compute_s, comm_wait_s = (max(0.0, float(v)) for v in (step_s, compute_s, comm_wait_s))
        samples = max(0, int(samples))
        self._child(mn.STEPS_TOTAL).inc()
        self._child(mn.SAMPLES_TOTAL).inc(samples)
        self._child(STEP_HISTOGRAM).observe(step_s)
        self._child(mn.COMPUTE_SECONDS_TOTAL).inc(compute_s)
        self._child(mn.COMMUNICATION_WAIT_SECONDS_TOTAL).inc(comm_wait_s)
        if step_s > 0:
            self._child(mn.THROUGHPUT_SAMPLES_PER_SECOND).set(samples / step_s)
        if compute_s > 0:
            self._child(mn.COMPUTE_THROUGHPUT_SAMPLES_PER_SECOND).set(samples / compute_s)
        loss_value = None if loss is None else float(loss)
        if loss_value is not None:
            self._child(mn.LOSS).set(loss_value)
        with self._lock:
            t = self._totals
            if t["steps"] == 0:  # warm-up (first collectives, allocator): kept apart as well
                first = {"step_seconds": step_s, "samples": samples,
                         "compute_seconds": compute_s, "comm_wait_seconds": comm_wait_s}
                t.update({rundir.FIRST_STEP_KEYS[k]: v for k, v in first.items()})
            t["steps"] += 1
            t["samples"] += samples
            t["step_seconds"] += step_s
            t["compute_seconds"] += compute_s
            t["comm_wait_seconds"] += comm_wait_s
            if loss_value is not None:
                self._last["loss"] = loss_value
            self._last["throughput_samples_per_second"] = samples / step_s if step_s > 0 else None
        now = time.monotonic()
        if now - self._last_device_s >= DEVICE_REFRESH_S:
            self.update_device()
        if self._stats_dir is not None and now - self._last_write_s >= STATS_WRITE_S:
            self.flush()

    def set_job_efficiency(self, ratio: float) -> None:
        """Export the job's efficiency (rank 0 calls this; see :func:`job_efficiency_ratio`)."""
        self._child(mn.JOB_EFFICIENCY_RATIO).set(float(ratio))
        with self._lock:
            self._last["job_efficiency_ratio"] = float(ratio)

    def set_job_prediction(self, predicted_samples_per_s: float, measured_samples_per_s: float) -> None:
        """Export the planner's prediction and measured / predicted (rank 0; the contract's
        ``predicted_samples_per_s``, the job's samples/s over the last efficiency window)."""
        ratio = measured_samples_per_s / predicted_samples_per_s
        self._child(mn.JOB_PREDICTED_THROUGHPUT_SAMPLES_PER_SECOND).set(predicted_samples_per_s)
        self._child(mn.JOB_PREDICTION_RATIO).set(ratio)
        with self._lock:
            self._last["job_prediction_ratio"] = ratio

    def set_local_batch(self, n: int) -> None:
        """Set the local batch size gauge (samples per step on this rank)."""
        self._child(mn.LOCAL_BATCH_SIZE).set(int(n))
        with self._lock:
            self._last["local_batch"] = int(n)

    def set_memory_peak(self, peak_bytes: int, cap_bytes: int) -> None:
        """Set ``htj_memory_peak_bytes`` and keep peak and cap for ``rank-<R>.json``."""
        self._child(mn.MEMORY_PEAK_BYTES).set(int(peak_bytes))
        with self._lock:
            self._last["memory_peak_bytes"] = int(peak_bytes)
            self._last["memory_cap_bytes"] = int(cap_bytes)

    def set_total_steps(self, n: int) -> None:
        """Say how many optimizer steps the job takes in all (``htj_planned_steps``; the progress
        bar's and ``status.progress``'s total; optional)."""
        self._child(mn.PLANNED_STEPS).set(int(n))
        with self._lock:
            self._last["total_steps"] = int(n)

    def set_resumed_step(self, step: int) -> None:
        """The job step this process resumed at (``htj_resumed_step``, ``rank-<R>.json``'s
        ``resumed_step``; progress shows ``resumed_step + steps`` of the total)."""
        self._child(mn.RESUMED_STEP).set(int(step))
        with self._lock:
            self._last["resumed_step"] = int(step)

    def set_checkpoints_not_resumed(self, n: int) -> None:
        """Other jobs' checkpoints rank 0 passed over at its start (``htj_checkpoints_not_resumed``;
        the operator posts a ``CheckpointNotResumed`` Warning Event; issue 33)."""
        self._child(mn.CHECKPOINTS_NOT_RESUMED).set(int(n))

    def record_checkpoint_fallback(self) -> None:
        """Count one resume that passed over an unreadable newer checkpoint
        (``htj_checkpoint_fallbacks_total``; the operator posts a ``CheckpointFallback`` Event)."""
        self._child(mn.CHECKPOINT_FALLBACKS_TOTAL).inc()

    def record_checkpoint_save_failure(self) -> None:
        """Count one failed periodic checkpoint save (``htj_checkpoint_save_failures_total``;
        :class:`hetero_worker.ckpt.saving.PeriodicSaves`)."""
        self._child(mn.CHECKPOINT_SAVE_FAILURES_TOTAL).inc()

    def record_rebalance(self) -> None:
        """Count one change of this rank's batch split."""
        self._child(mn.REBALANCES_TOTAL).inc()
        with self._lock:
            self._totals["rebalances"] += 1

    def set_membership_generation(self, generation: int) -> None:
        """Set ``htj_membership_generation`` (``rank-<R>.json``'s ``membership_generation``)."""
        self._child(mn.MEMBERSHIP_GENERATION).set(int(generation))
        with self._lock:
            self._last["membership_generation"] = int(generation)

    def observe_membership_recovery(self, seconds: float) -> None:
        """Set ``htj_membership_recovery_seconds``: a loss to the next completed step."""
        self._child(mn.MEMBERSHIP_RECOVERY_SECONDS).set(float(seconds))
        with self._lock:
            self._last["membership_recovery_s"] = float(seconds)

    def observe_pipeline_step(self, stage: int, planned_bubble_ratio: float,
                              wait_ratio: float) -> None:
        """Set the pipeline gauges (``rank-<R>.json``'s ``pipeline_stage`` and
        ``pipeline_wait_ratio``): this rank's stage, the planned bubble and the last step's
        measured share outside compute (0..1)."""
        self._child(mn.PIPELINE_STAGE).set(int(stage))
        self._child(mn.PIPELINE_PLANNED_BUBBLE_RATIO).set(float(planned_bubble_ratio))
        self._child(mn.PIPELINE_WAIT_RATIO).set(float(wait_ratio))
        with self._lock:
            self._last["pipeline_stage"] = int(stage)
            self._last["pipeline_wait_ratio"] = float(wait_ratio)

    def observe_stage_compute(self, forward_s: float, backward_s: float, optimizer_s: float,
                              samples: int) -> None:
        """Add one step's pipeline-stage compute to the statistics (``rank-<R>.json``'s
        ``stage_forward_seconds``, ``stage_backward_seconds``, ``stage_optimizer_seconds``,
        ``stage_samples`` and ``stage_steps``): what the planner learns each stage's block times
        from. Call it after :meth:`observe_step`; the first step (warm-up) is not counted.

        Args:
            forward_s / backward_s: seconds in the stage's forward / backward of every
                micro-batch of the step.
            optimizer_s: seconds of the step's own work outside the schedule: zeroing the
                gradients and the optimizer step.
            samples: samples that went through the stage in the step (its pipeline's batch).
        """
        with self._lock:
            t = self._totals
            if t["steps"] <= 1:
                return
            t["stage_forward_seconds"] = t.get("stage_forward_seconds", 0.0) + max(0.0, forward_s)
            t["stage_backward_seconds"] = (t.get("stage_backward_seconds", 0.0)
                                           + max(0.0, backward_s))
            t["stage_optimizer_seconds"] = (t.get("stage_optimizer_seconds", 0.0)
                                            + max(0.0, optimizer_s))
            t["stage_samples"] = t.get("stage_samples", 0) + int(samples)
            t["stage_steps"] = t.get("stage_steps", 0) + 1

    def record_step_redone(self) -> None:
        """Count one interrupted step redone after a membership change."""
        self._child(mn.STEPS_REDONE_TOTAL).inc()

    def record_skipped_step(self) -> None:
        """Count one step skipped for inf/NaN gradients (also call observe_step for it)."""
        self._child(mn.SKIPPED_STEPS_TOTAL).inc()
        with self._lock:
            self._totals["skipped_steps"] += 1

    def add_inter_group_bytes(self, n: int) -> None:
        """Count gradient bytes sent between groups by this rank."""
        self._child(mn.INTER_GROUP_BYTES_TOTAL).inc(max(0, int(n)))

    # --- device -------------------------------------------------------------------------------

    def update_device(self) -> None:
        """Refresh GPU utilisation/memory (NVML) and torch CUDA allocator gauges.

        Does nothing for a simulated device or where NVML / CUDA are absent: those series then have
        no samples. torch is consulted only when the process has already imported it.
        """
        self._last_device_s = time.monotonic()
        if self.contract.device.simulated:
            return
        target = nvml.nvml_target(self._cuda_visible_devices, self.contract.dist.local_rank)
        reading, ident = nvml.read_device(target, identity=not self._identity_done)
        if ident is not None:
            self._export_identity(ident)
        if reading is not None:
            if reading.utilization_ratio is not None:
                self._child(mn.GPU_UTILIZATION_RATIO).set(reading.utilization_ratio)
            self._child(mn.GPU_MEMORY_USED_BYTES).set(reading.memory_used_bytes)
            self._child(mn.GPU_MEMORY_TOTAL_BYTES).set(reading.memory_total_bytes)
        self._update_allocator()

    def _export_identity(self, ident: nvml.DeviceIdentity) -> None:
        """Set ``htj_gpu_info`` (once: a rank's device does not change)."""
        self._identity_done = True
        self._families[GPU_INFO].labels(
            **self.labels, UUID=ident.uuid, gpu=ident.gpu_index, GPU_I_ID=ident.gi_id,
            GPU_I_PROFILE=ident.gi_profile).set(1)

    def _update_allocator(self) -> None:
        torch = sys.modules.get("torch")
        if torch is None:
            return
        try:
            if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
                return
            allocated = int(torch.cuda.memory_allocated())
            reserved = int(torch.cuda.memory_reserved())
        except Exception:  # a broken CUDA setup must not stop training
            return
        self._child(mn.TORCH_MEMORY_ALLOCATED_BYTES).set(allocated)
        self._child(mn.TORCH_MEMORY_RESERVED_BYTES).set(reserved)
        self._child(mn.TORCH_MEMORY_FRAGMENTATION_RATIO).set(
            1.0 - allocated / reserved if reserved > 0 else 0.0)

    # --- run-dir statistics -------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Cumulative statistics of this rank (the content of ``rank-<R>.json``)."""
        c = self.contract
        with self._lock:
            return {"rank": c.dist.rank, "group": c.dist.group, "gpu_product": c.device.product,
                    "simulated": c.device.simulated, "relative_speed": c.device.relative_speed,
                    "precision": c.precision,
                    # recomputed forwards are in its compute seconds (planning normalises them)
                    "recomputes": c.memory.sharding == "full" or c.memory.activation_checkpointing,
                    **self._totals, **self._last,
                    "updated_unix_s": time.time()}

    def flush(self) -> None:
        """Write ``rank-<R>.json`` now when ``HTJ_RUN_DIR`` is set (also runs at exit)."""
        if self._stats_dir is None:
            return
        self._last_write_s = time.monotonic()
        try:
            rundir.write_json_atomic(rundir.rank_stats_path(self._stats_dir, self.contract.dist.rank),
                                     self.stats())
        except OSError as exc:
            log(f"cannot write statistics ({exc})", rank=self.contract.dist.rank)


def job_efficiency_ratio(wall_s: float, rank_samples: Sequence[float],
                         rank_compute_s: Sequence[float]) -> float | None:
    """Achieved samples/s of the job over the sum of every rank's compute-only samples/s.

    ``sum(rank_samples) / wall_s`` divided by ``sum_r rank_samples[r] / rank_compute_s[r]``: the
    share of what the ranks' devices could process on their own (forward, backward, optimizer;
    no communication, no waiting, no data loading) that the job turned into trained samples.

    Args:
        wall_s: wall time of the window on rank 0, seconds (everything between the window's
            first step start and its last step end: waits, data loading, checkpoints included).
        rank_samples: samples each rank trained in the window, ``len == world_size``.
        rank_compute_s: each rank's compute seconds in the window (step time minus the time
            blocked in gradient synchronisation; a simulated device's delay counts as compute).

    Returns:
        The ratio (normally 0..1), or None when the window has no time, no samples or a rank
        with no compute time.
    """
    if wall_s <= 0 or not rank_samples or sum(rank_samples) <= 0:
        return None
    if any(c <= 0 for c in rank_compute_s):
        return None
    capacity = sum(n / c for n, c in zip(rank_samples, rank_compute_s, strict=True))
    return (sum(rank_samples) / wall_s) / capacity


def _flush_if_alive(ref: weakref.ref[WorkerMetrics]) -> None:
    metrics = ref()
    if metrics is not None:
        metrics.flush()
