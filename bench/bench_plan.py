"""Benchmark the planner as the operator runs it: start-to-plan at 1k / 10k / 50k nodes, 1,024 ranks.

Six GPU types (H100, A100, A100 under MIG mixed, L40S, T4, V100), random free counts (other
tenants' pods), seeded.  Each measurement runs in a fresh interpreter that fills the node index as
the operator does (:func:`hetero_operator.cluster.nodeindex.trim_node`, one node at a time) and times whole
starts: inventory from the index plus ``plan_job`` (``Reconciler._plan``).  The first start parses
every node; before each later start 1 % of the nodes change (new index values, as kopf stores them
for a changed Node), so a start parses those and reuses the parses the other index values keep
(:mod:`hetero_operator.cluster.nodeindex`); starts with nothing changed reuse the last inventory.
Peak memory is the process's ``VmHWM``.  Plan quality: on random small instances the plan is
compared with an exhaustive search over every choice of free GPUs (max total relative speed, then
fewest nodes), which does not use the planner's pools or selection.

Targets (issue 11): start-to-plan <= 50 ms and peak RSS <= 200 MB at 10,000 nodes.  Each
measurement runs 3 times (``--repeats``).  Run from the repository root::

    .venv/bin/python bench/bench_plan.py            # writes bench/results/plan.json
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import benchlib

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "worker")]

from hetero_operator.api.spec import parse_job  # noqa: E402
from hetero_operator.api.types import Inventory, Plan  # noqa: E402
from hetero_operator.cluster.inventory import build_inventory  # noqa: E402
from hetero_operator.cluster.nodeindex import build_indexed_inventory  # noqa: E402
from hetero_operator.planning.plan import plan_job  # noqa: E402

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


def synthetic_nodes(n_nodes: int, seed: int = 0) -> Iterator[tuple[dict, dict | None]]:
    """Node dicts as the API returns them, each with the pod using part of its GPUs (or None)."""
    rng = random.Random(seed)
    weights = [t["weight"] for t in TYPES]
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
        node = {"metadata": {"name": name, "labels": labels, "resourceVersion": str(1000 + i)},
                "status": {"allocatable": alloc, "capacity": dict(alloc),
                           "conditions": [{"type": "Ready", "status": "True"}]}}
        resource, total = next((r, int(v)) for r, v in alloc.items() if int(v) > 0)
        busy = rng.randint(0, total)
        pod = None
        if busy:
            pod = {"metadata": {"name": f"other-{i}", "namespace": "tenant"},
                   "spec": {"nodeName": name, "containers": [
                       {"name": "c", "resources": {"limits": {resource: str(busy)}}}]},
                   "status": {"phase": "Running"}}
        yield node, pod


def synthetic_cluster(n_nodes: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Nodes (dicts as the API returns them) and pods using part of their GPUs."""
    nodes, pods = [], []
    for node, pod in synthetic_nodes(n_nodes, seed):
        nodes.append(node)
        if pod is not None:
            pods.append(pod)
    return nodes, pods


