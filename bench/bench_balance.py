"""Benchmark: proportional vs equal batch split vs ideal, and our sync's overhead vs plain DDP.

Run from the repository root (takes about 4 minutes on 2 idle CPU cores)::

    .venv/bin/python bench/bench_balance.py [--steps 25] [--delays-per-sample-s 0.002,0.005]

1. **Balance.** Four simulated ranks with relative speeds 1, 1, 2, 4 and global batch 256 train the
   digits MLP on random inputs. Simulated compute is ``local_batch * delay / speed`` on top of the
   real CPU forward/backward (:mod:`hetero_worker.runtime.simulation`); all ranks on one machine, so the
   ``auto`` hierarchy is flat. We measure the job's samples/s with
   the proportional split [32, 32, 64, 128] and with the equal split [64]*4, and the *ideal*: the
   sum of each rank's standalone throughput (one process, no communication, its proportional
   batch). Targets: proportional >= 1.85 x equal; proportional / ideal >= 0.95 at 5 ms per sample
   (:data:`IDEAL_TARGETS`, issue 23), reported without a target at 2 ms. Measured at 2 ms and 5 ms
   per sample: the fixed per-step cost (real compute, all-reduce, waking 4 processes on few
   cores) is a larger share of the shorter step.
2. **Sync overhead.** Four ranks, equal batches (64), equal speeds, no simulated delay: median step
   time of our ``Trainer.step`` vs plain ``DistributedDataParallel`` (its default all-reduce),
   interleaved in ABBA blocks inside the same processes so machine noise hits both alike; the
   ratio is the median over adjacent block pairs. Target: ours <= 1.05 x plain. Three paths, each
   really run: ``hook`` (our Python comm hook forced on a flat layout: the same single all-reduce
   as DDP, issued as an async future, so the ratio is the hook's own cost), ``hierarchical``
   (2 simulated nodes x 2 ranks: the path of every job with more than one group; on one machine
   its three dependent collectives per bucket only add latency), ``fast_flat`` (one group: no
   hook, weight in the loss). Both sides run the same model; ours is built by ``Trainer.wrap``
   (``gradient_as_bucket_view``), plain DDP with its defaults.

Every comparison runs ``--repeats`` (3) times within the invocation; the results file carries the
median, the spread and every run, the date and load average, and met/missed per target
(:mod:`benchlib`). Out of time (``--timeout-s``): exit status 3, nothing written.

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

import benchlib

HERE = Path(__file__).resolve().parent
SPEEDS = [1.0, 1.0, 2.0, 4.0]
GLOBAL_BATCH = 256
WARMUP_STEPS = 2
IDEAL_TARGETS = {0.005: 0.95}
"""Proportional / ideal targets by simulated seconds per sample (issue 23: >= 0.95 at 5 ms; at
2 ms reported only: the fixed per-step cost, one Gloo all-reduce's latency, is ~8 % of the step)."""


def proportional(global_batch: int, speeds: list[float]) -> list[int]:
    """Largest-remainder split of ``global_batch`` proportional to ``speeds`` (the project's one
    splitter, :func:`heterotrain_common.split.split_batch`)."""
    from heterotrain_common.split import split_batch
    return split_batch(global_batch, speeds)


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
    """Train ``args.steps`` measured steps; rank 0 writes samples/s and each rank's time budget."""
    import torch
    import torch.nn.functional as F

    from hetero_worker import trainer as ht

    t = ht.init(seed=0)
    model = t.wrap(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n = GLOBAL_BATCH * (args.steps + WARMUP_STEPS + 1)
    data = torch.utils.data.TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,)))
    starts, parts = [], []
    batches = iter(t.loader(data))
    for _ in range(args.steps + WARMUP_STEPS + 1):
        t0 = time.perf_counter()
        x, y = next(batches)
        t1 = time.perf_counter()
        r = t.step(opt, lambda m: F.cross_entropy(m(x), y))
        starts.append(t0)
        parts.append((t1 - t0, r.compute_s, r.comm_wait_s))
    starts.append(time.perf_counter())
    summaries = t.gather_summaries()
    measured = parts[WARMUP_STEPS:]
    budget = {"load_s": statistics.mean(p[0] for p in measured),
              "compute_s": statistics.mean(p[1] for p in measured),
              "comm_wait_s": statistics.mean(p[2] for p in measured)}
    budgets: list = [None] * t.contract.dist.world_size
    torch.distributed.all_gather_object(budgets, budget)
    if t.rank == 0:
        marks = starts[WARMUP_STEPS:]
        step_s = (marks[-1] - marks[0]) / (len(marks) - 1)
        Path(args.out).write_text(json.dumps({
            "step_s": step_s, "samples_per_s": sum(t.local_batches) / step_s,
            "per_rank": summaries, "per_rank_mean_step_parts_s": budgets,
            "live_efficiency_ratio": t.efficiency_ratio}))
    t.close()


