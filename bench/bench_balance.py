"""Benchmark: proportional vs equal batch split vs ideal, and our sync's overhead vs plain DDP.

Run from the repository root (takes about a minute on 2 CPU cores)::

    .venv/bin/python bench/bench_balance.py [--steps 25] [--delays-per-sample-s 0.002,0.005]

1. **Balance.** Four simulated ranks with relative speeds 1, 1, 2, 4 and global batch 256 train the
   digits MLP on random inputs. Simulated compute is ``local_batch * delay / speed`` on top of the
   real CPU forward/backward (:mod:`hetero_worker.simulate`); all ranks on one machine, so the
   ``auto`` hierarchy is flat. We measure the job's samples/s with
   the proportional split [32, 32, 64, 128] and with the equal split [64]*4, and the *ideal*: the
   sum of each rank's standalone throughput (one process, no communication, its proportional
   batch). Targets: proportional >= 0.93 x ideal and >= 1.85 x equal. Measured at 2 ms and 5 ms
   per sample: the fixed per-step cost (real compute, all-reduce, waking 4 processes on few
   cores) is a larger share of the shorter step.
2. **Sync overhead.** Four ranks, equal batches (64), equal speeds, no simulated delay: median step
   time of our full ``Trainer.step`` (weighted comm hook; the layout ``auto`` picks for one
   machine, i.e. flat) vs plain ``DistributedDataParallel`` (its default all-reduce), interleaved
   in ABBA blocks inside the same processes so machine noise hits both alike; the ratio is the
   median over adjacent block pairs. Target: ours <= 1.05 x plain. Also reported: the three-stage hierarchical reduction on 2 simulated nodes x 2 ranks,
   which on one machine only adds latency (it pays off when the leaders' link is the slow one).

Prints a table and writes ``bench/results/balance.json``.
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

HERE = Path(__file__).resolve().parent
SPEEDS = [1.0, 1.0, 2.0, 4.0]
GLOBAL_BATCH = 256


def proportional(global_batch: int, speeds: list[float]) -> list[int]:
    """Largest-remainder split of ``global_batch`` proportional to ``speeds``."""
    raw = [global_batch * s / sum(speeds) for s in speeds]
    split = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - split[i], reverse=True):
        if sum(split) == global_batch:
            break
        split[i] += 1
    return split


def mlp(width: int = 128, depth: int = 1):
    """Digits-shaped MLP: 64 -> width (x depth) -> 10."""
    from torch import nn
    layers, last = [], 64
    for _ in range(depth):
        layers += [nn.Linear(last, width), nn.ReLU()]
        last = width
    return nn.Sequential(*layers, nn.Linear(last, 10))


# --- worker side (one process per rank) ---------------------------------------------------------
def worker_balance(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F
    from hetero_worker import trainer as ht

    t = ht.init(seed=0)
    model = t.wrap(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n = GLOBAL_BATCH * (args.steps + 3)
    data = torch.utils.data.TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,)))
    starts = []
    for x, y in t.loader(data):
        starts.append(time.perf_counter())
        t.step(opt, lambda m: F.cross_entropy(m(x), y))
    starts.append(time.perf_counter())
    summaries = t.gather_summaries()
    if t.rank == 0:
        measured = starts[3:]  # 2 warm-up steps
        step_s = (measured[-1] - measured[0]) / (len(measured) - 1)
        Path(args.out).write_text(json.dumps({
            "step_s": step_s, "samples_per_s": sum(t.local_batches) / step_s,
            "per_rank": summaries}))
    t.close()


def worker_overhead(args: argparse.Namespace) -> None:
    import copy

    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from hetero_worker import trainer as ht

    t = ht.init(seed=0, delay_per_sample_s=0.0)
    base = mlp(width=512, depth=3)
    plain = DistributedDataParallel(copy.deepcopy(base))
    ours = t.wrap(base)
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.01)
    opt_ours = torch.optim.SGD(ours.parameters(), lr=0.01)
    x, y = torch.randn(t.local_batch, 64), torch.randint(0, 10, (t.local_batch,))

    def plain_step() -> None:
        opt_plain.zero_grad(set_to_none=True)
        F.cross_entropy(plain(x), y).backward()
        opt_plain.step()

    def ours_step() -> None:
        t.step(opt_ours, lambda m: F.cross_entropy(m(x), y))

    # ABBA block order (plain, ours, ours, plain, ...) cancels slow drifts of machine load; a
    # step's time is the slowest rank's (everyone waits for it in the collective).
    order = [("plain", plain_step), ("ours", ours_step), ("ours", ours_step), ("plain", plain_step)]
    blocks: list[tuple[str, list[float]]] = []
    for block in range(2 * args.blocks):
        name, fn = order[block % 4]
        times = []
        for i in range(args.block_steps + 1):
            torch.distributed.barrier()
            start = time.perf_counter()
            fn()
            if i:  # the first step after a switch warms caches
                times.append(time.perf_counter() - start)
        slowest = torch.tensor(times, dtype=torch.float64)
        torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
        blocks.append((name, slowest.tolist()))
    if t.rank == 0:
        medians = [(name, statistics.median(v)) for name, v in blocks]
        ratios = []
        for i in range(0, len(medians) - 1, 2):  # adjacent (plain, ours) or (ours, plain) pairs
            pair = dict(medians[i:i + 2])
            ratios.append(pair["ours"] / pair["plain"])
        Path(args.out).write_text(json.dumps({
            "plain": statistics.median(m for n, m in medians if n == "plain"),
            "ours": statistics.median(m for n, m in medians if n == "ours"),
            "ratio": statistics.median(ratios), "pair_ratios": ratios}))
    t.close()


# --- driver side ------------------------------------------------------------------------------
def launch(mode: str, batches: list[int], speeds: list[float], nodes: list[str], *,
           delay_s: float, args: argparse.Namespace, hierarchy: str = "auto") -> dict:
    """Start one process per rank running this file in ``mode``; return rank 0's JSON."""
    from hetero_worker.simulate import free_port, local_rank_envs, simulated_cluster

    products = [(f"sim-speed-{s:g}", "8.0", s) for s in speeds]
    entries, profiles = simulated_cluster(products=products, nodes=nodes, local_batches=batches)
    envs = local_rank_envs(entries=entries, profiles=profiles, hierarchy=hierarchy,
                           master_port=free_port(), job_name=f"bench-{mode}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, __file__, "--worker", mode, "--out", str(out),
               "--steps", str(args.steps), "--blocks", str(args.blocks),
               "--block-steps", str(args.block_steps)]
        procs = []
        for env in envs:
            full = dict(os.environ, OMP_NUM_THREADS="1", HTJ_SIM_DELAY_PER_SAMPLE_S=str(delay_s),
                        **env)
            procs.append(subprocess.Popen(cmd, env=full))
        codes = [p.wait(timeout=600) for p in procs]
        if any(codes):
            raise SystemExit(f"bench {mode} failed: exit codes {codes}")
        return json.loads(out.read_text())


