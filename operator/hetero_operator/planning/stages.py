"""Pipeline stages across GPU types: which type runs which contiguous blocks (pure; issue 30).

The model is a sequence of ``L`` blocks (what the worker's stages take, an ``nn.Sequential``).
Each GPU type placed for the job becomes one pipeline stage; its ranks of that type are the
stage's data-parallel replicas, so a stage's aggregate speed is ``ranks x speed``. The planner
picks the order of the types and the contiguous blocks of each stage so that the slowest stage's
micro-batch slot is as short as possible and every stage fits its type's memory.

**Slot of a stage** holding blocks ``[a, b)`` (seconds per micro-batch, forward + backward)::

    compute  = sum(block.compute_s_per_sample for a <= j < b) x micro_batch / (ranks x speed)
    transfer = boundary(a) + boundary(b)      (recv of the input, send of the output)
    boundary(k) = 2 x (bytes/s transfer of block k-1's output for one micro-batch + latency)

for ``0 < k < L`` (the activation forward, its gradient backward, over the link between GPU types
of :class:`heterotrain_common.linkcost.LinkModel`: ``inter_bw_bytes_per_s`` and
``inter_latency_s``); the first and last stage have no outer boundary. Compute and transfer are
added, not overlapped (conservative, as :mod:`hetero_operator.planning.steptime`).

**A block's compute** on a GPU type is its measured forward and backward seconds per sample
where an earlier run measured them (``measured``: :mod:`hetero_operator.planning.stagetimes`), else
``compute_s_per_sample / speed`` split :data:`~heterotrain_common.pipelineschedules.FORWARD_SHARE`
forward, the rest backward.

**Step** under GPipe or 1F1B with ``m`` micro-batches and ``s`` stages: the schedule played
operation by operation (:func:`hetero_operator.planning.schedulesim.simulate`: each stage's
forward and backward of one micro-batch, each boundary's one-way transfer, which overlaps
compute), then the slowest stage's gradient all-reduce among its replicas (a ring inside one node:
:func:`heterotrain_common.linkcost.collective_s`, the stage's parameter bytes,
``intra_bw_bytes_per_s``), after the pipeline drains. With equal stages and free transfers the
played schedule takes ``(m + s - 1)`` slots (the bubble is ``(s - 1) / (m + s - 1)`` of the step;
Huang et al., "GPipe", 2019; Narayanan et al., "PipeDream", 2019). The split is chosen by the
slowest slot (below); the played schedule and the all-reduce give the predicted step.

**Memory of a rank** of stage ``i`` (bytes)::

    param_bytes(stage) x STATE_BYTES_PER_PARAM_BYTE
    + activation_bytes_per_sample(stage) x ceil(micro_batch / ranks) x in_flight(i)

with ``in_flight = m`` under GPipe (every forward before any backward) and ``min(m, s - i)``
under 1F1B (stage ``i`` holds at most ``s - i`` micro-batches, PipeDream-Flush).

The search: every order of the types (up to :data:`MAX_ORDERED_TYPES` types; beyond, fastest
aggregate first), and for each an exact dynamic programme over the contiguous splits
minimising the slowest slot (``O(s L^2)``). Ties go to the order given (fastest aggregate first),
then to the split with more blocks on earlier stages.

Not modelled yet: a stage's replicas spread over several nodes, stages that span GPU types,
several stages of one type, a stage count other than the number of types.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hetero_operator.planning.schedulesim import simulate
from heterotrain_common.linkcost import LinkModel, collective_s
from heterotrain_common.pipelineschedules import FORWARD_SHARE, SCHEDULES

STATE_BYTES_PER_PARAM_BYTE = 4
"""Resident bytes per fp32 parameter byte in a stage: the parameter, its gradient and Adam's two
moments."""
MAX_ORDERED_TYPES = 6
"""Up to this many GPU types every order of them is tried (6! = 720 orders)."""


class StagePlanError(ValueError):
    """No stage split fits; the message names the stage, its GPU type and the fix."""


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockCost:
    """One block of the model.

    Attributes:
        param_bytes: fp32 parameter bytes of the block, >= 0.
        activation_bytes_per_sample: bytes the block keeps for backward per sample, >= 0.
        output_bytes_per_sample: bytes of the block's output per sample (what crosses a stage
            boundary after it), >= 0.
        compute_s_per_sample: forward + backward seconds per sample on a device of speed 1.0, >= 0.
    """

    param_bytes: int
    activation_bytes_per_sample: int
    output_bytes_per_sample: int
    compute_s_per_sample: float

    def __post_init__(self) -> None:
        if min(self.param_bytes, self.activation_bytes_per_sample, self.output_bytes_per_sample,
               self.compute_s_per_sample) < 0:
            raise ValueError("block costs must be >= 0")


@dataclass(frozen=True, kw_only=True, slots=True)
class BlockTime:
    """One block's compute on one device of a GPU type, measured (seconds per sample, >= 0).

    Attributes:
        forward_s: forward seconds per sample.
        backward_s: backward seconds per sample.
    """

    forward_s: float
    backward_s: float


@dataclass(frozen=True, kw_only=True, slots=True)
class StageDevice:
    """The placed ranks of one GPU type.

    Attributes:
        gpu_type: the type's name (e.g. ``A100-80GB``).
        speed: relative speed of one device (1.0 = the speed ``compute_s_per_sample`` is given at), > 0.
        memory_bytes: usable memory of one device, > 0.
        ranks: ranks of this type, >= 1 (the stage's data-parallel replicas).
    """

    gpu_type: str
    speed: float
    memory_bytes: int
    ranks: int = 1

    def __post_init__(self) -> None:
        if self.speed <= 0 or self.memory_bytes <= 0 or self.ranks < 1:
            raise ValueError(f"{self.gpu_type}: speed and memory must be > 0 and ranks >= 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class Stage:
    """One planned stage.

    Attributes:
        index: stage number, 0 = first (takes the input).
        gpu_type: the GPU type whose ranks run it.
        ranks: its data-parallel replicas.
        blocks: ``(first, end)``: blocks ``first <= j < end``.
        compute_s: compute of one micro-batch, seconds (``forward_s + backward_s``).
        forward_s / backward_s: of one micro-batch, seconds.
        transfer_s: boundary sends and receives of one micro-batch, seconds.
        slot_s: ``compute_s + transfer_s``.
        sync_s: the gradient all-reduce among the stage's replicas once per step, seconds.
        memory_bytes: a rank's need (parameters, optimiser state, activations in flight).
    """

    index: int
    gpu_type: str
    ranks: int
    blocks: tuple[int, int]
    compute_s: float
    forward_s: float
    backward_s: float
    transfer_s: float
    slot_s: float
    sync_s: float
    memory_bytes: int

    @property
    def block_count(self) -> int:
        """Number of blocks in the stage."""
        return self.blocks[1] - self.blocks[0]


@dataclass(frozen=True, kw_only=True, slots=True)
class StagePlan:
    """The chosen stages and the predicted step.

    Attributes:
        stages: in pipeline order.
        micro_batches: ``m``.
        schedule: ``GPipe`` or ``1F1B``.
        slowest_slot_s: the largest ``slot_s``.
        step_s: the played schedule's step (:func:`hetero_operator.planning.schedulesim.simulate`)
            + the slowest stage's ``sync_s``.
        bubble_fraction: ``(s - 1) / (m + s - 1)``.
    """

    stages: tuple[Stage, ...]
    micro_batches: int
    schedule: str
    slowest_slot_s: float
    step_s: float
    bubble_fraction: float

    @property
    def block_counts(self) -> list[int]:
        """Blocks per stage, pipeline order."""
        return [s.block_count for s in self.stages]


def in_flight(stage_index: int, stage_count: int, micro_batches: int, schedule: str) -> int:
    """Micro-batches whose activations stage ``stage_index`` holds at once (see module docstring)."""
    if schedule == "GPipe":
        return micro_batches
    return min(micro_batches, stage_count - stage_index)


class _Costs:
    """Prefix sums and per-segment costs for one problem (internal)."""

    def __init__(self, blocks: Sequence[BlockCost], link: LinkModel, micro_batch: float,
                 micro_batches: int, schedule: str, devices: Sequence[StageDevice],
                 measured: Mapping[str, Sequence[BlockTime]]) -> None:
        self.blocks = blocks
        self.micro_batch = micro_batch
        self.m = micro_batches
        self.schedule = schedule
        self.s = len(devices)
        self.forward: dict[str, list[float]] = {}   # GPU type -> prefix sums, s per sample
        self.backward: dict[str, list[float]] = {}
        for d in devices:
            times = measured.get(d.gpu_type)
            if times is not None and len(times) != len(blocks):
                raise ValueError(f"{d.gpu_type}: {len(times)} measured block times for "
                                 f"{len(blocks)} blocks")
            if times is None:
                times = [BlockTime(forward_s=FORWARD_SHARE * b.compute_s_per_sample / d.speed,
                                   backward_s=(1 - FORWARD_SHARE) * b.compute_s_per_sample / d.speed)
                         for b in blocks]
            self.forward[d.gpu_type] = list(itertools.accumulate((t.forward_s for t in times),
                                                                 initial=0.0))
            self.backward[d.gpu_type] = list(itertools.accumulate((t.backward_s for t in times),
                                                                  initial=0.0))
        self.params = list(itertools.accumulate((b.param_bytes for b in blocks), initial=0))
        self.acts = list(itertools.accumulate((b.activation_bytes_per_sample for b in blocks), initial=0))
        self.one_way = [0.0] * (len(blocks) + 1)   # one micro-batch's transfer after block k-1
        for k in range(1, len(blocks)):
            nbytes = blocks[k - 1].output_bytes_per_sample * micro_batch
            self.one_way[k] = nbytes / link.inter_bw_bytes_per_s + link.inter_latency_s
        self.boundary = [2 * t for t in self.one_way]   # forward and backward

    def memory(self, a: int, b: int, device: StageDevice, index: int) -> int:
        per_rank = math.ceil(self.micro_batch / device.ranks)
        return ((self.params[b] - self.params[a]) * STATE_BYTES_PER_PARAM_BYTE
                + (self.acts[b] - self.acts[a]) * per_rank
                * in_flight(index, self.s, self.m, self.schedule))

    def forward_s(self, a: int, b: int, device: StageDevice) -> float:
        prefix = self.forward[device.gpu_type]
        return (prefix[b] - prefix[a]) * self.micro_batch / device.ranks

    def backward_s(self, a: int, b: int, device: StageDevice) -> float:
        prefix = self.backward[device.gpu_type]
        return (prefix[b] - prefix[a]) * self.micro_batch / device.ranks

    def compute_s(self, a: int, b: int, device: StageDevice) -> float:
        return self.forward_s(a, b, device) + self.backward_s(a, b, device)

    def slot(self, a: int, b: int, device: StageDevice, index: int) -> float:
        """Slot seconds of blocks ``[a, b)`` on ``device`` as stage ``index``; inf if it does not fit."""
        if self.memory(a, b, device, index) > device.memory_bytes:
            return math.inf
        return self.compute_s(a, b, device) + self.boundary[a] + self.boundary[b]


def _best_split(costs: _Costs, order: Sequence[StageDevice]) -> tuple[float, list[int]] | None:
    """Minimal slowest slot over contiguous splits (each stage >= 1 block) and the stage ends."""
    n, s = len(costs.blocks), len(order)
    best = [[math.inf] * (n + 1) for _ in range(s + 1)]
    cut = [[0] * (n + 1) for _ in range(s + 1)]
    best[0][0] = 0.0
    for i in range(1, s + 1):
        for b in range(i, n - (s - i) + 1):
            # a from high to low, strict improvement only: on ties the earlier stages keep more
            for a in range(b - 1, i - 2, -1):
                if best[i - 1][a] == math.inf:
                    continue
                value = max(best[i - 1][a], costs.slot(a, b, order[i - 1], i - 1))
                if value < best[i][b] - 1e-12:
                    best[i][b], cut[i][b] = value, a
    if best[s][n] == math.inf:
        return None
    ends, b = [], n
    for i in range(s, 0, -1):
        ends.append(b)
        b = cut[i][b]
    return best[s][n], ends[::-1]


def _why_not(costs: _Costs, devices: Sequence[StageDevice]) -> str:
    """The sentence for a model no split fits: the first block no type can hold, else the total."""
    s = len(devices)
    roomiest = max(devices, key=lambda d: (d.memory_bytes, d.gpu_type))
    for j in range(len(costs.blocks)):
        if all(costs.memory(j, j + 1, d, 0) > d.memory_bytes for d in devices):
            need = costs.memory(j, j + 1, roomiest, 0)
            return (f"block {j} alone needs {need / 2**20:.0f} MiB per rank on {roomiest.gpu_type} "
                    f"(the roomiest GPU type, {roomiest.memory_bytes / 2**20:.0f} MiB) as the first of "
                    f"{s} stages: raise spec.training.pipeline.microBatches (fewer activations per "
                    f"micro-batch), use schedule 1F1B (fewer micro-batches in flight), split the block, "
                    f"or place GPUs with more memory")
    return (f"the {len(costs.blocks)} blocks need more memory than {s} stages on "
            f"{', '.join(d.gpu_type for d in devices)} hold together: raise "
            f"spec.training.pipeline.microBatches, use schedule 1F1B, place more or larger GPUs, "
            f"or use spec.training.sharding Full")


def plan_stages(blocks: Sequence[BlockCost], devices: Sequence[StageDevice], *, global_batch: int,
                micro_batches: int, link: LinkModel, schedule: str = SCHEDULES[0],
                measured: Mapping[str, Sequence[BlockTime]] | None = None) -> StagePlan:
    """Stages for ``blocks`` on ``devices``, one stage per GPU type (see the module docstring).

    Args:
        blocks: the model's blocks, in order (at least as many as ``devices``).
        devices: the placed ranks, one entry per GPU type.
        global_batch: samples per step, >= micro_batches.
        micro_batches: ``m`` >= 1; a micro-batch holds ``global_batch / m`` samples.
        link: the link between GPU types (bandwidth, latency).
        schedule: ``GPipe`` or ``1F1B``.
        measured: per GPU type, every block's measured time on one of its devices; a type
            without an entry is modelled from ``compute_s_per_sample`` and its speed.

    Returns:
        The plan with the smallest slowest slot.

    Raises:
        ValueError: fewer blocks than GPU types, an unknown schedule, a bad batch.
        StagePlanError: no split fits memory (the message names the fix).
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"spec.training.pipeline.schedule must be one of {', '.join(SCHEDULES)}, "
                         f"got {schedule!r}")
    if not devices:
        raise ValueError("no GPU types placed")
    if len({d.gpu_type for d in devices}) != len(devices):
        raise ValueError("one StageDevice per GPU type")
    if len(blocks) < len(devices):
        raise ValueError(f"{len(blocks)} blocks cannot fill {len(devices)} stages (one per GPU type): "
                         f"split the model into more blocks or place fewer GPU types")
    if micro_batches < 1 or global_batch < micro_batches:
        raise ValueError(f"spec.training.pipeline.microBatches must be 1..{global_batch} (the global "
                         f"batch), got {micro_batches}")
    ranked = sorted(devices, key=lambda d: (-d.ranks * d.speed, d.gpu_type))
    orders = (itertools.permutations(ranked) if len(ranked) <= MAX_ORDERED_TYPES else [tuple(ranked)])
    costs = _Costs(blocks, link, global_batch / micro_batches, micro_batches, schedule, devices,
                   measured or {})
    chosen: tuple[float, Sequence[StageDevice], list[int]] | None = None
    for order in orders:
        found = _best_split(costs, order)
        if found is not None and (chosen is None or found[0] < chosen[0] - 1e-12):
            chosen = (found[0], order, found[1])
    if chosen is None:
        raise StagePlanError(_why_not(costs, devices))
    slowest, order, ends = chosen
    stages, a = [], 0
    for i, (device, b) in enumerate(zip(order, ends)):
        forward, backward = costs.forward_s(a, b, device), costs.backward_s(a, b, device)
        compute = forward + backward
        transfer = costs.boundary[a] + costs.boundary[b]
        sync = collective_s([list(range(device.ranks))], ["one node"] * device.ranks,
                            costs.params[b] - costs.params[a], link, kind="allreduce")
        stages.append(Stage(index=i, gpu_type=device.gpu_type, ranks=device.ranks, blocks=(a, b),
                            compute_s=compute, forward_s=forward, backward_s=backward,
                            transfer_s=transfer, slot_s=compute + transfer,
                            sync_s=sync, memory_bytes=costs.memory(a, b, device, i)))
        a = b
    s = len(stages)
    played = simulate([st.forward_s for st in stages], [st.backward_s for st in stages],
                      [costs.one_way[st.blocks[1]] for st in stages[:-1]], micro_batches, schedule)
    return StagePlan(stages=tuple(stages), micro_batches=micro_batches, schedule=schedule,
                     slowest_slot_s=slowest,
                     step_s=played.step_s + max(st.sync_s for st in stages),
                     bubble_fraction=(s - 1) / (micro_batches + s - 1))
