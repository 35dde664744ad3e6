"""Run inside each rank process by the speed tests; writes ``<out>/rank<R>.json``.

Scenarios (one spawn each, several facts per spawn):

* ``codecs``: 4 ranks on 2 simulated nodes, node hierarchy; the same small training run with every
  inter-group codec (none, fp16, bf16, int8, powersgd) -> final loss, counted leader bytes, and
  the exact stats pass-through; plus work stealing with one rank stalled for a whole step.
* ``rebalance``: 4 ranks through :class:`hetero_worker.trainer.Trainer` + :func:`speed.attach`
  with rebalancing on and one slow rank; records every step's sample indices, split and the
  parameters so the test can replay the steps in one process.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from hetero_worker import trainer as ht
from hetero_worker.comm.groups import build_process_groups
from hetero_worker.comm.sync import WeightedGradSync
from hetero_worker.speed.codecs import MODES, CompressionConfig, theoretical_bytes
from hetero_worker.speed.controller import CodecReducer, SpeedConfig, attach
from hetero_worker.speed.rebalance import RebalanceConfig
from hetero_worker.speed.stealing import MicroBatchDispenser, default_store, steal_step
from heterotrain_common.topology import build_layout

CODEC_STEPS = 150
CODEC_BATCH = 16


def codec_model() -> torch.nn.Module:
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 4))


def codec_data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed teacher task; each rank its own samples per step."""
    g = torch.Generator().manual_seed(100 + rank)
    teacher = torch.Generator().manual_seed(1)
    w = torch.randn(32, 4, generator=teacher)
    x = torch.randn(CODEC_STEPS * CODEC_BATCH, 32, generator=g)
    return x, (x @ w).argmax(dim=1)


def eval_loss(model: torch.nn.Module) -> float:
    xs, ys = zip(*(codec_data(r) for r in range(4)))
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(torch.cat(xs)), torch.cat(ys)))


def train_with_codec(rank: int, groups, mode: str) -> dict:
    model = codec_model()
    sync = WeightedGradSync(groups, [CODEC_BATCH] * 4)
    reducer = CodecReducer(sync, CompressionConfig(mode=mode, powersgd_rank=4))
    reducer.install()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    x, y = codec_data(rank)
    for step in range(CODEC_STEPS):
        opt.zero_grad()
        sl = slice(step * CODEC_BATCH, (step + 1) * CODEC_BATCH)
        torch.nn.functional.cross_entropy(model(x[sl]), y[sl]).backward()
        reducer.set_pending([float(rank == r) * (r + 0.25) for r in range(4)])
        sync.sync_after_backward(model.parameters())
        merged = reducer.take_merged().tolist()
        opt.step()
    shapes = [p.shape for p in model.parameters()]
    per_step = theoretical_bytes(CompressionConfig(mode=mode, powersgd_rank=4), shapes, leaders=2)
    return {"loss": eval_loss(model), "bytes_counted": reducer.codec_bytes_sent,
            "bytes_theory": per_step * CODEC_STEPS if groups.is_leader else 0,
            "stats": merged, "param0": [float(p.sum()) for p in model.parameters()]}


def stealing_check(rank: int) -> dict:
    """3 steps of 8 micro-batches of 4; rank 1 sits out step 1 until the others took everything."""
    store = default_store()
    torch.manual_seed(3)
    model = torch.nn.Linear(5, 2).double()
    g = torch.Generator().manual_seed(9)
    x = torch.randn(3 * 32, 5, generator=g, dtype=torch.float64)
    y = torch.randn(3 * 32, 2, generator=g, dtype=torch.float64)
    disp = MicroBatchDispenser(store=store, global_batch=32, micro_batch=4, prefix="test/steal")
    out = []
    for step in range(3):
        if step == 1 and rank == 1:
            store.wait(["test/steal/drained1"])  # stalled for the whole step
        base = step * 32

        def compute(lo: int, hi: int) -> torch.Tensor:
            pred = model(x[base + lo:base + hi])
            return ((pred - y[base + lo:base + hi]) ** 2).sum()

        res = steal_step(step=step, dispenser=disp, params=list(model.parameters()), compute=compute,
                         on_drained=(lambda: store.set("test/steal/drained1", "1"))
                         if (step == 1 and rank == 0) else None)
        grads = [p.grad.clone() for p in model.parameters()]
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        out.append({"taken": list(res.taken), "total": res.total_samples,
                    "grad": [gr.reshape(-1).tolist() for gr in grads]})
    return {"steps": out, "params": [p.detach().reshape(-1).tolist() for p in model.parameters()]}


