"""The environment contract between the operator (or the embedded launcher) and a worker rank.

This module is the one place where the variable names and their meaning are defined; the operator's
pod rendering, the embedded ``heterotrain run`` launcher and the worker all import it.  It is pure
Python (no torch, no kopf, no kubernetes) so the operator image can import it without torch.

Names follow torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``; see ``torch.distributed.run``) plus our own ``HTJ_*`` variables.

A pod that hosts several ranks of one group (one process per GPU, like ``torchrun
--nproc-per-node``) receives the *pod* form: everything except ``RANK``, ``LOCAL_RANK`` and
``HTJ_LOCAL_BATCH_SIZE``, plus ``HTJ_FIRST_RANK``.  :func:`expand_pod_env` turns it into the rank
form for local rank ``i``; :func:`parse_contract` reads and cross-checks the rank form.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from heterotrain_common import defaults
from heterotrain_common.envnames import (ACTIVATION_CHECKPOINTING, CHECKPOINT_DIR, CHECKPOINT_KEEP,
                                         CHECKPOINT_TIMEOUT_S, COLLECTIVE_TIMEOUT_S,
                                         TERMINATION_GRACE_S,
                                         CHECKPOINT_INTERVAL_STEPS, COMPRESSION, DEVICE_PROFILE,
                                         FIRST_RANK, GLOBAL_BATCH_SIZE, GROUP, GROUP_RANK,
                                         GROUP_SIZE, HIERARCHIES, HIERARCHY, JOB_NAME,
                                         LOCAL_BATCH_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
                                         MASTER_ADDR, MASTER_PORT, MAX_STEPS, MEMORY_CAP_BYTES,
                                         METRICS_PORT, EPOCHS,
                                         MICRO_BATCH_SIZE, POWERSGD_RANK, PRECISION, PRECISIONS,
                                         PREDICTED_SAMPLES_PER_S, PROFILE_STEPS, RANK,
                                         RANK_ONLY_VARS, REBALANCE_INTERVAL_STEPS,
                                         RENDEZVOUS_TIMEOUT_S, REQUIRED_VARS, RESTART_GENERATION,
                                         RUN_DIR, SHARD_PPM, SHARDING, SIM_DELAY_PER_SAMPLE_S,
                                         TOPOLOGY, TORCHELASTIC_RESTART_COUNT, WORLD_SIZE)
from heterotrain_common.envread import (ContractError, choice_var, compression_mode, int_var,
                                        load_json, memory_settings, powersgd_rank,
                                        predicted_samples_per_s, profile_steps,
                                        rebalance_interval_steps, rendezvous_timeout_s, required,
                                        run_dir, seconds_from_env, sim_delay_per_sample_s)


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
        local_batch: samples per step on this rank (>= 1).
    """

    rank: int
    group: int
    node: str
    gpu_product: str
    compute_capability: str
    local_batch: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Contract:
    """The parsed, cross-checked rank form of the contract.

    Attributes mirror the variables; ``topology`` has ``world_size`` entries, ordered by rank.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    job_name: str
    group: int
    group_rank: int
    group_size: int
    local_batch_size: int
    global_batch_size: int
    precision: str
    hierarchy: str
    device: DeviceProfile
    topology: tuple[RankEntry, ...]
    metrics_port: int = 0
    checkpoint_dir: str = ""
    checkpoint_interval_steps: int = defaults.CHECKPOINT_INTERVAL_STEPS
    rebalance_interval_steps: int = defaults.REBALANCE_INTERVAL_STEPS
    compression: str = "none"
    powersgd_rank: int = defaults.POWERSGD_RANK
    restart_generation: int = 0
    sim_delay_per_sample_s: float = defaults.SIM_DELAY_PER_SAMPLE_S
    rendezvous_timeout_s: float = defaults.RENDEZVOUS_TIMEOUT_S
    run_dir: str = ""
    profile_steps: tuple[int, int] | None = None
    predicted_samples_per_s: float = 0.0
    max_steps: int | None = None
    epochs: int | None = None
    sharding: str = "none"
    micro_batch_size: int = 0
    activation_checkpointing: bool = False
    memory_cap_bytes: int = 0
    shard_ppm: tuple[int, ...] = ()
    checkpoint_keep: int = defaults.CHECKPOINT_KEEP
    checkpoint_timeout_s: float = float(defaults.CHECKPOINT_TIMEOUT_S)
    collective_timeout_s: float = defaults.COLLECTIVE_TIMEOUT_S
    termination_grace_s: float = float(defaults.TERMINATION_GRACE_S)
    extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def group_ranks(self) -> list[int]:
        """Global ranks of this rank's group, ascending."""
        return [e.rank for e in self.topology if e.group == self.group]

    @property
    def local_batches(self) -> list[int]:
        """Local batch per rank, ``len == world_size``."""
        return [e.local_batch for e in self.topology]


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


