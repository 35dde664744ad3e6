"""A simulated device's compute inside a pipeline stage (hetero_worker.stages.simdelay): each of
the stage's blocks sleeps its share of the per-sample delay, a third in its forward and the rest
in its backward, per micro-batch; the gradients are those of the unhooked model; a real device
sleeps nothing."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from hetero_worker.stages import simdelay
from heterotrain_common.contract import DeviceProfile

T4 = DeviceProfile(product="Tesla-T4", relative_speed=0.5, simulated=True)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(3, 3, dtype=torch.float64) for _ in range(4)])


def test_each_block_of_the_stage_sleeps_its_share_and_gradients_are_unchanged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(simdelay.time, "sleep", slept.append)
    hooked, plain = _model(), _model()
    handles = simdelay.simulate_stage_compute(hooked, [2, 2], 1, T4, 0.01)
    assert len(handles) == 4  # a pre-hook and a hook on each of blocks 2 and 3
    x = torch.randn(6, 3, dtype=torch.float64)
    out = hooked[2:](x)
    # per block: 0.01 s / speed 0.5 / 4 blocks = 5 ms per sample; forward 1/3 of it x 6 samples
    assert slept == pytest.approx([0.01, 0.01])
    out.sum().backward()
    assert slept[2:] == pytest.approx([0.02, 0.02])  # the backward's 2/3, block 3 then block 2
    # the stage's 2 of 4 blocks: half of the whole model's 6 x 0.01 / 0.5 s
    assert sum(slept) == pytest.approx(0.5 * 6 * 0.01 / 0.5)
    plain[2:](x).sum().backward()
    for a, b in zip(hooked.parameters(), plain.parameters(), strict=True):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            assert torch.equal(a.grad, b.grad)
    assert hooked[0].weight.grad is None  # block 0 is another stage's: no hooks, no gradient


def test_a_real_device_or_no_delay_adds_no_hooks() -> None:
    real = DeviceProfile(product="NVIDIA-A100-SXM4-40GB", relative_speed=1.0, simulated=False)
    assert simdelay.simulate_stage_compute(_model(), [2, 2], 0, real, 0.01) == []
    assert simdelay.simulate_stage_compute(_model(), [2, 2], 0, T4, 0.0) == []
    model = _model()
    before = copy.deepcopy(model.state_dict())
    for h in simdelay.simulate_stage_compute(model, [3, 1], 0, T4, 0.01):
        h.remove()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
