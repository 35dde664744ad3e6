"""Benchmark the planner: a 1,024-rank job over synthetic 1k / 10k / 50k-node inventories.

Six GPU types (H100, A100, A100 under MIG mixed, L40S, T4, V100), random free counts (other
tenants' pods), seeded.  Reports ``plan_job`` time (median of repeats) and peak memory
(tracemalloc), ``build_inventory`` time and peak memory (a second, traced run), and plan quality against an exhaustive greedy that sorts
every free device unit by (speed desc, free devices of its type on its node desc, node name):
our plan must use the same or fewer nodes and reach the same total expected throughput.

Targets (issue 3): <= 50 ms and <= 200 MB at 10,000 nodes.  Run from the repository root:

    .venv/bin/python bench/bench_plan.py            # writes bench/results/plan.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import resource
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "worker")]

from hetero_operator.inventory import build_inventory  # noqa: E402
from hetero_operator.model import Inventory, Plan  # noqa: E402
from hetero_operator.planning import eligible_pools, plan_job  # noqa: E402
from hetero_operator.spec import parse_job  # noqa: E402

A100 = "NVIDIA-A100-SXM4-80GB"
TYPES: list[dict[str, Any]] = [
    {"product": "NVIDIA-H100-80GB-HBM3", "cc": "9.0", "mem": 81559, "count": 8, "weight": 1},
    {"product": A100, "cc": "8.0", "mem": 81920, "count": 8, "weight": 2},
    {"product": A100, "cc": "8.0", "mem": 81920, "count": 2, "weight": 2,
     "mig": {"3g.40gb": (2, 40192), "2g.20gb": (2, 19968), "1g.10gb": (4, 9728)}},
    {"product": "NVIDIA-L40S", "cc": "8.9", "mem": 46068, "count": 4, "weight": 2},
    {"product": "Tesla-T4", "cc": "7.5", "mem": 15360, "count": 4, "weight": 3},
    {"product": "Tesla-V100-SXM2-16GB", "cc": "7.0", "mem": 16384, "count": 8, "weight": 2},
]
JOB = {
    "apiVersion": "heterotrain.io/v1alpha1", "kind": "HeteroTrainingJob", "metadata": {"name": "bench"},
    "spec": {"worker": {"command": ["python", "train.py"]},
             "images": [{"image": "reg/train:cu124", "cudaVersion": "12.4",
                         "computeCapabilities": ["7.0", "7.5", "8.0", "8.6", "8.9", "9.0"]}],
             "gpus": {"ranks": 1024, "minRanks": 512},
             "training": {"globalBatchSize": 65536, "memoryPerSampleMiB": 64}},
}


def synthetic_cluster(n_nodes: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Nodes (dicts as the API returns them) and pods using part of their GPUs."""
    rng = random.Random(seed)
    weights = [t["weight"] for t in TYPES]
    nodes, pods = [], []
    for i in range(n_nodes):
        t = rng.choices(TYPES, weights)[0]
        name = f"node-{i:05d}"
        labels = {"nvidia.com/gpu.product": t["product"], "nvidia.com/gpu.count": str(t["count"]),
                  "nvidia.com/gpu.memory": str(t["mem"]), "nvidia.com/gpu.compute.major": t["cc"][0],
                  "nvidia.com/gpu.compute.minor": t["cc"][2], "nvidia.com/cuda.driver-version.full": "550.127.05",
                  "nvidia.com/cuda.runtime-version.full": "12.4"}
        alloc = {"nvidia.com/gpu": "0" if "mig" in t else str(t["count"])}
        for profile, (count, mem) in t.get("mig", {}).items():
            labels[f"nvidia.com/mig-{profile}.count"] = str(count)
            labels[f"nvidia.com/mig-{profile}.memory"] = str(mem)
            alloc[f"nvidia.com/mig-{profile}"] = str(count)
        nodes.append({"metadata": {"name": name, "labels": labels},
                      "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}})
        resource, total = next((r, int(v)) for r, v in alloc.items() if int(v) > 0)
        busy = rng.randint(0, total)
        if busy:
            pods.append({"spec": {"nodeName": name, "containers": [
                {"name": "c", "resources": {"limits": {resource: str(busy)}}}]}, "status": {"phase": "Running"}})
    return nodes, pods


def greedy_baseline(job: Any, inventory: Inventory) -> tuple[int, float]:
    """Exhaustive greedy: every free unit sorted by (speed desc, node's free units of the type desc,
    node name); returns (nodes used, total speed) of the first ``ranks`` units."""
    pools, _ = eligible_pools(job, inventory)
    units = []
    for p in pools:
        for _ in range(p.free):
            units.append((-p.speed, -p.free, p.node, p.device.resource_name))
    units.sort()
    chosen = units[:job.gpus.ranks]
    return len({u[2] for u in chosen}), -sum(u[0] for u in chosen)


def measure(n_nodes: int, repeats: int) -> dict[str, Any]:
    job = parse_job(JOB)
    nodes, pods = synthetic_cluster(n_nodes)
    t0 = time.perf_counter()
    inventory = build_inventory(nodes, pods)
    inventory_s = time.perf_counter() - t0
    tracemalloc.start()
    build_inventory(nodes, pods)
    _, inventory_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        plan = plan_job(job, inventory)
        times.append(time.perf_counter() - t0)
    assert isinstance(plan, Plan)
    tracemalloc.start()
    plan_job(job, inventory)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    base_nodes, base_speed = greedy_baseline(job, inventory)
    ours_speed = sum(r.relative_speed for r in plan.ranks)
    return {
        "nodes": n_nodes, "devices_free": sum(d.free for d in inventory.devices()),
        "ranks": plan.world_size, "plan_ms_median": round(1000 * statistics.median(times), 2),
        "plan_ms_min": round(1000 * min(times), 2), "plan_peak_mib": round(peak / 2**20, 2),
        "build_inventory_ms": round(1000 * inventory_s, 1),
        "build_inventory_peak_mib": round(inventory_peak / 2**20, 1),
        "nodes_used": len(plan.nodes), "greedy_nodes_used": base_nodes,
        "total_speed": round(ours_speed, 6), "greedy_total_speed": round(base_speed, 6),
        "quality_ok": len(plan.nodes) <= base_nodes and abs(ours_speed - base_speed) < 1e-6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "plan.json")
    args = parser.parse_args()
    rows = [measure(n, args.repeats) for n in args.sizes]
    for r in rows:
        print(f"{r['nodes']:>6} nodes: plan {r['plan_ms_median']:7.2f} ms (min {r['plan_ms_min']:.2f}), "
              f"peak {r['plan_peak_mib']:6.2f} MiB, inventory {r['build_inventory_ms']:8.1f} ms "
              f"(peak {r['build_inventory_peak_mib']:.1f} MiB), "
              f"nodes {r['nodes_used']} vs greedy {r['greedy_nodes_used']}, speed {r['total_speed']:.3f} "
              f"vs {r['greedy_total_speed']:.3f}, quality ok: {r['quality_ok']}")
    ten_k = next((r for r in rows if r["nodes"] == 10000), None)
    result = {"benchmark": "plan_job, 1024 ranks, 6 GPU types with MIG",
              "targets": {"plan_ms": 50, "peak_mib": 200},
              "meets_targets_at_10k": bool(ten_k and ten_k["plan_ms_median"] <= 50
                                           and ten_k["plan_peak_mib"] <= 200 and ten_k["quality_ok"]),
              "process_max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
              "python": platform.python_version(), "machine": platform.machine(), "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"process max RSS (all sizes, node dicts included): {result['process_max_rss_mib']} MiB")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