# --- one process per measurement: start-to-plan time and the process's peak memory -------------
def vm_kib(field_name: str) -> int:
    """``VmHWM`` (peak) or ``VmRSS`` of this process, KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise ValueError(f"no {field_name} in /proc/self/status")


def child(n_nodes: int, starts: int, seed: int) -> dict[str, Any]:
    """What the operator holds and does, in a fresh process: index ``n_nodes`` nodes, plan starts.

    The node index is filled as kopf fills it (one trimmed node at a time, the API's dict dropped),
    the GPU pods of other tenants likewise; then ``starts`` starts of the 1,024-rank job, each timed
    from the indexed nodes to the plan (``build_indexed_inventory`` + ``plan_job``, what
    ``Reconciler._plan`` runs).  The first start parses every node (cold: right after the operator
    started); the next ones reuse the parses kept on the index values (warm).
    """
    from hetero_operator.cluster.nodeindex import gpu_pod_entry, trim_node

    job = parse_job(JOB)
    index, pod_index = [], []
    for node, pod in synthetic_nodes(n_nodes, seed):
        index.append(trim_node(node))
        entry = gpu_pod_entry(pod) if pod else None
        if entry:
            pod_index.extend(entry.values())
    indexed_kib = vm_kib("VmRSS")
    times, plan_only, cpu, unchanged = [], [], [], []
    plan: Any = None
    rng = random.Random(seed + 1)
    for start in range(2 * starts + 1):
        if start > starts:  # the rest: nothing changed since the last start
            t0 = time.perf_counter()
            inventory = build_indexed_inventory(index, pod_index)
            plan_job(job, inventory)
            unchanged.append(time.perf_counter() - t0)
            continue
        for i in rng.sample(range(n_nodes), n_nodes // 100):  # 1 % of the nodes changed since the
            changed = copy.deepcopy(dict(index[i]))            # last start: kopf stores new values
            changed["metadata"]["labels"]["example.com/changed"] = str(start)
            index[i] = trim_node(changed)
        c0, t0 = time.process_time(), time.perf_counter()
        inventory = build_indexed_inventory(index, pod_index)
        t1 = time.perf_counter()
        plan = plan_job(job, inventory)
        t2, c2 = time.perf_counter(), time.process_time()
        times.append(t2 - t0)
        plan_only.append(t2 - t1)
        cpu.append(c2 - c0)
        del inventory
    assert isinstance(plan, Plan), plan
    t0 = time.perf_counter()
    full = build_inventory(index, pod_index)  # what every start cost before the index kept parses
    full_parse_s = time.perf_counter() - t0
    return {"nodes": n_nodes, "ranks": plan.world_size, "nodes_used": len(plan.nodes),
            "devices_free": sum(d.free for d in full.devices()),
            "cold_start_to_plan_ms": 1000 * times[0],
            "warm_start_to_plan_ms": 1000 * statistics.median(times[1:]),
            "unchanged_start_to_plan_ms": 1000 * statistics.median(unchanged),
            "warm_plan_job_ms": 1000 * statistics.median(plan_only[1:]),
            "warm_start_to_plan_cpu_ms": 1000 * statistics.median(cpu[1:]),
            "full_inventory_parse_ms": 1000 * full_parse_s,
            "rss_after_index_mib": indexed_kib / 1024, "peak_rss_mib": vm_kib("VmHWM") / 1024}


def run_child(n_nodes: int, starts: int, seed: int, deadline: benchlib.Deadline) -> dict[str, Any]:
    """:func:`child` in a fresh interpreter (its peak RSS is its own)."""
    try:
        out = subprocess.run([sys.executable, __file__, "--child", str(n_nodes), "--starts", str(starts),
                              "--seed", str(seed)], capture_output=True, text=True, check=True,
                             timeout=deadline.left_s(f"{n_nodes} nodes"))
    except subprocess.TimeoutExpired:
        raise benchlib.BenchTimeout(f"{n_nodes} nodes: out of time") from None
    return json.loads(out.stdout.strip().splitlines()[-1])


# --- plan quality against an exhaustive search (small instances) --------------------------------
SMALL_TYPES = [("NVIDIA-H100-80GB-HBM3", "9.0", 81559), ("NVIDIA-A100-SXM4-80GB", "8.0", 81920),
               ("NVIDIA-L40S", "8.9", 46068), ("Tesla-T4", "7.5", 15360), ("Tesla-V100-SXM2-16GB", "7.0", 16384)]


def small_instance(rng: random.Random) -> tuple[list[dict], int]:
    """4-6 nodes of 1-3 GPU types, 1-4 free GPUs each; a rank count up to the free total."""
    types = rng.sample(SMALL_TYPES, rng.randint(1, 3))
    nodes = []
    for i in range(rng.randint(4, 6)):
        product, cc, mem = rng.choice(types)
        count = rng.randint(1, 4)
        nodes.append({"metadata": {"name": f"n{i}", "labels": {
            "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count),
            "nvidia.com/gpu.memory": str(mem), "nvidia.com/gpu.compute.major": cc[0],
            "nvidia.com/gpu.compute.minor": cc[2], "nvidia.com/cuda.driver-version.full": "550.127.05"}},
            "status": {"allocatable": {"nvidia.com/gpu": str(count)},
                       "conditions": [{"type": "Ready", "status": "True"}]}})
    free = sum(int(n["status"]["allocatable"]["nvidia.com/gpu"]) for n in nodes)
    return nodes, rng.randint(1, free)


def exhaustive_best(inventory: Inventory, ranks: int) -> tuple[float, int]:
    """The best (total relative speed, fewest nodes) over *every* choice of ``ranks`` free GPUs.

    Independent of the planner: it enumerates every vector of per-(node, device) counts from the
    parsed inventory (what the nodes offer), not the planner's pools or its selection rule.
    """
    devices = [d for d in inventory.devices() if d.free > 0]
    best: tuple[float, int] | None = None
    for counts in itertools.product(*(range(d.free + 1) for d in devices)):
        if sum(counts) != ranks:
            continue
        speed = round(sum(c * d.relative_speed for c, d in zip(counts, devices, strict=True)), 9)
        used = len({d.node for c, d in zip(counts, devices, strict=True) if c})
        if best is None or (speed, -used) > (best[0], -best[1]):
            best = (speed, used)
    assert best is not None
    return best


def quality(instances: int, seed: int) -> dict[str, Any]:
    """Share of random small instances where the plan equals the exhaustive optimum."""
    rng = random.Random(seed)
    worse = []
    for k in range(instances):
        nodes, ranks = small_instance(rng)
        body = json.loads(json.dumps(JOB))
        body["spec"]["gpus"] = {"ranks": ranks, "minRanks": ranks, "selection": "All"}
        body["spec"]["training"]["globalBatchSize"] = 64 * ranks
        job = parse_job(body)
        inventory = build_inventory(nodes)
        plan = plan_job(job, inventory)
        assert isinstance(plan, Plan), plan
        ours = (round(sum(r.relative_speed for r in plan.ranks), 9), len(plan.nodes))
        best = exhaustive_best(inventory, ranks)
        if ours != best:
            worse.append({"instance": k, "ranks": ranks, "ours": ours, "exhaustive": best})
    return {"instances": instances, "seed": seed, "optimal_share": 1 - len(worse) / instances,
            "not_optimal": worse[:10]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--starts", type=int, default=7, help="timed starts per process")
    parser.add_argument("--repeats", type=int, default=benchlib.REPEATS)
    parser.add_argument("--quality-instances", type=int, default=150)
    parser.add_argument("--timeout-s", type=float, default=900.0)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "plan.json")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.starts, args.seed)))
        return 0
    deadline = benchlib.Deadline(args.timeout_s)
    run_meta = benchlib.meta()
    started = time.monotonic()
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in args.sizes}
    qualities = []
    for repeat in range(args.repeats):
        for n in args.sizes:
            r = run_child(n, args.starts, 0, deadline)
            runs[n].append(r)
            print(f"repeat {repeat}: {n:>6} nodes: start-to-plan {r['warm_start_to_plan_ms']:.1f} ms "
                  f"(first start {r['cold_start_to_plan_ms']:.1f} ms; plan_job alone "
                  f"{r['warm_plan_job_ms']:.1f} ms; full parse {r['full_inventory_parse_ms']:.1f} ms); "
                  f"peak RSS {r['peak_rss_mib']:.1f} MiB", flush=True)
        qualities.append(quality(args.quality_instances, seed=repeat))
        deadline.left_s("plan quality")
        print(f"repeat {repeat}: plan = exhaustive optimum on {qualities[-1]['optimal_share']:.1%} of "
              f"{args.quality_instances} small instances", flush=True)
    targets = []
    for n in args.sizes:
        size = f"{n:,} nodes, 1,024 ranks"
        key = n == 10000
        targets.append(benchlib.Target(
            f"start-to-plan, {size}, 1 % of the nodes changed since the last start", "<=" if key else "info",
            50.0, " ms", [r["warm_start_to_plan_ms"] for r in runs[n]],
            "inventory from the node index (only changed nodes parsed) + plan_job; median of 7 starts"))
        targets.append(benchlib.Target(
            f"... of which plan_job, {size}", "info", 50.0, " ms",
            [r["warm_plan_job_ms"] for r in runs[n]], "the rest is the inventory from the index"))
        targets.append(benchlib.Target(
            f"... the same start in CPU seconds of the process, {size}", "info", 50.0, " ms",
            [r["warm_start_to_plan_cpu_ms"] for r in runs[n]], "less sensitive to other load"))
        targets.append(benchlib.Target(
            f"start-to-plan, {size}, nothing changed since the last start", "info", 50.0, " ms",
            [r["unchanged_start_to_plan_ms"] for r in runs[n]], "the last inventory reused + plan_job"))
        targets.append(benchlib.Target(
            f"first start after the operator starts, {size} (every node parsed)", "info", 50.0, " ms",
            [r["cold_start_to_plan_ms"] for r in runs[n]], "once per operator start"))
        targets.append(benchlib.Target(
            f"peak RSS of the process, {size}", "<=" if key else "info", 200.0, " MiB",
            [r["peak_rss_mib"] for r in runs[n]],
            "VmHWM of a fresh interpreter holding the trimmed node index, GPU pods, plans"))
    targets.append(benchlib.Target(
        "plans equal to the exhaustive optimum (max total speed, then fewest nodes)", ">=", 1.0, "",
        [q["optimal_share"] for q in qualities],
        f"{args.quality_instances} random instances per run, 4-6 nodes, 1-3 GPU types"))
    run_meta["wall_s"] = round(time.monotonic() - started, 1)
    doc = benchlib.write_results(args.out, benchmark="plan", run_meta=run_meta, targets=targets,
                                 details={"job": JOB["spec"], "runs": {str(n): v for n, v in runs.items()},
                                          "quality": qualities})
    benchlib.print_targets(doc)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(benchlib.main_guard(main))
