"""One rank of a tiny real data-parallel run that exports worker metrics (used by workload.py).

Usage: ``python ddp_metrics_worker.py STOP_FILE STEP_SLEEP_S MAX_S`` with the rank-form contract in
the environment. Each step: forward/backward of a linear model on the rank's local batch, a real
gloo all-reduce of the batch-weighted gradients, an SGD step, then ``WorkerMetrics.observe_step``.
The ranks agree every step (all-reduce of a flag) on whether to stop, so they all take the same
number of steps and exit 0 together once STOP_FILE exists or MAX_S seconds have passed.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

from hetero_worker.metrics import WorkerMetrics
from hetero_worker.runtime.shutdown import leave_process_group
from heterotrain_common.contract import parse_contract


def main(stop_file: str, step_sleep_s: float, max_s: float) -> int:
    c = parse_contract(os.environ)
    torch.set_num_threads(1)
    torch.manual_seed(c.dist.rank)
    dist.init_process_group("gloo", init_method=f"tcp://{c.dist.master_addr}:{c.dist.master_port}",
                            rank=c.dist.rank, world_size=c.dist.world_size)
    metrics = WorkerMetrics(c)
    metrics.start_server(addr="127.0.0.1")
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    weight = c.local_batch / c.global_batch  # local mean * b/B, summed = global mean
    started = time.monotonic()
    while True:
        t0 = time.perf_counter()
        x, y = torch.randn(c.local_batch, 16), torch.randint(0, 4, (c.local_batch,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        t1 = time.perf_counter()
        for p in model.parameters():
            p.grad.mul_(weight)
            dist.all_reduce(p.grad)
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        metrics.observe_step(t3 - t0, (t1 - t0) + (t3 - t2), t2 - t1, c.local_batch, loss.item())
        stop = torch.tensor([float(os.path.exists(stop_file) or time.monotonic() - started > max_s)])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop.item() > 0:
            break
        time.sleep(step_sleep_s)  # sync-ok: the workload's deliberate step time
    leave_process_group()
    metrics.stop_server()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3])))
