"""The environment contract between the operator (or the embedded launcher) and a worker rank.

This module is the one place where the variables' meaning, parsing and defaults are defined (their
names are in :mod:`heterotrain_common.envnames`); the operator's pod rendering, the embedded
``heterotrain run`` launcher and the worker all import it.  It is pure Python (no torch, no kopf,
no kubernetes) so the operator image can import it without torch.

Names follow torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``; see ``torch.distributed.run``) plus our own ``HTJ_*`` variables.

The parsed rank form is a :class:`Contract` of small groups: ``dist`` (:class:`RankInfo`: where the
rank sits), ``batch`` (:class:`BatchSettings`), ``comm`` (:class:`CommSettings`), ``memory``
(:class:`MemorySettings`), ``checkpoint`` (:class:`CheckpointSettings`) and ``run``
(:class:`RunSettings`: metrics, profiling, run directory, simulation), beside ``precision``,
``device`` and ``topology``.  Each variable is declared once, as the field that holds it:
``var(NAME, reader, default=...)`` names its variable, how its text is read (and written back) and
its default; :func:`parse_contract`, :func:`render_rank_env` and :func:`read_var` all walk those
fields, so a new knob is one field (plus its name in ``envnames``).

A rank's batch is written once, in its ``HTJ_TOPOLOGY`` entry (``local_batch``); the global
batch is their sum.  :attr:`Contract.local_batch` and :attr:`Contract.global_batch` derive both.

A pod that hosts several ranks of one group (one process per GPU, like ``torchrun
--nproc-per-node``) receives the *pod* form: everything except ``RANK``, ``LOCAL_RANK`` and
``HTJ_GROUP_RANK``, plus ``HTJ_FIRST_RANK``.  :func:`expand_pod_env` turns it into the rank form
for local rank ``i``; :func:`parse_contract` reads and cross-checks the rank form.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from heterotrain_common import defaults
from heterotrain_common.envnames import (ACTIVATION_CHECKPOINTING, CHECKPOINT_DIR,
                                         CHECKPOINT_INTERVAL_STEPS, CHECKPOINT_KEEP,
                                         CHECKPOINT_MAX_FAILURES,
                                         CHECKPOINT_TIMEOUT_S, COLLECTIVE_TIMEOUT_S, COMPRESSION,
                                         DEVICE_PROFILE, EPOCHS, FIRST_RANK,
                                         GROUP, GROUP_RANK, GROUP_SIZE, HIERARCHIES, HIERARCHY,
                                         JOB_NAME, JOB_UID, LOCAL_RANK, LOCAL_WORLD_SIZE,
                                         MASTER_ADDR, MASTER_PORT, MAX_STEPS, MEMORY_CAP_BYTES,
                                         METRICS_PORT, MICRO_BATCH_SIZE, OPTIONAL_VARS,
                                         PIPELINE_VARS, POWERSGD_RANK, PRECISION, PRECISIONS,
                                         PREDICTED_SAMPLES_PER_S, PRICES_PER_HOUR, PROFILE_STEPS,
                                         RANK,
                                         RANK_ONLY_VARS, REBALANCE_INTERVAL_STEPS,
                                         RENDEZVOUS_TIMEOUT_S, REQUIRED_VARS, RESTART_GENERATION,
                                         RESUME_FROM,
                                         RUN_DIR, SHARD_PPM, SHARDING, SHARDINGS,
                                         SIM_DELAY_PER_SAMPLE_S, TERMINATION_GRACE_S, TOPOLOGY,
                                         TORCHELASTIC_RESTART_COUNT, TRACKING, WORLD_SIZE)
from heterotrain_common.envfields import (Var, count, group, non_negative_s, one_of, positive_s,
                                          read_fields, read_value, short_float, text, var, walk,
                                          write_fields)
from heterotrain_common.pipelineenv import PipelineSettings, check_pipeline
from heterotrain_common.tracking import (prices_to_json, read_prices, read_tracking,
                                          tracking_to_json)
from heterotrain_common.envread import (ContractError, int_var, load_json, parse_compression,
                                        parse_flag, parse_rate, parse_shard_ppm, parse_step_range,
                                        required)

@dataclass(frozen=True, kw_only=True, slots=True)
class DeviceProfile:
    """The device a rank runs on, real or simulated.

    Attributes:
        product: GFD ``nvidia.com/gpu.product`` value, e.g. ``"Tesla-T4"`` or
            ``"NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"``; ``"cpu"`` for a plain CPU rank.
        compute_capability: CUDA compute capability as ``"major.minor"``, e.g. ``"7.5"``;
            ``""`` for a CPU.
        memory_mib: device memory in MiB (0 when unknown).
        relative_speed: throughput relative to the planner's reference device (> 0).
        simulated: True when the rank runs on a CPU and imitates this device by an added delay.
        mig_profile: MIG profile such as ``"1g.10gb"``, ``""`` for a whole GPU.
    """

    product: str
    compute_capability: str = ""
    memory_mib: int = 0
    relative_speed: float = 1.0
    simulated: bool = False
    mig_profile: str = ""

    def to_json(self) -> str:
        """Serialise with stable key order."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DeviceProfile:
        """Parse; raises :class:`ContractError` naming ``HTJ_DEVICE_PROFILE``."""
        data = load_json(DEVICE_PROFILE, text, dict)
        try:
            profile = cls(**data)
        except TypeError as exc:
            raise ContractError(DEVICE_PROFILE, f"unexpected or missing keys ({exc})") from None
        if not isinstance(profile.relative_speed, (int, float)) or profile.relative_speed <= 0:
            raise ContractError(DEVICE_PROFILE, "relative_speed must be a number > 0")
        return profile


