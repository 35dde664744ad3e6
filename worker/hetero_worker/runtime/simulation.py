"""Simulated devices on a CPU, and local contract environments for tests and benchmarks.

A rank whose :class:`~heterotrain_common.contract.DeviceProfile` says ``simulated`` runs its real
forward/backward on the CPU and then waits ``local_batch * delay_per_sample_s / relative_speed``
seconds more, so a slower card takes proportionally longer per sample and batch balancing is
visible and deterministic. A real GPU (``simulated`` false) gets no delay.

The base delay per sample comes from ``HTJ_SIM_DELAY_PER_SAMPLE_S`` (seconds, default
:data:`heterotrain_common.defaults.SIM_DELAY_PER_SAMPLE_S`) or a trainer argument.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence

from heterotrain_common import contract as c
from heterotrain_common import envnames
from heterotrain_common.contract import DeviceProfile, RankEntry


def delay_per_sample_s(environ: Mapping[str, str] | None = None) -> float:
    """Base delay from ``HTJ_SIM_DELAY_PER_SAMPLE_S``, or the default.

    Raises:
        ContractError: the variable is set but is not a number >= 0.
    """
    return c.read_var(os.environ if environ is None else environ,
                      envnames.SIM_DELAY_PER_SAMPLE_S)


def simulated_delay_s(profile: DeviceProfile, local_batch: int, per_sample_s: float) -> float:
    """Extra seconds a simulated device adds for one step of ``local_batch`` samples (0 if real)."""
    if not profile.simulated:
        return 0.0
    return local_batch * per_sample_s / profile.relative_speed


def simulate_compute(profile: DeviceProfile, local_batch: int, per_sample_s: float) -> float:
    """Sleep for :func:`simulated_delay_s`; returns the seconds slept."""
    delay_s = simulated_delay_s(profile, local_batch, per_sample_s)
    if delay_s > 0:
        time.sleep(delay_s)
    return delay_s


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (bind to port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local_rank_envs(*, entries: Sequence[RankEntry], profiles: Sequence[DeviceProfile],
                    precision: str = "fp32", hierarchy: str = "group", master_port: int,
                    master_addr: str = "127.0.0.1", job_name: str = "local",
                    checkpoint_dir: str = "", metrics_port: int = 0) -> list[dict[str, str]]:
    """The rank form of the contract for every rank of a job on this machine.

    Every rank gets its own ``LOCAL_RANK`` (one process per rank on one host). Used by tests and
    benchmarks that run without the planner; ``heterotrain run`` renders through the planner.

    Args:
        entries: the topology, ordered by rank.
        profiles: one device profile per rank.
        precision: one of ``bf16``, ``fp16``, ``fp32`` for every rank.
        hierarchy: one of ``contract.HIERARCHIES``.
        master_port: rank 0's TCPStore port (pick with :func:`free_port`).

    Returns:
        One str -> str dict per rank (to merge over ``os.environ``).
    """
    world = len(entries)
    envs = []
    for e, profile in zip(entries, profiles, strict=True):
        members = [x.rank for x in entries if x.group == e.group]
        envs.append({
            envnames.RANK: str(e.rank), envnames.WORLD_SIZE: str(world), envnames.LOCAL_RANK: str(e.rank),
            envnames.LOCAL_WORLD_SIZE: str(world), envnames.MASTER_ADDR: master_addr,
            envnames.MASTER_PORT: str(master_port), envnames.JOB_NAME: job_name, envnames.GROUP: str(e.group),
            envnames.GROUP_RANK: str(members.index(e.rank)), envnames.GROUP_SIZE: str(len(members)),
            envnames.PRECISION: precision, envnames.HIERARCHY: hierarchy, envnames.DEVICE_PROFILE: profile.to_json(),
            envnames.TOPOLOGY: c.topology_to_json(list(entries)), envnames.METRICS_PORT: str(metrics_port),
            envnames.CHECKPOINT_DIR: checkpoint_dir,
        })
    return envs


def simulated_cluster(*, products: Sequence[tuple[str, str, float]], nodes: Sequence[str],
                      local_batches: Sequence[int], groups: Sequence[int] | None = None,
                      ) -> tuple[list[RankEntry], list[DeviceProfile]]:
    """Build a topology and simulated profiles from per-rank tuples.

    Args:
        products: per rank ``(gpu_product, compute_capability, relative_speed)``.
        nodes: per rank node name.
        local_batches: per rank samples per step.
        groups: per rank group index; default: a new group whenever node or product changes.

    Returns:
        ``(entries, profiles)`` for :func:`local_rank_envs`.
    """
    if groups is None:
        groups, last = [], None
        for node, (product, _, _) in zip(nodes, products, strict=True):
            key = (node, product)
            groups.append(groups[-1] + (key != last) if groups else 0)
            last = key
    entries = [RankEntry(rank=r, group=groups[r], node=nodes[r], gpu_product=p[0],
                         compute_capability=p[1], local_batch=local_batches[r])
               for r, p in enumerate(products)]
    profiles = [DeviceProfile(product=p[0], compute_capability=p[1], relative_speed=p[2],
                              simulated=True) for p in products]
    return entries, profiles
