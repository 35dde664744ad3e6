"""The names of the environment contract between the operator (or ``heterotrain run``) and a worker
rank, and the values each may take."""

from __future__ import annotations

from typing import Literal

# --- torchrun-compatible names -------------------------------------------------------------
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
LOCAL_RANK = "LOCAL_RANK"
LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
# --- ours ----------------------------------------------------------------------------------
JOB_NAME = "HTJ_JOB_NAME"
"""Name of the HeteroTrainingJob; a metric label."""
GROUP = "HTJ_GROUP"
"""Index of this rank's group (same node, same GPU type: the fast interconnect)."""
GROUP_RANK = "HTJ_GROUP_RANK"
"""Rank inside the group, 0 is the group leader."""
GROUP_SIZE = "HTJ_GROUP_SIZE"
"""Number of ranks in the group."""
FIRST_RANK = "HTJ_FIRST_RANK"
"""Pod form only: global rank of the pod's local rank 0."""
PRECISION = "HTJ_PRECISION"
"""One of :data:`PRECISIONS`: the autocast dtype this rank uses."""
HIERARCHY = "HTJ_HIERARCHY"
"""One of :data:`HIERARCHIES`: how gradients are reduced."""
DEVICE_PROFILE = "HTJ_DEVICE_PROFILE"
"""JSON of :class:`DeviceProfile`: the real or simulated device this rank runs on."""
TOPOLOGY = "HTJ_TOPOLOGY"
"""JSON list of :class:`RankEntry`, one per rank, ordered by rank.  The one place a rank's batch
is written: its entry's ``local_batch`` is its samples per optimizer step, and the sum over the
entries is the global batch (``Contract.local_batch`` and ``Contract.global_batch``)."""
METRICS_PORT = "HTJ_METRICS_PORT"
"""TCP port of this rank's Prometheus endpoint; 0 disables it."""
CHECKPOINT_DIR = "HTJ_CHECKPOINT_DIR"
"""Directory for checkpoints; empty disables checkpointing."""
CHECKPOINT_INTERVAL_STEPS = "HTJ_CHECKPOINT_INTERVAL_STEPS"
"""Optimizer steps between checkpoints (default 50)."""
REBALANCE_INTERVAL_STEPS = "HTJ_REBALANCE_INTERVAL_STEPS"
"""Steps between re-solves of the batch split from measured speeds; 0 (default) keeps it static."""
COMPRESSION = "HTJ_COMPRESSION"
"""One of :data:`COMPRESSIONS`: codec for gradients crossing the inter-group link (default none)."""
POWERSGD_RANK = "HTJ_POWERSGD_RANK"
"""Matrix rank for ``powersgd`` compression (default 4)."""
RESTART_GENERATION = "HTJ_RESTART_GENERATION"
"""Job-wide restart generation: 0 for the first start, +1 for every whole-gang restart of any
cause.  Identical on every rank of one generation, so anything that must agree across ranks
(store key prefixes, per-attempt scratch paths, per-attempt seeds) derives from it; a
torchrun-style per-agent counter does not agree (shared/cases/34)."""
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
"""torchrun's name, set to the same job-wide value so code written for torchrun agrees too."""
PREDICTED_SAMPLES_PER_S = "HTJ_PREDICTED_SAMPLES_PER_S"
"""The planner's predicted job throughput, samples/s (optional; unset or 0: no prediction).  Rank 0
exports measured / predicted as ``htj_job_prediction_ratio``."""
# --- checkpoints that survive, preemption, slow storage (issue 20) ---------------------------
CHECKPOINT_KEEP = "HTJ_CHECKPOINT_KEEP"
"""How many verified checkpoints to keep (``spec.training.checkpoint.keep``, default
:data:`heterotrain_common.defaults.CHECKPOINT_KEEP`); a resume falls back to an older one when the
newest is unreadable on any rank."""
CHECKPOINT_TIMEOUT_S = "HTJ_CHECKPOINT_TIMEOUT_S"
"""Timeout of the checkpoint process group (save, its agreement, the stop agreement), seconds
(``spec.training.checkpoint.timeoutSeconds``): separate from the training collectives', so a slow
save never fails the other ranks by a collective timeout."""
COLLECTIVE_TIMEOUT_S = "HTJ_COLLECTIVE_TIMEOUT_S"
"""Timeout of the training collectives (gradient reduction), seconds
(``spec.training.collectiveTimeoutSeconds``)."""
TERMINATION_GRACE_S = "HTJ_TERMINATION_GRACE_S"
"""The pod's ``terminationGracePeriodSeconds``: after SIGTERM the ranks agree on a step, write one
checkpoint and exit within it (``heterotrain launch`` waits that long for them)."""
CHECKPOINT_MAX_FAILURES = "HTJ_CHECKPOINT_MAX_FAILURES"
"""Periodic checkpoint saves that may fail in a row before the job fails (default
:data:`heterotrain_common.defaults.CHECKPOINT_MAX_FAILURES`); a failed one is a warning and a metric
and is tried again at the next interval (``hetero_worker.ckpt.saving``)."""
JOB_UID = "HTJ_JOB_UID"
"""The HeteroTrainingJob's ``metadata.uid``: checkpoint manifests record it beside the restart
generation, so a stale gang never publishes into or prunes a directory a newer generation of the
same job owns (``hetero_worker.ckpt.ownership``); unset outside the operator."""
RESUME_FROM = "HTJ_RESUME_FROM"
"""Whose checkpoints besides its own the job may resume (``spec.training.checkpoint.resumeFrom``):
a job name or UID, or ``AnyJob``; unset: only checkpoints whose manifest records this job's
``HTJ_JOB_UID`` (``hetero_worker.ckpt.ownership``, issue 33)."""
RESILIENCE_VARS = (CHECKPOINT_KEEP, CHECKPOINT_TIMEOUT_S, COLLECTIVE_TIMEOUT_S, TERMINATION_GRACE_S,
                   CHECKPOINT_MAX_FAILURES, JOB_UID, RESUME_FROM)