@dataclass(frozen=True, kw_only=True, slots=True)
class RankEntry:
    """One rank of the topology (``HTJ_TOPOLOGY`` holds a list of these, ordered by rank).

    Attributes:
        rank: global rank, 0 <= rank < WORLD_SIZE.
        group: group index; ranks of one group are contiguous and share node and GPU type.
        node: Kubernetes node name (or ``"localhost"`` for the embedded default).
        gpu_product: GFD product label value.
        compute_capability: ``"major.minor"``, ``""`` for CPU.
        local_batch: samples per optimizer step on this rank (>= 1): the one place the rank's
            batch is written (the global batch is the sum over the topology).
    """

    rank: int
    group: int
    node: str
    gpu_product: str
    compute_capability: str
    local_batch: int


def topology_to_json(entries: list[RankEntry] | tuple[RankEntry, ...]) -> str:
    """Serialise a topology; compact, stable key order."""
    return json.dumps([asdict(e) for e in entries], sort_keys=True, separators=(",", ":"))


def topology_from_json(text: str) -> tuple[RankEntry, ...]:
    """Parse ``HTJ_TOPOLOGY``; raises :class:`ContractError` naming it."""
    data = load_json(TOPOLOGY, text, list)
    entries = []
    for i, item in enumerate(data):
        if not isinstance(item, dict):
            raise ContractError(TOPOLOGY, f"entry {i} must be an object")
        try:
            entries.append(RankEntry(**item))
        except TypeError as exc:
            raise ContractError(TOPOLOGY, f"entry {i} has unexpected or missing keys ({exc})") from None
    return tuple(entries)


def _read_device(text: str, name: str) -> DeviceProfile:
    return DeviceProfile.from_json(text)


def _read_topology(text: str, name: str) -> tuple[RankEntry, ...]:
    return topology_from_json(text)


