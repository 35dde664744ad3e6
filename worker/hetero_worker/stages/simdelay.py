"""A simulated device's compute inside a pipeline stage (issue 30).

Under data parallelism a simulated rank waits ``local_batch x delay_per_sample_s /
relative_speed`` after its real forward and backward (:mod:`hetero_worker.runtime.simulation`).
A pipeline overlaps the stages' micro-batches, so the wait must fall where the stage computes:
each block of the rank's stage sleeps its share, ``1 / blocks`` of the whole model's per-sample
delay, for every micro-batch it runs: :data:`FORWARD_SHARE` before its forward (a forward
pre-hook) and the rest in its backward (an identity ``autograd.Function`` on its output). A
stage of ``k`` of ``B`` blocks thus takes ``k / B`` of what the whole model would take on its
device, which is the planner's model of a stage (docs/pipeline.md: equal blocks, compute divided
by the device's speed). A real GPU (``simulated`` false) sleeps nothing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from hetero_worker.runtime.simulation import simulated_delay_s
from heterotrain_common.contract import DeviceProfile
from heterotrain_common.pipelineschedules import FORWARD_SHARE



class _SleepInBackward(torch.autograd.Function):
    """Identity forward; the backward sleeps ``seconds`` before passing the gradient on."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, seconds: float) -> torch.Tensor:  # noqa: D102
        ctx.seconds = seconds
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # noqa: D102
        if ctx.seconds > 0:
            time.sleep(ctx.seconds)
        return grad, None


def simulate_stage_compute(model: nn.Sequential, block_counts: Sequence[int], stage: int,
                           profile: DeviceProfile, delay_per_sample_s: float) -> list[Any]:
    """Hook this rank's blocks of ``model`` so that each sleeps its simulated compute.

    Args:
        model: the whole model (``nn.Sequential`` of blocks); only this stage's blocks get hooks.
        block_counts: blocks per stage, pipeline order.
        stage: this rank's stage.
        profile: the rank's device (no hooks unless ``simulated``).
        delay_per_sample_s: simulated seconds per sample of the whole model at speed 1.0.

    Returns:
        The hook handles (``handle.remove()`` undoes them); ``[]`` for a real device or no delay.
    """
    total = sum(block_counts)
    per_block_s = simulated_delay_s(profile, 1, delay_per_sample_s) / max(total, 1)
    if per_block_s <= 0:
        return []
    first = sum(block_counts[:stage])
    handles: list[Any] = []
    for block in list(model)[first:first + block_counts[stage]]:
        handles.append(block.register_forward_pre_hook(_forward_sleep(per_block_s)))
        handles.append(block.register_forward_hook(_backward_sleep(per_block_s)))
    return handles


def _samples(args: Any) -> int:
    """The micro-batch size: dimension 0 of the block's first tensor argument (1 if none)."""
    first = args[0] if isinstance(args, tuple) and args else args
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 1


def _forward_sleep(per_block_s: float) -> Any:
    def hook(_module: nn.Module, args: Any) -> None:
        time.sleep(FORWARD_SHARE * per_block_s * _samples(args))
    return hook


def _backward_sleep(per_block_s: float) -> Any:
    def hook(_module: nn.Module, args: Any, output: Any) -> Any:
        if isinstance(output, torch.Tensor) and output.requires_grad:
            return _SleepInBackward.apply(
                output, (1.0 - FORWARD_SHARE) * per_block_s * _samples(args))
        return output
    return hook
