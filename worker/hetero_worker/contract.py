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
from typing import Any, Literal

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
LOCAL_BATCH_SIZE = "HTJ_LOCAL_BATCH_SIZE"
"""Samples per optimizer step on this rank."""
GLOBAL_BATCH_SIZE = "HTJ_GLOBAL_BATCH_SIZE"
"""Samples per optimizer step over all ranks; equals the sum of local batches."""
PRECISION = "HTJ_PRECISION"
"""One of :data:`PRECISIONS`: the autocast dtype this rank uses."""
HIERARCHY = "HTJ_HIERARCHY"
"""One of :data:`HIERARCHIES`: how gradients are reduced."""
DEVICE_PROFILE = "HTJ_DEVICE_PROFILE"
"""JSON of :class:`DeviceProfile`: the real or simulated device this rank runs on."""
TOPOLOGY = "HTJ_TOPOLOGY"
"""JSON list of :class:`RankEntry`, one per rank, ordered by rank."""
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

# --- worker knobs beside the contract (set by `heterotrain run`, tests and benchmarks) ----------
SIM_DELAY_PER_SAMPLE_S = "HTJ_SIM_DELAY_PER_SAMPLE_S"
"""Simulated seconds per sample at relative speed 1.0 (default
:data:`DEFAULT_SIM_DELAY_PER_SAMPLE_S`); only simulated devices sleep."""
RENDEZVOUS_TIMEOUT_S = "HTJ_RENDEZVOUS_TIMEOUT_S"
"""Seconds a rank waits for rank 0 before giving up (default :data:`DEFAULT_RENDEZVOUS_TIMEOUT_S`)."""
RUN_DIR = "HTJ_RUN_DIR"
"""Directory for the per-rank statistics and the result of ``heterotrain run``; unset in a pod."""
PROFILE_STEPS = "HTJ_PROFILE_STEPS"
"""Steps to trace with the PyTorch Profiler, ``"20-25"`` (inclusive, 1-based: step n is the n-th
optimizer step of the run) or ``"20"``; unset or empty: no profiler (zero cost). Set by
``heterotrain run --profile-steps`` and by the operator from the job annotation
``heterotrain.io/profile-steps``."""
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
DEFAULT_SIM_DELAY_PER_SAMPLE_S = 0.002
DEFAULT_RENDEZVOUS_TIMEOUT_S = 600.0

