#!/usr/bin/env python
"""GPU timing for ``bench/gpu_check.sh``: the hierarchy with NCCL inside each group and Gloo
across, against the flat layout, on one GPU shared by several rank processes (issue 23).

Four rank processes on ``cuda:0``, each its own topology group (ranks sharing one physical GPU
may not share an NCCL communicator, so the groups are NCCL groups of one): ``group`` runs the
in-group collectives on NCCL and the leaders' all-reduce over Gloo through a host copy; ``flat``
runs one Gloo all-reduce over all ranks through a host copy. Both train the speed benchmark's
MLP (256-1024-1024-4, fp32, 8 samples per rank) through the real ``Trainer`` for
``WARMUP + STEPS`` steps; rank 0 reports the median step. Prints one table row per layout and
the ratio ``group / flat``. A timing, not a test: nothing fails on the ratio.

    python bench/gpu_hierarchy.py            # about 1 minute
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORLD = 4
BATCH = 8
WARMUP, STEPS = 3, 20
PRODUCT = "GPU-under-test"


def worker(out: str) -> int:
    import torch

    from hetero_worker import trainer as ht
    t = ht.init()
    torch.manual_seed(5)
    model = t.wrap(torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                       torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                       torch.nn.Linear(1024, 4)))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(BATCH * WORLD * (WARMUP + STEPS), 256, generator=g)
    data = torch.utils.data.TensorDataset(x, x[:, :4].argmax(dim=1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    times = []

    def sync() -> None:  # a CPU dry run of this script has nothing to wait for
        if t.device.type == "cuda":
            torch.cuda.synchronize(t.device)

    for xb, yb in t.loader(data, shuffle=False):
        sync()
        start = time.perf_counter()
        t.step(opt, lambda m: torch.nn.functional.cross_entropy(m(xb), yb))
        sync()
        times.append(time.perf_counter() - start)
    if t.rank == 0:
        Path(out).write_text(json.dumps({"median_step_s": statistics.median(times[WARMUP:]),
                                         "layout": t.layout.mode, "device": str(t.device),
                                         "intra_backend": t.groups.intra_backend}))
    t.close()
    return 0


def run(hierarchy: str) -> dict:
    sys.path.insert(0, str(ROOT / "worker"))
    sys.path.insert(0, str(ROOT / "common"))
    from hetero_worker.runtime.simulation import free_port, local_rank_envs
    from heterotrain_common import contract as c
    entries = [c.RankEntry(rank=r, group=r, node="gpu-node", gpu_product=PRODUCT,
                           compute_capability="8.0", local_batch=BATCH) for r in range(WORLD)]
    profiles = [c.DeviceProfile(product=PRODUCT, compute_capability="8.0")] * WORLD
    envs = local_rank_envs(entries=entries, profiles=profiles, precision="fp32",
                           hierarchy=hierarchy, master_port=free_port())
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp, "rank0.json")
        procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(result)],
                                  env=dict(os.environ, OMP_NUM_THREADS="1", **env), cwd=ROOT)
                 for env in envs]
        codes = [p.wait(timeout=240) for p in procs]
        if any(codes):
            raise RuntimeError(f"{hierarchy}: rank exit codes {codes}")
        return json.loads(result.read_text())


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        return worker(sys.argv[2])
    rows = {h: run(h) for h in ("group", "flat")}
    print(f"\n{'layout (4 ranks on one GPU)':<48}  median step")
    labels = {"group": "hierarchy: NCCL in each group, Gloo across",
              "flat": "flat: one Gloo all-reduce (host copy)"}
    for h, r in rows.items():
        print(f"{labels[h]:<48}  {1000 * r['median_step_s']:8.2f} ms  ({r['intra_backend']} intra)")
    ratio = rows["group"]["median_step_s"] / rows["flat"]["median_step_s"]
    print(f"{'hierarchy / flat':<48}  {ratio:8.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
