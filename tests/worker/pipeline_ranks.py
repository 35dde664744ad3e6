"""Rank script of ``test_pipeline_procs.py``: the pipelined hierarchy on real Gloo ranks.

For every hierarchical layout (group, node, arch) of the A100 / V100 / 2x T4 contract with
uneven batches, a float64 model whose DDP buckets are rebuilt after the first step into another
partition of its parameters (registered a, b, c, applied c -> b -> a, 300-byte buckets) trains 3
SGD steps through the pipeline: plainly (its parameters against one process on the full batch),
with the rebalancer's stats riding in the first bucket (their sum), and with int8 and PowerSGD
on the leaders' link (the codec state's parameters after the rebuild; stderr says whether any
state was reset). Writes ``<out>/rank<R>.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import sys

import torch
from rank_main import run_and_write
from torch.nn.parallel import DistributedDataParallel

from hetero_worker import trainer as ht
from hetero_worker.comm.groups import build_process_groups
from hetero_worker.comm.sync import WeightedGradSync
from hetero_worker.speed.codecs import CompressionConfig
from hetero_worker.speed.controller import CodecReducer, codec_hook
from heterotrain_common.topology import build_layout

STEPS = 3
BUCKET_CAP_MB = 300 / (1 << 20)  # 300 bytes: 2 buckets, re-partitioned at the rebuild


class Rebuilt(torch.nn.Module):
    """Registered a, b, c; applied c -> b -> a, so gradients become ready in a, b, c order while
    DDP's first buckets follow reverse registration order (c, b, a)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(7)
        self.a = torch.nn.Linear(5, 3)
        self.b = torch.nn.Linear(4, 5)
        self.c = torch.nn.Linear(6, 4)
        self.double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(torch.tanh(self.b(torch.tanh(self.c(x)))))


def data(batches: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    n = sum(batches) * STEPS
    return (torch.randn(n, 6, generator=g, dtype=torch.float64),
            torch.randn(n, 3, generator=g, dtype=torch.float64))


def reference(batches: list[int]) -> list[torch.Tensor]:
    model = Rebuilt()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data(batches)
    big = sum(batches)
    for s in range(STEPS):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[s * big:(s + 1) * big]),
                                     y[s * big:(s + 1) * big]).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def train(rank: int, batches: list[int], sync: WeightedGradSync,
          reducer: CodecReducer | None) -> tuple[list[torch.Tensor], list[list[list[int]]], list]:
    """3 steps; returns parameters, the buckets' parameter indices per step, merged stats."""
    module = Rebuilt()
    index = {id(p): i for i, p in enumerate(module.parameters())}
    model = DistributedDataParallel(module, bucket_cap_mb=BUCKET_CAP_MB,
                                    gradient_as_bucket_view=True)
    seen: list[list[list[int]]] = []

    def recording(state, bucket):  # type: ignore[no-untyped-def]  # unannotated: DDP checks them
        seen[-1].append(sorted(index[id(p)] for p in bucket.parameters()))
        if reducer is not None:
            return codec_hook(reducer, bucket)
        return sync.submit(bucket.buffer())

    if reducer is not None:
        reducer.param_index = index
        reducer.param_numels = [p.numel() for p in module.parameters()]
        reducer.install()
    model.register_comm_hook(None, recording)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data(batches)
    big, off = sum(batches), sum(batches[:rank])
    merged = []
    for s in range(STEPS):
        seen.append([])
        if reducer is not None:
            reducer.set_pending([0.0] * rank + [float(rank + 1) * (s + 1)]
                                + [0.0] * (len(batches) - rank - 1))
        lo = s * big + off
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[lo:lo + batches[rank]]),
                                     y[lo:lo + batches[rank]]).backward()
        opt.step()
        if reducer is not None:
            got = reducer.take_merged()
            merged.append(None if got is None else got.tolist())
    return [p.detach().clone() for p in module.parameters()], seen, merged


def digest(params: list[torch.Tensor]) -> str:
    return hashlib.sha256(b"".join(p.numpy().tobytes() for p in params)).hexdigest()


def pipeline_scenario(t: ht.Trainer) -> dict:
    batches = list(t.contract.local_batches)
    ref = reference(batches)
    topo = [e.group for e in t.contract.topology]
    out: dict = {}
    for mode in ("group", "node", "arch"):
        groups = build_process_groups(build_layout(t.contract.topology, mode), t.rank,
                                      topology_group_of=topo)
        runs = {"plain": None, "stats": "none", "int8": "int8", "powersgd": "powersgd"}
        for name, codec in runs.items():
            sync = WeightedGradSync(groups, batches)
            reducer = None if codec is None else CodecReducer(
                sync, CompressionConfig(mode=codec, powersgd_rank=2))
            params, seen, merged = train(t.rank, batches, sync, reducer)
            out[f"{mode}/{name}"] = {
                "diff": max((a - b).abs().max().item() for a, b in zip(params, ref, strict=True)),
                "digest": digest(params), "buckets": seen, "merged": merged,
                "codec_keys": sorted(sorted(c.keys) for c in reducer.codecs.values()
                                     if getattr(c, "keys", None) is not None) if reducer else [],
                "layout_groups": [list(g) for g in groups.layout.groups],
                "leader": groups.is_leader}
            sync.close()
        groups.destroy()
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    return run_and_write(pipeline_scenario, args.out)


if __name__ == "__main__":
    sys.exit(main())