def standalone_samples_per_s(batch: int, speed: float, *, delay_s: float, steps: int) -> float:
    """One rank alone: its batch, its simulated speed, real forward/backward, no communication."""
    import torch
    import torch.nn.functional as F
    from hetero_worker.contract import DeviceProfile
    from hetero_worker.simulate import simulate_compute

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    profile = DeviceProfile(product="sim", relative_speed=speed, simulated=True)
    x, y = torch.randn(batch, 64), torch.randint(0, 10, (batch,))
    marks = []
    for _ in range(steps + 3):
        marks.append(time.perf_counter())
        opt.zero_grad()
        simulate_compute(profile, batch, delay_s)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    marks.append(time.perf_counter())
    measured = marks[3:]
    return batch * (len(measured) - 1) / (measured[-1] - measured[0])


def balance_at(delay_s: float, args: argparse.Namespace) -> dict:
    """Proportional vs equal vs ideal at one simulated seconds-per-sample."""
    nodes = ["localhost"] * 4  # one machine: hierarchy "auto" resolves to flat
    split = proportional(GLOBAL_BATCH, SPEEDS)
    equal = [GLOBAL_BATCH // len(SPEEDS)] * len(SPEEDS)
    prop = launch("balance", split, SPEEDS, nodes, delay_s=delay_s, args=args)
    eq = launch("balance", equal, SPEEDS, nodes, delay_s=delay_s, args=args)
    standalone = [standalone_samples_per_s(b, s, delay_s=delay_s, steps=args.steps)
                  for b, s in zip(split, SPEEDS, strict=True)]
    ideal = sum(standalone)
    return {"delay_per_sample_s": delay_s, "proportional_split": split, "equal_split": equal,
            "proportional_samples_per_s": prop["samples_per_s"],
            "equal_samples_per_s": eq["samples_per_s"],
            "standalone_samples_per_s": standalone, "ideal_samples_per_s": ideal,
            "proportional_over_ideal": prop["samples_per_s"] / ideal,
            "proportional_over_equal": prop["samples_per_s"] / eq["samples_per_s"],
            "per_rank_proportional": prop["per_rank"], "per_rank_equal": eq["per_rank"]}


def run_benchmark(args: argparse.Namespace) -> dict:
    balances = [balance_at(d, args) for d in args.delays_per_sample_s]
    equal = [GLOBAL_BATCH // len(SPEEDS)] * len(SPEEDS)
    overhead = launch("overhead", equal, [1.0] * 4, ["localhost"] * 4, delay_s=0.0, args=args)
    two_nodes = ["node-a", "node-a", "node-b", "node-b"]
    overhead_hier = launch("overhead", equal, [1.0] * 4, two_nodes, delay_s=0.0, args=args,
                           hierarchy="group")
    return {
        "config": {"speeds": SPEEDS, "global_batch": GLOBAL_BATCH, "steps": args.steps,
                   "cpu_count": os.cpu_count(), "load_average_1m": os.getloadavg()[0]},
        "balance": balances,
        "sync_overhead": {
            "plain_ddp_step_s": overhead["plain"], "ours_step_s": overhead["ours"],
            "ours_over_plain": overhead["ratio"], "pair_ratios": overhead["pair_ratios"],
            "hierarchical_plain_ddp_step_s": overhead_hier["plain"],
            "hierarchical_ours_step_s": overhead_hier["ours"],
            "hierarchical_ours_over_plain": overhead_hier["ratio"],
            "hierarchical_pair_ratios": overhead_hier["pair_ratios"],
            "model": "MLP 64-512-512-512-10 (0.56M params), batch 64 per rank, 4 ranks; "
                     "flat = one machine (auto); hierarchical = 2 simulated nodes x 2 ranks "
                     "(reduce, leaders' all-reduce, broadcast)"},
        "targets": {"proportional_over_ideal": 0.93, "proportional_over_equal": 1.85,
                    "ours_over_plain_max": 1.05},
    }


def print_table(result: dict) -> None:
    o = result["sync_overhead"]
    for b in result["balance"]:
        print(f"--- simulated {b['delay_per_sample_s'] * 1e3:g} ms per sample at speed 1 ---")
        print(f"{'configuration':<34} {'samples/s':>10}")
        print(f"{'ideal (sum of standalone)':<34} {b['ideal_samples_per_s']:>10.1f}")
        print(f"{'proportional ' + str(b['proportional_split']):<34} "
              f"{b['proportional_samples_per_s']:>10.1f}")
        print(f"{'equal ' + str(b['equal_split']):<34} {b['equal_samples_per_s']:>10.1f}")
        print(f"proportional / ideal = {b['proportional_over_ideal']:.3f} (target >= 0.93)")
        print(f"proportional / equal = {b['proportional_over_equal']:.2f}x (target >= 1.85x)")
        print(f"{'rank':>4} {'speed':>5} {'batch':>5} {'wait (prop.)':>12} {'wait (equal)':>12}")
        for p, e in zip(b["per_rank_proportional"], b["per_rank_equal"], strict=True):
            print(f"{p['rank']:>4} {p['relative_speed']:>5g} {p['local_batch']:>5} "
                  f"{p['wait_share']:>12.1%} {e['wait_share']:>12.1%}")
    print(f"sync step time: ours {o['ours_step_s'] * 1e3:.2f} ms vs plain DDP "
          f"{o['plain_ddp_step_s'] * 1e3:.2f} ms; median pair ratio {o['ours_over_plain']:.3f}x "
          f"(target <= 1.05)")
    print(f"hierarchical (2 simulated nodes): ours {o['hierarchical_ours_step_s'] * 1e3:.2f} ms vs "
          f"plain DDP {o['hierarchical_plain_ddp_step_s'] * 1e3:.2f} ms; median pair ratio "
          f"{o['hierarchical_ours_over_plain']:.3f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25, help="measured steps per balance run")
    parser.add_argument("--delays-per-sample-s", type=lambda v: [float(x) for x in v.split(",")],
                        default=[0.002, 0.005],
                        help="simulated seconds per sample at speed 1, comma-separated")
    parser.add_argument("--blocks", type=int, default=16, help="overhead: blocks per variant")
    parser.add_argument("--block-steps", type=int, default=6, help="overhead: steps per block")
    parser.add_argument("--output", default=str(HERE / "results" / "balance.json"))
    parser.add_argument("--worker", choices=["balance", "overhead"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "balance":
        worker_balance(args)
        return 0
    if args.worker == "overhead":
        worker_overhead(args)
        return 0
    result = run_benchmark(args)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2))
    print_table(result)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