def worker_allreduce(args: argparse.Namespace) -> None:
    """The fixed cost alone: after a sleep as long as a step's simulated compute (32 samples at
    speed 1), one gloo all-reduce of a gradient the size of the balance MLP's, as DDP issues it;
    rank 0 writes the median over steps of the slowest rank's all-reduce time."""
    import torch
    import torch.distributed as dist

    from hetero_worker import trainer as ht
    from hetero_worker.runtime import simulation as simulate

    t = ht.init(seed=0, delay_per_sample_s=0.0)
    sleep_s = 32 * simulate.delay_per_sample_s()
    grad = torch.zeros(sum(p.numel() for p in mlp().parameters()))
    times = []
    for _ in range(args.steps + WARMUP_STEPS):
        time.sleep(sleep_s)
        start = time.perf_counter()
        dist.all_reduce(grad)
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times[WARMUP_STEPS:], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if t.rank == 0:
        Path(args.out).write_text(json.dumps({"allreduce_s": statistics.median(slowest.tolist()),
                                              "numel": grad.numel()}))
    t.close()


def worker_overhead(args: argparse.Namespace) -> None:
    """Plain DDP vs our sync in ABBA blocks; ``args.variant`` picks our path (see VARIANTS)."""
    import copy
    import functools

    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from hetero_worker import trainer as ht
    from hetero_worker.comm.sync import WeightedGradSync

    t = ht.init(seed=0, delay_per_sample_s=0.0)
    if args.variant == "hook":  # the Python hook + comm thread even though the layout is flat
        t.sync.register = functools.partial(WeightedGradSync.register, t.sync, fast_flat=False)
    base = mlp(width=512, depth=3)
    plain = DistributedDataParallel(copy.deepcopy(base))
    ours = t.wrap(base)
    if t.sync.weight_in_loss:
        path = "fast-flat (no hook, weight in the loss)"
    elif t.layout.is_flat:
        path = "comm hook: weight, then one async all-reduce future (no comm thread)"
    else:
        path = ("comm hook: leaders reduce, all-reduce, broadcast on the comm thread; "
                "non-leaders' reduce + broadcast as async futures")
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
            "path": path, "groups": len(t.layout.groups) if hasattr(t.layout, "groups") else None,
            "plain": statistics.median(m for n, m in medians if n == "plain"),
            "ours": statistics.median(m for n, m in medians if n == "ours"),
            "ratio": statistics.median(ratios), "pair_ratios": ratios}))
    t.close()


