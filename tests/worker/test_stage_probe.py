"""hetero_worker.stages.probe measures a pipelined model's per-block costs for
spec.training.pipeline.blockCosts: exact parameter counts and output bytes of the example LM's
blocks, its transformer layers' saved activations, compute shares summing to the block count, and
the entries the spec parser takes back."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hetero_operator.api.pipelinespec import parse_pipeline
from hetero_worker.examples.lm_pipeline import make_pipeline_model
from hetero_worker.stages.probe import as_spec, measure_block_costs


def test_the_example_lms_blocks() -> None:
    torch.manual_seed(0)
    model = make_pipeline_model(64, 128, 2, 4)
    costs = measure_block_costs(model, torch.randint(0, 256, (8, 64)))
    # embedding 256 x 128 + positions 64 x 128; a layer's attention and MLP; the head 128 x 256
    assert [c.parameters for c in costs] == [40960, 198272, 198272, 33024]
    assert sum(c.parameters for c in costs) == 470528  # examples/lm-pipeline.yaml's figure
    assert [c.output_bytes_per_sample for c in costs] == [64 * 128 * 4] * 3 + [64 * 256 * 4]
    embed, layer1, layer2, head = costs
    assert embed.activation_bytes_per_sample < layer1.activation_bytes_per_sample
    assert layer1.activation_bytes_per_sample == layer2.activation_bytes_per_sample > 64 * 128 * 4
    assert sum(c.compute for c in costs) == pytest.approx(4, abs=0.01)
    assert min(c.compute for c in costs) > 0
    assert all(p.grad is None for p in model.parameters())  # left as it found them
    spec = parse_pipeline({"blockCosts": as_spec(costs)})
    assert spec is not None and spec.blocks == 4
    assert [(c.parameters, c.output_bytes_per_sample) for c in spec.block_costs] == [
        (c.parameters, c.output_bytes_per_sample) for c in costs]


def test_a_model_that_is_no_sequential_or_a_single_sample_is_refused() -> None:
    with pytest.raises(TypeError, match="nn.Sequential of blocks, got Linear"):
        measure_block_costs(nn.Linear(2, 2), torch.randn(4, 2))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 2 samples"):
        measure_block_costs(nn.Sequential(nn.Linear(2, 2)), torch.randn(1, 2))
