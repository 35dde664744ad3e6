"""Run inside each rank process by the multi-process tests; writes ``<out>/rank<R>.json``.

One spawn checks several facts (spawning costs seconds each). Scenarios:

* ``main``: case 16 groups, gradient equivalence (flat/group/node/arch, hook and manual, plus the
  plain-DDP negative control), step-count agreement through the trainer's loader, inf/NaN
  agreement (unit and end-to-end through ``Trainer.step`` in fp16).
* ``case15``: two ranks, batches 12/6, linear 8->1 with MSE, against a single process.
* ``join``: rendezvous then one all-reduce (case 17).
* ``stream``: the trainer's loader over an ``IterableDataset`` with 2 DataLoader workers, a split
  change after the first step, against a single process on the full batches (issue 22).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch
import torch.distributed as dist
from rank_main import run_and_write
from torch.nn.parallel import DistributedDataParallel

from hetero_worker import trainer as ht
from hetero_worker.comm.groups import build_process_groups, hierarchical_all_reduce_
from hetero_worker.comm.sync import WeightedGradSync
from hetero_worker.precision import AgreeingGradScaler
from heterotrain_common.topology import build_layout, layout_from_node_sizes


def case16(t: ht.Trainer) -> dict:
    """Hierarchical all-reduce of rank+1 over node sizes 2,2 and 3,1 (every rank builds all)."""
    values = {}
    for sizes in ([2, 2], [3, 1]):
        layout = layout_from_node_sizes(sizes)
        groups = build_process_groups(layout, t.rank, topology_group_of=[0, 0, 1, 1])
        x = torch.tensor([float(t.rank + 1)])
        hierarchical_all_reduce_(x, groups)
        values[",".join(map(str, sizes))] = {"sum": x.item(), "groups": layout.groups,
                                             "leaders": layout.leaders}
    return values


def make_mlp() -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(),
                               torch.nn.Linear(5, 3)).double()


def make_data(batches: list[int], steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    n = sum(batches) * steps
    return (torch.randn(n, 6, generator=g, dtype=torch.float64),
            torch.randn(n, 3, generator=g, dtype=torch.float64))


def reference_params(batches: list[int], steps: int) -> list[torch.Tensor]:
    """Single process, full global batch, mean MSE, SGD lr 0.1."""
    model = make_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = make_data(batches, steps)
    big = sum(batches)
    for s in range(steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[s * big:(s + 1) * big]),
                                     y[s * big:(s + 1) * big]).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def distributed_params(rank: int, batches: list[int], steps: int, *, sync: WeightedGradSync | None,
                       manual: bool = False, fast_flat: bool = True) -> list[torch.Tensor]:
    """Each rank trains on its slice; ``sync=None`` is plain DDP (the averaging bug)."""
    module = make_mlp()
    if manual:
        model = module
    else:
        model = DistributedDataParallel(module)
        if sync is not None:
            sync.register(model, fast_flat=fast_flat)
    factor = sync.loss_factor if sync is not None else 1.0
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = make_data(batches, steps)
    big, off = sum(batches), sum(batches[:rank])
    for s in range(steps):
        lo = s * big + off
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x[lo:lo + batches[rank]]),
                                            y[lo:lo + batches[rank]])
        (loss * factor).backward()
        if manual:
            sync.sync_after_backward(model.parameters())
        opt.step()
    return [p.detach().clone() for p in module.parameters()]


def max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b, strict=True))


def gradient_equivalence(t: ht.Trainer, steps: int = 2) -> dict:
    batches = list(t.contract.local_batches)
    ref = reference_params(batches, steps)
    topo_groups = [e.group for e in t.contract.topology]
    out = {}
    for mode in ("flat", "group", "node", "arch"):
        groups = build_process_groups(build_layout(t.contract.topology, mode), t.rank,
                                      topology_group_of=topo_groups)
        sync = WeightedGradSync(groups, batches)
        out[f"hook/{mode}"] = max_diff(distributed_params(t.rank, batches, steps, sync=sync), ref)
        if mode == "flat":  # the Python hook too, not only the built-in fast path
            pyhook = WeightedGradSync(groups, batches)
            out["pyhook/flat"] = max_diff(distributed_params(t.rank, batches, steps, sync=pyhook,
                                                             fast_flat=False), ref)
        if mode == "group":
            out["manual/group"] = max_diff(
                distributed_params(t.rank, batches, steps, sync=sync, manual=True), ref)
            out["inter_group_bytes/group"] = sync.inter_group_bytes
    out["plain_ddp"] = max_diff(distributed_params(t.rank, batches, steps, sync=None), ref)
    return out


def inf_agreement_unit(rank: int) -> dict:
    """Rank 2 alone has an inf gradient; agreeing scaler vs plain scaler."""
    out = {}
    for name, scaler in (("agreeing", AgreeingGradScaler("cpu", init_scale=1024.0)),
                         ("plain", torch.amp.GradScaler("cpu", init_scale=1024.0))):
        torch.manual_seed(3)
        model = torch.nn.Linear(4, 2)
        before = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        scaler.scale(model(torch.ones(2, 4)).sum()).backward()
        if rank == 2:
            model.weight.grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
        out[name] = {"changed": max_diff(list(model.parameters()), before) > 0,
                     "scale": scaler.get_scale()}
    return out


def inf_agreement_trainer(t: ht.Trainer, precision: str) -> dict:
    """End to end through Trainer.step; rank 2's batch holds an inf at step 0."""
    fp16 = ht.Trainer(dataclasses.replace(t.contract, precision=precision), delay_per_sample_s=0.0)
    torch.manual_seed(5)
    model = fp16.wrap(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                          torch.nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.ones(fp16.local_batch, 4)
    results = []
    for step in range(2):
        if step == 0 and t.rank == 2:
            x[0, 0] = float("inf")
        before = [p.detach().clone() for p in fp16.module.parameters()]
        res = fp16.step(opt, lambda m: m(x).float().pow(2).mean())
        x[0, 0] = 1.0
        results.append({"skipped": res.skipped,
                        "changed": max_diff(list(fp16.module.parameters()), before) > 0})
    flat = torch.cat([p.detach().flatten() for p in fp16.module.parameters()])
    everyone = [torch.zeros_like(flat) for _ in range(t.contract.dist.world_size)]
    dist.all_gather(everyone, flat)
    return {"steps": results, "scale": fp16.scaler.get_scale() if fp16.scaler else None,
            "params_equal_all_ranks": all(torch.equal(flat, o) for o in everyone)}


def loader_steps(t: ht.Trainer) -> dict:
    """Batches per epoch through the trainer's loader, and a mid-epoch split change."""
    dataset = torch.utils.data.TensorDataset(torch.arange(101))
    loader = t.loader(dataset)
    seen, counts = [], []
    for epoch in range(2):
        n = 0
        for step, (idx,) in enumerate(loader):
            if epoch == 1 and step == 2:
                t.set_split(list(reversed(t.contract.local_batches)))
            seen.append([epoch, idx.tolist()])
            n += 1
        counts.append(n)
    return {"counts": counts, "seen": seen, "epoch": t.epoch}


def main_scenario(t: ht.Trainer) -> dict:
    return {"case16": case16(t), "equivalence": gradient_equivalence(t),
            "inf_unit": inf_agreement_unit(t.rank),
            "inf_trainer": inf_agreement_trainer(t, "fp16"),
            # A100 ranks in bf16 (no scaler) next to fp16 ranks: all join the agreement.
            "inf_mixed": inf_agreement_trainer(t, "bf16" if t.rank in (0, 1) else "fp16"),
            "loader": loader_steps(t)}


def case15_scenario(t: ht.Trainer) -> dict:
    """Case 15: linear 8->1, MSE mean, batches 12/6, seed 1234."""
    batches = list(t.contract.local_batches)
    g = torch.Generator().manual_seed(1234)
    x, y = torch.randn(18, 8, generator=g), torch.randn(18, 1, generator=g)

    def fresh() -> torch.nn.Module:
        torch.manual_seed(1234)
        return torch.nn.Linear(8, 1)

    ref = fresh()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    torch.nn.functional.mse_loss(ref(x), y).backward()
    ref_opt.step()
    off = sum(batches[:t.rank])
    xs, ys = x[off:off + t.local_batch], y[off:off + t.local_batch]
    out = {}
    for name, weighted in (("weighted", True), ("naive", False)):
        model = DistributedDataParallel(fresh())
        factor = 1.0
        if weighted:
            t.sync.register(model)
            factor = t.sync.loss_factor
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        (torch.nn.functional.mse_loss(model(xs), ys) * factor).backward()
        opt.step()
        out[name] = max_diff(list(model.module.parameters()), list(ref.parameters()))
    return out


class PairStream(torch.utils.data.IterableDataset):
    """``(x[i], y[i])`` in order; with workers, sample ``i`` from worker ``i % num_workers``."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = torch.utils.data.get_worker_info()
        step, first = (1, 0) if info is None else (info.num_workers, info.id)
        for i in range(first, len(self.x), step):
            yield self.x[i], self.y[i]


def stream_scenario(t: ht.Trainer, steps: int = 3) -> dict:
    """Train ``steps`` steps on a stream of the reference's samples (plus a remainder of 7 that
    is dropped); the full-batch update does not depend on the split, so a split change after the
    first step must still give the single-process result."""
    batches = list(t.contract.local_batches)
    x, y = make_data(batches, steps)
    stream = PairStream(torch.cat([x, x[:7]]), torch.cat([y, y[:7]]))
    model = t.wrap(make_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sizes = []
    for xb, yb in t.loader(stream, num_workers=2):
        sizes.append(len(xb))
        t.step(opt, lambda m, xb=xb, yb=yb: torch.nn.functional.mse_loss(m(xb), yb))
        if t.global_step == 1:
            t.set_split(list(reversed(batches)))
    return {"sizes": sizes, "epoch": t.epoch, "position": t.sampler.state_dict(),
            "diff": max_diff(list(t.module.parameters()), reference_params(batches, steps))}


def join_scenario(t: ht.Trainer) -> dict:
    x = torch.tensor([float(t.rank + 1)])
    dist.all_reduce(x)
    return {"sum": x.item()}


SCENARIOS = {"main": main_scenario, "case15": case15_scenario, "join": join_scenario,
             "stream": stream_scenario}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    return run_and_write(SCENARIOS[args.scenario], args.out)


if __name__ == "__main__":
    sys.exit(main())
