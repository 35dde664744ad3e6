"""Measure a pipelined model's per-block costs for ``spec.training.pipeline.blockCosts`` (issue 30).

The planner cuts an ``nn.Sequential`` into stages by each block's parameters, activation bytes,
output bytes and compute (docs/pipeline.md, "In the plan"); without ``blockCosts`` it takes
the blocks as equal. Run this once on a sample batch, where the model runs (a CPU measures the
shares of compute well enough when the blocks are of the same kind; measure on the GPU for
blocks of different kinds)::

    from hetero_worker.stages.probe import measure_block_costs, as_spec
    costs = measure_block_costs(make_pipeline_model(64, 128, 2, 4), inputs[:16])
    print(yaml.safe_dump({"blockCosts": as_spec(costs)}))   # paste under spec.training.pipeline

Per block, on the batch its predecessors produce:

* ``parameters``: the count (``numel``), exact;
* ``activation_bytes_per_sample``: the bytes it saves for backward per sample
  (:func:`hetero_worker.memory.caps.measure_activation_bytes`: one sample against the batch);
* ``output_bytes_per_sample``: its output's bytes per sample, what crosses a cut after it;
* ``compute``: its share of the forward and backward time (median of ``repeats``), scaled so that
  the blocks' figures sum to their number (1.0 each for equal blocks).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from hetero_worker.memory.caps import measure_activation_bytes


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredBlock:
    """One block's measured costs (see the module docstring for how each is measured)."""

    parameters: int
    activation_bytes_per_sample: int
    output_bytes_per_sample: int
    compute: float


def measure_block_costs(model: nn.Sequential, inputs: torch.Tensor, *,
                        repeats: int = 3) -> list[MeasuredBlock]:
    """Measure every block of ``model`` on ``inputs``.

    Args:
        model: the whole model as an ``nn.Sequential`` of blocks (its gradients are zeroed
            afterwards).
        inputs: a batch of at least 2 samples along dimension 0, on the model's device.
        repeats: timed forward and backward passes per block (the median counts).

    Returns:
        One :class:`MeasuredBlock` per block, in model order.

    Raises:
        TypeError: ``model`` is not an ``nn.Sequential``.
        ValueError: fewer than 2 samples, or ``repeats`` < 1.
    """
    if not isinstance(model, nn.Sequential):
        raise TypeError(f"a pipelined model is an nn.Sequential of blocks, got "
                        f"{type(model).__name__}")
    n = len(inputs)
    if n < 2 or repeats < 1:
        raise ValueError(f"need a batch of at least 2 samples and repeats >= 1, got {n} and "
                         f"{repeats}")
    x = inputs
    found: list[tuple[int, int, int, float]] = []
    for block in model:
        feed = x.detach().requires_grad_(x.is_floating_point())
        per_sample, _ = measure_activation_bytes(block, _sum_loss, (feed,))
        with torch.no_grad():
            out = block(feed)
        seconds = [_time_once(block, feed) for _ in range(repeats)]
        found.append((sum(p.numel() for p in block.parameters()), per_sample,
                      out.numel() * out.element_size() // n, statistics.median(seconds)))
        x = out
    model.zero_grad(set_to_none=True)
    total_s = sum(s for *_, s in found) or 1.0
    return [MeasuredBlock(parameters=p, activation_bytes_per_sample=a, output_bytes_per_sample=o,
                          compute=round(len(found) * s / total_s, 3) or 0.001)
            for p, a, o, s in found]


def as_spec(costs: list[MeasuredBlock]) -> list[dict[str, Any]]:
    """``costs`` as ``spec.training.pipeline.blockCosts`` entries (YAML-ready; ``compute`` as a
    decimal string: the spec holds no floats)."""
    return [{"parameters": c.parameters, "activationBytesPerSample": c.activation_bytes_per_sample,
             "outputBytesPerSample": c.output_bytes_per_sample, "compute": f"{c.compute:g}"}
            for c in costs]


def _sum_loss(block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A scalar to run the block's backward from."""
    return block(x).float().sum()


def _time_once(block: nn.Module, feed: torch.Tensor) -> float:
    """Seconds of one forward and backward of ``block`` on ``feed``."""
    start = time.perf_counter()
    _sum_loss(block, feed).backward()
    return time.perf_counter() - start