@dataclass(frozen=True, kw_only=True, slots=True)
class RankInfo:
    """Where this rank sits in the job: torchrun's variables plus its group's.

    Attributes:
        rank: global rank, ``0 <= rank < world_size`` (``RANK``).
        world_size: ranks in the job (``WORLD_SIZE``).
        local_rank: position among the ranks of its pod (``LOCAL_RANK``).
        local_world_size: ranks in its pod (``LOCAL_WORLD_SIZE``).
        master_addr: rank 0's address (``MASTER_ADDR``).
        master_port: rendezvous TCP port, 1..65535 (``MASTER_PORT``).
        job_name: the HeteroTrainingJob's name, a metric label (``HTJ_JOB_NAME``).
        group: its group's index (``HTJ_GROUP``); group_rank: its place in it, 0 leads
            (``HTJ_GROUP_RANK``); group_size: ranks in it (``HTJ_GROUP_SIZE``).
        restart_generation: job-wide restart generation, 0 on the first start
            (``HTJ_RESTART_GENERATION``, also rendered as ``TORCHELASTIC_RESTART_COUNT``).
        job_uid: the job's ``metadata.uid``, ``""`` outside the operator (``HTJ_JOB_UID``);
            checkpoint manifests record it with the generation.
    """

    rank: int = var(RANK, count(0))
    world_size: int = var(WORLD_SIZE, count(1))
    local_rank: int = var(LOCAL_RANK, count(0))
    local_world_size: int = var(LOCAL_WORLD_SIZE, count(1))
    master_addr: str = var(MASTER_ADDR, text)
    master_port: int = var(MASTER_PORT, count(1, 65535))
    job_name: str = var(JOB_NAME, text)
    group: int = var(GROUP, count(0))
    group_rank: int = var(GROUP_RANK, count(0))
    group_size: int = var(GROUP_SIZE, count(1))
    restart_generation: int = var(RESTART_GENERATION, count(0), default=0,
                                  also=(TORCHELASTIC_RESTART_COUNT,))
    job_uid: str = var(JOB_UID, text, default="")


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchSettings:
    """How long the run trains.  The batch of one step is the topology's
    (:attr:`Contract.local_batch`, :attr:`Contract.global_batch`).

    Attributes:
        max_steps: optimizer steps of the whole job, None = no limit (``HTJ_MAX_STEPS``).
        epochs: epochs overriding the script's, None = the script's (``HTJ_EPOCHS``).
    """

    max_steps: int | None = var(MAX_STEPS, count(1), default=None)
    epochs: int | None = var(EPOCHS, count(1), default=None)


@dataclass(frozen=True, kw_only=True, slots=True)
class CommSettings:
    """How gradients travel and how long the ranks wait for each other.

    Attributes:
        hierarchy: one of ``envnames.HIERARCHIES`` (``HTJ_HIERARCHY``).
        compression: codec on the inter-group link, one of ``envnames.COMPRESSIONS``, lower case
            (``HTJ_COMPRESSION``).
        powersgd_rank: PowerSGD factor rank, 1..64 (``HTJ_POWERSGD_RANK``).
        rebalance_interval_steps: steps between re-solves of the batch split, 0 = static
            (``HTJ_REBALANCE_INTERVAL_STEPS``).
        collective_timeout_s: timeout of the training collectives, s > 0
            (``HTJ_COLLECTIVE_TIMEOUT_S``).
        rendezvous_timeout_s: how long ranks > 0 wait for rank 0, s > 0
            (``HTJ_RENDEZVOUS_TIMEOUT_S``).
    """

    hierarchy: str = var(HIERARCHY, one_of(HIERARCHIES))
    compression: str = var(COMPRESSION, parse_compression, default="none")
    powersgd_rank: int = var(POWERSGD_RANK, count(1, 64), default=defaults.POWERSGD_RANK)
    rebalance_interval_steps: int = var(REBALANCE_INTERVAL_STEPS, count(0),
                                        default=defaults.REBALANCE_INTERVAL_STEPS)
    collective_timeout_s: float = var(COLLECTIVE_TIMEOUT_S, positive_s,
                                      default=defaults.COLLECTIVE_TIMEOUT_S, write=short_float)
    rendezvous_timeout_s: float = var(RENDEZVOUS_TIMEOUT_S, positive_s,
                                      default=defaults.RENDEZVOUS_TIMEOUT_S, write=repr)


