"""Names of the worker's Prometheus metrics, defined once: the worker exports them
(:mod:`hetero_worker.metrics`), the operator reads them (``status.progress``, learned speeds).

Fixed in docs/internal-api.md; ``htj_`` prefix, base units, ``_total`` for counters.
"""

from __future__ import annotations

CHECKPOINT_FALLBACKS_TOTAL = "htj_checkpoint_fallbacks_total"
CHECKPOINT_SAVE_FAILURES_TOTAL = "htj_checkpoint_save_failures_total"
CHECKPOINTS_NOT_RESUMED = "htj_checkpoints_not_resumed"
COMMUNICATION_WAIT_SECONDS_TOTAL = "htj_communication_wait_seconds_total"
COMPUTE_SECONDS_TOTAL = "htj_compute_seconds_total"
COMPUTE_THROUGHPUT_SAMPLES_PER_SECOND = "htj_compute_throughput_samples_per_second"
GPU_INFO = "htj_gpu_info"
GPU_MEMORY_TOTAL_BYTES = "htj_gpu_memory_total_bytes"
GPU_MEMORY_USED_BYTES = "htj_gpu_memory_used_bytes"
GPU_UTILIZATION_RATIO = "htj_gpu_utilization_ratio"
INTER_GROUP_BYTES_TOTAL = "htj_inter_group_bytes_total"
JOB_EFFICIENCY_RATIO = "htj_job_efficiency_ratio"
JOB_PREDICTED_THROUGHPUT_SAMPLES_PER_SECOND = "htj_job_predicted_throughput_samples_per_second"
JOB_PREDICTION_RATIO = "htj_job_prediction_ratio"
LOCAL_BATCH_SIZE = "htj_local_batch_size"
LOSS = "htj_loss"
MEMBERSHIP_GENERATION = "htj_membership_generation"
MEMBERSHIP_RECOVERY_SECONDS = "htj_membership_recovery_seconds"
STEPS_REDONE_TOTAL = "htj_steps_redone_total"
MEMORY_PEAK_BYTES = "htj_memory_peak_bytes"
PLANNED_STEPS = "htj_planned_steps"
RESUMED_STEP = "htj_resumed_step"
REBALANCES_TOTAL = "htj_rebalances_total"
SAMPLES_TOTAL = "htj_samples_total"
SKIPPED_STEPS_TOTAL = "htj_skipped_steps_total"
STEP_DURATION_SECONDS = "htj_step_duration_seconds"
STEPS_TOTAL = "htj_steps_total"
THROUGHPUT_SAMPLES_PER_SECOND = "htj_throughput_samples_per_second"
TORCH_MEMORY_ALLOCATED_BYTES = "htj_torch_memory_allocated_bytes"
TORCH_MEMORY_FRAGMENTATION_RATIO = "htj_torch_memory_fragmentation_ratio"
TORCH_MEMORY_RESERVED_BYTES = "htj_torch_memory_reserved_bytes"
