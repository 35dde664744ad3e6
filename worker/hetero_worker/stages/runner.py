"""One rank's pipeline stage: its blocks, the Gloo group the activations travel on, and the
schedule (``torch.distributed.pipelining``: ``PipelineStage`` with ``ScheduleGPipe`` or
``Schedule1F1B``).

A step splits the batch into ``micro_batches`` equal micro-batches along dimension 0; the first
stage takes the inputs, the last the targets and the loss. The loss function is applied per
micro-batch and the gradients are averaged over the micro-batches (``scale_grads``), so with a
loss that is a mean over its micro-batch the gradients equal those of the mean over the whole
batch, as one process training the whole model would get.

Activations and their gradients cross stages over ``group``, which must be a Gloo group (stages
run on different GPU types, and no NCCL communicator spans GPU types). ``group`` holds one rank
per stage (one pipeline); data parallelism inside a stage runs several pipelines side by side
(:mod:`hetero_worker.stages.layout`). CPU tensors only (CUDA tensors through Gloo sends are not
built yet).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from hetero_worker.stages.split import stage_module
from heterotrain_common.pipelineschedules import SCHEDULES

SCHEDULE_CLASSES = {"1F1B": Schedule1F1B, "GPipe": ScheduleGPipe}
"""The schedule classes that run each ``spec.training.pipeline.schedule`` value."""
COMPUTE_METHODS = {"forward_one_chunk": "forward", "backward_one_chunk": "backward",
                   "backward_weight_one_chunk": "backward"}
"""``PipelineStage`` methods that run the stage's forward and backward of one micro-batch (the
schedule's sends and receives are separate operations), and which part of the stage's compute
their time is."""


class AutocastStage(nn.Module):
    """A stage module whose forward runs under ``autocast`` and hands its output on in the dtype
    of its parameters (fp32 master weights: what crosses to the next stage and what the loss
    sees), so the activations between stages keep one dtype whatever a stage computes in.

    Args:
        inner: the stage's blocks (its parameters are this module's).
        autocast: a context manager factory (the rank's precision).
    """

    def __init__(self, inner: nn.Module, autocast: Callable[[], Any]) -> None:
        super().__init__()
        self.inner, self._autocast = inner, autocast
        self._dtype = next((p.dtype for p in inner.parameters()), torch.float32)

    def forward(self, *args: Any) -> Any:
        """The blocks' output under autocast, floating tensors cast to the parameters' dtype."""
        with self._autocast():
            out = self.inner(*args)
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            return out.to(self._dtype)
        return out


class StageRunner:
    """Runs this rank's stage of a pipelined model.

    Attributes:
        module: the stage's blocks (share parameters with the model given); give its
            ``parameters()`` to the optimiser.
        compute_s: seconds of the last :meth:`step` spent in the stage's forward and backward
            (the rest of the schedule's time is the bubble and the activation transfers).
        forward_s / backward_s: the forward and the backward part of ``compute_s``.
        stage_index: this stage's place, 0 = first.
        stage_count: stages in the pipeline.
    """

    def __init__(self, model: nn.Sequential, block_counts: Sequence[int], *, stage_index: int,
                 group: dist.ProcessGroup, micro_batches: int,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                 schedule: str = SCHEDULES[0], device: torch.device | None = None,
                 autocast: Callable[[], Any] | None = None) -> None:
        """Build the stage.

        Args:
            model: the whole model as an ``nn.Sequential`` of blocks (every rank builds it alike).
            block_counts: blocks per stage, pipeline order (from the planner).
            stage_index: this rank's stage; its rank in ``group`` must equal it.
            group: the Gloo group of the stages' ranks, stage order.
            micro_batches: micro-batches per step, >= 1.
            loss_fn: ``loss_fn(output, target)`` per micro-batch (a mean over the micro-batch).
            schedule: ``1F1B`` (default) or ``GPipe``.
            device: where the stage runs (CPU by default).
            autocast: a context manager factory the stage's forward runs under (the rank's
                precision, :meth:`hetero_worker.precision.PrecisionPolicy.autocast`); its output
                goes to the next stage in the parameters' dtype. None: no autocast.

        Raises:
            ValueError: an unknown schedule, a non-Gloo group, counts that do not match the group
                size, or a stage index other than the rank's place in the group.
        """
        if schedule not in SCHEDULE_CLASSES:
            raise ValueError(f"spec.training.pipeline.schedule must be one of "
                             f"{', '.join(SCHEDULES)}, got {schedule!r}")
        if dist.get_backend(group) != "gloo":
            raise ValueError(f"pipeline activations cross GPU types over Gloo, got a "
                             f"{dist.get_backend(group)} group")
        if len(block_counts) != dist.get_world_size(group):
            raise ValueError(f"{len(block_counts)} stages but {dist.get_world_size(group)} ranks "
                             f"in the pipeline group (one rank per stage)")
        if dist.get_rank(group) != stage_index:
            raise ValueError(f"stage {stage_index} runs on the group's rank {stage_index}, "
                             f"this rank is {dist.get_rank(group)}")
        self.stage_index = stage_index
        self.stage_count = len(block_counts)
        self.module = stage_module(model, block_counts, stage_index)
        device = device or torch.device("cpu")
        runs = self.module if autocast is None else AutocastStage(self.module, autocast)
        self._stage = PipelineStage(runs, stage_index, self.stage_count, device, group=group)
        self._schedule = SCHEDULE_CLASSES[schedule](self._stage, n_microbatches=micro_batches,
                                                    loss_fn=loss_fn, scale_grads=True)
        self.compute_s = self.forward_s = self.backward_s = 0.0
        for name, part in COMPUTE_METHODS.items():  # the schedule calls them on the stage object
            setattr(self._stage, name, self._timed(getattr(self._stage, name), part))

    def _timed(self, method: Callable[..., Any], part: str) -> Callable[..., Any]:
        """``method`` adding its wall time to :attr:`compute_s` and to ``part``'s figure."""
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - start
                self.compute_s += elapsed
                if part == "forward":
                    self.forward_s += elapsed
                else:
                    self.backward_s += elapsed
        return timed

    @property
    def is_first(self) -> bool:
        """This stage takes the inputs."""
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        """This stage takes the targets and computes the loss."""
        return self.stage_index == self.stage_count - 1

    def step(self, inputs: torch.Tensor | None = None,
             target: torch.Tensor | None = None) -> list[torch.Tensor] | None:
        """Forward and backward of one batch through the pipeline; gradients accumulate into
        ``module``'s parameters (zero them and step the optimiser around this call).

        Args:
            inputs: the whole batch, first stage only.
            target: the whole batch's targets, last stage only.

        Returns:
            The per-micro-batch losses on the last stage; None elsewhere.

        Raises:
            ValueError: inputs given to a later stage or missing on the first; target likewise.
        """
        if (inputs is not None) != self.is_first:
            raise ValueError("the inputs go to the first stage only")
        if (target is not None) != self.is_last:
            raise ValueError("the target goes to the last stage only")
        self.compute_s = self.forward_s = self.backward_s = 0.0
        if self.is_first and self.is_last:
            losses: list[torch.Tensor] = []
            self._schedule.step(inputs, target=target, losses=losses)
            return losses
        if self.is_first:
            self._schedule.step(inputs)
            return None
        if self.is_last:
            losses = []
            self._schedule.step(target=target, losses=losses)
            return losses
        self._schedule.step()
        return None