# --- driver side ------------------------------------------------------------------------------
def launch(mode: str, batches: list[int], speeds: list[float], nodes: list[str], *,
           delay_s: float, args: argparse.Namespace, deadline: benchlib.Deadline,
           hierarchy: str = "auto", variant: str = "") -> dict:
    """Start one process per rank running this file in ``mode``; return rank 0's JSON.

    Raises:
        BenchTimeout: the ranks did not finish before ``deadline``.
        RuntimeError: a rank failed.
    """
    from hetero_worker.runtime.simulation import free_port, local_rank_envs, simulated_cluster

    products = [(f"sim-speed-{s:g}", "8.0", s) for s in speeds]
    entries, profiles = simulated_cluster(products=products, nodes=nodes, local_batches=batches)
    envs = local_rank_envs(entries=entries, profiles=profiles, hierarchy=hierarchy,
                           master_port=free_port(), job_name=f"bench-{mode}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, __file__, "--worker", mode, "--out", str(out),
               "--steps", str(args.steps), "--blocks", str(args.blocks),
               "--block-steps", str(args.block_steps), "--variant", variant]
        procs = []
        for env in envs:
            full = dict(os.environ, OMP_NUM_THREADS="1", HTJ_SIM_DELAY_PER_SAMPLE_S=str(delay_s),
                        **env)
            full["HTJ_METRICS_PORT"] = "0"  # no HTTP server threads competing for the 2 cores
            procs.append(subprocess.Popen(cmd, env=full))
        codes = benchlib.wait_procs(procs, deadline, f"{mode} {variant or batches}")
        if any(codes):
            raise RuntimeError(f"bench {mode} failed: exit codes {codes}")
        return json.loads(out.read_text())


def standalone_samples_per_s(batch: int, speed: float, *, delay_s: float, steps: int) -> float:
    """One rank alone: its batch, its simulated speed, real forward/backward, no communication."""
    import torch
    import torch.nn.functional as F

    from hetero_worker.runtime.simulation import simulate_compute
    from heterotrain_common.contract import DeviceProfile

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    profile = DeviceProfile(product="sim", relative_speed=speed, simulated=True)
    x, y = torch.randn(batch, 64), torch.randint(0, 10, (batch,))
    marks = []
    for _ in range(steps + WARMUP_STEPS + 1):
        marks.append(time.perf_counter())
        opt.zero_grad()
        simulate_compute(profile, batch, delay_s)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    marks.append(time.perf_counter())
    measured = marks[WARMUP_STEPS:]
    return batch * (len(measured) - 1) / (measured[-1] - measured[0])