@dataclass(frozen=True, kw_only=True, slots=True)
class MemorySettings:
    """The planner's memory model for this rank (all at their defaults without one).

    Attributes:
        sharding: ``none``, ``group`` or ``full`` (``HTJ_SHARDING``).
        micro_batch_size: most samples per forward/backward, 0 = the whole local batch
            (``HTJ_MICRO_BATCH_SIZE``).
        activation_checkpointing: recompute the user's blocks in backward
            (``HTJ_ACTIVATION_CHECKPOINTING``, ``1``/``0``).
        cap_bytes: usable device memory in bytes a simulated device enforces, 0 = no cap
            (``HTJ_MEMORY_CAP_BYTES``).
        shard_ppm: ``full`` only: each rank's share of the state in parts per million, in rank
            order, summing to 1 000 000; ``()`` = even shares (``HTJ_SHARD_PPM``).
    """

    sharding: str = var(SHARDING, one_of(SHARDINGS), default="none")
    micro_batch_size: int = var(MICRO_BATCH_SIZE, count(0), default=0)
    activation_checkpointing: bool = var(ACTIVATION_CHECKPOINTING, parse_flag, default=False,
                                         write=lambda on: "1" if on else "0")
    cap_bytes: int = var(MEMORY_CAP_BYTES, count(0), default=0)
    shard_ppm: tuple[int, ...] = var(SHARD_PPM, parse_shard_ppm, default=(),
                                     write=lambda shares: ",".join(str(p) for p in shares))


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointSettings:
    """Where and how often the job saves, and how long a save may take.

    Attributes:
        dir: checkpoint directory, ``""`` = no checkpoints (``HTJ_CHECKPOINT_DIR``).
        interval_steps: optimizer steps between checkpoints, >= 1
            (``HTJ_CHECKPOINT_INTERVAL_STEPS``).
        keep: verified checkpoints kept, >= 1 (``HTJ_CHECKPOINT_KEEP``).
        timeout_s: timeout of the checkpoint process group, s > 0 (``HTJ_CHECKPOINT_TIMEOUT_S``).
        max_failures: periodic saves that may fail in a row before the job fails, >= 1
            (``HTJ_CHECKPOINT_MAX_FAILURES``).
        resume_from: whose checkpoints besides the job's own it resumes: a job name or UID, or
            ``AnyJob``; ``""``: its own only (``HTJ_RESUME_FROM``, ``hetero_worker.ckpt.ownership``).
    """

    dir: str = var(CHECKPOINT_DIR, text, default="")
    interval_steps: int = var(CHECKPOINT_INTERVAL_STEPS, count(1),
                              default=defaults.CHECKPOINT_INTERVAL_STEPS)
    keep: int = var(CHECKPOINT_KEEP, count(1), default=defaults.CHECKPOINT_KEEP)
    timeout_s: float = var(CHECKPOINT_TIMEOUT_S, positive_s,
                           default=float(defaults.CHECKPOINT_TIMEOUT_S), write=short_float)
    max_failures: int = var(CHECKPOINT_MAX_FAILURES, count(1),
                            default=defaults.CHECKPOINT_MAX_FAILURES)
    resume_from: str = var(RESUME_FROM, text, default="")


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSettings:
    """How the rank's process runs and reports.

    Attributes:
        dir: directory for per-rank statistics and ``heterotrain run``'s result, ``""`` in a pod
            (``HTJ_RUN_DIR``).
        metrics_port: Prometheus endpoint's TCP port, 0 = off (``HTJ_METRICS_PORT``).
        profile_steps: ``(first, last)`` optimizer steps to trace, inclusive and 1-based; None =
            no profiler (``HTJ_PROFILE_STEPS``, ``"20-25"``).
        predicted_samples_per_s: the planner's predicted job throughput, 0 = none
            (``HTJ_PREDICTED_SAMPLES_PER_S``).
        sim_delay_per_sample_s: simulated seconds per sample at relative speed 1.0, >= 0
            (``HTJ_SIM_DELAY_PER_SAMPLE_S``).
        termination_grace_s: the pod's termination grace period, s >= 0
            (``HTJ_TERMINATION_GRACE_S``).
        tracking: experiment tracking, the normal form of
            :func:`heterotrain_common.tracking.parse_tracking`; None = none (``HTJ_TRACKING``).
        prices_per_hour: the plan's price of one device per hour per GPU product, None for an
            unpriced type; None = not given, every type unpriced (``HTJ_PRICES_PER_HOUR``).
    """

    dir: str = var(RUN_DIR, text, default="")
    metrics_port: int = var(METRICS_PORT, count(0, 65535), default=0)
    profile_steps: tuple[int, int] | None = var(PROFILE_STEPS, parse_step_range, default=None,
                                                write=lambda steps: "{}-{}".format(*steps))
    predicted_samples_per_s: float = var(PREDICTED_SAMPLES_PER_S, parse_rate, default=0.0,
                                         write=repr)
    sim_delay_per_sample_s: float = var(SIM_DELAY_PER_SAMPLE_S, non_negative_s,
                                        default=defaults.SIM_DELAY_PER_SAMPLE_S, write=repr)
    termination_grace_s: float = var(TERMINATION_GRACE_S, non_negative_s,
                                     default=float(defaults.TERMINATION_GRACE_S), write=short_float)
    tracking: Mapping[str, Any] | None = var(TRACKING, read_tracking, default=None,
                                             write=tracking_to_json)
    prices_per_hour: Mapping[str, float | None] | None = var(PRICES_PER_HOUR, read_prices,
                                                             default=None, write=prices_to_json)


