#!/usr/bin/env python
"""Speed benchmark: rebalancing, link-aware hierarchy and inter-group compression (issue 6).

One script, every ratio measured within one run.  Run as root from the repository root::

    sudo .venv/bin/python bench/bench_speed.py            # about 15 minutes (3 repeats)
    .venv/bin/python bench/bench_speed.py --only rebalance # no root needed for this part

Setups (4 real gloo rank processes each, via :class:`hetero_worker.trainer.Trainer` and
:func:`hetero_worker.speed.controller.attach`):

1. ``rebalance`` (loopback): simulated speeds 1,1,2,4 (a sleep of ``batch * delay / speed`` on
   top of real compute).  Equal split vs rebalancing from equal; then the fastest rank drops to
   speed 1 at step 10 of 60: one-time split vs rebalancing.  "Ideal" = sum of the ranks'
   standalone throughputs (each rank timing its own compute alone, no communication).
2. ``slow`` (two network namespaces, "nodes" A = ranks 0,1 and B = ranks 2,3, joined by a veth
   shaped to 100 Mbit/s with ``tc tbf``; see bench/netns.py): step time for hierarchy flat /
   node / arch / auto, then compression none / int8 / powersgd /
   fp16 / bf16 on the node hierarchy: step times, bytes counted by the codec and bytes that
   really left node A's veth.
3. ``fast``: the same link unshaped: hierarchy flat / node / arch / auto (one step of each in
   turn, so the load drift of the machine cancels); and the codec losses
   (none / int8 / powersgd) after a fixed number of steps (the arithmetic does not depend on the
   link speed, so the long runs go where they are cheap).

Every setup runs ``--repeats`` (3) times within one invocation, each repeat in fresh rank
processes with its own seed (model initialisation and data of the link setups), so the spread of
the codec losses is real.  Writes ``bench/results/speed.json`` (median, range and every run per
target, date, load, met/missed: :mod:`benchlib`; ``bench/report.py`` makes its docs/benchmarks.md table),
``speed.png`` (plot of the last repeat) and the per-step data to ``$TMPDIR/bench-speed-raw.json``.  A setup that runs
out of time (``--timeout-s``) ends the benchmark with exit status 3 and nothing written.

The codec rows also give each codec's step time on the *unshaped* link: everything but the slow
transfer (forward/backward, the in-node reduce and broadcast, the codec's own arithmetic, the
optimizer), i.e. the best speed-up over fp32 this machine allows for that codec.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import benchlib  # noqa: E402

DELAY_S = 0.040          # simulated seconds per sample at speed 1 (rebalance setup)
SPEEDS = [1.0, 1.0, 2.0, 4.0]
SLOW_SPEEDS = [1.0, 1.0, 2.0, 1.0]
GLOBAL_BATCH = 64
LINK_BATCH = 4           # per rank in the link setups
LOSS_STEPS = 500         # fixed number of steps for the codec loss comparison (fast link)
CODEC_TIMING_STEPS = 14  # timed steps per codec on the slow link (2 warm-up)
TIMING_STEPS = 12        # timed steps per hierarchy mode on the shaped link (after 2 warm-up steps)
FAST_TIMING_STEPS = 60   # interleaved steps per mode on the unshaped link (~30 ms each: cheap, and
                         # the median of 24 had a spread of about +-7 % on the loaded machine)
LINK_MBIT = 100
if os.environ.get("HTJ_BENCH_QUICK"):  # --quick: a smoke run of the whole script (numbers meaningless)
    LOSS_STEPS, CODEC_TIMING_STEPS, TIMING_STEPS, FAST_TIMING_STEPS = 12, 4, 3, 6


# ================================ rank side =====================================================
def _torch():
    import torch
    torch.set_num_threads(1)
    return torch


def _trainer(contract, *, hierarchy: str | None = None, delay_s: float = 0.0):
    from hetero_worker import trainer as ht
    if hierarchy is not None:
        contract = dataclasses.replace(contract, comm=dataclasses.replace(contract.comm,
                                                                          hierarchy=hierarchy))
    return ht.Trainer(contract, delay_per_sample_s=delay_s, seed=0)


def _set_speed(t, speed: float) -> None:
    """Emulate throttling: the simulated device of this rank gets a new relative speed."""
    device = dataclasses.replace(t.contract.device, relative_speed=speed)
    t.contract = dataclasses.replace(t.contract, device=device)


def standalone_throughput(batch: int, speed: float, steps: int = 6) -> float:
    """Samples/s of this rank alone: forward/backward + simulated delay, no communication."""
    torch = _torch()
    model = torch.nn.Linear(16, 16)
    x, y = torch.randn(batch, 16), torch.randn(batch, 16)
    start = time.perf_counter()
    for _ in range(steps):
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        time.sleep(batch * DELAY_S / speed)
    return batch * steps / (time.perf_counter() - start)


def rebalance_run(contract, *, split: list[int], dynamic: bool, steps: int,
                  slow_at: int | None = None) -> dict:
    """One training run of the rebalance setup; returns per-step times and splits (rank 0)."""
    torch = _torch()
    from hetero_worker.speed.controller import SpeedConfig, attach
    from hetero_worker.speed.rebalance import RebalanceConfig
    t = _trainer(contract, hierarchy="flat", delay_s=DELAY_S)
    t.set_split(split)
    interval = 5 if dynamic else 0
    speed = attach(t, SpeedConfig(rebalance=RebalanceConfig(interval_steps=interval)))
    torch.manual_seed(0)
    model = t.wrap(torch.nn.Linear(16, 16))
    data = torch.utils.data.TensorDataset(torch.randn(GLOBAL_BATCH * steps, 16),
                                          torch.randn(GLOBAL_BATCH * steps, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step_s, splits = [], []
    for step, (x, y) in enumerate(t.loader(data)):
        if step == slow_at and t.rank == 3:
            _set_speed(t, 1.0)
        splits.append(list(t.local_batches))
        start = time.perf_counter()
        speed.step(opt, lambda m: torch.nn.functional.mse_loss(m(x), y))
        step_s.append(time.perf_counter() - start)
    return {"step_s": step_s, "splits": splits, "history": speed.rebalancer.history
            if speed.rebalancer else []}


def rebalance_scenario(contract) -> dict:
    import torch.distributed as dist

    from heterotrain_common.split import split_batch
    prop = split_batch(GLOBAL_BATCH, SPEEDS)
    prop_slow = split_batch(GLOBAL_BATCH, SLOW_SPEEDS)
    rank = contract.dist.rank
    alone = [standalone_throughput(prop[rank], SPEEDS[rank]),
             standalone_throughput(prop_slow[rank], SLOW_SPEEDS[rank])]
    gathered: list = [None] * 4
    dist.all_gather_object(gathered, alone)
    equal = [GLOBAL_BATCH // 4] * 4
    return {
        "standalone": gathered, "proportional_split": prop, "proportional_split_slow": prop_slow,
        "equal": rebalance_run(contract, split=equal, dynamic=False, steps=15),
        "dynamic_from_equal": rebalance_run(contract, split=equal, dynamic=True, steps=40),
        "one_time_drift": rebalance_run(contract, split=prop, dynamic=False, steps=60, slow_at=10),
        "dynamic_drift": rebalance_run(contract, split=prop, dynamic=True, steps=60, slow_at=10),
    }


SEED = int(os.environ.get("BENCH_SPEED_SEED", "0"))
"""Repeat index: each repeat trains its own initialisation and data (the loss spread is real)."""
POWERSGD_RANK = int(os.environ.get("BENCH_SPEED_POWERSGD_RANK", "4"))
HIGH_RANK = "powersgd-r16"
"""PowerSGD at rank 16 as well: the rank lever (4x the factor bytes of rank 4, still ~1/22 of fp32)."""


def _link_model(torch):
    torch.manual_seed(5 + 1000 * SEED)
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 4))


def _link_data(torch, n: int):
    g = torch.Generator().manual_seed(100 + 1000 * SEED)
    w = torch.randn(256, 4, generator=torch.Generator().manual_seed(1 + 1000 * SEED))
    x = torch.randn(n, 256, generator=g)
    return torch.utils.data.TensorDataset(x, (x @ w).argmax(dim=1))


def _tx_bytes() -> int:
    dev = os.environ.get("GLOO_SOCKET_IFNAME", "")
    try:
        return int(Path(f"/sys/class/net/{dev}/statistics/tx_bytes").read_text())
    except (OSError, ValueError):
        return -1


def link_run(contract, *, hierarchy: str, compression: str = "none", steps: int,
             eval_loss: bool = False, count_bytes: bool = False) -> dict:
    """Train the link model ``steps`` steps; step times, loss, bytes (counted and on the veth)."""
    torch = _torch()
    import torch.distributed as dist

    from hetero_worker.speed.codecs import CompressionConfig
    from hetero_worker.speed.controller import SpeedConfig, attach
    t = _trainer(contract, hierarchy=hierarchy)
    mode, _, rank = compression.partition("-r")  # "powersgd-r16": PowerSGD at rank 16
    speed = attach(t, SpeedConfig(compression=CompressionConfig(
        mode=mode, powersgd_rank=int(rank) if rank else POWERSGD_RANK)))
    if count_bytes:
        speed.reducer.install()  # also for "none": count the leaders' bytes with the same code
    dist.barrier()
    start = time.perf_counter()
    model = t.wrap(_link_model(torch))  # with auto: the link probe (one-time start cost)
    wrap_s = time.perf_counter() - start
    data = _link_data(torch, LINK_BATCH * 4 * steps)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    # cosine decay to 0: the usual recipe; it also damps the run-to-run chaos of the final loss
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 0.5 * (1 + math.cos(math.pi * k / steps)))
    dist.barrier()
    tx0 = _tx_bytes()
    step_s = []
    for x, y in t.loader(data, shuffle=False):
        start = time.perf_counter()
        speed.step(opt, lambda m: torch.nn.functional.cross_entropy(m(x), y))
        sched.step()
        step_s.append(time.perf_counter() - start)
    dist.barrier()
    tx = _tx_bytes() - tx0
    loss = None
    if eval_loss:
        with torch.no_grad():
            loss = float(torch.nn.functional.cross_entropy(t.module(data.tensors[0]), data.tensors[1]))
    return {"hierarchy": speed.chosen_hierarchy, "step_s": step_s, "loss": loss,
            "counted_bytes": speed.reducer.codec_bytes_sent, "veth_tx_bytes": tx,
            "predicted_s": speed.predicted_sync_s, "wrap_s": wrap_s, "probe_s": speed.probe_s,
            "link": dataclasses.asdict(speed.link) if speed.link else None}


INTERLEAVE_BARRIER = os.environ.get("BENCH_SPEED_NO_BARRIER") is None
"""Start every interleaved step from a barrier (untimed); off only to show the artefact."""


def link_modes_interleaved(contract, *, steps: int) -> dict:
    """Step times of flat / node / arch / auto, one step of each in turn (load drift cancels).

    Each round starts with another mode (the order rotates) and every timed step starts after a
    barrier: rank 0 returns from a hierarchical step while the other ranks may still be busy
    with it, and without the barrier the *next* mode's step would be billed that skew (the
    mode after ``arch`` was ``auto`` in every round: 0.86-0.93x of the same flat layout).
    ``flat-control`` is a second, identical flat layout: its ratio to ``flat`` is the noise of
    this comparison.
    """
    torch = _torch()
    import torch.distributed as dist

    from hetero_worker.speed.controller import SpeedConfig, attach
    runs = {}
    for mode in ("flat", "node", "arch", "auto", "flat-control"):
        t = _trainer(contract, hierarchy=mode.removesuffix("-control"))
        speed = attach(t, SpeedConfig())
        dist.barrier()
        start = time.perf_counter()
        model = t.wrap(_link_model(torch))  # with auto: the link probe (one-time start cost)
        wrap_s = time.perf_counter() - start
        data = _link_data(torch, LINK_BATCH * 4 * steps)
        runs[mode] = {"t": t, "speed": speed, "opt": torch.optim.SGD(model.parameters(), lr=0.02),
                      "batches": iter(t.loader(data, shuffle=False)), "step_s": [],
                      "wrap_s": wrap_s}
    modes = list(runs)
    for k in range(steps):
        for mode in modes[k % len(modes):] + modes[:k % len(modes)]:
            r = runs[mode]
            x, y = next(r["batches"])
            if INTERLEAVE_BARRIER:
                dist.barrier()
            start = time.perf_counter()
            r["speed"].step(r["opt"], lambda m: torch.nn.functional.cross_entropy(m(x), y))
            r["step_s"].append(time.perf_counter() - start)
    return {mode: {"hierarchy": r["speed"].chosen_hierarchy, "step_s": r["step_s"],
                   "predicted_s": r["speed"].predicted_sync_s, "wrap_s": r["wrap_s"],
                   "probe_s": r["speed"].probe_s, "trial_s": r["speed"].trial_s,
                   "link": dataclasses.asdict(r["speed"].link) if r["speed"].link else None}
            for mode, r in runs.items()}


PART = os.environ.get("BENCH_SPEED_PART", "")
"""``hierarchy``: the slow link's flat and node layouts and the pipeline's parts only; ``codecs``:
the codecs of :data:`CODECS` only (bench/bench_powersgd.py)."""
CODECS = [c for c in os.environ.get("BENCH_SPEED_CODECS", "").split(",") if c]
"""Codecs of the ``codecs`` part, e.g. ``none,powersgd-r1``; run in an order rotated by the seed."""
PARTS_REPEATS = 5


def pipeline_parts(contract) -> dict:
    """What the pipelined node step overlaps, each measured alone (seconds, MAX over ranks).

    ``backward_s``: every rank's forward + backward of the link model on its batch, no
    communication (median of ``PARTS_REPEATS``). ``transfer_s``: the node leaders' (ranks 0 and
    2) Gloo all-reduce of the fp32 gradient over the link alone, in the pieces DDP's buckets cut
    it into on the node layout (25 MB cap), after a barrier (median).
    """
    torch = _torch()
    import torch.distributed as dist

    from hetero_worker.comm.sync import HIERARCHICAL_BUCKET_CAP_MB
    model = _link_model(torch)
    data = _link_data(torch, LINK_BATCH)
    x, y = data.tensors
    back = []
    for _ in range(PARTS_REPEATS + 1):
        model.zero_grad()
        start = time.perf_counter()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        back.append(time.perf_counter() - start)
    numel = sum(p.numel() for p in model.parameters())
    cap = int(HIERARCHICAL_BUCKET_CAP_MB * (1 << 20)) // 4
    leaders = dist.new_group([0, 2], backend="gloo")
    transfer = []
    for _ in range(PARTS_REPEATS + 1):  # the first opens the connections
        dist.barrier()
        start = time.perf_counter()
        if contract.dist.rank in (0, 2):
            for lo in range(0, numel, cap):
                dist.all_reduce(torch.zeros(min(cap, numel - lo)), group=leaders)
        transfer.append(time.perf_counter() - start)
    dist.destroy_process_group(leaders)
    times = torch.tensor([statistics.median(back[1:]), statistics.median(transfer[1:])],
                         dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    return {"backward_s": float(times[0]), "transfer_s": float(times[1]), "grad_numel": numel}


def link_scenario(contract, *, slow: bool) -> dict:
    """Hierarchy modes; on the slow link codec step times and bytes, on the fast one codec losses."""
    if PART == "codecs":
        turn = SEED % len(CODECS)
        return codec_runs(contract, slow=slow, modes=CODECS[turn:] + CODECS[:turn])
    if slow and PART == "hierarchy":
        out = {"modes": {m: link_run(contract, hierarchy=m, steps=TIMING_STEPS + 2)
                         for m in ("flat", "node")}}
        out["parts"] = pipeline_parts(contract)
        return out
    if slow:  # one mode after the other: a step that returns while its last bytes still sit in
        # the shaped queue would bill them to the next step, i.e. to another mode if interleaved
        out = {"modes": {m: link_run(contract, hierarchy=m, steps=TIMING_STEPS + 2)
                         for m in ("flat", "node", "arch", "auto")}}
    else:  # fast link: no queue; interleave so that the load drift of the machine cancels
        out = {"modes": link_modes_interleaved(contract, steps=FAST_TIMING_STEPS + 2)}
    modes = ("none", "int8", "powersgd", HIGH_RANK) + (("fp16", "bf16") if slow else ())
    return {**out, **codec_runs(contract, slow=slow, modes=modes)}


def codec_runs(contract, *, slow: bool, modes) -> dict:
    """Each codec of ``modes`` on the node hierarchy, one after the other.

    Slow link: ``{"codecs": {mode: link_run(...)}}`` (``CODEC_TIMING_STEPS`` steps, bytes
    counted). Fast link: ``{"losses": {mode: loss}, "fast_step_s": {mode: median step s}}`` after
    ``LOSS_STEPS`` steps: the arithmetic does not depend on the link speed, so the long runs go
    where they are cheap; the step times there are each codec's floor (all but the slow transfer).
    """
    if slow:
        return {"codecs": {mode: link_run(contract, hierarchy="node", compression=mode,
                                          steps=CODEC_TIMING_STEPS, count_bytes=True)
                           for mode in modes}}
    runs = {mode: link_run(contract, hierarchy="node", compression=mode, steps=LOSS_STEPS,
                           eval_loss=True, count_bytes=True) for mode in modes}
    return {"losses": {mode: r["loss"] for mode, r in runs.items()},
            "fast_step_s": {mode: statistics.median(r["step_s"][2:]) for mode, r in runs.items()}}


def worker_main(scenario: str, out_dir: str) -> int:
    from hetero_worker.runtime import rendezvous
    from heterotrain_common.contract import parse_contract
    contract = parse_contract(os.environ)
    rendezvous.init_distributed(rank=contract.dist.rank, world_size=contract.dist.world_size,
                                master_addr=contract.dist.master_addr, master_port=contract.dist.master_port,
                                backend="gloo", timeout_s=120)
    if scenario == "rebalance":
        result = rebalance_scenario(contract)
    else:
        result = link_scenario(contract, slow=scenario == "slow")
    Path(out_dir, f"rank{contract.dist.rank}.json").write_text(json.dumps(result))
    from hetero_worker.runtime.shutdown import leave_process_group
    leave_process_group()
    return 0


# ================================ orchestrator ==================================================
def _envs(scenario: str, master_addr: str, port: int) -> list[dict[str, str]]:
    from hetero_worker.runtime.simulation import local_rank_envs, simulated_cluster
    if scenario == "rebalance":
        products = [("Tesla-T4", "7.5", s) for s in SPEEDS]
        nodes = ["local"] * 4
        batches = [GLOBAL_BATCH // 4] * 4
        groups = [0] * 4
    else:  # A100 + T4 on each node: arch groups cross the link
        products = [("NVIDIA-A100-SXM4-40GB", "8.0", 1.0), ("Tesla-T4", "7.5", 1.0)] * 2
        nodes = ["node-a", "node-a", "node-b", "node-b"]
        batches = [LINK_BATCH] * 4
        groups = None
    entries, profiles = simulated_cluster(products=products, nodes=nodes, local_batches=batches,
                                          groups=groups)
    return local_rank_envs(entries=entries, profiles=profiles, hierarchy="flat",
                           master_addr=master_addr, master_port=port)


PYTHONPATH = os.pathsep.join([str(ROOT / "worker"), str(ROOT / "common"), str(ROOT / "operator")]
                             + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
"""The ranks import this tree's packages (a second checkout's too, before any editable install)."""


def launch(scenario: str, link=None, timeout_s: float = 420, seed: int = 0) -> list[dict]:
    """Start the 4 ranks of ``scenario`` (in namespaces A, A, B, B when ``link`` is given)."""
    from hetero_worker.runtime.simulation import free_port
    master = link.address("A") if link else "127.0.0.1"
    port = 29400 + os.getpid() % 500 if link else free_port()
    with tempfile.TemporaryDirectory() as out:
        procs = []
        for rank, env in enumerate(_envs(scenario, master, port)):
            node = "AB"[rank // 2]
            full = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", BENCH_SPEED_SEED=str(seed),
                        PYTHONPATH=PYTHONPATH, **env,
                        GLOO_SOCKET_IFNAME=link.device(node) if link else "lo")
            argv = [sys.executable, str(Path(__file__).resolve()), "--worker", scenario, out]
            procs.append(subprocess.Popen(link.exec_argv(node, argv) if link else argv, env=full,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        deadline = time.monotonic() + timeout_s
        for rank, proc in enumerate(procs):
            try:
                log, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                raise benchlib.BenchTimeout(f"{scenario}: rank {rank} still running after "
                                            f"{timeout_s:.0f} s") from None
            if proc.returncode != 0:
                for p in procs:
                    p.kill()
                raise RuntimeError(f"{scenario}: rank {rank} exit {proc.returncode}:\n{log[-3000:]}")
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(4)]


def _throughput(run: dict, first: int, last: int | None = None) -> float:
    times = run["step_s"][first:last]
    return GLOBAL_BATCH * len(times) / sum(times)


def _median(run: dict, skip: int = 2) -> float:
    return statistics.median(run["step_s"][skip:])


def summarize_rebalance(r: dict) -> dict:
    ideal = sum(a[0] for a in r["standalone"])
    ideal_slow = sum(a[1] for a in r["standalone"])
    equal = _throughput(r["equal"], 3)
    dyn = _throughput(r["dynamic_from_equal"], 20)
    one_time = _throughput(r["one_time_drift"], 10)
    dyn_drift = _throughput(r["dynamic_drift"], 10)
    per_step = [GLOBAL_BATCH / s for s in r["dynamic_drift"]["step_s"]]
    recover = next((k - 10 for k in range(10, 60) if statistics.mean(per_step[k:k + 3]) >= 0.85 * ideal_slow), None)
    return {
        "ideal_samples_per_s": ideal, "equal_samples_per_s": equal, "dynamic_samples_per_s": dyn,
        "dynamic_over_ideal": dyn / ideal, "dynamic_over_equal": dyn / equal,
        "final_split_static": r["dynamic_from_equal"]["splits"][-1],
        "ideal_after_drift_samples_per_s": ideal_slow,
        "one_time_after_drift_samples_per_s": one_time,
        "dynamic_after_drift_samples_per_s": dyn_drift,
        "dynamic_steps_20_60_over_new_ideal": _throughput(r["dynamic_drift"], 20) / ideal_slow,
        "steps_to_085_of_new_ideal": recover,
        "dynamic_over_one_time": dyn_drift / one_time,
        "final_split_drift": r["dynamic_drift"]["splits"][-1],
        "per_step_dynamic_drift": per_step,
        "per_step_one_time_drift": [GLOBAL_BATCH / s for s in r["one_time_drift"]["step_s"]],
    }


def summarize_modes(r: dict) -> dict:
    """Steady state: median step after 2 warm-up steps.  The ``auto`` probe runs once inside
    ``Trainer.wrap``, before the first step, and is reported on its own (``auto_probe_s``)."""
    med = {m: _median(v) for m, v in r["modes"].items()}
    fixed = {m: med[m] for m in ("flat", "node", "arch")}
    best = min(fixed, key=fixed.get)
    auto = r["modes"]["auto"]
    return {"step_s": med, "best_fixed": best, "auto_chose": auto["hierarchy"],
            "auto_over_best": fixed[best] / med["auto"], "node_over_flat": med["flat"] / med["node"],
            "auto_probe_s": auto.get("probe_s"), "auto_wrap_s": auto.get("wrap_s"),
            "wrap_s": {m: v.get("wrap_s") for m, v in r["modes"].items()},
            "flat_over_control": (med["flat"] / med["flat-control"]
                                  if "flat-control" in med else None),
            "model_matches_fastest": auto["hierarchy"] == best,
            # a different pick among modes within 5 % of each other is a tie, not a miss
            "model_choice_within_5pct": fixed.get(auto["hierarchy"], float("inf")) <= 1.05 * fixed[best],
            "predicted_sync_s": auto["predicted_s"], "trial_sync_s": auto.get("trial_s"),
            "measured_link": auto["link"]}


def summarize_pipeline(slow: dict) -> dict:
    """The pipelined node step against what it overlaps, each measured alone."""
    parts = slow["parts"]
    node, flat = _median(slow["modes"]["node"]), _median(slow["modes"]["flat"])
    bound = max(parts["backward_s"], parts["transfer_s"])
    return {"node_step_s": node, "flat_step_s": flat, **parts, "bound_s": bound,
            "node_over_bound": node / bound, "node_over_flat": flat / node}


def summarize_codecs(slow: dict, fast: dict | None) -> dict:
    c = slow["codecs"]
    losses = (fast or {}).get("losses", {})
    base_s, base_loss = _median(c["none"]), losses.get("none")
    out = {}
    for mode, run in c.items():
        loss = losses.get(mode)
        out[mode] = {"step_s": _median(run), "speedup_over_fp32": base_s / _median(run),
                     "loss": loss, "loss_rel_diff": None if loss is None or base_loss is None
                     else (loss - base_loss) / base_loss,
                     "counted_bytes": run["counted_bytes"], "veth_tx_bytes": run["veth_tx_bytes"],
                     "veth_over_counted": run["veth_tx_bytes"] / run["counted_bytes"]
                     if run["counted_bytes"] else None,
                     # the same codec's step on the unshaped link: all but the slow transfer
                     "unshaped_step_s": (fast or {}).get("fast_step_s", {}).get(mode),
                     "bytes_per_step": run["counted_bytes"] / len(run["step_s"])}
    return out


def targets(summaries: list[dict]) -> list[benchlib.Target]:
    """The issue's targets over the repeats (one value per repeat each)."""
    out: list[benchlib.Target] = []

    def add(name: str, op: str, target: float, unit: str, key, note: str = "") -> None:
        values = [v for v in (key(s) for s in summaries) if v is not None and v is not False]
        if values:
            out.append(benchlib.Target(name, op, target, unit, values, note))

    def r(s: dict, key: str):
        return s["rebalance"][key] if "rebalance" in s else None

    add("speeds 1,1,2,4 rebalanced from an equal start / ideal", ">=", 0.95, "",
        lambda s: r(s, "dynamic_over_ideal"), "ideal = sum of each rank's standalone samples/s")
    add("speeds 1,1,2,4 rebalanced / equal split (both really run)", ">=", 1.9, "x",
        lambda s: r(s, "dynamic_over_equal"))
    add("fastest rank drops to speed 1 at step 10: steps until 0.85 of the new ideal", "<=", 10,
        " steps", lambda s: None if "rebalance" not in s
        else 50 if r(s, "steps_to_085_of_new_ideal") is None  # never within the run's 50 steps
        else r(s, "steps_to_085_of_new_ideal"))
    add("... rebalancing / one-time split, steps 10-60", ">=", 1.3, "x",
        lambda s: r(s, "dynamic_over_one_time"))
    add(f"{LINK_MBIT} Mbit/s, per-node hierarchy: pipelined step / max(backward compute, "
        "cross-link transfer), each measured alone", "<=", 1.15, "x",
        lambda s: s["pipeline"]["node_over_bound"] if "pipeline" in s else None,
        "backward: forward+backward of one rank's batch, no communication; transfer: the node "
        "leaders' all-reduce of the fp32 gradient over the link, alone (MAX over ranks)")
    for part, label in (("backward_s", "backward compute alone"),
                        ("transfer_s", "cross-link transfer alone"), ("node_step_s", "pipelined step")):
        add(f"... {label} ({LINK_MBIT} Mbit/s)", "info", 0, " s",
            lambda s, part=part: s["pipeline"][part] if "pipeline" in s else None)
    add(f"{LINK_MBIT} Mbit/s: per-node hierarchy / flat", ">=", 1.4, "x",
        lambda s: s["slow_modes"]["node_over_flat"] if "slow_modes" in s
        else s["pipeline"]["node_over_flat"] if "pipeline" in s else None)
    for key, name in (("slow_modes", f"{LINK_MBIT} Mbit/s"), ("fast_modes", "unshaped veth")):
        add(f"{name}: Auto / best fixed layout", ">=", 0.95, "x",
            lambda s, key=key: s[key]["auto_over_best"] if key in s else None,
            "steady state: median step of the best of flat/node/arch over Auto's; Auto's "
            "one-time link probe is the next row")
        add(f"{name}: Auto's one-time link probe at start (inside Trainer.wrap, not in the steps)",
            "info", 0, " s", lambda s, key=key: s[key]["auto_probe_s"] if key in s else None,
            "probe all-reduces, close-call trial and regrouping; paid once per start")
    add("unshaped veth: flat / flat again (control: the same layout twice, interleaved)", "info",
        0, "x", lambda s: s["fast_modes"]["flat_over_control"] if "fast_modes" in s else None,
        "the noise of the Auto / best ratio on this machine")

    def c(s: dict, mode: str, key: str):
        return s["codecs"][mode][key] if "codecs" in s else None

    for mode, goal in (("int8", 3.0), ("powersgd", 10.0), (HIGH_RANK, 10.0)):
        label = {"int8": "int8 + error feedback", "powersgd": f"PowerSGD rank {POWERSGD_RANK}",
                 HIGH_RANK: "PowerSGD rank 16 (the default)"}[mode]
        add(f"{label}: step speed-up over fp32, {LINK_MBIT} Mbit/s", ">=", goal, "x",
            lambda s, mode=mode: c(s, mode, "speedup_over_fp32"))
        add(f"{label}: loss after {LOSS_STEPS} steps vs uncompressed", "<=", 2.0, " %",
            lambda s, mode=mode: None if c(s, mode, "loss_rel_diff") is None
            else abs(100 * c(s, mode, "loss_rel_diff")),
            "absolute relative difference; each repeat its own seed")
        add(f"{label}: best speed-up this machine allows (fp32 step over {LINK_MBIT} Mbit/s / the "
            "codec's step on the unshaped link)", "info", goal, "x",
            lambda s, mode=mode: None if not c(s, mode, "unshaped_step_s")
            else c(s, "none", "step_s") / c(s, mode, "unshaped_step_s"),
            "the codec's step without the slow transfer: the floor the 2-core machine sets")
    for mode in ("fp16", "bf16"):
        add(f"{mode}: step speed-up over fp32, {LINK_MBIT} Mbit/s", "info", 0, "x",
            lambda s, mode=mode: c(s, mode, "speedup_over_fp32"))
    return out


