"""Run inside each rank process by tests/gpu/test_gpu_trainer.py; writes ``<out>/rank<R>.json``.

Every rank runs the real :class:`hetero_worker.trainer.Trainer` on the one CUDA device of the
machine (``cuda:0``): several rank processes share the GPU, each in its own topology group, so
the plan gives NCCL groups of one and Gloo between the leaders (the heterogeneous path on a
single card). Every process group created is recorded (spy on torch's group helper).

Scenarios: ``groups`` (fp32, exact groups, gradients against one process, allocator metrics),
``bf16``, ``fp16`` (scaler, inf on one rank skips everywhere), ``steal`` (work stealing under
fp16 autocast and scaler), ``int8`` / ``powersgd`` (compression through the trainer plus the
codec on CUDA tensors), ``resume`` (``--kill-at N`` exits hard after step N; a second start
resumes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

CREATED: list[list] = []
STEPS = 6
DEVICE = torch.device("cuda:0")  # main() sets the trainer's device (CPU for a dry run of this file)


def _spy() -> None:
    helper = c10d._new_process_group_helper

    def recording(group_size, group_rank, ranks, backend, *args, **kwargs):  # type: ignore[no-untyped-def]
        CREATED.append([str(backend), list(ranks) or None])
        return helper(group_size, group_rank, ranks, backend, *args, **kwargs)

    c10d._new_process_group_helper = recording


def make_model(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 4)).to(dtype)


def make_data(n: int, dtype: torch.dtype = torch.float32) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(n, 16, generator=g, dtype=dtype)
    return torch.utils.data.TensorDataset(x, x[:, :4] * 0.5 + 0.1)


def params_of(module: torch.nn.Module) -> list[float]:
    return [float(v) for p in module.parameters() for v in p.detach().double().cpu().reshape(-1)]


def train(t, model, data, steps: int, *, inf_at: int | None = None, kill_at: int | None = None):  # type: ignore[no-untyped-def]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = t.loader(data, shuffle=False)
    t.resume(opt)  # after wrap and loader: the sampler position is part of the state
    results = []
    while t.global_step < steps:
        for x, y in loader:
            poison = inf_at is not None and t.global_step == inf_at and t.rank == 1

            def loss_fn(m, x=x, y=y, poison=poison):  # type: ignore[no-untyped-def]
                loss = torch.nn.functional.mse_loss(m(t.to_device(x)).float(), t.to_device(y).float())
                return loss * float("inf") if poison else loss

            results.append(t.step(opt, loss_fn))
            t.maybe_checkpoint(opt, every_steps=2 if t.contract.checkpoint.dir else 0)
            if kill_at is not None and t.global_step == kill_at:
                os._exit(17)  # killed mid-run: no clean shutdown
            if t.global_step >= steps:
                break
    return opt, results


def reference(batches: list[int], steps: int) -> list[float]:
    """One process, the whole global batch, on the GPU (no autocast)."""
    model = make_model().to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = make_data(sum(batches) * STEPS * 2)  # the very tensors the ranks train on
    big = sum(batches)
    for s in range(steps):
        x, y = data[s * big:(s + 1) * big]
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x.to(DEVICE)), y.to(DEVICE)).backward()
        opt.step()
    return params_of(model)


def scenario(name: str, t, args) -> dict:  # type: ignore[no-untyped-def]
    batches = list(t.local_batches)
    facts: dict = {"device": str(t.device), "trainer_groups": [
        [g.backend, list(g.ranks)] for g in t.groups.plan.to_create()],
        "ddp_backend": dist.get_backend(t.groups.ddp_group)}
    if name == "steal":
        from hetero_worker.speed.stealing import MicroBatchDispenser, default_store
        model = t.wrap(make_model())
        data = make_data(sum(batches) * STEPS)
        t.loader(data, shuffle=False)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        disp = MicroBatchDispenser(store=default_store(), global_batch=sum(batches), micro_batch=3,
                                   prefix="gpu/steal")

        def loss_sum(module, idx):  # type: ignore[no-untyped-def]
            x, y = data[idx]
            return torch.nn.functional.mse_loss(module(x.to(DEVICE)).float(), y.to(DEVICE),
                                                reduction="sum")

        res = [t.steal_step(opt, disp, loss_sum) for _ in range(3)]
        facts.update(total=[r.total_samples for r in res], taken=[list(r.taken) for r in res],
                     params=params_of(t.module), scale=float(t.scaler.get_scale()))
        return facts
    model = t.wrap(make_model(torch.float64 if name == "resume" else torch.float32))
    data = make_data(sum(batches) * STEPS * 2, torch.float64 if name == "resume" else torch.float32)
    _, results = train(t, model, data, STEPS, inf_at=2 if name == "fp16" else None,
                       kill_at=args.kill_at)
    facts.update(params=params_of(t.module), losses=[r.loss for r in results],
                 skipped=[r.skipped for r in results], global_step=t.global_step)
    if t.scaler is not None:
        facts["scale"] = float(t.scaler.get_scale())
    if name == "groups":
        facts["reference"] = reference(batches, STEPS)
        t.metrics.update_device()
        facts["allocated"] = t.metrics.registry.get_sample_value(
            "htj_torch_memory_allocated_bytes", t.metrics.labels)
    if name in ("int8", "powersgd") and t.groups.leaders is not None:
        facts["codec_cuda_vs_cpu"] = codec_on_cuda(name, t.groups.leaders, t.rank)
    return facts


def codec_on_cuda(mode: str, leaders, rank: int) -> float:  # type: ignore[no-untyped-def]
    """The codec's SUM on CUDA tensors equals the same codec on CPU tensors (max abs diff)."""
    from hetero_worker.speed.codecs import CompressionConfig, make_codec
    g = torch.Generator().manual_seed(30 + rank)
    cpu = [torch.randn(64, 32, generator=g), torch.randn(32, generator=g)]
    gpu = [x.to(DEVICE) for x in cpu]
    config = CompressionConfig(mode=mode, powersgd_rank=2)
    make_codec(config, seed=1).allreduce_(cpu, leaders)
    make_codec(config, seed=1).allreduce_(gpu, leaders)
    assert all(x.device == DEVICE for x in gpu)
    return max(float((a - b.cpu()).abs().max()) for a, b in zip(cpu, gpu))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario")
    parser.add_argument("out")
    parser.add_argument("--kill-at", type=int, default=None)
    args = parser.parse_args()
    _spy()
    from hetero_worker import trainer as ht
    t = ht.init()
    global DEVICE
    DEVICE = t.device
    facts = scenario(args.scenario, t, args)
    facts["created"] = CREATED
    facts["comm_ranks"] = [[r.gpu_type, r.torch_build, r.on_cuda, r.physical_gpu]
                           for r in t.comm_ranks]
    Path(args.out, f"rank{t.rank}.json").write_text(json.dumps(facts))
    t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