def render_rank_env(contract: Contract) -> dict[str, str]:
    """Render a :class:`Contract` as the rank form of the environment (str -> str)."""
    env = {
        RANK: str(contract.rank), WORLD_SIZE: str(contract.world_size),
        LOCAL_RANK: str(contract.local_rank), LOCAL_WORLD_SIZE: str(contract.local_world_size),
        MASTER_ADDR: contract.master_addr, MASTER_PORT: str(contract.master_port),
        JOB_NAME: contract.job_name, GROUP: str(contract.group),
        GROUP_RANK: str(contract.group_rank), GROUP_SIZE: str(contract.group_size),
        LOCAL_BATCH_SIZE: str(contract.local_batch_size),
        GLOBAL_BATCH_SIZE: str(contract.global_batch_size), PRECISION: contract.precision,
        HIERARCHY: contract.hierarchy, DEVICE_PROFILE: contract.device.to_json(),
        TOPOLOGY: topology_to_json(contract.topology),
        METRICS_PORT: str(contract.metrics_port), CHECKPOINT_DIR: contract.checkpoint_dir,
        CHECKPOINT_INTERVAL_STEPS: str(contract.checkpoint_interval_steps),
        REBALANCE_INTERVAL_STEPS: str(contract.rebalance_interval_steps),
        COMPRESSION: contract.compression, POWERSGD_RANK: str(contract.powersgd_rank),
        RESTART_GENERATION: str(contract.restart_generation),
        TORCHELASTIC_RESTART_COUNT: str(contract.restart_generation),
    }
    if contract.sim_delay_per_sample_s != defaults.SIM_DELAY_PER_SAMPLE_S:
        env[SIM_DELAY_PER_SAMPLE_S] = repr(contract.sim_delay_per_sample_s)
    if contract.rendezvous_timeout_s != defaults.RENDEZVOUS_TIMEOUT_S:
        env[RENDEZVOUS_TIMEOUT_S] = repr(contract.rendezvous_timeout_s)
    if contract.run_dir:
        env[RUN_DIR] = contract.run_dir
    if contract.profile_steps is not None:
        env[PROFILE_STEPS] = "{}-{}".format(*contract.profile_steps)
    if contract.predicted_samples_per_s > 0:
        env[PREDICTED_SAMPLES_PER_S] = repr(contract.predicted_samples_per_s)
    if contract.max_steps is not None:
        env[MAX_STEPS] = str(contract.max_steps)
    if contract.epochs is not None:
        env[EPOCHS] = str(contract.epochs)
    if contract.sharding != "none":
        env[SHARDING] = contract.sharding
    if contract.micro_batch_size:
        env[MICRO_BATCH_SIZE] = str(contract.micro_batch_size)
    if contract.activation_checkpointing:
        env[ACTIVATION_CHECKPOINTING] = "1"
    if contract.memory_cap_bytes:
        env[MEMORY_CAP_BYTES] = str(contract.memory_cap_bytes)
    if contract.shard_ppm:
        env[SHARD_PPM] = ",".join(str(p) for p in contract.shard_ppm)
    for name, value, default in (
            (CHECKPOINT_KEEP, contract.checkpoint_keep, defaults.CHECKPOINT_KEEP),
            (CHECKPOINT_TIMEOUT_S, contract.checkpoint_timeout_s, defaults.CHECKPOINT_TIMEOUT_S),
            (COLLECTIVE_TIMEOUT_S, contract.collective_timeout_s, defaults.COLLECTIVE_TIMEOUT_S),
            (TERMINATION_GRACE_S, contract.termination_grace_s, defaults.TERMINATION_GRACE_S)):
        if value != default:
            env[name] = f"{value:g}" if isinstance(value, float) else str(value)
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
    env.update({RANK: str(rank), LOCAL_RANK: str(local_rank),
                LOCAL_BATCH_SIZE: str(topology[rank].local_batch),
                GROUP_RANK: str(rank - group_first)})
    return env