def render_plot(s: dict, path: Path) -> None:
    """Three panels: throughput per step across the drift, step time per hierarchy, per codec."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    if "rebalance" in s:
        r, ax = s["rebalance"], axes[0]
        ax.plot(r["per_step_dynamic_drift"], label="rebalancing")
        ax.plot(r["per_step_one_time_drift"], label="one-time split")
        ax.axhline(r["ideal_samples_per_s"], ls="--", c="grey", label="ideal before")
        ax.axhline(r["ideal_after_drift_samples_per_s"], ls=":", c="black", label="ideal after")
        ax.axvline(10, c="red", lw=0.8)
        ax.set(title="Speeds 1,1,2,4; rank 3 drops to 1 at step 10", xlabel="step",
               ylabel="samples/s")
        ax.legend(fontsize=8)
    for key, label, offset in (("slow_modes", f"{LINK_MBIT} Mbit/s", -0.2), ("fast_modes", "unshaped", 0.2)):
        if key in s:
            modes = list(s[key]["step_s"])
            axes[1].bar([i + offset for i in range(len(modes))], [s[key]["step_s"][m] * 1000 for m in modes],
                        width=0.4, label=label)
            axes[1].set_xticks(range(len(modes)), modes)
    axes[1].set(title="Step time per hierarchy (2 nodes x 2 ranks)", ylabel="ms", yscale="log")
    axes[1].legend(fontsize=8)
    if "codecs" in s:
        c = s["codecs"]
        axes[2].bar(list(c), [v["step_s"] * 1000 for v in c.values()])
        axes[2].set(title=f"Step time per codec over {LINK_MBIT} Mbit/s (node hierarchy)", ylabel="ms",
                    yscale="log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def run_repeat(repeat: int, only: str | None, deadline: benchlib.Deadline) -> tuple[dict, dict]:
    """One repeat of every setup (fresh rank processes, seed ``repeat``): (summary, raw)."""
    summary: dict = {}
    raw: dict = {}
    if only in (None, "rebalance"):
        raw["rebalance"] = launch("rebalance", timeout_s=deadline.left_s("rebalance"), seed=repeat)[0]
        summary["rebalance"] = summarize_rebalance(raw["rebalance"])
        print(json.dumps({k: v for k, v in summary["rebalance"].items() if not k.startswith("per_step")}),
              flush=True)
    if only in (None, "link", "hierarchy"):
        from netns import VethLink, available
        reason = available()
        if reason:
            print(f"skipping the link setups: {reason}", file=sys.stderr)
            return summary, raw
        with VethLink(rate_mbit=LINK_MBIT) as link:
            raw["slow"] = launch("slow", link, timeout_s=deadline.left_s("slow link"), seed=repeat)[0]
            if only == "hierarchy":
                summary["pipeline"] = summarize_pipeline(raw["slow"])
                print(json.dumps(summary["pipeline"]), flush=True)
                return summary, raw
            summary["slow_modes"] = summarize_modes(raw["slow"])
            print(json.dumps(summary["slow_modes"]), flush=True)
            link.set_rate(None)
            raw["fast"] = launch("fast", link, timeout_s=deadline.left_s("fast link"), seed=repeat)[0]
            summary["fast_modes"] = summarize_modes(raw["fast"])
            summary["codecs"] = summarize_codecs(raw["slow"], raw["fast"])
            print(json.dumps(summary["fast_modes"]), json.dumps(summary["codecs"]), flush=True)
    return summary, raw


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", nargs=2, metavar=("SCENARIO", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--only", choices=["rebalance", "link", "hierarchy"],
                        help="run one part (hierarchy: the pipelined node step on the shaped "
                        "link against its parts alone; results in speed-hierarchy.json)")
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--quick", action="store_true", help="smoke run with few steps")
    parser.add_argument("--repeats", type=int, default=benchlib.REPEATS)
    parser.add_argument("--timeout-s", type=float, default=3000.0,
                        help="whole benchmark; on expiry exit 3 and write nothing")
    parser.add_argument("--powersgd-rank", type=int, default=POWERSGD_RANK)
    args = parser.parse_args()
    if args.quick:
        os.environ["HTJ_BENCH_QUICK"] = "1"
        globals().update(LOSS_STEPS=12, CODEC_TIMING_STEPS=4, TIMING_STEPS=3, FAST_TIMING_STEPS=6)
    if args.worker:
        return worker_main(*args.worker)
    os.environ["BENCH_SPEED_POWERSGD_RANK"] = str(args.powersgd_rank)
    if args.only == "hierarchy":
        os.environ["BENCH_SPEED_PART"] = "hierarchy"
    globals().update(POWERSGD_RANK=args.powersgd_rank)
    sys.path.insert(0, str(ROOT / "worker"))
    deadline = benchlib.Deadline(args.timeout_s)
    run_meta = benchlib.meta()
    started = time.monotonic()
    summaries, raws = [], []
    for repeat in range(args.repeats):
        summary, raw = run_repeat(repeat, args.only, deadline)
        summaries.append(summary)
        raws.append(raw)
    run_meta["wall_s"] = round(time.monotonic() - started, 1)
    config = {"delay_per_sample_s": DELAY_S, "speeds": SPEEDS, "global_batch": GLOBAL_BATCH,
              "link_mbit": LINK_MBIT, "link_batch_per_rank": LINK_BATCH, "loss_steps": LOSS_STEPS,
              "codec_timing_steps": CODEC_TIMING_STEPS, "hierarchy_timing_steps": TIMING_STEPS,
              "powersgd_rank": POWERSGD_RANK, "repeats": args.repeats, "quick": bool(args.quick)}
    out = Path(args.out)
    name = "speed-hierarchy" if args.only == "hierarchy" else "speed"
    doc = benchlib.write_results(out / f"{name}.json", benchmark=name, run_meta=run_meta,
                                 targets=targets(summaries),
                                 details={"config": config, "summaries": summaries})
    raw_path = Path(tempfile.gettempdir()) / "bench-speed-raw.json"  # per-step data, not committed
    raw_path.write_text(json.dumps(raws))
    if args.only != "hierarchy":
        render_plot(summaries[-1], out / "speed.png")
    benchlib.print_targets(doc)
    print(f"total {run_meta['wall_s']:.0f} s; results in {out}; per-step data in {raw_path}")
    return 0


if __name__ == "__main__":
    sys.exit(benchlib.main_guard(main))