def int8_pieces(groups) -> dict:
    """Pipelined pieces give the same sum as one piece; the sum equals the decoded inputs' sum."""
    from hetero_worker.speed.int8 import Int8Compression, dequantize_int8, quantize_int8
    if groups.leaders is None:
        return {}
    g = torch.Generator().manual_seed(20 + groups.rank)
    x = torch.randn(1000, generator=g)
    one, many = x.clone(), x.clone()
    Int8Compression(chunk=64, piece_chunks=10**6).allreduce_([one], groups.leaders)
    exact = torch.tensor([float(groups.rank), 1.0])
    Int8Compression(chunk=64, piece_chunks=2).allreduce_([many], groups.leaders, exact=exact)
    q, s = quantize_int8(x, 64)
    mine = dequantize_int8(q, s, 64)
    dist.all_reduce(mine, group=groups.leaders)
    return {"pieces_equal": bool(torch.equal(one, many)),
            "sum_of_decoded": float((one - mine).abs().max()), "exact": exact.tolist()}


def trainer_stealing(t: ht.Trainer) -> dict:
    """Two work-stealing steps through the trainer (sampler order, hierarchical reduction)."""
    from hetero_worker.speed.stealing import trainer_steal_step
    torch.manual_seed(3)
    model = t.wrap(torch.nn.Linear(5, 2).double())
    g = torch.Generator().manual_seed(9)
    data = torch.utils.data.TensorDataset(torch.randn(80, 5, generator=g, dtype=torch.float64),
                                          torch.randn(80, 2, generator=g, dtype=torch.float64))
    t.loader(data)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    disp = MicroBatchDispenser(store=default_store(), global_batch=sum(t.local_batches),
                               micro_batch=5, prefix="test/tsteal")

    def loss_sum(module, idx):
        x, y = data[idx]
        return ((module(x) - y) ** 2).sum()

    taken = [list(trainer_steal_step(t, opt, disp, loss_sum).taken) for _ in range(2)]
    return {"taken": taken, "params": [p.detach().reshape(-1).tolist() for p in t.module.parameters()],
            "cursor": t.sampler.cursor}


def codecs_scenario(t: ht.Trainer) -> dict:
    layout = build_layout(t.contract.topology, "node")
    groups = build_process_groups(layout, t.rank, topology_group_of=[e.group for e in t.contract.topology])
    result = {mode: train_with_codec(t.rank, groups, mode) for mode in MODES}
    result["int8_pieces"] = int8_pieces(groups)
    result["trainer_stealing"] = trainer_stealing(t)
    result["stealing"] = stealing_check(t.rank)
    return result


def rebalance_scenario(t: ht.Trainer) -> dict:
    config = SpeedConfig(rebalance=RebalanceConfig(interval_steps=3, max_change_fraction=0.25),
                         compression=CompressionConfig(mode="none"))
    speed = attach(t, config)
    torch.manual_seed(7)
    model = t.wrap(torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(),
                                       torch.nn.Linear(5, 3)).double())
    g = torch.Generator().manual_seed(11)
    data = torch.utils.data.TensorDataset(torch.randn(160, 6, generator=g, dtype=torch.float64),
                                          torch.randn(160, 3, generator=g, dtype=torch.float64),
                                          torch.arange(160))
    loader = t.loader(data)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    steps = []
    for epoch in range(2):  # two epochs of 160 / 32 = 5 steps
        for x, y, idx in loader:
            split = list(t.local_batches)
            speed.step(opt, lambda m: torch.nn.functional.mse_loss(m(x), y))
            steps.append({"split": split, "indices": idx.tolist(), "epoch": epoch})
    params = [p.detach().reshape(-1).tolist() for p in t.module.parameters()]
    return {"steps": steps, "params": params, "history": speed.rebalancer.history,
            "throughput": speed.throughput_by_class()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["codecs", "rebalance"])
    parser.add_argument("out")
    args = parser.parse_args()
    t = ht.init(sync_mode="hook")
    result = {"codecs": codecs_scenario, "rebalance": rebalance_scenario}[args.scenario](t)
    Path(args.out, f"rank{t.rank}.json").write_text(json.dumps(result))
    t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())


# --- test-side helpers (imported by the test modules; not used inside rank processes) -----------
def spawn(scenario: str, out: Path, *, speeds: list[float], batches: list[int],
          nodes: list[str], delay_per_sample_s: float = 0.0, timeout_s: float = 150) -> list[dict]:
    """Start one process per rank running ``scenario``; return their JSON results.

    Raises:
        AssertionError: a rank failed or timed out (its stderr tail in the message).
    """
    from rankproc import assert_ok, read_rank_json, run_ranks

    from hetero_worker.runtime.simulation import free_port, local_rank_envs, simulated_cluster
    products = [("NVIDIA-A100-SXM4-40GB" if s >= 1 else "Tesla-T4", "8.0" if s >= 1 else "7.5", s)
                for s in speeds]
    entries, profiles = simulated_cluster(products=products, nodes=nodes, local_batches=batches)
    envs = local_rank_envs(entries=entries, profiles=profiles, hierarchy="node",
                           master_port=free_port())
    assert_ok(run_ranks([sys.executable, __file__, scenario, str(out)], envs, timeout_s=timeout_s,
                        HTJ_SIM_DELAY_PER_SAMPLE_S=str(delay_per_sample_s)))
    return read_rank_json(Path(out), len(envs))
