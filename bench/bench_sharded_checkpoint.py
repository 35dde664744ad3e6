#!/usr/bin/env python
"""Sharded checkpoint benchmark (issues 12, 29): save and resume time and bytes on disk, Group
sharding (``torch.distributed.checkpoint``, :mod:`hetero_worker.ckpt.sharded`: the largest group
writes), Full sharding (:mod:`hetero_worker.ckpt.flatdcp`: every rank writes its uneven slices, shares
50 / 25 / 12.5 / 12.5 %) vs None (rank 0 writes one ``checkpoint.pt``).

Run from the repository root::

    .venv/bin/python bench/bench_sharded_checkpoint.py            # about a minute on 2 cores

The model is the LM of ``examples/lm-large.yaml`` (context 64, width 128, 2 blocks: 470 528
parameters; AdamW, one step taken so its state exists: 7.5 MB of parameters and optimizer state)
on 4 Gloo rank processes: simulated A100, V100 and two T4s, groups [A100] [V100] [T4, T4] (under
Group sharding the T4 pair writes, each T4 its half). Each repeat is ``t.save_checkpoint`` then
``t.resume`` into the same job, timed on rank 0 between barriers (wall seconds of the whole
collective). Figures are CPU and local-disk ones; they say nothing about a network volume or GPUs.

Writes ``bench/results/sharded-checkpoint.json`` in the shape of :mod:`benchlib` (all figures
``info``; the issue sets no target for them).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

SPLIT = [8, 4, 2, 2]
FULL_SHARES = "500000,250000,125000,125000"  # HTJ_SHARD_PPM under Full
PRODUCTS = [("NVIDIA-A100-SXM4-40GB", "8.0", 1.0), ("Tesla-V100-SXM2-16GB", "7.0", 0.5),
            ("Tesla-T4", "7.5", 0.25), ("Tesla-T4", "7.5", 0.25)]


def rank_main(out: Path, ckpt: Path, repeats: int) -> int:
    """One rank: wrap the LM, one AdamW step, then ``repeats`` x (save, resume), timed."""
    import warnings  # the LM's loss only reads the logits (docs/memory.md, FSDP2's view warning)

    import torch
    import torch.distributed as dist

    from hetero_worker import trainer as ht
    from hetero_worker.examples.lm import lm_loss, make_model
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    t = ht.init(seed=3)
    model = t.wrap(make_model(64, 128, 2, 4), block=torch.nn.TransformerEncoderLayer)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    windows = torch.randint(0, 256, (t.local_batch, 65), generator=torch.Generator().manual_seed(t.rank))
    t.step(opt, lm_loss, batch=(windows,))
    saves, loads = [], []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        t.save_checkpoint(opt, str(ckpt))
        dist.barrier()
        saves.append(time.perf_counter() - start)
        start = time.perf_counter()
        assert t.resume(opt, str(ckpt))
        dist.barrier()
        loads.append(time.perf_counter() - start)
    params = sum(p.numel() for p in t.full_state_dict().values())  # collective under Full
    if t.rank == 0:
        files = {str(p.relative_to(ckpt)): p.stat().st_size for p in sorted(ckpt.rglob("*"))
                 if p.is_file()}
        out.write_text(json.dumps({"save_s": saves, "resume_s": loads, "files": files,
                                   "parameters": params}))
    t.close()
    return 0


def run_mode(mode: str, repeats: int, workdir: Path, timeout_s: float) -> dict:
    """Start the 4 ranks with ``HTJ_SHARDING=mode``; rank 0's figures."""
    from hetero_worker.runtime.simulation import free_port, local_rank_envs, simulated_cluster

    entries, profiles = simulated_cluster(products=PRODUCTS, nodes=["a", "a", "b", "b"],
                                          local_batches=SPLIT)
    ckpt, out = workdir / f"ckpt-{mode}", workdir / f"{mode}.json"
    envs = local_rank_envs(entries=entries, profiles=profiles, master_port=free_port(),
                           checkpoint_dir=str(ckpt))
    procs = []
    for env in envs:
        env.update({"HTJ_SHARDING": mode, "OMP_NUM_THREADS": "1", "HTJ_SIM_DELAY_PER_SAMPLE_S": "0",
                    "PYTHONPATH": str(ROOT / "worker"), "HTJ_SHARD_PPM": FULL_SHARES})
        procs.append(subprocess.Popen(
            [sys.executable, __file__, "--rank-mode", "--out", str(out), "--ckpt", str(ckpt),
             "--repeats", str(repeats)], env={**__import__("os").environ, **env}, cwd=ROOT))
    codes = [p.wait(timeout=timeout_s) for p in procs]
    if any(codes):
        raise ValueError(f"{mode}: rank exit codes {codes}")
    return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rank-mode", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--ckpt", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--results", type=Path, default=ROOT / "bench/results/sharded-checkpoint.json")
    args = parser.parse_args()
    if args.rank_mode:
        return rank_main(args.out, args.ckpt, args.repeats)

    import benchlib

    run_meta = benchlib.meta()
    with tempfile.TemporaryDirectory() as tmp:
        figures = {mode: run_mode(mode, args.repeats, Path(tmp), 300)
                   for mode in ("full", "group", "none")}
    targets = []
    for mode, label in (("full", "Full (DCP, every rank its slices)"),
                        ("group", "Group (DCP, the T4 pair writes)"), ("none", "None (rank 0 writes)")):
        f = figures[mode]
        targets.append(benchlib.Target(f"save, {label}", "info", 0.0, " s", f["save_s"],
                                       "rank 0, between barriers"))
        targets.append(benchlib.Target(f"resume, {label}", "info", 0.0, " s", f["resume_s"],
                                       "rank 0, read + agree + load, between barriers"))
    details = {mode: {"files": f["files"], "parameters": f["parameters"],
                      "bytes_total": sum(f["files"].values())} for mode, f in figures.items()}
    doc = benchlib.write_results(args.results, benchmark="sharded-checkpoint", run_meta=run_meta,
                                 targets=targets, details=details)
    benchlib.print_targets(doc)
    for mode, d in details.items():
        print(f"{mode}: {d['parameters']} parameters, files {d['files']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
