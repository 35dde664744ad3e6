"""Value types of the planned pipeline (``Plan.pipeline``; issue 30): stages per GPU type.

Built by :mod:`hetero_operator.planning.pipelineplan` from the stage planner's split
(:mod:`hetero_operator.planning.stages`); rendered into the rank env contract
(:mod:`hetero_operator.render.env`), ``status.plan.pipeline`` and the plan table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class StageAssignment:
    """One planned stage.

    Attributes:
        index: stage number in pipeline order, 0 takes the input.
        gpu_type: the GPU type whose ranks run it.
        ranks: its replicas, global ranks in replica order (replica ``r`` of every stage forms
            pipeline ``r``).
        first_block: the stage's first block.
        blocks: the number of contiguous blocks it holds.
        slot_s: predicted seconds of one micro-batch in the stage (compute plus transfers).
        memory_bytes: a rank's planned need (state and activations in flight), bytes.
    """

    index: int
    gpu_type: str
    ranks: tuple[int, ...]
    first_block: int
    blocks: int
    slot_s: float
    memory_bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelinePlan:
    """The planned pipeline.

    Attributes:
        stages: in pipeline order.
        micro_batches: micro-batches per step.
        schedule: ``1F1B`` or ``GPipe``.
        step_s: predicted step (the schedule played on the stages' times,
            ``hetero_operator.planning.schedulesim``, plus the replicas' all-reduce), seconds at
            the planner's scale (relative without an absolute reference).
        bubble_fraction: ``(s - 1) / (m + s - 1)``.
        absolute: ``step_s`` is in seconds (the planner had samples/s of a speed-1.0 device).
        measured_stages: the GPU types whose block times earlier pipelined runs measured
            (``hetero_operator.planning.stagetimes``), sorted; ``()``: all modelled.
    """

    stages: tuple[StageAssignment, ...]
    micro_batches: int
    schedule: str
    step_s: float
    bubble_fraction: float
    absolute: bool = False
    measured_stages: tuple[str, ...] = ()

    @property
    def block_counts(self) -> list[int]:
        """Blocks per stage, pipeline order."""
        return [s.blocks for s in self.stages]

    @property
    def replicas(self) -> int:
        """Replicas per stage (the same on every stage)."""
        return len(self.stages[0].ranks)


@dataclass(frozen=True, kw_only=True, slots=True)
class LayoutChoice:
    """``Auto``'s choice between the pipeline and data parallelism without it
    (``spec.training.sharding Auto`` with ``spec.training.pipeline``;
    :mod:`hetero_operator.planning.layoutchoice`).

    Attributes:
        chosen: ``Pipeline``, or the sharding mode of the plan without a pipeline (``None``,
            ``Group``, ``Full``).
        pipeline_samples_per_s: the pipeline's predicted throughput, samples/s (global batch over
            ``PipelinePlan.step_s``); None where the planner has no seconds per sample.
        flat_samples_per_s: the predicted throughput of the best mode without a pipeline,
            samples/s; None where no mode fits or there are no seconds per sample.
        reasons: why, one sentence per candidate (its prediction, or per GPU type why it does not
            fit).
    """

    chosen: str
    pipeline_samples_per_s: float | None
    flat_samples_per_s: float | None
    reasons: tuple[str, ...]