@dataclass(frozen=True, kw_only=True, slots=True)
class Contract:
    """The parsed, cross-checked rank form of the contract.

    Attributes:
        dist, batch, comm, memory, checkpoint, run: the groups above.
        pipeline: the pipeline stages (:mod:`heterotrain_common.pipelineenv`; issue 30).
        precision: autocast dtype, one of ``envnames.PRECISIONS`` (``HTJ_PRECISION``).
        device: the real or simulated device (``HTJ_DEVICE_PROFILE``).
        topology: ``world_size`` entries, ordered by rank (``HTJ_TOPOLOGY``).
        extra: further variables rendered as they are (a group's ``NCCL_*``); never parsed.
    """

    dist: RankInfo = group(RankInfo)
    batch: BatchSettings = group(BatchSettings)
    precision: str = var(PRECISION, one_of(PRECISIONS))
    device: DeviceProfile = var(DEVICE_PROFILE, _read_device, write=DeviceProfile.to_json)
    topology: tuple[RankEntry, ...] = var(TOPOLOGY, _read_topology, write=topology_to_json)
    comm: CommSettings = group(CommSettings)
    memory: MemorySettings = group(MemorySettings)
    checkpoint: CheckpointSettings = group(CheckpointSettings)
    run: RunSettings = group(RunSettings)
    pipeline: PipelineSettings = group(PipelineSettings)
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def group_ranks(self) -> list[int]:
        """Global ranks of this rank's group, ascending."""
        return [e.rank for e in self.topology if e.group == self.dist.group]

    @property
    def local_batches(self) -> list[int]:
        """Local batch per rank, ``len == world_size`` (the topology's ``local_batch``)."""
        return [e.local_batch for e in self.topology]

    @property
    def local_batch(self) -> int:
        """Samples per optimizer step on this rank: its topology entry's ``local_batch``."""
        return self.topology[self.dist.rank].local_batch

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all ranks: the sum of the topology's local batches."""
        return sum(self.local_batches)


_TABLE: dict[str, tuple[Var, Any]] = {v.name: (v, default) for _, v, default in walk(Contract)}
VARIABLES: tuple[str, ...] = tuple(n for v, _ in _TABLE.values() for n in (v.name, *v.also))
"""Every variable :func:`render_rank_env` may write, in declaration order (``extra`` aside)."""
_ALWAYS = frozenset((*REQUIRED_VARS, *OPTIONAL_VARS))
"""Rendered even at their defaults; every other variable only when it differs."""
_PIPELINE = frozenset(PIPELINE_VARS)
"""Rendered even at their defaults when the job runs as a pipeline (every rank gets the layout)."""


def read_var(environ: Mapping[str, str], name: str) -> Any:
    """One variable's value as :func:`parse_contract` reads it (unset or empty: its default).

    Args:
        environ: e.g. ``os.environ``.
        name: a variable of :data:`VARIABLES` that is read (not ``TORCHELASTIC_RESTART_COUNT``).

    Raises:
        ContractError: malformed, or required and unset.
        KeyError: ``name`` is not a variable of the contract.
    """
    v, default = _TABLE[name]
    return read_value(environ, v, default)


def render_rank_env(contract: Contract) -> dict[str, str]:
    """Render a :class:`Contract` as the rank form of the environment (str -> str).

    Every variable of ``envnames.REQUIRED_VARS`` and ``envnames.OPTIONAL_VARS`` is written (and of
    ``envnames.PIPELINE_VARS`` under a pipeline); the others only when not at their defaults; then
    ``contract.extra``.
    """
    env: dict[str, str] = {}
    write_fields(contract, env, always=_ALWAYS | _PIPELINE if contract.pipeline.enabled else _ALWAYS)
    env.update(contract.extra)
    return env


def pod_env(rank_env: Mapping[str, str]) -> dict[str, str]:
    """Turn the rank form of local rank 0 of a pod into the pod form (drop rank-only variables)."""
    env = {k: v for k, v in rank_env.items() if k not in RANK_ONLY_VARS}
    env[FIRST_RANK] = rank_env[RANK]
    return env