def balance_once(delay_s: float, args: argparse.Namespace, deadline: benchlib.Deadline) -> dict:
    """One repeat at one delay: proportional and equal splits really run, and the ideal."""
    nodes = ["localhost"] * 4  # one machine: hierarchy "auto" resolves to flat
    split = proportional(GLOBAL_BATCH, SPEEDS)
    equal = [GLOBAL_BATCH // len(SPEEDS)] * len(SPEEDS)
    prop = launch("balance", split, SPEEDS, nodes, delay_s=delay_s, args=args, deadline=deadline)
    eq = launch("balance", equal, SPEEDS, nodes, delay_s=delay_s, args=args, deadline=deadline)
    standalone = [standalone_samples_per_s(b, s, delay_s=delay_s, steps=args.steps)
                  for b, s in zip(split, SPEEDS, strict=True)]
    ideal = sum(standalone)
    allreduce = launch("allreduce", split, SPEEDS, nodes, delay_s=delay_s, args=args, deadline=deadline)
    slowest_alone_s = max(b / a for b, a in zip(split, standalone, strict=True))
    big = split.index(max(split))  # the largest batch: most loading and real compute
    parts = prop["per_rank_mean_step_parts_s"][big]
    return {"fixed_parts_largest_batch_rank_s": {
                "rank": big, "load_s": parts["load_s"],
                "compute_over_standalone_s": parts["compute_s"] - split[big] / standalone[big],
                "comm_wait_s": parts["comm_wait_s"]},
            "proportional_samples_per_s": prop["samples_per_s"],
            "proportional_step_s": prop["step_s"], "slowest_standalone_step_s": slowest_alone_s,
            "fixed_per_step_s": prop["step_s"] - slowest_alone_s,
            "gloo_allreduce_after_sleep_s": allreduce["allreduce_s"],
            "equal_samples_per_s": eq["samples_per_s"],
            "standalone_samples_per_s": standalone, "ideal_samples_per_s": ideal,
            "proportional_over_ideal": prop["samples_per_s"] / ideal,
            "proportional_over_equal": prop["samples_per_s"] / eq["samples_per_s"],
            "live_efficiency_ratio": prop.get("live_efficiency_ratio"),
            "per_rank_mean_step_parts_s": prop["per_rank_mean_step_parts_s"],
            "per_rank_proportional": prop["per_rank"], "per_rank_equal": eq["per_rank"]}


VARIANTS = {
    # name: (nodes, hierarchy, variant flag, what it is)
    "hook": (["localhost"] * 4, "flat", "hook",
             "our comm hook (Python hook, weighting, async all-reduce future) with the same single "
             "flat all-reduce as plain DDP: the hook path's own overhead"),
    "hierarchical": (["node-a", "node-a", "node-b", "node-b"], "group", "",
                     "2 simulated nodes x 2 ranks: reduce, leaders' all-reduce, broadcast (the "
                     "path every job with more than one group takes); on one machine it only adds "
                     "latency"),
    "fast_flat": (["localhost"] * 4, "auto", "",
                  "one group: no hook at all, DDP's own all-reduce with the weight in the loss"),
}


def run_benchmark(args: argparse.Namespace, deadline: benchlib.Deadline) -> tuple[list, dict]:
    """All repeats; returns (targets, details)."""
    equal = [GLOBAL_BATCH // len(SPEEDS)] * len(SPEEDS)
    delays = [] if args.only == "overhead" else args.delays_per_sample_s
    variants = [] if args.only == "balance" else (args.variants or list(VARIANTS))
    balance: dict[float, list[dict]] = {d: [] for d in delays}
    overhead: dict[str, list[dict]] = {v: [] for v in variants}
    for repeat in range(args.repeats):  # repeats outermost: a load change hits every variant
        for d in delays:
            balance[d].append(balance_once(d, args, deadline))
            print(f"repeat {repeat}: {d * 1e3:g} ms/sample: proportional/ideal "
                  f"{balance[d][-1]['proportional_over_ideal']:.3f}, proportional/equal "
                  f"{balance[d][-1]['proportional_over_equal']:.2f}x", flush=True)
        for name in variants:
            nodes, hierarchy, flag, _ = VARIANTS[name]
            overhead[name].append(launch("overhead", equal, [1.0] * 4, nodes, delay_s=0.0, args=args,
                                         deadline=deadline, hierarchy=hierarchy, variant=flag))
            print(f"repeat {repeat}: sync {name}: ours/plain {overhead[name][-1]['ratio']:.3f}",
                  flush=True)
    targets = []
    for d, runs in balance.items():
        ms = f"{d * 1e3:g} ms/sample"
        goal = IDEAL_TARGETS.get(d)
        targets.append(benchlib.Target(
            f"proportional / ideal at {ms}", "info" if goal is None else ">=", goal or 0.0, "",
            [r["proportional_over_ideal"] for r in runs],
            "ideal = sum of each rank's standalone samples/s (its batch, no communication)"))
        targets.append(benchlib.Target(
            f"proportional / equal split at {ms}", ">=", 1.85, "x",
            [r["proportional_over_equal"] for r in runs], "both splits really run, same code"))
        if all(r.get("live_efficiency_ratio") is not None for r in runs):
            targets.append(benchlib.Target(
                f"htj_job_efficiency_ratio rank 0 exported, proportional split at {ms}", "info", 0, "",
                [r["live_efficiency_ratio"] for r in runs],
                "the live figure (steps 11-20); its reference is compute measured inside the job"))
        targets.append(benchlib.Target(
            f"fixed per-step cost at {ms}: step - slowest rank's standalone step", "info", 0, " ms",
            [1000 * r["fixed_per_step_s"] for r in runs]))
        for key, what in (("load_s", "data loading"),
                          ("compute_over_standalone_s", "step compute over its standalone step"),
                          ("comm_wait_s", "wait in the gradient all-reduce")):
            targets.append(benchlib.Target(
                f"... largest-batch rank at {ms}: {what}", "info", 0, " ms",
                [1000 * r["fixed_parts_largest_batch_rank_s"][key] for r in runs],
                "the rank's mean per step; the three add up to its step minus its standalone step"))
        targets.append(benchlib.Target(
            f"... of which one gloo all-reduce of the MLP's gradient at {ms} (4 processes, after a "
            "sleep as long as the step's compute)", "info", 0, " ms", [1000 * r["gloo_allreduce_after_sleep_s"] for r in runs],
            "the same collective DDP issues, alone: the floor of the fixed cost on this machine"))
    names = {"hook": "sync overhead: our hook path / plain DDP (flat, same all-reduce)",
             "hierarchical": "sync overhead: hierarchical hook path, 2 groups / plain DDP",
             "fast_flat": "sync overhead: flat fast path (no hook) / plain DDP"}
    for name, runs in overhead.items():
        targets.append(benchlib.Target(names[name], "<=", 1.05, "x", [r["ratio"] for r in runs],
                                       VARIANTS[name][3]))
    details = {
        "config": {"speeds": SPEEDS, "global_batch": GLOBAL_BATCH, "steps": args.steps,
                   "warmup_steps": WARMUP_STEPS, "repeats": args.repeats,
                   "proportional_split": proportional(GLOBAL_BATCH, SPEEDS), "equal_split": equal,
                   "overhead_model": "MLP 64-512-512-512-10 (0.56M params), batch 64 per rank, "
                                     "4 ranks, equal speeds, no simulated delay",
                   "overhead_blocks": args.blocks, "overhead_block_steps": args.block_steps},
        "balance": {f"{d:g}": runs for d, runs in balance.items()},
        "sync_overhead": {name: {"what": VARIANTS[name][3], "runs": runs}
                          for name, runs in overhead.items()},
    }
    return targets, details


def print_table(details: dict) -> None:
    """Per delay, the last repeat's per-rank split of a step (where the fixed cost goes)."""
    for delay, runs in details["balance"].items():
        last = runs[-1]
        print(f"--- {float(delay) * 1e3:g} ms per sample, last repeat: mean per-step parts (ms) ---")
        print(f"{'rank':>4} {'speed':>5} {'batch':>5} {'load':>7} {'compute':>8} {'wait':>7} "
              f"{'standalone step':>15}")
        for p, parts, alone in zip(last["per_rank_proportional"], last["per_rank_mean_step_parts_s"],
                                   last["standalone_samples_per_s"], strict=True):
            print(f"{p['rank']:>4} {p['relative_speed']:>5g} {p['local_batch']:>5} "
                  f"{parts['load_s'] * 1e3:>7.2f} {parts['compute_s'] * 1e3:>8.2f} "
                  f"{parts['comm_wait_s'] * 1e3:>7.2f} {p['local_batch'] / alone * 1e3:>15.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25, help="measured steps per balance run")
    parser.add_argument("--delays-per-sample-s", type=lambda v: [float(x) for x in v.split(",")],
                        default=[0.002, 0.005],
                        help="simulated seconds per sample at speed 1, comma-separated")
    parser.add_argument("--blocks", type=int, default=8, help="overhead: blocks per variant")
    parser.add_argument("--block-steps", type=int, default=6, help="overhead: steps per block")
    parser.add_argument("--only", choices=["balance", "overhead"], help="run one part")
    parser.add_argument("--variants", type=lambda v: v.split(","), default=None,
                        help=f"overhead variants to run (default all: {','.join(VARIANTS)})")
    parser.add_argument("--repeats", type=int, default=benchlib.REPEATS)
    parser.add_argument("--timeout-s", type=float, default=900.0,
                        help="whole benchmark; on expiry exit 3 and write nothing")
    parser.add_argument("--output", default=str(HERE / "results" / "balance.json"))
    parser.add_argument("--worker", choices=["balance", "overhead", "allreduce"], help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "balance":
        worker_balance(args)
        return 0
    if args.worker == "overhead":
        worker_overhead(args)
        return 0
    if args.worker == "allreduce":
        worker_allreduce(args)
        return 0
    deadline = benchlib.Deadline(args.timeout_s)
    run_meta = benchlib.meta()
    started = time.monotonic()
    targets, details = run_benchmark(args, deadline)
    run_meta["wall_s"] = round(time.monotonic() - started, 1)
    doc = benchlib.write_results(Path(args.output), benchmark="balance", run_meta=run_meta,
                                 targets=targets, details=details)
    print_table(details)
    benchlib.print_targets(doc)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(benchlib.main_guard(main))
