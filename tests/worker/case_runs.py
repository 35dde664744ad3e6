"""What the worker's tests of shared/cases share: the case's fixture (its copy in
tests/fixtures/cases/), its ranks' contract envs, and the end of a case's rank script.

Imported by name (``import case_runs``; pytest puts this directory on ``sys.path``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch.distributed as dist
import yaml

from hetero_worker.runtime.simulation import free_port, local_rank_envs, simulated_cluster
from heterotrain_common import envnames

CASES = Path(__file__).resolve().parents[1] / "fixtures" / "cases"

PRODUCTS = {"a100-40gb": ("NVIDIA-A100-SXM4-40GB", "8.0", 1.0), "t4": ("Tesla-T4", "7.5", 0.25)}
"""A case's ``gpu_class`` -> the simulated device (product, compute capability, relative speed)."""


def load(stem: str) -> dict[str, Any]:
    """The case ``<stem>.yaml`` (e.g. ``60-grad-clip-local-norm-under-sharding``)."""
    return yaml.safe_load((CASES / f"{stem}.yaml").read_text())


def case_envs(case: dict[str, Any], *, sharding: str = "none",
              precisions: list[str] | None = None) -> list[dict[str, str]]:
    """The contract envs of the case's ranks (``gpu_class``, ``node``, ``local_batch``; the Full
    shares from ``shard_share_ppm`` where given) under its hierarchy, with ``HTJ_SHARDING`` and
    each rank's precision (default fp32)."""
    ranks = case["ranks"]
    entries, profiles = simulated_cluster(products=[PRODUCTS[r["gpu_class"]] for r in ranks],
                                          nodes=[r["node"] for r in ranks],
                                          local_batches=[r["local_batch"] for r in ranks])
    envs = local_rank_envs(entries=entries, profiles=profiles, hierarchy=case["hierarchy"],
                           master_port=free_port())
    for env, precision in zip(envs, precisions or ["fp32"] * len(ranks), strict=True):
        env.update({envnames.SHARDING: sharding, envnames.PRECISION: precision})
        if sharding == "full" and all("shard_share_ppm" in r for r in ranks):
            env[envnames.SHARD_PPM] = ",".join(str(r["shard_share_ppm"]) for r in ranks)
    return envs


def finish(rank: int, out: Path, facts: dict[str, Any]) -> None:
    """End a rank script: ``out/rank<rank>.json``, a barrier, exit 0 at once (no Gloo teardown)."""
    (out / f"rank{rank}.json").write_text(json.dumps(facts))
    dist.barrier()
    os._exit(0)
