"""Render a plan into the env contract (rank form) for every rank; pure.

The operator and the embedded ``heterotrain run`` launcher both call :func:`render_rank_envs`; the
operator then turns local rank 0 of each group into the pod form with
``heterotrain_common.contract.pod_env``.  One pod per group, so ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` are the
rank's position in its group and the group's size.  The pod form carries local rank 0's
``HTJ_METRICS_PORT``; ``heterotrain launch`` adds the local rank, matching the rank form here.
"""

from __future__ import annotations

import json

from hetero_operator.api.memoryplan import RankMemory
from hetero_operator.api.pipelineplan import PipelinePlan
from hetero_operator.api.spec import JobSpec
from hetero_operator.api.types import Plan
from heterotrain_common.pipelineenv import PipelineSettings
from heterotrain_common.contract import (CheckpointSettings, CommSettings, Contract, DeviceProfile,
                                         MemorySettings, RankEntry, RankInfo, RunSettings,
                                         render_rank_env)

HIERARCHY_TO_CONTRACT: dict[str, str] = {
    "Auto": "auto", "Flat": "flat", "Group": "group", "PerNode": "node", "PerArchitecture": "arch",
}
"""``spec.training.hierarchy`` -> ``HTJ_HIERARCHY``."""


def render_rank_envs(plan: Plan, job: JobSpec, *, master_addr: str, master_port: int,
                     simulated: bool, metrics_port_base: int | None = None,
                     checkpoint_dir: str | None = None,
                     restart_generation: int = 0, job_uid: str = "") -> list[dict[str, str]]:
    """The rank-form environment of every rank of ``plan``.

    Args:
        plan: from :func:`hetero_operator.planning.plan.plan_job`.
        job: the job the plan is for (name, global batch, hierarchy, metrics port, checkpoint).
        master_addr: rank 0's address (the headless Service name, or ``127.0.0.1``).
        master_port: rendezvous TCP port.
        simulated: ranks run on CPU and imitate their device (``DeviceProfile.simulated``).
        metrics_port_base: when set (all ranks on one host, the embedded default) rank r gets
            ``metrics_port_base + r``; otherwise ``spec.worker.metricsPort + LOCAL_RANK``
            (0 stays 0 = off).
        checkpoint_dir: overrides ``spec.training.checkpoint.path``.
        restart_generation: the job-wide restart generation (``HTJ_RESTART_GENERATION`` and
            ``TORCHELASTIC_RESTART_COUNT``, equal on every rank; shared/cases/34).
        job_uid: the job's ``metadata.uid`` (``HTJ_JOB_UID``; checkpoint manifests record it with
            the generation, so a stale gang never publishes or prunes where a newer one wrote).

    Returns:
        One ``dict[str, str]`` per rank, ordered by rank; each parses with
        ``heterotrain_common.contract.parse_contract``; group ``extra_env`` (e.g.
        ``NCCL_P2P_DISABLE=1``) is included.  A rank's batch is its ``HTJ_TOPOLOGY`` entry.

    Raises:
        ValueError: the plan's local batches do not sum to ``spec.training.globalBatchSize`` (a
            plan made for another job).
    """
    if sum(r.local_batch for r in plan.ranks) != job.training.global_batch_size:
        raise ValueError(f"the plan's local batches sum to {sum(r.local_batch for r in plan.ranks)}, "
                         f"not spec.training.globalBatchSize {job.training.global_batch_size}")
    topology = tuple(
        RankEntry(rank=r.rank, group=r.group, node=r.node, gpu_product=r.gpu_type,
                  compute_capability=r.compute_capability, local_batch=r.local_batch)
        for r in plan.ranks)
    world, training = len(plan.ranks), job.training
    hierarchy = HIERARCHY_TO_CONTRACT[training.hierarchy]
    ckpt = training.checkpoint_path if checkpoint_dir is None else checkpoint_dir
    value = plan.value  # the planner's prediction, when in samples/s: rank 0 exports the ratio
    predicted = value.predicted_throughput if value is not None and value.absolute else 0.0
    prices = _prices_per_hour(plan, training.tracking_json)
    memory = {m.rank: m for m in plan.memory.ranks} if plan.memory is not None else {}
    sharding = plan.memory.mode.lower() if plan.memory is not None else "none"
    shares = tuple(memory[k].state_share_ppm for k in sorted(memory)) if sharding == "full" else ()
    envs = []
    for r in plan.ranks:
        group = plan.groups[r.group]
        if metrics_port_base is not None:
            port = metrics_port_base + r.rank
        else:
            port = job.worker.metrics_port + r.group_rank if job.worker.metrics_port else 0
        device = DeviceProfile(product=r.gpu_type, compute_capability=r.compute_capability,
                               memory_mib=r.memory_mib, relative_speed=r.relative_speed,
                               simulated=simulated, mig_profile=r.mig_profile)
        contract = Contract(
            dist=RankInfo(rank=r.rank, world_size=world, local_rank=r.group_rank,
                          local_world_size=len(group.ranks), master_addr=master_addr,
                          master_port=master_port, job_name=job.name, group=r.group,
                          group_rank=r.group_rank, group_size=len(group.ranks),
                          restart_generation=restart_generation, job_uid=job_uid),
            precision=r.precision, device=device, topology=topology,
            comm=CommSettings(hierarchy=hierarchy, compression=training.compression.lower(),
                              powersgd_rank=training.powersgd_rank,
                              rebalance_interval_steps=training.rebalance_interval_steps,
                              collective_timeout_s=float(training.collective_timeout_s)),
            memory=_memory_settings(memory.get(r.rank), sharding, shares),
            checkpoint=CheckpointSettings(dir=ckpt, interval_steps=training.checkpoint_interval_steps,
                                          keep=training.checkpoint_keep,
                                          timeout_s=float(training.checkpoint_timeout_s),
                                          resume_from=training.checkpoint_resume_from),
            run=RunSettings(metrics_port=port, profile_steps=job.profile_steps,
                            predicted_samples_per_s=predicted,
                            termination_grace_s=float(job.worker.termination_grace_s),
                            tracking=json.loads(training.tracking_json) if training.tracking_json
                            else None, prices_per_hour=prices),
            pipeline=_pipeline_settings(plan.pipeline, r.stage),
            extra=dict(group.extra_env))
        envs.append(render_rank_env(contract))
    return envs


