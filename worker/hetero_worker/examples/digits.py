"""Train an MLP on scikit-learn's handwritten digits across heterogeneous ranks.

Run on every rank (``heterotrain run examples/digits.yaml`` does that)::

    python -m hetero_worker.examples.digits [--epochs 12] [--result-json out.json]

The dataset ships with scikit-learn (1797 8x8 images, no download). A fixed, stratified 80/20
split gives 1437 training and 360 held-out images; rank 0 prints the held-out accuracy, a per-rank
table and writes the result JSON (``accuracy``, ``steps``, ``elapsed_s``, ``per_rank`` with
samples/s and wait share).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any


def load_data(seed: int = 0) -> tuple[Any, Any, Any, Any]:
    """``(x_train [1437, 64] float32, y_train [1437] int64, x_test [360, 64], y_test [360])``.

    Features are standardised with the training split's mean and deviation.
    """
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data, digits.target, test_size=0.2, random_state=seed, stratify=digits.target)
    scaler = StandardScaler().fit(x_train)
    x_train, x_test = scaler.transform(x_train), scaler.transform(x_test)
    as_x = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    as_y = lambda a: torch.tensor(a, dtype=torch.int64)  # noqa: E731
    return as_x(x_train), as_y(y_train), as_x(x_test), as_y(y_test)


def make_model() -> Any:
    """MLP 64 -> 128 -> 10."""
    from torch import nn
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def train(args: argparse.Namespace) -> int:
    """Train, evaluate, report; returns the exit code."""
    import torch
    import torch.nn.functional as F

    from hetero_worker import trainer as ht

    t = ht.init(seed=args.seed)
    from hetero_worker.examples import apply_run_limits
    apply_run_limits(args, t)
    start = time.perf_counter()
    x_train, y_train, x_test, y_test = load_data()
    model = t.wrap(make_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loader = t.loader(torch.utils.data.TensorDataset(x_train, y_train))
    t.metrics.set_total_steps(args.max_steps or args.epochs * (len(x_train) // sum(t.local_batches)))
    t.resume(optimizer)  # the Trainer says on rank 0 where it resumed
    while t.epoch < args.epochs and not _done(t, args):
        for x, y in loader:
            result = t.step(optimizer, lambda m: F.cross_entropy(m(t.to_device(x)),
                                                                 t.to_device(y)))
            if t.maybe_checkpoint(optimizer, args.checkpoint_every) and t.rank == 0:
                print(f"checkpoint step={t.global_step}", flush=True)
            if t.rank == 0 and t.global_step % 50 == 0:
                print(f"step {t.global_step} epoch {t.epoch} loss {result.loss:.4f}", flush=True)
            if _done(t, args):
                break
    accuracy = evaluate(t, x_test, y_test)
    summaries = t.gather_summaries()
    if t.rank == 0:
        _report(args, t, accuracy, summaries, time.perf_counter() - start)
    t.close()
    return 0


def _done(t: Any, args: argparse.Namespace) -> bool:
    return args.max_steps is not None and t.global_step >= args.max_steps


def evaluate(t: Any, x_test: Any, y_test: Any) -> float:
    """Held-out accuracy (replicas are identical, so every rank gets the same number)."""
    import torch
    t.module.eval()
    with torch.no_grad():
        predicted = t.module(t.to_device(x_test)).argmax(dim=1).cpu()
    t.module.train()
    return float((predicted == y_test).float().mean().item())


def _report(args: argparse.Namespace, t: Any, accuracy: float, summaries: list[dict[str, Any]],
            elapsed_s: float) -> None:
    import torch

    from hetero_worker.examples import format_table, write_result
    from heterotrain_common import rundir

    print(format_table(summaries))
    print(f"held-out accuracy {accuracy:.4f} after {t.global_step} steps "
          f"({elapsed_s:.1f} s)", flush=True)
    result = {"example": "digits", "accuracy": accuracy, "steps": t.global_step,
              "epochs": t.epoch, "elapsed_s": elapsed_s,
              "global_batch": sum(t.local_batches), "per_rank": summaries}
    write_result(args.result_json, result)
    rundir.write_result({"accuracy": accuracy, "steps": t.global_step})
    if args.dump_params:
        torch.save([p.detach().cpu() for p in t.module.parameters()], args.dump_params)


def main(argv: list[str] | None = None) -> int:
    """Entry point; a bad contract or a rendezvous timeout exits non-zero with a message."""
    from hetero_worker.examples import add_common_args
    from hetero_worker.runtime.preflight import exit_on_setup_error, preflight

    parser = argparse.ArgumentParser(prog="python -m hetero_worker.examples.digits",
                                     description=__doc__.splitlines()[0])
    add_common_args(parser)
    parser.add_argument("--lr", type=float, default=1e-2, help="Adam learning rate")
    parser.set_defaults(epochs=12)
    args = parser.parse_args(argv)
    # Check the contract before importing torch: a bad variable fails in well under a second.
    return exit_on_setup_error(lambda: preflight(os.environ) and train(args))


if __name__ == "__main__":
    sys.exit(main())
