"""Built-in examples, each runnable as ``python -m hetero_worker.examples.<name>`` on every rank.

* ``digits``: an MLP on scikit-learn's bundled handwritten digits (no download); the default job.
* ``lm``: a small transformer language model on the Python standard library's own source text.

Both read the contract from the environment (``heterotrain run`` or the operator sets it) and use
only the public :mod:`hetero_worker.trainer` API.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_common_args(parser: argparse.ArgumentParser) -> None:
    """Flags every example takes."""
    parser.add_argument("--epochs", type=int, default=None, help="epochs to train")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    parser.add_argument("--seed", type=int, default=0, help="model-init and data-order seed")
    parser.add_argument("--checkpoint-every", type=int, default=None,
                        help="checkpoint every N steps (0: never; default: "
                             "HTJ_CHECKPOINT_INTERVAL_STEPS when HTJ_CHECKPOINT_DIR is set)")
    parser.add_argument("--result-json", default="", help="rank 0 writes the result here")
    parser.add_argument("--dump-params", default="",
                        help="rank 0 saves the final parameters here (torch.save; for tests)")


def apply_run_limits(args: argparse.Namespace, t: Any) -> None:
    """``heterotrain run --epochs/--max-steps`` reach the examples through the contract
    (``HTJ_EPOCHS``, ``HTJ_MAX_STEPS``): the epochs replace ``args.epochs``, the step limit is
    the smaller of the two."""
    args.epochs = t.epochs(args.epochs)
    limits = [m for m in (args.max_steps, t.max_steps) if m is not None]
    args.max_steps = min(limits) if limits else None


def write_result(path: str, result: dict[str, Any]) -> None:
    """Write the result JSON (rank 0), creating parent directories."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=2, sort_keys=True))


def format_table(summaries: list[dict[str, Any]]) -> str:
    """Plain-text per-rank table: device, batch, samples/s, wait share."""
    lines = [f"{'rank':>4} {'device':<24} {'batch':>5} {'samples/s':>10} {'wait':>6}"]
    for s in summaries:
        lines.append(f"{s['rank']:>4} {s['gpu_product']:<24} {s['local_batch']:>5} "
                     f"{s['samples_per_s']:>10.1f} {s['wait_share']:>6.1%}")
    return "\n".join(lines)
