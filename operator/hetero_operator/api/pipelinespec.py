"""``spec.training.pipeline``: pipeline stages across GPU types (pure; issue 30, item 1).

    pipeline:
      stages: Auto        # or an integer 2..MAX_STAGES (one stage per placed GPU type today)
      microBatches: 8     # micro-batches per step, >= stages
      schedule: 1F1B      # or GPipe
      blocks: 12          # the model's blocks (its nn.Sequential's length); the planner needs it
      boundaryBytesPerSample: 4096   # bytes one block's output holds per sample (crosses a cut)
      blockCosts:         # optional, one per block (hetero_worker.stages.probe measures them)
        - {parameters: 49408, activationBytesPerSample: 40k, outputBytesPerSample: 32Ki, compute: "1.5"}

Parsed here into :class:`PipelineSpec`; the planner (:mod:`hetero_operator.planning.stages`,
wired by :mod:`hetero_operator.planning.pipelineplan`) and the worker
(:mod:`hetero_worker.stages`) take the same schedule names. Without ``blockCosts`` the blocks are
taken as equal: each holds ``1 / blocks`` of ``spec.training.model.parameters``, of its
activations and of the compute. With them, each block has its own parameters, activation bytes
per sample, output bytes per sample (what crosses a cut after it; default
``boundaryBytesPerSample``) and relative compute (any positive scale: the planner uses the
shares).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hetero_operator.api.errors import SpecError
from hetero_operator.api.fields import quantity
from hetero_operator.api.strictfields import nearest
from heterotrain_common.pipelineschedules import SCHEDULES
MAX_STAGES = 16
"""Most pipeline stages a job may ask for."""
MAX_MICRO_BATCHES = 1024
"""Most micro-batches per step."""
MAX_BLOCKS = 4096
"""Most blocks a pipelined model may declare."""
DEFAULT_MICRO_BATCHES = 8
"""``microBatches`` when absent: the bubble of 3 stages is then 2 / 10 of the step."""
FIELDS: tuple[str, ...] = ("blockCosts", "blocks", "boundaryBytesPerSample", "microBatches",
                           "schedule", "stages")
COST_FIELDS: tuple[str, ...] = ("activationBytesPerSample", "compute", "outputBytesPerSample",
                                "parameters")
"""The fields of one ``blockCosts`` entry."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockCostSpec:
    """One ``spec.training.pipeline.blockCosts`` entry: a block as the planner weighs it.

    Attributes:
        parameters: the block's parameters (count).
        activation_bytes_per_sample: bytes it keeps for backward per sample.
        output_bytes_per_sample: bytes of its output per sample (crosses a cut after it); None =
            ``boundaryBytesPerSample``.
        compute: its relative compute per sample (> 0; only the shares matter; the spec gives an
            integer or a decimal string).
    """

    parameters: int
    activation_bytes_per_sample: int
    output_bytes_per_sample: int | None
    compute: float


@dataclass(frozen=True, kw_only=True, slots=True)
class PipelineSpec:
    """A parsed ``spec.training.pipeline``.

    Attributes:
        stages: stage count, or None for ``Auto`` (the planner picks).
        micro_batches: micro-batches per step.
        schedule: ``1F1B`` or ``GPipe``.
        blocks: the model's blocks (``spec.training.pipeline.blocks``); 0 = not given (the
            planner refuses to plan without it).
        boundary_bytes_per_sample: bytes of a block's output per sample, what crosses a stage
            boundary forward (and its gradient backward); 0 = not given (transfers not modelled).
        block_costs: one :class:`BlockCostSpec` per block (``blockCosts``); ``()`` = equal
            blocks.
    """

    stages: int | None
    micro_batches: int
    schedule: str
    blocks: int = 0
    boundary_bytes_per_sample: int = 0
    block_costs: tuple[BlockCostSpec, ...] = ()