def _prices_per_hour(plan: Plan, tracking_json: str) -> dict[str, float | None] | None:
    """``HTJ_PRICES_PER_HOUR``: the plan's price per device-hour of each of its GPU types (None:
    unpriced), for the trackers' run metadata; rendered for a job with tracking or a priced type,
    else None (not rendered: the pods of a job without either carry no prices)."""
    types = plan.value.types if plan.value is not None else ()
    prices = {t.gpu_type: t.price_per_hour for t in types}
    if not tracking_json and all(p is None for p in prices.values()):
        return None
    return {r.gpu_type: prices.get(r.gpu_type) for r in plan.ranks}


def _pipeline_settings(pipe: PipelinePlan | None, stage: int | None) -> PipelineSettings:
    """The pipeline variables of a rank of ``stage`` (the defaults, no pipeline, without one)."""
    if pipe is None or stage is None:
        return PipelineSettings()
    return PipelineSettings(stage=stage, stage_blocks=tuple(pipe.block_counts),
                            stage_ranks=tuple(s.ranks for s in pipe.stages),
                            micro_batches=pipe.micro_batches, schedule=pipe.schedule)


def _memory_settings(m: RankMemory | None, sharding: str,
                     shares: tuple[int, ...] = ()) -> MemorySettings:
    """The memory settings of one rank (None without a memory model: the defaults); the
    micro-batch size is the memory bound (samples that fit), so a rebalanced local batch stays
    within memory; ``shares``: every rank's ``state_share_ppm`` under Full sharding
    (``HTJ_SHARD_PPM``), else empty."""
    if m is None:
        return MemorySettings()
    return MemorySettings(sharding=sharding, micro_batch_size=m.samples_that_fit,
                          activation_checkpointing=m.activation_checkpointing,
                          cap_bytes=m.usable_bytes, shard_ppm=shares)
