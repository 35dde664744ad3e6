"""``spec.training.pipeline`` in the plan (issue 30): the stages per GPU type of the placed ranks.

:func:`refusal` names the spec combinations the pipelined worker does not run (checked before
any placement); :func:`plan_pipeline` turns the placed groups into the stage planner's problem
(:func:`hetero_operator.planning.stages.plan_stages`) and its answer into every rank's stage,
replica and batch.

**The problem.** One stage per placed GPU type; a type's ranks are the stage's replicas. The model
is ``spec.training.pipeline.blockCosts`` as given (each block's parameters, activation and output
bytes per sample, and share of the compute), or else ``spec.training.pipeline.blocks`` equal
blocks: each holds ``1 / blocks`` of the fp32
parameter bytes (``4 x spec.training.model.parameters``), of the activations per sample
(``spec.training.model.activationBytesPerSample``) and of one sample's compute
(``1 / spec.training.referenceSamplesPerSecond`` seconds at speed 1.0, or 1 relative unit), and
its output holds ``spec.training.pipeline.boundaryBytesPerSample`` bytes per sample. A type's
memory is its smallest device's minus ``spec.training.memoryReserveMiB``; the link between types
is the inter-node one.

**Batches.** Replica ``r`` of every stage forms pipeline ``r``; the global batch is split equally
over the pipelines (each a multiple of the micro-batches: ``torch.distributed.pipelining`` cuts
equal micro-batches), and a pipeline's batch equally over its stages' ranks (the topology's
``local_batch``, so the local batches still sum to the global batch and every rank counts its
share of the samples). Every rank of pipeline ``r`` reads the pipeline's whole batch: the first
stage its inputs, the last its targets.

**Precision.** ``Auto`` plans fp32 on every stage (the stage model's bytes and times are fp32's);
a forced ``BF16`` or ``FP16`` runs every stage under that autocast, and with fp16 one dynamic loss
scale spans every stage (:func:`stage_precision`; the worker: ``hetero_worker.pipelinepart``).

**Measured stage times.** Where an earlier pipelined run of the job's profile measured its
stages (:mod:`hetero_operator.planning.stagetimes`), their forward and backward seconds replace
the model's block times of those GPU types, so the stage split and the predicted step
(``PipelinePlan.step_s``) follow what the stages really took.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from hetero_operator.api.pipelineplan import PipelinePlan, StageAssignment
from hetero_operator.api.spec import JobSpec
from hetero_operator.planning import stagetimes
from hetero_operator.planning.marginal import LinkSettings
from hetero_operator.planning.stages import BlockCost, StageDevice, StagePlanError, plan_stages
from heterotrain_common.split import split_batch

PIPELINE_NOT_PLANNED = "PipelineNotPlanned"
"""Unschedulable reason: ``spec.training.pipeline`` combined with what the pipelined worker does
not run, or a placement it cannot cut into stages; the message names the field and the fix."""
PIPELINE_PRECISION = "fp32"
"""What every pipelined rank runs in under ``spec.training.precision: Auto`` (see the module
docstring)."""


def stage_precision(job: JobSpec) -> str:
    """Every pipelined rank's precision: :data:`PIPELINE_PRECISION` for ``Auto``, else the forced
    one (``bf16``/``fp16``/``fp32``; ``BF16`` excludes pre-Ampere devices as for data parallelism)."""
    policy = job.training.precision
    return PIPELINE_PRECISION if policy == "Auto" else policy.lower()
BYTES_PER_PARAMETER = 4
"""fp32 parameter bytes per parameter (the stage planner's ``param_bytes``)."""


def refusal(job: JobSpec) -> str:
    """Why ``job``'s pipeline is not planned whatever the cluster, naming the field and the fix;
    ``""`` when its combination is supported. Only for a job with ``spec.training.pipeline``."""
    t = job.training
    pipe = t.pipeline
    assert pipe is not None
    problems: list[str] = []
    if not pipe.blocks:
        problems.append("spec.training.pipeline.blocks is needed: the number of blocks of the "
                        "model (its nn.Sequential's length), which the planner cuts into stages")
    costs = pipe.block_costs
    if costs and t.model_parameters and sum(c.parameters for c in costs) != t.model_parameters:
        problems.append(f"spec.training.pipeline.blockCosts count "
                        f"{sum(c.parameters for c in costs):,} parameters in all and "
                        f"spec.training.model.parameters says {t.model_parameters:,}: make them "
                        f"agree (measure both with hetero_worker.stages.probe)")
    if t.sharding in ("Group", "Full"):
        problems.append(f"spec.training.sharding {t.sharding} does not combine with a pipeline (a "
                        "stage holds its blocks whole; the pipeline is the answer to a model "
                        "larger than one card): set spec.training.sharding None or Auto, or "
                        "leave spec.training.pipeline out")
    if t.compression != "None":
        problems.append(f"spec.training.compression.mode {t.compression}: the stage replicas' "
                        "gradient all-reduce is not compressed: leave spec.training.compression "
                        "out")
    if t.rebalance_interval_steps:
        problems.append("spec.training.rebalance.intervalSteps "
                        f"{t.rebalance_interval_steps}: a pipeline's blocks and batches are fixed "
                        "for the run (rebalancing moves samples between ranks of one model): set "
                        "it to 0")
    return "; ".join(problems)


def plan_pipeline(job: JobSpec, groups_spec: Sequence[tuple[Any, int]], *, link: LinkSettings,
                  reference_samples_per_s: float | None,
                  learned: Mapping[tuple[str, str], Any] | None = None,
                  ) -> tuple[PipelinePlan, list[int], list[int], list[int]] | str:
    """The stages of the placed groups.

    Args:
        job: a job with ``spec.training.pipeline`` and no :func:`refusal`.
        groups_spec: ``(pool, group size)`` per group in rank order
            (:func:`hetero_operator.planning.pools.group_specs`).
        link: the planner's link settings (the inter-node link joins the stages).
        reference_samples_per_s: samples/s of a speed-1.0 device, None for relative seconds.
        learned: the job's learned table; the stage times earlier pipelined runs measured
            (:mod:`hetero_operator.planning.stagetimes`) replace the model's where the plan is
            absolute.

    Returns:
        ``(pipeline plan, stage per rank, replica per rank, local batch per rank)``, or a
        refusal message naming the field and the fix.
    """
    t = job.training
    pipe = t.pipeline
    assert pipe is not None
    types = [p.gpu_type for p, size in groups_spec for _ in range(size)]
    counts = Counter(types)
    if len(counts) < 2:
        return (f"spec.training.pipeline makes one stage per GPU type and the plan placed one "
                f"type ({types[0]}): leave spec.training.pipeline out (data parallelism alone), "
                f"or allow more GPU types in spec.gpus")
    if pipe.stages is not None and pipe.stages != len(counts):
        return (f"spec.training.pipeline.stages {pipe.stages}: the planner makes one stage per "
                f"placed GPU type, {len(counts)} here ({', '.join(counts)}): set stages Auto or "
                f"{len(counts)}")
    if pipe.blocks < len(counts):
        return (f"spec.training.pipeline.blocks {pipe.blocks} cannot fill {len(counts)} stages "
                f"(one per GPU type: {', '.join(counts)}): split the model into more blocks or "
                f"allow fewer GPU types in spec.gpus")
    if len(set(counts.values())) > 1:
        placed = ", ".join(f"{k} x {t_}" for t_, k in counts.items())
        return (f"the worker runs the same number of replicas on every stage and the plan placed "
                f"{placed}: set spec.gpus.ranks (and spec.gpus.allowedProducts) so that every GPU "
                f"type gets the same number of ranks")
    replicas = next(iter(counts.values()))
    pipeline_batches = split_batch(t.global_batch_size, [1.0] * replicas)
    if min(pipeline_batches) < pipe.micro_batches:
        return (f"spec.training.pipeline.microBatches {pipe.micro_batches} exceeds a pipeline's "
                f"batch ({min(pipeline_batches)} samples: globalBatchSize "
                f"{t.global_batch_size} over {replicas} replicas per stage): lower microBatches "
                f"or raise spec.training.globalBatchSize")
    if any(b % pipe.micro_batches for b in pipeline_batches):
        step = replicas * pipe.micro_batches
        return (f"spec.training.globalBatchSize {t.global_batch_size} gives {replicas} "
                f"pipeline(s) batches of {'/'.join(map(str, pipeline_batches))} samples, not "
                f"multiples of spec.training.pipeline.microBatches {pipe.micro_batches} "
                f"(torch.distributed.pipelining cuts equal micro-batches): set globalBatchSize to "
                f"a multiple of {step} (e.g. {max(step, t.global_batch_size // step * step)})")
    devices = []
    for gpu_type in counts:
        pools = [p for p, _ in groups_spec if p.gpu_type == gpu_type]
        memory_mib = min(p.device.memory_mib for p in pools) - t.memory_reserve_mib
        devices.append(StageDevice(gpu_type=gpu_type, speed=pools[0].speed,
                                   memory_bytes=max(1, memory_mib) * 2**20,
                                   ranks=counts[gpu_type]))
    blocks = _blocks(job, reference_samples_per_s)
    measured = (stagetimes.block_times(learned, blocks, devices, precision=stage_precision(job),
                                       micro_batch=min(pipeline_batches) / pipe.micro_batches)
                if learned and reference_samples_per_s else {})
    try:
        planned = plan_stages(blocks, devices, global_batch=t.global_batch_size,
                              micro_batches=pipe.micro_batches, link=link.model(),
                              schedule=pipe.schedule, measured=measured)
    except StagePlanError as exc:
        return f"spec.training.pipeline: {exc}"
    stage_of = {s.gpu_type: s.index for s in planned.stages}
    stage = [stage_of[g] for g in types]
    seen: Counter[str] = Counter()
    replica = []
    for g in types:
        replica.append(seen[g])
        seen[g] += 1
    stage_count = len(planned.stages)
    shares = [split_batch(b, [1.0] * stage_count) for b in pipeline_batches]
    batches = [shares[r][s] for s, r in zip(stage, replica)]
    assignments = tuple(StageAssignment(
        index=s.index, gpu_type=s.gpu_type,
        ranks=tuple(k for k, g in enumerate(types) if g == s.gpu_type),
        first_block=s.blocks[0], blocks=s.block_count, slot_s=round(s.slot_s, 9),
        memory_bytes=s.memory_bytes) for s in planned.stages)
    plan = PipelinePlan(stages=assignments, micro_batches=pipe.micro_batches,
                        schedule=pipe.schedule, step_s=round(planned.step_s, 9),
                        bubble_fraction=round(planned.bubble_fraction, 6),
                        absolute=bool(reference_samples_per_s),
                        measured_stages=tuple(sorted(measured)))
    return plan, stage, replica, batches


def _blocks(job: JobSpec, reference_samples_per_s: float | None) -> list[BlockCost]:
    """The blocks as ``spec.training.pipeline.blockCosts`` gives them, else equal blocks (see the
    module docstring; parameter and activation bytes split exactly)."""
    t = job.training
    pipe = t.pipeline
    assert pipe is not None
    n = pipe.blocks
    sample_s = 1.0 / reference_samples_per_s if reference_samples_per_s else 1.0
    if pipe.block_costs:  # the whole model's compute shared by the blocks' relative figures
        total = sum(c.compute for c in pipe.block_costs)
        return [BlockCost(param_bytes=BYTES_PER_PARAMETER * c.parameters,
                          activation_bytes_per_sample=c.activation_bytes_per_sample,
                          output_bytes_per_sample=(pipe.boundary_bytes_per_sample
                                                   if c.output_bytes_per_sample is None
                                                   else c.output_bytes_per_sample),
                          compute_s_per_sample=sample_s * c.compute / total)
                for c in pipe.block_costs]
    params = _even(BYTES_PER_PARAMETER * t.model_parameters, n)
    acts = _even(t.activation_bytes_per_sample, n)
    return [BlockCost(param_bytes=params[j], activation_bytes_per_sample=acts[j],
                      output_bytes_per_sample=pipe.boundary_bytes_per_sample,
                      compute_s_per_sample=sample_s / n) for j in range(n)]


def _even(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` integer shares differing by at most one, larger ones first."""
    base, extra = divmod(int(total), parts)
    return [base + (1 if j < extra else 0) for j in range(parts)]