def parse_contract(environ: Mapping[str, str]) -> Contract:
    """Read and cross-check the rank form of the contract.

    Args:
        environ: usually ``os.environ``.

    Returns:
        The :class:`Contract`.

    Raises:
        ContractError: naming the first offending variable: missing, not an integer, out of
            range, or inconsistent with ``HTJ_TOPOLOGY`` (rank outside WORLD_SIZE, ranks missing
            from the topology, local batches not summing to ``HTJ_GLOBAL_BATCH_SIZE``, group
            fields disagreeing with the topology).
    """
    for name in REQUIRED_VARS:
        required(environ, name)
    world = int_var(environ, WORLD_SIZE, minimum=1)
    rank = int_var(environ, RANK, minimum=0)
    if rank >= world:
        raise ContractError(RANK, f"{rank} is outside WORLD_SIZE={world}; use 0..{world - 1}")
    local_world = int_var(environ, LOCAL_WORLD_SIZE, minimum=1)
    local_rank = int_var(environ, LOCAL_RANK, minimum=0)
    if local_rank >= local_world:
        raise ContractError(LOCAL_RANK, f"{local_rank} is outside LOCAL_WORLD_SIZE={local_world}")
    port = int_var(environ, MASTER_PORT, minimum=1, maximum=65535)
    topology = topology_from_json(required(environ, TOPOLOGY))
    _check_topology(topology, world)
    contract = Contract(
        rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
        master_addr=required(environ, MASTER_ADDR), master_port=port, job_name=required(environ, JOB_NAME),
        group=int_var(environ, GROUP, minimum=0), group_rank=int_var(environ, GROUP_RANK, minimum=0),
        group_size=int_var(environ, GROUP_SIZE, minimum=1),
        local_batch_size=int_var(environ, LOCAL_BATCH_SIZE, minimum=1),
        global_batch_size=int_var(environ, GLOBAL_BATCH_SIZE, minimum=1),
        precision=choice_var(environ, PRECISION, PRECISIONS),
        hierarchy=choice_var(environ, HIERARCHY, HIERARCHIES),
        device=DeviceProfile.from_json(required(environ, DEVICE_PROFILE)), topology=topology,
        metrics_port=int_var(environ, METRICS_PORT, minimum=0, maximum=65535, default=0),
        checkpoint_dir=environ.get(CHECKPOINT_DIR, ""),
        checkpoint_interval_steps=int_var(environ, CHECKPOINT_INTERVAL_STEPS, minimum=1,
                                          default=defaults.CHECKPOINT_INTERVAL_STEPS),
        rebalance_interval_steps=rebalance_interval_steps(environ),
        compression=compression_mode(environ),
        powersgd_rank=powersgd_rank(environ),
        sim_delay_per_sample_s=sim_delay_per_sample_s(environ),
        rendezvous_timeout_s=rendezvous_timeout_s(environ),
        run_dir=run_dir(environ),
        profile_steps=profile_steps(environ),
        predicted_samples_per_s=predicted_samples_per_s(environ),
        max_steps=_optional_count(environ, MAX_STEPS),
        epochs=_optional_count(environ, EPOCHS),
        restart_generation=int_var(environ, RESTART_GENERATION, minimum=0, default=0),
        checkpoint_keep=int_var(environ, CHECKPOINT_KEEP, minimum=1, default=defaults.CHECKPOINT_KEEP),
        checkpoint_timeout_s=seconds_from_env(environ, CHECKPOINT_TIMEOUT_S,
                                              default_s=float(defaults.CHECKPOINT_TIMEOUT_S),
                                              allow_zero=False),
        collective_timeout_s=seconds_from_env(environ, COLLECTIVE_TIMEOUT_S,
                                              default_s=defaults.COLLECTIVE_TIMEOUT_S, allow_zero=False),
        termination_grace_s=seconds_from_env(environ, TERMINATION_GRACE_S,
                                             default_s=float(defaults.TERMINATION_GRACE_S),
                                             allow_zero=True),
        **memory_settings(environ),
    )
    _check_rank_against_topology(contract)
    if contract.shard_ppm and len(contract.shard_ppm) != world:
        raise ContractError(SHARD_PPM, f"has {len(contract.shard_ppm)} shares for WORLD_SIZE={world}; "
                            "give one per rank, in rank order")
    return contract


def _optional_count(environ: Mapping[str, str], name: str) -> int | None:
    """A whole number >= 1 from ``name``; None when unset or empty.

    Raises:
        ContractError: not a whole number >= 1.
    """
    if environ.get(name, "") == "":
        return None
    return int_var(environ, name, minimum=1)


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
    total = sum(c.local_batches)
    if total != c.global_batch_size:
        raise ContractError(GLOBAL_BATCH_SIZE, f"{c.global_batch_size} != sum of local batches "
                            f"in {TOPOLOGY} ({total}: {c.local_batches})")
    me = c.topology[c.rank]
    if me.local_batch != c.local_batch_size:
        raise ContractError(LOCAL_BATCH_SIZE, f"{c.local_batch_size} disagrees with {TOPOLOGY} "
                            f"entry for rank {c.rank} ({me.local_batch})")
    if me.group != c.group:
        raise ContractError(GROUP, f"{c.group} disagrees with {TOPOLOGY} entry for rank {c.rank} "
                            f"({me.group})")
    members = c.group_ranks
    if len(members) != c.group_size:
        raise ContractError(GROUP_SIZE, f"{c.group_size} but {TOPOLOGY} has {len(members)} "
                            f"ranks in group {c.group}")
    if members.index(c.rank) != c.group_rank:
        raise ContractError(GROUP_RANK, f"{c.group_rank} but rank {c.rank} is member "
                            f"{members.index(c.rank)} of group {c.group}")
