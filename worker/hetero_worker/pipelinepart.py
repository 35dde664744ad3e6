"""The Trainer's pipeline part (issue 30): a rank of a pipelined job runs its stage of the user's
model when the contract carries a stage layout (``HTJ_PIPELINE_*``,
:mod:`heterotrain_common.pipelineenv`).

What the Trainer does under a pipeline (its ``wrap``, ``loader`` and ``step`` hand over to this
part; the script is the same as for data parallelism)::

    t = ht.init()
    stage = t.wrap(model)                      # model: an nn.Sequential of blocks; returns the
    opt = torch.optim.SGD(stage.parameters())  # rank's stage (its contiguous blocks)
    for x, y in t.loader(dataset):             # the pipeline's batch on every rank of it
        t.step(opt, F.cross_entropy, batch=(x, y))   # loss_fn(output, target) per micro-batch

* **Stages.** The model is cut by ``HTJ_PIPELINE_STAGE_BLOCKS``; this rank runs stage
  ``HTJ_PIPELINE_STAGE`` with :class:`~hetero_worker.stages.runner.StageRunner` (``PipelineStage``
  with ``Schedule1F1B`` or ``ScheduleGPipe``, ``HTJ_PIPELINE_MICRO_BATCHES``), its activations
  and their gradients over its pipeline's Gloo group (the communicator rule: nothing that crosses
  GPU types goes over NCCL).
* **Replicas.** Replica ``r`` of every stage forms pipeline ``r``
  (:class:`~hetero_worker.stages.layout.StageLayout`); every rank of pipeline ``r`` reads the
  pipeline's batch, the sum of its ranks' topology ``local_batch`` (the first stage uses the
  inputs, the last the targets). After the backward a stage's replicas reduce their gradients
  (:func:`~hetero_worker.stages.layout.reduce_stage_gradients_`), each weighted by its pipeline's
  share of the global batch, so the update is the whole batch's mean. Stage replicas start from
  replica 0's parameters (a broadcast on the stage's group).
* **Loss.** The last stage's mean over the micro-batches, weighted over the pipelines like the
  gradients, sent to every rank (each reports the job's loss).
* **Checkpoints.** ``t.maybe_checkpoint(opt)``, ``t.save_checkpoint(opt)`` and ``t.resume(opt)``
  work as under data parallelism: replica 0 of every stage hands its blocks (keyed by their global
  index in the model) and its optimizer state to rank 0, which writes one checkpoint; a resume on
  the same stage cut restores every rank's stage, the data position, the step and (same plan) the
  RNG, so a killed run resumes bit-identical (:mod:`hetero_worker.ckpt.stagestate`); on another
  cut of the same blocks each parameter's optimizer state moves with it. A SIGTERM
  stops every rank after the same step with one checkpoint, as under data parallelism
  (:class:`~hetero_worker.stop.GracefulStop`).
* **Simulated devices.** Each block of the stage sleeps its share of the simulated per-sample
  delay in its forward and its backward, per micro-batch (:mod:`hetero_worker.stages.simdelay`),
  so a slower type's stage takes longer inside the schedule, as the planner models it.
* **Precision.** A forced ``spec.training.precision`` runs each stage's forward under the rank's
  autocast, its output handed on in the parameters' dtype; with fp16 anywhere in the job one loss
  scale spans every stage: the last stage scales the loss, every rank unscales its gradients, and
  the ranks of all stages agree on skipping a step with inf/NaN (:meth:`step`); the scale is in
  the checkpoint.
* **Not built here.** CUDA tensors through the Gloo sends (the stages run on the CPU), rebalancing
  and compression.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hetero_worker.loading import TrainData
from hetero_worker.stages.layout import StageLayout, build_stage_groups, reduce_stage_gradients_
from hetero_worker.stages.runner import StageRunner
from hetero_worker.stages.simdelay import simulate_stage_compute
from hetero_worker.stages.split import stage_module
from hetero_worker.stepping import StepResult
from heterotrain_common.contract import Contract


class PipelinePart:
    """One rank's stage, its groups, its pipeline's data and its steps.

    Args:
        contract: the rank's contract, with a stage layout (``contract.pipeline.enabled``).
        steps: the Trainer's step count (the loader ends at ``max_steps``).
        metrics: the rank's metrics.
        seed: the sampler's seed.

    Attributes:
        layout: every stage's ranks.
        stage, replica: this rank's stage and pipeline.
        pipeline_batches: samples per step of every pipeline.
        data: the pipeline's data part (a split over the pipelines, this rank's pipeline's share).
        runner: the stage runner (None before :meth:`wrap`).
    """

    def __init__(self, contract: Contract, *, steps: Any, metrics: Any, seed: int) -> None:
        settings = contract.pipeline
        self.contract, self.metrics, self.steps = contract, metrics, steps
        self.rank = contract.dist.rank
        self.layout = StageLayout(stage_ranks=settings.stage_ranks)
        self.stage, self.replica = self.layout.place(self.rank)
        batches = contract.local_batches
        self.pipeline_batches = [sum(batches[k] for k in ranks) for ranks in self.layout.pipelines()]
        self.data = TrainData(self.pipeline_batches, self.replica, seed=seed, steps=steps,
                              metrics=metrics)
        self.runner: StageRunner | None = None
        self._scaler: Any = None  # the job's loss scaler (fp16), set with the runner
        self._groups: Any = None
        self._module: nn.Module | None = None
        self._last_rank = self.layout.pipelines()[self.replica][-1]

    @property
    def module(self) -> nn.Module | None:
        """This rank's stage module (None before :meth:`wrap`)."""
        return self._module

    @property
    def weight(self) -> float:
        """This pipeline's share of the global batch times the replica count (the factor that
        turns the replicas' average into the whole batch's mean)."""
        return self.pipeline_batches[self.replica] * self.layout.replicas / sum(self.pipeline_batches)

    def wrap(self, model: nn.Module,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
             ) -> nn.Module:
        """Build the groups (collective), cut ``model`` and return this rank's stage module.

        Args:
            model: the whole model as an ``nn.Sequential`` of blocks, built alike on every rank.
            loss_fn: ``loss_fn(output, target)``; None: the first :meth:`step`'s.

        Raises:
            TypeError: ``model`` is not an ``nn.Sequential``.
        """
        if not isinstance(model, nn.Sequential):
            raise TypeError(f"a pipelined job's model must be an nn.Sequential of blocks (the "
                            f"planner cuts spec.training.pipeline.blocks of them), got "
                            f"{type(model).__name__}")
        settings = self.contract.pipeline
        if sum(settings.stage_blocks) != len(model):
            raise ValueError(f"the plan cuts {sum(settings.stage_blocks)} blocks "
                             f"(HTJ_PIPELINE_STAGE_BLOCKS {list(settings.stage_blocks)}) and the "
                             f"model has {len(model)}: set spec.training.pipeline.blocks to "
                             f"{len(model)}")
        self._model = model
        self._groups = build_stage_groups(self.layout, self.rank)
        self._module = stage_module(model, settings.stage_blocks, self.stage)
        simulate_stage_compute(model, settings.stage_blocks, self.stage, self.contract.device,
                               self.contract.run.sim_delay_per_sample_s)  # simulated devices only
        if self.layout.replicas > 1:  # replicas start from replica 0's parameters
            first = self.layout.stage_ranks[self.stage][0]
            with torch.no_grad():
                for p in self._module.parameters():
                    dist.broadcast(p.data, src=first, group=self._groups.stage)
        if loss_fn is not None:
            self._build(loss_fn)
        return self._module

    def _build(self, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
               precision: Any = None, scaler: Any = None) -> None:
        """The stage runner (its stage module shares the parameters :meth:`wrap` returned), its
        forward under ``precision``'s autocast and its loss scaled by ``scaler`` (the job's one
        loss scale: every stage's gradients carry the same scale)."""
        settings = self.contract.pipeline
        self._scaler = scaler
        if scaler is not None:  # only the last stage scales a loss; every stage holds the scale
            scaler.scale(torch.zeros(()))
        scaled = loss_fn if scaler is None else (lambda out, target: scaler.scale(loss_fn(out, target)))
        autocast = precision.autocast if precision is not None and precision.dtype is not None else None
        self.runner = StageRunner(self._model, settings.stage_blocks, stage_index=self.stage,
                                  group=self._groups.pipeline,
                                  micro_batches=settings.micro_batches, loss_fn=scaled,
                                  schedule=settings.schedule, autocast=autocast)

    def step(self, optimizer: torch.optim.Optimizer,
             loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
             batch: Sequence[torch.Tensor] | None, *, precision: Any = None,
             scaler: Any = None) -> StepResult:
        """One optimizer step of every stage: the pipeline's forward and backward over its
        micro-batches, the stage replicas' gradient reduction, the optimizer step.

        With a loss scaler (some rank of the job runs fp16) the last stage scales each
        micro-batch's loss, so every stage's gradients carry the same scale; every rank unscales
        its own and the ranks of all stages agree whether any found inf/NaN
        (:class:`hetero_worker.precision.AgreeingGradScaler`, one all-reduce over the job): then
        every stage skips the step and the one scale backs off everywhere alike.

        Args:
            optimizer: over the stage module's parameters (what :meth:`wrap` returned).
            loss_fn: ``loss_fn(output, target)``, a mean over the micro-batch.
            batch: ``(inputs, target)``, the pipeline's batch (from the Trainer's loader).
            precision: the rank's :class:`~hetero_worker.precision.PrecisionPolicy` (its
                autocast), fixed at the first step; None: none.
            scaler: the job's loss scaler (None: no fp16 rank), fixed at the first step.

        Raises:
            RuntimeError: no :meth:`wrap` yet, or no batch.
        """
        if self._groups is None:
            raise RuntimeError("call Trainer.wrap(model) before step()")
        if batch is None or len(batch) != 2:
            raise RuntimeError("a pipelined step takes batch=(inputs, target): the pipeline's "
                               "batch from Trainer.loader")
        if self.runner is None:
            self._build(loss_fn, precision, scaler)
        runner = self.runner
        assert runner is not None
        start = time.perf_counter()
        inputs, target = batch
        optimizer.zero_grad(set_to_none=False)
        zeroed_s = time.perf_counter() - start
        losses = runner.step(inputs if runner.is_first else None,
                             target if runner.is_last else None)
        grads = [p.grad for p in runner.module.parameters() if p.grad is not None]
        if self.layout.replicas > 1:
            for g in grads:
                g.mul_(self.weight)
            reduce_stage_gradients_(runner.module, self._groups.stage)
        scaler = self._scaler
        loss_scale = scaler.get_scale() if scaler is not None else 1.0
        loss = self._job_loss(losses) / loss_scale
        optimizer_start = time.perf_counter()
        skipped = False
        if scaler is None:
            optimizer.step()
        else:  # agreed over every stage: all step, or all skip and back off
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
            scaler.update()
            skipped = scaler.last_found_inf
            if skipped:
                self.metrics.record_skipped_step()
        step_s = time.perf_counter() - start
        # compute: the stage's forward and backward and the optimizer; the rest is waiting
        compute_s = runner.compute_s + (step_s - (optimizer_start - start))
        self.steps.global_step += 1
        local = self.contract.local_batch
        wait_s = max(0.0, step_s - compute_s)
        self.metrics.set_local_batch(local)  # its share of the samples, not the pipeline's batch
        self.metrics.observe_step(step_s, compute_s, wait_s, local, loss)
        stages, micro = len(self.layout.stage_ranks), self.contract.pipeline.micro_batches
        self.metrics.observe_pipeline_step(self.stage, (stages - 1) / (micro + stages - 1),
                                           wait_s / step_s if step_s > 0 else 0.0)
        self.metrics.observe_stage_compute(runner.forward_s, runner.backward_s,
                                           zeroed_s + step_s - (optimizer_start - start),
                                           self.pipeline_batches[self.replica])
        return StepResult(loss=loss, skipped=skipped, step_s=step_s, compute_s=compute_s,
                          comm_wait_s=wait_s)

    def _job_loss(self, losses: list[torch.Tensor] | None) -> float:
        """The job's loss on every rank: the last stages' micro-batch means, weighted over the
        pipelines, summed on the last stage's group and sent along every pipeline."""
        value = torch.zeros(1, dtype=torch.float64)
        if losses is not None:
            mean = torch.stack([x.detach().to(torch.float64) for x in losses]).mean()
            value[0] = mean * self.pipeline_batches[self.replica] / sum(self.pipeline_batches)
            if self.layout.replicas > 1:
                dist.all_reduce(value, group=self._groups.stage)
        dist.broadcast(value, src=self._last_rank, group=self._groups.pipeline)
        return float(value[0])
