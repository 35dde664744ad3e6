#!/usr/bin/env python
"""Memory benchmark (issue 12): the largest model each sharding mode plans, and the step time of
Group vs None on a model that fits.

Run from the repository root::

    .venv/bin/python bench/bench_memory.py                 # both parts, about 2 minutes on 2 cores
    .venv/bin/python bench/bench_memory.py --only largest  # part 1 only (a second)

1. ``largest`` (planned, the planner's memory model, no run): binary search for the largest
   ``spec.training.model.parameters`` (AdamW, 16 B per parameter) for which a mode fits every rank,
   on the issue's cluster (1x A100-80GB next to 4x T4-16GB on one node) and on the example's
   scaled-down node list, with no activations and with the example's 900 kB per sample at a
   micro-batch of one.  ``Full`` is evaluated though the worker does not run it yet.
2. ``steptime`` (measured): ``heterotrain run`` of ``examples/lm-large.yaml`` on a node list whose
   T4 memory label is raised to 64 MiB (so that None fits too), forced ``sharding: None`` and
   ``Group`` in turn, ``--repeats`` times each, 20 steps; the figure is rank 0's mean step time
   (``step_seconds / steps`` of ``rank-0.json``), median and range over the repeats.

Writes ``bench/results/memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT / "worker"))

from hetero_operator import memory  # noqa: E402

JOB = ROOT / "examples" / "lm-large.yaml"
NODES = ROOT / "examples" / "clusters" / "scaled-memory.yaml"
GIB = 2**30


def _slots(cluster: list[tuple[int, str, int, int]], batches: list[int]) -> list[memory.RankSlot]:
    """``cluster``: (group, gpu_type, memory_mib, ranks) rows on one node each group."""
    slots, rank = [], 0
    for group, gpu_type, mib, count in cluster:
        for _ in range(count):
            slots.append(memory.RankSlot(rank=rank, group=group, node=f"node-{group}",
                                         gpu_type=gpu_type, memory_mib=mib, precision="fp32",
                                         local_batch=batches[rank]))
            rank += 1
    return slots


def largest(slots: list[memory.RankSlot], mode: str, *, act: int, reserve_mib: int) -> int:
    """Largest parameter count for which ``mode`` fits (binary search, exact to one parameter)."""
    def fits(n: int) -> bool:
        m = memory.ModelMemory(parameters=n, optimizer="AdamW", activation_bytes_per_sample=act)
        return memory.evaluate_mode(slots, m, mode, reserve_mib=reserve_mib, cross_gbps=10.0)[0].fits
    lo, hi = 0, 10**13
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def part_largest() -> dict:
    setups = {
        "issue: 1x A100-80GB + 4x T4-16GB (reserve 1024 MiB)": (
            [(0, "NVIDIA-A100-SXM4-80GB", 81920, 1), (1, "Tesla-T4", 15360, 4)], 1024),
        "example: scaled-memory.yaml, 1x A100 40 MiB + 2x T4 6 MiB (reserve 0)": (
            [(0, "NVIDIA-A100-SXM4-40GB", 40, 1), (1, "Tesla-T4", 6, 2)], 0),
    }
    out = {}
    for name, (cluster, reserve) in setups.items():
        world = sum(c[3] for c in cluster)
        for act_name, act in (("no activations", 0), ("900 kB per sample, micro-batch 1", 900_000)):
            slots = _slots(cluster, [1] * world)
            row = {mode: largest(slots, mode, act=act, reserve_mib=reserve) for mode in memory.MODES}
            row["group_over_none"] = round(row["Group"] / row["None"], 2) if row["None"] else None
            row["full_over_none"] = round(row["Full"] / row["None"], 2) if row["None"] else None
            out[f"{name}; {act_name}"] = row
            print(f"{name}; {act_name}: " + ", ".join(
                f"{m} {row[m]:,} parameters" for m in memory.MODES)
                + f" (Group {row['group_over_none']}x, Full {row['full_over_none']}x None)")
    return out


def _run(job: Path, nodes: Path, workdir: Path) -> float:
    done = subprocess.run([sys.executable, "-m", "hetero_operator.cli", "run", str(job), "--nodes",
                           str(nodes), "--workdir", str(workdir), "--max-steps", "20"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "XDG_CACHE_HOME": str(workdir / "xdg")})
    if done.returncode != 0:
        raise SystemExit(f"run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    stats = json.loads((workdir / "rank-0.json").read_text())
    return stats["step_seconds"] / stats["steps"]


def part_steptime(repeats: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    nodes = yaml.safe_load(NODES.read_text())
    for node in nodes["items"]:
        if node["metadata"]["name"] == "node-t4":
            node["metadata"]["labels"]["nvidia.com/gpu.memory"] = "64"
    roomy = tmp / "nodes.yaml"
    roomy.write_text(yaml.safe_dump(nodes))
    jobs = {}
    for mode in ("None", "Group"):
        doc = yaml.safe_load(JOB.read_text())
        doc["spec"]["training"]["sharding"] = mode
        jobs[mode] = tmp / f"job-{mode}.yaml"
        jobs[mode].write_text(yaml.safe_dump(doc))
    runs: dict[str, list[float]] = {"None": [], "Group": []}
    for r in range(repeats):
        for mode in ("None", "Group"):  # alternating, so load drift hits both
            runs[mode].append(_run(jobs[mode], roomy, tmp / f"{mode}-{r}"))
            print(f"repeat {r + 1}: {mode} {runs[mode][-1] * 1000:.1f} ms per step (rank 0)", flush=True)
    out = {mode: {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v), "runs_s": v}
           for mode, v in runs.items()}
    out["group_over_none"] = out["Group"]["median_s"] / out["None"]["median_s"]
    print(f"step time Group / None: {out['group_over_none']:.2f} (medians of {repeats})")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("largest", "steptime"), default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    result: dict = {"date_unix_s": time.time(), "load_1min": os.getloadavg()[0],
                    "cpus": os.cpu_count()}
    if args.only in (None, "largest"):
        result["largest_planned"] = part_largest()
    if args.only in (None, "steptime"):
        result["steptime_measured"] = part_steptime(args.repeats)
    out = ROOT / "bench" / "results" / "memory.json"
    out.write_text(json.dumps(result, indent=2, sort_keys=True))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
