"""Train a small byte-level transformer language model on the Python standard library's source.

Every machine with Python has this text (``os.path.dirname(os.__file__)``), so nothing is
downloaded. The workload is matmul-bound, unlike the digits MLP::

    python -m hetero_worker.examples.lm [--max-steps 40] [--text-bytes 400000]

Sorted ``*.py`` files are concatenated up to ``--text-bytes`` bytes and cut into windows of
``--context + 1`` bytes; the last 5% of windows are held out. Rank 0 prints the loss curve and the
held-out loss and perplexity (nats per byte, e^loss), and writes the result JSON.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any


def stdlib_text(max_bytes: int) -> bytes:
    """The first ``max_bytes`` bytes of the stdlib's ``*.py`` files, sorted by path."""
    root = Path(os.path.dirname(os.__file__))
    chunks, total = [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    return b"".join(chunks)[:max_bytes]


def make_windows(text: bytes, context: int) -> Any:
    """``[n_windows, context + 1]`` int64 byte ids."""
    import torch
    ids = torch.frombuffer(bytearray(text), dtype=torch.uint8).to(torch.int64)
    n = len(ids) // (context + 1)
    return ids[:n * (context + 1)].view(n, context + 1)


def make_model(context: int, width: int, layers: int, heads: int) -> Any:
    """Causal transformer over bytes: ``[B, T]`` ids -> ``[B, T, 256]`` logits."""
    import torch
    from torch import nn

    class ByteLM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(256, width)
            self.position = nn.Embedding(context, width)
            layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                               batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.head = nn.Linear(width, 256)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            steps = ids.shape[1]
            mask = nn.Transformer.generate_square_subsequent_mask(steps, device=ids.device)
            h = self.embed(ids) + self.position(torch.arange(steps, device=ids.device))
            return self.head(self.blocks(h, mask=mask, is_causal=True))

    return ByteLM()


def lm_loss(model: Any, windows: Any) -> Any:
    """Mean next-byte cross-entropy (nats) over ``windows [B, T+1]``."""
    import torch.nn.functional as F
    logits = model(windows[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, 256), windows[:, 1:].reshape(-1))


def train(args: argparse.Namespace) -> int:
    """Train, evaluate, report; returns the exit code."""
    import torch

    from hetero_worker import trainer as ht
    from hetero_worker.examples import format_table, write_result
    from heterotrain_common import rundir

    t = ht.init(seed=args.seed)
    from hetero_worker.examples import apply_run_limits
    apply_run_limits(args, t)
    start = time.perf_counter()
    windows = make_windows(stdlib_text(args.text_bytes), args.context)
    held_out = max(1, len(windows) // 20)
    train_set, val_set = windows[:-held_out], windows[-held_out:]
    model = t.wrap(make_model(args.context, args.width, args.layers, args.heads))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = t.loader(torch.utils.data.TensorDataset(train_set))
    steps_per_epoch = len(train_set) // sum(t.local_batches)
    t.metrics.set_total_steps(min(args.max_steps, args.epochs * steps_per_epoch))
    t.resume(optimizer)
    first_loss = None
    while t.epoch < args.epochs and t.global_step < args.max_steps:
        for (batch,) in loader:
            result = t.step(optimizer, lambda m: lm_loss(m, t.to_device(batch)))
            first_loss = result.loss if first_loss is None else first_loss
            t.maybe_checkpoint(optimizer, args.checkpoint_every)
            if t.rank == 0 and t.global_step % 10 == 0:
                print(f"step {t.global_step} loss {result.loss:.3f}", flush=True)
            if t.global_step >= args.max_steps:
                break
    t.module.eval()
    with torch.no_grad():
        val_loss = float(lm_loss(t.module, t.to_device(val_set[:256])).item())
    summaries = t.gather_summaries()
    if t.rank == 0:
        elapsed_s = time.perf_counter() - start
        print(format_table(summaries))
        print(f"held-out loss {val_loss:.3f} nats/byte (perplexity {math.exp(val_loss):.2f}), "
              f"first train loss {first_loss:.3f}, {t.global_step} steps ({elapsed_s:.1f} s)",
              flush=True)
        result = {"example": "lm", "first_loss": first_loss, "val_loss": val_loss,
                  "perplexity": math.exp(val_loss), "steps": t.global_step,
                  "elapsed_s": elapsed_s, "per_rank": summaries}
        write_result(args.result_json, result)
        rundir.write_result({"val_loss": val_loss, "perplexity": math.exp(val_loss),
                             "steps": t.global_step})
        if args.dump_params:
            torch.save([p.detach().cpu() for p in t.module.parameters()], args.dump_params)
    t.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; a bad contract or a rendezvous timeout exits non-zero with a message."""
    return run_lm_main(argv, prog="python -m hetero_worker.examples.lm", doc=__doc__, train=train)


def run_lm_main(argv: list[str] | None, *, prog: str, doc: str | None,
                train: Any) -> int:
    """The LM examples' shared command line (model shape, text, learning rate) around ``train``."""
    from hetero_worker.examples import add_common_args
    from hetero_worker.runtime.preflight import exit_on_setup_error, preflight

    parser = argparse.ArgumentParser(prog=prog, description=(doc or "").splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    parser.add_argument("--context", type=int, default=64, help="bytes of context")
    parser.add_argument("--width", type=int, default=128, help="model width")
    parser.add_argument("--layers", type=int, default=2, help="transformer blocks")
    parser.add_argument("--heads", type=int, default=4, help="attention heads")
    parser.add_argument("--text-bytes", type=int, default=400_000, help="stdlib text to read")
    parser.set_defaults(epochs=1, max_steps=40)
    args = parser.parse_args(argv)
    return exit_on_setup_error(lambda: preflight(os.environ) and train(args))


if __name__ == "__main__":
    sys.exit(main())