def expand_pod_env(pod: Mapping[str, str], local_rank: int) -> dict[str, str]:
    """Derive the rank form for ``local_rank`` from a pod form (what our launcher does).

    Raises:
        ContractError: ``HTJ_FIRST_RANK`` or ``HTJ_TOPOLOGY`` missing or malformed, or
            ``local_rank`` outside ``LOCAL_WORLD_SIZE``.
    """
    first = int_var(pod, FIRST_RANK, minimum=0)
    local_world = int_var(pod, LOCAL_WORLD_SIZE, minimum=1)
    if not 0 <= local_rank < local_world:
        raise ContractError(LOCAL_RANK, f"{local_rank} outside LOCAL_WORLD_SIZE={local_world}")
    topology = topology_from_json(required(pod, TOPOLOGY))
    rank = first + local_rank
    if rank >= len(topology):
        raise ContractError(FIRST_RANK, f"rank {rank} has no entry in {TOPOLOGY}")
    group_first = min(e.rank for e in topology if e.group == topology[rank].group)
    env = {k: v for k, v in pod.items() if k != FIRST_RANK}
    env.update({RANK: str(rank), LOCAL_RANK: str(local_rank), GROUP_RANK: str(rank - group_first)})
    return env


def parse_contract(environ: Mapping[str, str]) -> Contract:
    """Read and cross-check the rank form of the contract.

    Args:
        environ: usually ``os.environ``.

    Returns:
        The :class:`Contract`.

    Raises:
        ContractError: naming the first offending variable (in declaration order): missing, not
            an integer, out of range, or inconsistent with ``HTJ_TOPOLOGY`` (rank outside
            WORLD_SIZE, ranks missing from the topology, a local batch below 1, group fields
            disagreeing with the topology, shares not one per rank).
    """
    contract: Contract = read_fields(Contract, environ)
    d = contract.dist
    if d.rank >= d.world_size:
        raise ContractError(RANK, f"{d.rank} is outside WORLD_SIZE={d.world_size}; "
                            f"use 0..{d.world_size - 1}")
    if d.local_rank >= d.local_world_size:
        raise ContractError(LOCAL_RANK, f"{d.local_rank} is outside "
                            f"LOCAL_WORLD_SIZE={d.local_world_size}")
    _check_topology(contract.topology, d.world_size)
    _check_rank_against_topology(contract)
    shares = contract.memory.shard_ppm
    if shares and len(shares) != d.world_size:
        raise ContractError(SHARD_PPM, f"has {len(shares)} shares for WORLD_SIZE={d.world_size}; "
                            "give one per rank, in rank order")
    check_pipeline(contract.pipeline, d.rank, d.world_size)
    return contract


def _check_topology(topology: tuple[RankEntry, ...], world: int) -> None:
    ranks = [e.rank for e in topology]
    if ranks != list(range(world)):
        missing = sorted(set(range(world)) - set(ranks))
        raise ContractError(TOPOLOGY, f"must list ranks 0..{world - 1} in order "
                            f"(WORLD_SIZE={world}); missing {missing}, got {ranks}")
    for e in topology:
        if e.local_batch < 1:
            raise ContractError(TOPOLOGY, f"rank {e.rank} has local_batch {e.local_batch}; must be >= 1")
    groups = [e.group for e in topology]
    seen: list[int] = []
    for g in groups:
        if seen and g != seen[-1] and g in seen:
            raise ContractError(TOPOLOGY, f"ranks of group {g} are not contiguous")
        if not seen or g != seen[-1]:
            seen.append(g)


def _check_rank_against_topology(c: Contract) -> None:
    d = c.dist
    me = c.topology[d.rank]
    if me.group != d.group:
        raise ContractError(GROUP, f"{d.group} disagrees with {TOPOLOGY} entry for rank {d.rank} "
                            f"({me.group})")
    members = c.group_ranks
    if len(members) != d.group_size:
        raise ContractError(GROUP_SIZE, f"{d.group_size} but {TOPOLOGY} has {len(members)} "
                            f"ranks in group {d.group}")
    if members.index(d.rank) != d.group_rank:
        raise ContractError(GROUP_RANK, f"{d.group_rank} but rank {d.rank} is member "
                            f"{members.index(d.rank)} of group {d.group}")
