"""Run inside each rank process by tests/gpu/test_gpu_sharded.py; writes ``<out>/rank<R>.json``.

The real Trainer under Group or Full sharding (``HTJ_SHARDING``) on the machine's one CUDA device,
each rank in its own topology group (NCCL groups of one, Gloo between the leaders), the model and
data of tests/gpu/gpu_ranks.py. Scenarios:

* ``fp16``: fp16 autocast and the agreed loss scaler; rank 1's loss is inf at step 2 (0-based), so
  every rank must skip that step together and keep learning;
* ``resume``: float64, a checkpoint every 2 steps (``HTJ_CHECKPOINT_DIR``); ``--kill-at N`` exits
  hard after step N, a second start resumes from the sharded checkpoint.

Facts: the model's full parameters (gathered: DTensor shards under Group, slices under Full), the
step losses, skipped flags, the loss scale and the global step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import gpu_ranks  # noqa: E402

STEPS = gpu_ranks.STEPS


def full_params(t) -> list[float]:  # type: ignore[no-untyped-def]
    """Every parameter of the whole model, by name order, as float64 values (collective)."""
    out: list[float] = []
    for _, value in sorted(t.full_state_dict().items()):
        if hasattr(value, "full_tensor"):  # Group sharding: DTensor shards
            value = value.full_tensor()
        out += [float(v) for v in value.detach().double().cpu().reshape(-1)]
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["fp16", "resume"])
    parser.add_argument("out")
    parser.add_argument("--kill-at", type=int, default=None)
    args = parser.parse_args()
    from hetero_worker import trainer as ht
    t = ht.init()
    gpu_ranks.DEVICE = t.device
    dtype = torch.float64 if args.scenario == "resume" else torch.float32
    model = t.wrap(gpu_ranks.make_model(dtype))
    data = gpu_ranks.make_data(sum(t.local_batches) * STEPS * 2, dtype)
    _, results = gpu_ranks.train(t, model, data, STEPS,
                                 inf_at=2 if args.scenario == "fp16" else None, kill_at=args.kill_at)
    facts = {"device": str(t.device), "sharding": t.contract.memory.sharding,
             "param_device": str(next(model.parameters()).device),
             "params": full_params(t), "losses": [r.loss for r in results],
             "skipped": [r.skipped for r in results], "global_step": t.global_step,
             "scale": float(t.scaler.get_scale()) if t.scaler is not None else None}
    Path(args.out, f"rank{t.rank}.json").write_text(json.dumps(facts))
    t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
