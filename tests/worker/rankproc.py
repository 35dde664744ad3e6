"""Start real rank processes with contract envs (helpers for the worker's multi-process tests).

Imported by name (``from rankproc import ...``; pytest puts this directory on ``sys.path``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from hetero_worker.runtime.simulation import free_port, local_rank_envs, simulated_cluster

HERE = Path(__file__).parent
RANK_CHECKS = HERE / "rank_checks.py"


@dataclass
class RankRun:
    """Outcome of one rank process."""

    rank: int
    returncode: int
    stdout: str
    stderr: str


def base_env(**extra: str) -> dict[str, str]:
    """os.environ with one thread per rank (2 shared cores) plus ``extra``."""
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                "HTJ_SIM_DELAY_PER_SAMPLE_S": "0"})
    env.update(extra)
    return env


def start_rank(cmd: list[str], rank_env: dict[str, str], **extra: str) -> subprocess.Popen:
    """Start one rank process; stdout/stderr captured as text."""
    env = base_env(**extra)
    env.update(rank_env)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=HERE.parent.parent)


def wait_all(procs: list[subprocess.Popen], timeout_s: float) -> list[RankRun]:
    """Wait for every process; kill the rest when the deadline passes (no hang)."""
    deadline = time.monotonic() + timeout_s
    runs = []
    for rank, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            out, err = proc.communicate()
            err += f"\n[test] killed after {timeout_s} s"
        runs.append(RankRun(rank, proc.returncode, out, err))
    return runs


def run_ranks(cmd: list[str], envs: list[dict[str, str]], *, timeout_s: float = 120,
              **extra: str) -> list[RankRun]:
    """Start one process per env, wait for all; assert nothing about the result."""
    procs = [start_rank(cmd, env, **extra) for env in envs]
    return wait_all(procs, timeout_s)


def assert_ok(runs: list[RankRun]) -> None:
    """Every rank exited 0 (shows the failing rank's stderr)."""
    for run in runs:
        assert run.returncode == 0, f"rank {run.rank} exit {run.returncode}:\n{run.stderr[-4000:]}"


def mixed_cluster_envs(local_batches: list[int], *, nodes: list[str] | None = None,
                       precision: str = "fp32", hierarchy: str = "group",
                       checkpoint_dir: str = "") -> list[dict[str, str]]:
    """Contract envs for a simulated A100/V100/T4 mix with the given batches."""
    catalogue = [("NVIDIA-A100-SXM4-40GB", "8.0", 1.0), ("Tesla-V100-SXM2-16GB", "7.0", 0.5),
                 ("Tesla-T4", "7.5", 0.25), ("Tesla-T4", "7.5", 0.25)]
    world = len(local_batches)
    products = [catalogue[min(r, 3)] for r in range(world)]
    nodes = nodes or [f"node-{'ab'[r * 2 // world]}" for r in range(world)]
    entries, profiles = simulated_cluster(products=products, nodes=nodes,
                                          local_batches=local_batches)
    return local_rank_envs(entries=entries, profiles=profiles, precision=precision,
                           hierarchy=hierarchy, master_port=free_port(),
                           checkpoint_dir=checkpoint_dir)


def read_rank_json(directory: Path, world: int) -> list[dict]:
    """``rank{r}.json`` written by rank_checks.py, one per rank."""
    return [json.loads((directory / f"rank{r}.json").read_text()) for r in range(world)]
