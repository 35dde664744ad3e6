"""The byte-level LM of :mod:`hetero_worker.examples.lm`, planned with the memory model (issue 12).

Its model state (470 528 parameters x 16 B with AdamW = 7.5 MB) does not fit the smallest device of
``examples/clusters/scaled-memory.yaml`` (simulated T4s whose memory labels are scaled down to
6 MiB), so the planner shards it (``Group``: each T4 of the pair holds half) and gives the T4s
micro-batches. The only differences to ``lm.py`` are the two calls the memory model needs::

    model = t.wrap(make_model(...), block=nn.TransformerEncoderLayer)   # the unit to shard / checkpoint
    t.step(optimizer, lm_loss, batch=(windows,))                         # micro-batches when planned

    heterotrain run examples/lm-large.yaml --nodes examples/clusters/scaled-memory.yaml
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import warnings


def train(args: argparse.Namespace) -> int:
    """Train, evaluate, report; returns the exit code."""
    import torch

    from hetero_worker import trainer as ht
    from hetero_worker.examples import format_table, write_result
    from hetero_worker.examples.lm import lm_loss, make_model, make_windows, stdlib_text
    from heterotrain_common import rundir

    # FSDP2 warns whenever the sharded root returns a view (the LM head's Linear on [B, T, W]
    # does): an in-place op on that view would skip its all-gather. lm_loss only reads the
    # logits (out-of-place float/reshape), so the warning does not apply to this model.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    t = ht.init(seed=args.seed)
    from hetero_worker.examples import apply_run_limits
    apply_run_limits(args, t)
    start = time.perf_counter()
    windows = make_windows(stdlib_text(args.text_bytes), args.context)
    held_out = max(1, len(windows) // 20)
    train_set, val_set = windows[:-held_out], windows[-held_out:]
    model = t.wrap(make_model(args.context, args.width, args.layers, args.heads),
                   block=torch.nn.TransformerEncoderLayer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = t.loader(torch.utils.data.TensorDataset(train_set))
    steps_per_epoch = len(train_set) // sum(t.local_batches)
    t.metrics.set_total_steps(min(args.max_steps, args.epochs * steps_per_epoch))
    t.resume(optimizer)  # sharded under Group (torch.distributed.checkpoint); the Trainer says where
    first_loss = None
    while t.epoch < args.epochs and t.global_step < args.max_steps:
        for (batch,) in loader:
            result = t.step(optimizer, lm_loss, batch=(t.to_device(batch),))
            first_loss = result.loss if first_loss is None else first_loss
            t.maybe_checkpoint(optimizer, args.checkpoint_every)
            if t.rank == 0 and t.global_step % 10 == 0:
                print(f"step {t.global_step} loss {result.loss:.3f}", flush=True)
            if t.global_step >= args.max_steps:
                break
    t.module.eval()
    with torch.no_grad():  # every rank: the sharded model's forward gathers inside each group
        val_loss = float(lm_loss(t.module, t.to_device(val_set[:256])).item())
    summaries = t.gather_summaries()
    if t.rank == 0:
        elapsed_s = time.perf_counter() - start
        print(format_table(summaries))
        peaks = ", ".join(f"rank {s['rank']} {s['memory_peak_bytes'] / 2**20:.2f} MiB"
                          for s in summaries if s.get("memory_peak_bytes") is not None)
        print(f"memory peak (state + saved activations, simulated caps): {peaks}")
        print(f"held-out loss {val_loss:.3f} nats/byte (perplexity {math.exp(val_loss):.2f}), "
              f"first train loss {first_loss:.3f}, {t.global_step} steps ({elapsed_s:.1f} s)",
              flush=True)
        write_result(args.result_json, {"example": "lm-large", "first_loss": first_loss,
                                        "val_loss": val_loss, "steps": t.global_step,
                                        "elapsed_s": elapsed_s, "per_rank": summaries})
        rundir.write_result({"val_loss": val_loss, "perplexity": math.exp(val_loss),
                             "steps": t.global_step})
    t.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; a bad contract or a rendezvous timeout exits non-zero with a message."""
    from hetero_worker.examples.lm import run_lm_main
    return run_lm_main(argv, prog="python -m hetero_worker.examples.lm_large", doc=__doc__,
                       train=train)


if __name__ == "__main__":
    sys.exit(main())