def parse_pipeline(raw: Any, path: str = "spec.training.pipeline") -> PipelineSpec | None:
    """``spec.training.pipeline`` as a :class:`PipelineSpec`; None when absent (no pipeline).

    Raises:
        SpecError: naming the field and the fix (unknown field, bad ``stages``,
            ``microBatches`` out of range or fewer than the stages, unknown ``schedule``).
    """
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise SpecError(path, f"must be a mapping (stages, microBatches, schedule), got "
                              f"{type(raw).__name__}")
    for key in raw:
        if key not in FIELDS:
            hint = nearest(str(key), FIELDS)
            raise SpecError(f"{path}.{key}", "is no pipeline field"
                            + (f": did you mean {hint}?" if hint else f" (known: {', '.join(FIELDS)})"))
    stages_raw = raw.get("stages", "Auto")
    if stages_raw == "Auto":
        stages = None
    elif isinstance(stages_raw, int) and not isinstance(stages_raw, bool) and 2 <= stages_raw <= MAX_STAGES:
        stages = stages_raw
    else:
        raise SpecError(f"{path}.stages", f"must be Auto or an integer in 2..{MAX_STAGES}, got "
                                          f"{stages_raw!r}")
    micro = raw.get("microBatches", DEFAULT_MICRO_BATCHES)
    if isinstance(micro, bool) or not isinstance(micro, int) or not 1 <= micro <= MAX_MICRO_BATCHES:
        raise SpecError(f"{path}.microBatches", f"must be an integer in 1..{MAX_MICRO_BATCHES}, got "
                                                f"{micro!r}")
    if stages is not None and micro < stages:
        raise SpecError(f"{path}.microBatches", f"{micro} micro-batches cannot fill {stages} stages "
                                                f"(every stage would idle most of the step): set "
                                                f"microBatches to at least {stages}")
    schedule = raw.get("schedule", SCHEDULES[0])
    if schedule not in SCHEDULES:
        raise SpecError(f"{path}.schedule", f"must be one of {', '.join(SCHEDULES)}; got {schedule!r}")
    costs = _block_costs(raw.get("blockCosts"), f"{path}.blockCosts")
    blocks = raw.get("blocks", len(costs))
    if isinstance(blocks, bool) or not isinstance(blocks, int) or not 0 <= blocks <= MAX_BLOCKS:
        raise SpecError(f"{path}.blocks", f"must be the model's number of blocks, an integer in "
                                          f"1..{MAX_BLOCKS}, got {blocks!r}")
    if blocks and stages is not None and blocks < stages:
        raise SpecError(f"{path}.blocks", f"{blocks} blocks cannot fill {stages} stages: every "
                                          f"stage holds at least one block")
    boundary = raw.get("boundaryBytesPerSample", 0)
    if isinstance(boundary, bool) or not isinstance(boundary, int) or not 0 <= boundary <= 2**40:
        raise SpecError(f"{path}.boundaryBytesPerSample", f"must be an integer of bytes >= 0, got "
                                                          f"{boundary!r}")
    if costs and blocks != len(costs):
        raise SpecError(f"{path}.blockCosts", f"has {len(costs)} entries and blocks is {blocks}: "
                                              f"give one entry per block (or leave blocks out)")
    return PipelineSpec(stages=stages, micro_batches=micro, schedule=schedule, blocks=blocks,
                        boundary_bytes_per_sample=boundary, block_costs=costs)


def _block_costs(raw: Any, path: str) -> tuple[BlockCostSpec, ...]:
    """``blockCosts`` as :class:`BlockCostSpec` entries; ``()`` when absent.

    Raises:
        SpecError: not a list of mappings, an unknown field, a missing or negative count, or a
            compute that is not a positive number.
    """
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw or len(raw) > MAX_BLOCKS:
        raise SpecError(path, f"must be a list of 1..{MAX_BLOCKS} entries, one per block "
                              f"(parameters, activationBytesPerSample, outputBytesPerSample, "
                              f"compute)")
    out = []
    for j, entry in enumerate(raw):
        at = f"{path}[{j}]"
        if not isinstance(entry, Mapping):
            raise SpecError(at, f"must be a mapping ({', '.join(COST_FIELDS)}), got "
                                f"{type(entry).__name__}")
        for key in entry:
            if key not in COST_FIELDS:
                hint = nearest(str(key), COST_FIELDS)
                raise SpecError(f"{at}.{key}", "is no block cost field" + (
                    f": did you mean {hint}?" if hint else f" (known: {', '.join(COST_FIELDS)})"))
        params = entry.get("parameters")
        if isinstance(params, bool) or not isinstance(params, int) or params < 0:
            raise SpecError(f"{at}.parameters", f"must be the block's parameter count, an integer "
                                                f">= 0, got {params!r}")
        compute = _positive_decimal(entry.get("compute", 1), f"{at}.compute")
        output = (quantity(entry, "outputBytesPerSample", f"{at}.outputBytesPerSample")
                  if "outputBytesPerSample" in entry else None)
        out.append(BlockCostSpec(
            parameters=params, compute=compute, output_bytes_per_sample=output,
            activation_bytes_per_sample=quantity(entry, "activationBytesPerSample",
                                                 f"{at}.activationBytesPerSample")))
    return tuple(out)


def _positive_decimal(value: Any, path: str) -> float:
    """An integer or a decimal string (``"1.84"``; no floats in the spec, as Kubernetes APIs
    avoid them) as a positive float.

    Raises:
        SpecError: anything else, or not above 0.
    """
    number: float | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value) if value.strip() == value and value else None
        except ValueError:
            number = None
    if number is None or not number > 0 or number != number or number == float("inf"):
        raise SpecError(path, f"must be a positive integer or decimal string (the block's relative "
                              f"compute per sample, e.g. \"1.84\"), got {value!r}")
    return number