"""Rendered only when not at their defaults (:func:`heterotrain_common.contract.render_rank_env`)."""
PREEMPTED_EXIT_CODE = 75
"""Exit code of a rank that stopped at an agreed step after SIGTERM (its own or a peer's) and
wrote its checkpoint (``EX_TEMPFAIL``: try again): the operator restarts the gang as an
infrastructure restart, not against ``backoffLimit``."""
ELASTIC_STORE = "HTJ_ELASTIC_STORE"
"""``host:port`` of the membership store of an elastic job (``spec.elastic``), hosted by the
supervisor so that it outlives any rank (:mod:`heterotrain_common.membership`); unset: the job is
not elastic and rank 0 hosts the rendezvous store as before."""
ELASTIC_MEMBER = "HTJ_ELASTIC_MEMBER"
"""An elastic rank's member id: its rank at launch, which it keeps while its ``RANK`` changes from
one membership generation to the next (:mod:`heterotrain_common.membership`)."""
ELASTIC_JOIN_GENERATION = "HTJ_ELASTIC_JOIN_GENERATION"
"""Set on a rank started to *grow* a running elastic job: the membership generation that adds it
(announced before the process starts). The rank builds its Trainer alone, then joins that
generation at its first step and receives the state from a peer, never from a checkpoint
(:mod:`heterotrain_common.membership`); unset: a rank of the launch (generation 0). ``next``
(:data:`heterotrain_common.membership.JOIN_NEXT`, on Kubernetes): the rank asks the membership
keeper for the generation that adds it (``elastic/want/<member>``) and joins the one it is
assigned."""
# --- worker knobs beside the contract (set by `heterotrain run`, tests and benchmarks) ----------
SIM_DELAY_PER_SAMPLE_S = "HTJ_SIM_DELAY_PER_SAMPLE_S"
"""Simulated seconds per sample at relative speed 1.0 (default
:data:`heterotrain_common.defaults.SIM_DELAY_PER_SAMPLE_S`); only simulated devices sleep."""
RENDEZVOUS_TIMEOUT_S = "HTJ_RENDEZVOUS_TIMEOUT_S"
"""Seconds a rank waits for rank 0 before giving up (default :data:`heterotrain_common.defaults.RENDEZVOUS_TIMEOUT_S`)."""
RUN_DIR = "HTJ_RUN_DIR"
"""Directory for the per-rank statistics and the result of ``heterotrain run``; unset in a pod."""
PROFILE_STEPS = "HTJ_PROFILE_STEPS"
"""Steps to trace with the PyTorch Profiler, ``"20-25"`` (inclusive, 1-based: step n is the n-th
optimizer step of the run) or ``"20"``; unset or empty: no profiler (zero cost). Set by
``heterotrain run --profile-steps`` and by the operator from the job annotation
``heterotrain.io/profile-steps``."""
MAX_STEPS = "HTJ_MAX_STEPS"
"""Stop training after this many optimizer steps of the job (whole run, a resume's steps before the
checkpoint included); unset or empty: no limit. Set by ``heterotrain run --max-steps`` (the
Trainer's loader ends its epochs there; a plain script gets it only when its own args name
``--max-steps``)."""
EPOCHS = "HTJ_EPOCHS"
"""Epochs to train, overriding the script's own number (``Trainer.epochs``); unset or empty: the
script's. Set by ``heterotrain run --epochs``."""
TRACKING = "HTJ_TRACKING"
"""Experiment tracking (``spec.training.tracking``): compact JSON of the normal form of
:func:`heterotrain_common.tracking.parse_tracking`, e.g. ``{"tensorboard":{"logDir":""}}``;
unset or empty: no tracking (docs/tracking.md)."""
PRICES_PER_HOUR = "HTJ_PRICES_PER_HOUR"
"""The plan's price of one device per hour of each GPU type of the job, keyed by the topology's
``gpu_product``: compact JSON such as ``{"NVIDIA A100":2.5,"Tesla T4":null}`` (null: unpriced, no
price known to the planner). Rendered for a job with tracking or a priced type; the trackers
write it into the run's metadata (docs/tracking.md). Unset or empty: every type unpriced."""
MAX_PROFILE_STEPS = 100
"""Most steps one trace may span (a Chrome trace grows with every step)."""
SHARDING = "HTJ_SHARDING"
"""How model state is spread (planner, ``spec.training.sharding``): ``none`` (replicated, the
default), ``group`` (sharded inside this rank's group), ``full`` (sharded over all ranks)."""
MICRO_BATCH_SIZE = "HTJ_MICRO_BATCH_SIZE"
"""Most samples one forward/backward may hold (the planner's memory model); a larger local batch
runs as ``ceil(local / micro)`` micro-batches with gradient accumulation and one synchronisation per
step.  Unset or 0: the whole local batch at once.  A per-group value (same device, same share), so
the pod form carries it and it stays right when rebalancing changes the local batch."""
ACTIVATION_CHECKPOINTING = "HTJ_ACTIVATION_CHECKPOINTING"
"""``1``: recompute the user's blocks' activations in backward (``torch.utils.checkpoint``);
unset or ``0``: off."""
MEMORY_CAP_BYTES = "HTJ_MEMORY_CAP_BYTES"
"""Usable memory of the rank's device, bytes (device memory minus the planner's reserve); a
simulated device enforces it (state + activations saved for backward); unset or 0: no cap."""
SHARD_PPM = "HTJ_SHARD_PPM"
"""``full`` sharding only: each rank's share of the model state, parts per million, comma-separated
in rank order (``"500000,250000,250000"``, summing to 1 000 000; the planner's shares, proportional
to usable memory).  A job-wide value, so the pod form carries it.  Unset under ``full``: even
shares."""
SHARDINGS: tuple[str, ...] = ("none", "group", "full")
TORCHRUN_VARS = (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
RANK_ONLY_VARS = (RANK, LOCAL_RANK, GROUP_RANK)
REQUIRED_VARS = (*TORCHRUN_VARS, JOB_NAME, GROUP, GROUP_RANK, GROUP_SIZE, PRECISION, HIERARCHY,
                 DEVICE_PROFILE, TOPOLOGY)
OPTIONAL_VARS = (METRICS_PORT, CHECKPOINT_DIR, CHECKPOINT_INTERVAL_STEPS, REBALANCE_INTERVAL_STEPS,
                 COMPRESSION, POWERSGD_RANK, RESTART_GENERATION, TORCHELASTIC_RESTART_COUNT)
KNOB_VARS = (SIM_DELAY_PER_SAMPLE_S, RENDEZVOUS_TIMEOUT_S, RUN_DIR, PROFILE_STEPS,
             PREDICTED_SAMPLES_PER_S, MAX_STEPS, EPOCHS, TRACKING, PRICES_PER_HOUR)
"""Worker knobs parsed here too; :func:`render_rank_env` writes them only when not at default."""
MEMORY_VARS = (SHARDING, MICRO_BATCH_SIZE, ACTIVATION_CHECKPOINTING, MEMORY_CAP_BYTES, SHARD_PPM)
"""The memory model's variables (issue 12); rendered only when not at their defaults (a job
without ``spec.training.model`` gets none of them)."""
PIPELINE_STAGE = "HTJ_PIPELINE_STAGE"
"""This rank's pipeline stage, 0 = the first (takes the input); one per GPU type, so a per-group
value (issue 30, docs/pipeline.md)."""
PIPELINE_STAGE_BLOCKS = "HTJ_PIPELINE_STAGE_BLOCKS"
"""Contiguous blocks per stage in pipeline order, comma-separated (``"8,3,1"``): the model's
``nn.Sequential`` is cut into them; unset or empty: no pipeline."""
PIPELINE_STAGE_RANKS = "HTJ_PIPELINE_STAGE_RANKS"
"""Every stage's ranks in pipeline order, stages separated by ``;`` and a stage's replicas by
``,`` (``"0,3;1,4;2,5"``): replica ``r`` of every stage forms pipeline ``r``."""
PIPELINE_MICRO_BATCHES = "HTJ_PIPELINE_MICRO_BATCHES"
"""Micro-batches per step of every pipeline (``spec.training.pipeline.microBatches``)."""
PIPELINE_SCHEDULE = "HTJ_PIPELINE_SCHEDULE"
"""``1F1B`` or ``GPipe`` (:mod:`heterotrain_common.pipelineschedules`)."""
PIPELINE_VARS = (PIPELINE_STAGE, PIPELINE_STAGE_BLOCKS, PIPELINE_STAGE_RANKS,
                 PIPELINE_MICRO_BATCHES, PIPELINE_SCHEDULE)
"""The pipeline's variables (issue 30); rendered only for a job with ``spec.training.pipeline``."""
Precision = Literal["bf16", "fp16", "fp32"]
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp32")
Hierarchy = Literal["flat", "group", "node", "arch", "auto"]
HIERARCHIES: tuple[str, ...] = ("flat", "group", "node", "arch", "auto")
COMPRESSIONS: tuple[str, ...] = ("none", "fp16", "bf16", "int8", "powersgd")
"""flat: one all-reduce over all ranks; group: reduce inside each topology group (same node and GPU
type), all-reduce among group leaders, broadcast back; node / arch: the same with groups formed per
node or per compute capability; auto: the worker picks one from its link cost model."""
