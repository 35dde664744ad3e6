"""Precision policy per architecture and the scaler's behaviour in one process."""

from __future__ import annotations

import pytest
import torch

from hetero_worker.precision import AgreeingGradScaler, PrecisionPolicy, precision_for_capability


@pytest.mark.parametrize(("cc", "expected"), [("9.0", "bf16"), ("8.0", "bf16"), ("8.9", "bf16"),
                                              ("7.5", "fp16"), ("7.0", "fp16"), ("6.1", "fp32"),
                                              ("", "fp32")],
                         ids=["H100", "A100", "L4", "T4", "V100", "P40", "CPU"])
def test_default_precision_by_compute_capability(cc: str, expected: str) -> None:
    assert precision_for_capability(cc) == expected


@pytest.mark.parametrize(("precision", "dtype", "scaler"), [
    ("bf16", torch.bfloat16, False), ("fp16", torch.float16, True), ("fp32", torch.float32, False)])
def test_policy_autocasts_to_its_dtype_and_scales_only_fp16(precision: str, dtype: torch.dtype,
                                                             scaler: bool) -> None:
    policy = PrecisionPolicy(precision=precision, device_type="cpu")
    layer = torch.nn.Linear(4, 4)
    with policy.autocast():
        out = layer(torch.ones(2, 4))
    assert out.dtype == dtype
    assert isinstance(policy.make_scaler(), AgreeingGradScaler) is scaler


def test_single_process_scaler_skips_on_inf_and_halves_the_scale() -> None:
    model = torch.nn.Linear(2, 1)
    before = model.weight.detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    scaler = AgreeingGradScaler("cpu", init_scale=256.0)
    scaler.scale(model(torch.tensor([[float("inf"), 1.0]])).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.last_found_inf and scaler.get_scale() == 128.0
    assert torch.equal(model.weight, before)


def test_unknown_precision_is_rejected() -> None:
    with pytest.raises(ValueError, match="fp8"):
        PrecisionPolicy(precision="fp8", device_type="cpu")


def test_every_rank_scales_when_any_rank_runs_fp16() -> None:
    """Summed gradients need one loss scale: a bf16 rank in a job with fp16 ranks scales too."""
    bf16 = PrecisionPolicy(precision="bf16", device_type="cpu")
    assert bf16.make_scaler() is None
    assert isinstance(bf16.make_scaler(job_has_fp16=True), AgreeingGradScaler)