TORCHRUN_VARS = (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
RANK_ONLY_VARS = (RANK, LOCAL_RANK, LOCAL_BATCH_SIZE, GROUP_RANK)
REQUIRED_VARS = (*TORCHRUN_VARS, JOB_NAME, GROUP, GROUP_RANK, GROUP_SIZE, LOCAL_BATCH_SIZE,
                 GLOBAL_BATCH_SIZE, PRECISION, HIERARCHY, DEVICE_PROFILE, TOPOLOGY)
OPTIONAL_VARS = (METRICS_PORT, CHECKPOINT_DIR, CHECKPOINT_INTERVAL_STEPS, REBALANCE_INTERVAL_STEPS,
                 COMPRESSION, POWERSGD_RANK, RESTART_GENERATION, TORCHELASTIC_RESTART_COUNT)
KNOB_VARS = (SIM_DELAY_PER_SAMPLE_S, RENDEZVOUS_TIMEOUT_S, RUN_DIR, PROFILE_STEPS,
             PREDICTED_SAMPLES_PER_S)
"""Worker knobs parsed here too; :func:`render_rank_env` writes them only when not at default."""
MEMORY_VARS = (SHARDING, MICRO_BATCH_SIZE, ACTIVATION_CHECKPOINTING, MEMORY_CAP_BYTES, SHARD_PPM)
"""The memory model's variables (issue 12); rendered only when not at their defaults (a job
without ``spec.training.model`` gets none of them)."""

Precision = Literal["bf16", "fp16", "fp32"]
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp32")
Hierarchy = Literal["flat", "group", "node", "arch", "auto"]
HIERARCHIES: tuple[str, ...] = ("flat", "group", "node", "arch", "auto")
COMPRESSIONS: tuple[str, ...] = ("none", "fp16", "bf16", "int8", "powersgd")
"""flat: one all-reduce over all ranks; group: reduce inside each topology group (same node and GPU
type), all-reduce among group leaders, broadcast back; node / arch: the same with groups formed per
node or per compute capability; auto: the worker picks one from its link cost model."""


class ContractError(ValueError):
    """An environment variable of the contract is missing, malformed or inconsistent.

    Attributes:
        variable: the offending variable's name, e.g. ``"HTJ_LOCAL_BATCH_SIZE"``.
    """

    def __init__(self, variable: str, message: str) -> None:
        super().__init__(f"{variable}: {message}")
        self.variable = variable


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
        data = _load_json(DEVICE_PROFILE, text, dict)
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
    checkpoint_interval_steps: int = 50
    rebalance_interval_steps: int = 0
    compression: str = "none"
    powersgd_rank: int = 16
    restart_generation: int = 0
    sim_delay_per_sample_s: float = DEFAULT_SIM_DELAY_PER_SAMPLE_S
    rendezvous_timeout_s: float = DEFAULT_RENDEZVOUS_TIMEOUT_S
    run_dir: str = ""
    profile_steps: tuple[int, int] | None = None
    predicted_samples_per_s: float = 0.0
    sharding: str = "none"
    micro_batch_size: int = 0
    activation_checkpointing: bool = False
    memory_cap_bytes: int = 0
    shard_ppm: tuple[int, ...] = ()
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
    data = _load_json(TOPOLOGY, text, list)
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
    if contract.sim_delay_per_sample_s != DEFAULT_SIM_DELAY_PER_SAMPLE_S:
        env[SIM_DELAY_PER_SAMPLE_S] = repr(contract.sim_delay_per_sample_s)
    if contract.rendezvous_timeout_s != DEFAULT_RENDEZVOUS_TIMEOUT_S:
        env[RENDEZVOUS_TIMEOUT_S] = repr(contract.rendezvous_timeout_s)
    if contract.run_dir:
        env[RUN_DIR] = contract.run_dir
    if contract.profile_steps is not None:
        env[PROFILE_STEPS] = "{}-{}".format(*contract.profile_steps)
    if contract.predicted_samples_per_s > 0:
        env[PREDICTED_SAMPLES_PER_S] = repr(contract.predicted_samples_per_s)
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
    first = _int(pod, FIRST_RANK, minimum=0)
    local_world = _int(pod, LOCAL_WORLD_SIZE, minimum=1)
    if not 0 <= local_rank < local_world:
        raise ContractError(LOCAL_RANK, f"{local_rank} outside LOCAL_WORLD_SIZE={local_world}")
    topology = topology_from_json(_get(pod, TOPOLOGY))
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
        _get(environ, name)
    world = _int(environ, WORLD_SIZE, minimum=1)
    rank = _int(environ, RANK, minimum=0)
    if rank >= world:
        raise ContractError(RANK, f"{rank} is outside WORLD_SIZE={world}; use 0..{world - 1}")
    local_world = _int(environ, LOCAL_WORLD_SIZE, minimum=1)
    local_rank = _int(environ, LOCAL_RANK, minimum=0)
    if local_rank >= local_world:
        raise ContractError(LOCAL_RANK, f"{local_rank} is outside LOCAL_WORLD_SIZE={local_world}")
    port = _int(environ, MASTER_PORT, minimum=1, maximum=65535)
    topology = topology_from_json(_get(environ, TOPOLOGY))
    _check_topology(topology, world)
    contract = Contract(
        rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
        master_addr=_get(environ, MASTER_ADDR), master_port=port, job_name=_get(environ, JOB_NAME),
        group=_int(environ, GROUP, minimum=0), group_rank=_int(environ, GROUP_RANK, minimum=0),
        group_size=_int(environ, GROUP_SIZE, minimum=1),
        local_batch_size=_int(environ, LOCAL_BATCH_SIZE, minimum=1),
        global_batch_size=_int(environ, GLOBAL_BATCH_SIZE, minimum=1),
        precision=_choice(environ, PRECISION, PRECISIONS),
        hierarchy=_choice(environ, HIERARCHY, HIERARCHIES),
        device=DeviceProfile.from_json(_get(environ, DEVICE_PROFILE)), topology=topology,
        metrics_port=_int(environ, METRICS_PORT, minimum=0, maximum=65535, default=0),
        checkpoint_dir=environ.get(CHECKPOINT_DIR, ""),
        checkpoint_interval_steps=_int(environ, CHECKPOINT_INTERVAL_STEPS, minimum=1, default=50),
        rebalance_interval_steps=rebalance_interval_steps(environ),
        compression=compression_mode(environ),
        powersgd_rank=powersgd_rank(environ),
        sim_delay_per_sample_s=sim_delay_per_sample_s(environ),
        rendezvous_timeout_s=rendezvous_timeout_s(environ),
        run_dir=run_dir(environ),
        profile_steps=profile_steps(environ),
        predicted_samples_per_s=predicted_samples_per_s(environ),
        restart_generation=_int(environ, RESTART_GENERATION, minimum=0, default=0),
        **memory_settings(environ),
    )
    _check_rank_against_topology(contract)
    if contract.shard_ppm and len(contract.shard_ppm) != world:
        raise ContractError(SHARD_PPM, f"has {len(contract.shard_ppm)} shares for WORLD_SIZE={world}; "
                            "give one per rank, in rank order")
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


def memory_settings(environ: Mapping[str, str]) -> dict[str, Any]:
    """The memory model's variables as :class:`Contract` fields.

    Returns:
        ``{"sharding": "none|group|full", "micro_batch_size": int >= 0,
        "activation_checkpointing": bool, "memory_cap_bytes": int >= 0,
        "shard_ppm": tuple of int}``.

    Raises:
        ContractError: naming the variable (unknown sharding, not an integer, a flag not 0/1,
            shares that are not integers >= 0 summing to 1 000 000).
    """
    sharding = environ.get(SHARDING) or "none"
    if sharding not in SHARDINGS:
        raise ContractError(SHARDING, f"must be one of {', '.join(SHARDINGS)}; got {sharding!r}")
    flag = environ.get(ACTIVATION_CHECKPOINTING) or "0"
    if flag not in ("0", "1"):
        raise ContractError(ACTIVATION_CHECKPOINTING, f"must be 0 or 1, got {flag!r}")
    return {"sharding": sharding,
            "micro_batch_size": _int(environ, MICRO_BATCH_SIZE, minimum=0, default=0),
            "activation_checkpointing": flag == "1",
            "memory_cap_bytes": _int(environ, MEMORY_CAP_BYTES, minimum=0, default=0),
            "shard_ppm": shard_ppm(environ)}


def shard_ppm(environ: Mapping[str, str]) -> tuple[int, ...]:
    """``HTJ_SHARD_PPM`` as a tuple (unset or empty: ``()``, even shares).

    Raises:
        ContractError: an entry is not an integer >= 0, or they do not sum to 1 000 000.
    """
    text = (environ.get(SHARD_PPM) or "").strip()
    if not text:
        return ()
    parts = text.split(",")
    if not all(p.strip().isdigit() for p in parts):
        raise ContractError(SHARD_PPM, f"must be integers >= 0 separated by commas, got {text!r}")
    shares = tuple(int(p) for p in parts)
    if sum(shares) != 10**6:
        raise ContractError(SHARD_PPM, f"must sum to 1000000 (parts per million), got {sum(shares)}")
    return shares


def rebalance_interval_steps(environ: Mapping[str, str]) -> int:
    """``HTJ_REBALANCE_INTERVAL_STEPS`` (unset or empty: 0 = static split).

    Raises:
        ContractError: not an integer >= 0.
    """
    return _int(environ, REBALANCE_INTERVAL_STEPS, minimum=0, default=0)


def compression_mode(environ: Mapping[str, str]) -> str:
    """``HTJ_COMPRESSION`` in lower case (the spec's spelling ``Int8`` is accepted; unset: none).

    Raises:
        ContractError: not one of :data:`COMPRESSIONS`.
    """
    mode = (environ.get(COMPRESSION) or "none").lower()
    if mode not in COMPRESSIONS:
        raise ContractError(COMPRESSION, f"must be one of {', '.join(COMPRESSIONS)}; "
                            f"got {environ.get(COMPRESSION)!r}")
    return mode


def powersgd_rank(environ: Mapping[str, str]) -> int:
    """``HTJ_POWERSGD_RANK`` (default 16: rank 4 trained the speed benchmark's MLP to a loss
    4.5-6.7 % above uncompressed, rank 16 within 1.4 %; docs/speed.md).

    Raises:
        ContractError: not an integer in 1..64.
    """
    return _int(environ, POWERSGD_RANK, minimum=1, maximum=64, default=16)


def sim_delay_per_sample_s(environ: Mapping[str, str]) -> float:
    """``HTJ_SIM_DELAY_PER_SAMPLE_S`` in seconds (default :data:`DEFAULT_SIM_DELAY_PER_SAMPLE_S`).

    Raises:
        ContractError: set but not a number >= 0.
    """
    return seconds_from_env(environ, SIM_DELAY_PER_SAMPLE_S,
                            default_s=DEFAULT_SIM_DELAY_PER_SAMPLE_S, allow_zero=True)


def rendezvous_timeout_s(environ: Mapping[str, str]) -> float:
    """``HTJ_RENDEZVOUS_TIMEOUT_S`` in seconds (default :data:`DEFAULT_RENDEZVOUS_TIMEOUT_S`).

    Raises:
        ContractError: set but not a number > 0.
    """
    return seconds_from_env(environ, RENDEZVOUS_TIMEOUT_S,
                            default_s=DEFAULT_RENDEZVOUS_TIMEOUT_S, allow_zero=False)


def predicted_samples_per_s(environ: Mapping[str, str]) -> float:
    """``HTJ_PREDICTED_SAMPLES_PER_S`` (unset or empty: 0 = no prediction).

    Raises:
        ContractError: not a finite number >= 0.
    """
    raw = environ.get(PREDICTED_SAMPLES_PER_S, "")
    if raw == "":
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ContractError(PREDICTED_SAMPLES_PER_S,
                            f"must be a number of samples/s, got {raw!r}") from None
    if not 0 <= value < float("inf"):
        raise ContractError(PREDICTED_SAMPLES_PER_S, f"must be a finite number >= 0, got {value}")
    return value


def run_dir(environ: Mapping[str, str]) -> str:
    """``HTJ_RUN_DIR``, ``""`` when unset (a pod)."""
    return environ.get(RUN_DIR, "")


def profile_steps(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """``HTJ_PROFILE_STEPS`` as ``(first, last)``, inclusive and 1-based; None when unset or empty.

    Raises:
        ContractError: not ``N`` or ``N-M`` with ``1 <= N <= M`` and at most
            :data:`MAX_PROFILE_STEPS` steps.
    """
    return parse_step_range(environ.get(PROFILE_STEPS, ""), PROFILE_STEPS)


def parse_step_range(text: str, name: str) -> tuple[int, int] | None:
    """``"20-25"`` -> ``(20, 25)``, ``"20"`` -> ``(20, 20)``, ``""`` -> None (shared by the CLI
    flag, the job annotation and the environment variable).

    Raises:
        ContractError: malformed, ``first < 1``, ``last < first`` or more than
            :data:`MAX_PROFILE_STEPS` steps (``name`` is reported as the variable).
    """
    text = text.strip()
    if not text:
        return None
    first_s, sep, last_s = text.partition("-")
    try:
        first, last = int(first_s), int(last_s) if sep else int(first_s)
    except ValueError:
        raise ContractError(name, f"must be steps like \"20-25\" or \"20\", got {text!r}") from None
    if first < 1 or last < first:
        raise ContractError(name, f"must be FIRST-LAST with 1 <= FIRST <= LAST, got {text!r}")
    if last - first + 1 > MAX_PROFILE_STEPS:
        raise ContractError(name, f"spans {last - first + 1} steps; at most {MAX_PROFILE_STEPS} "
                            "per trace")
    return first, last


def seconds_from_env(environ: Mapping[str, str], name: str, *, default_s: float,
                     allow_zero: bool) -> float:
    """A duration knob in seconds (``name`` unset or empty: ``default_s``).

    Raises:
        ContractError: set but not a number, or negative (or zero when ``allow_zero`` is False).
    """
    raw = environ.get(name, "")
    if raw == "":
        return default_s
    try:
        value = float(raw)
    except ValueError:
        raise ContractError(name, f"must be a number of seconds, got {raw!r}") from None
    if value < 0 or (value == 0 and not allow_zero) or value != value:
        raise ContractError(name, f"must be {'>= 0' if allow_zero else '> 0'}, got {value}")
    return value


def _get(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name)
    if value is None or value == "":
        raise ContractError(name, "is required but not set (the operator or `heterotrain run` "
                            "sets it; see hetero_worker.contract)")
    return value


def _int(environ: Mapping[str, str], name: str, *, minimum: int, maximum: int | None = None,
         default: int | None = None) -> int:
    raw = environ.get(name, "")
    if raw == "" and default is not None:
        return default
    raw = _get(environ, name)
    try:
        value = int(raw)
    except ValueError:
        raise ContractError(name, f"must be an integer, got {raw!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ContractError(name, f"must be {bound}, got {value}")
    return value


def _choice(environ: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    value = _get(environ, name)
    if value not in choices:
        raise ContractError(name, f"must be one of {', '.join(choices)}; got {value!r}")
    return value


def _load_json(name: str, text: str, kind: type) -> object:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ContractError(name, f"is not valid JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(data, kind):
        raise ContractError(name, f"must be a JSON {kind.__name__}")
    return data
