"""Value types of the planner's memory decision (``Plan.memory``): model, per-rank slots and
results, modes (pure)."""

from __future__ import annotations

from dataclasses import dataclass

SHARDINGS = ("Auto", "None", "Group", "Full")
"""``spec.training.sharding`` values."""
MODES = ("None", "Group", "Full")
"""Concrete modes, in order of the traffic they add (the tie-break of ``Auto``)."""
OPTIMIZERS = ("SGD", "Momentum", "Adam", "AdamW")
"""``spec.training.optimizer`` values."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelMemory:
    """What the job says about its model (``spec.training.model`` and ``optimizer``).

    Attributes:
        parameters: trainable parameters (0 = not given: no memory model).
        optimizer: one of :data:`OPTIMIZERS`.
        activation_bytes_per_sample: activations saved for backward per sample, bytes.
        checkpointed_activation_bytes_per_sample: the same with activation checkpointing of the
            user's blocks, bytes; 0 = not given (the planner never turns checkpointing on).
    """

    parameters: int
    optimizer: str = "AdamW"
    activation_bytes_per_sample: int = 0
    checkpointed_activation_bytes_per_sample: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class RankSlot:
    """One rank as the memory model sees it.

    Attributes:
        rank / group / node / gpu_type: as in the plan.
        memory_mib: the device's memory label, MiB.
        precision: ``"bf16"|"fp16"|"fp32"``.
        local_batch: samples of the global batch this rank computes per step (by speed).
    """

    rank: int
    group: int
    node: str
    gpu_type: str
    memory_mib: int
    precision: str
    local_batch: int


@dataclass(frozen=True, kw_only=True, slots=True)
class RankMemory:
    """One rank's memory under the chosen mode.

    Attributes:
        rank: global rank.
        gpu_type: GFD product with MIG suffix.
        usable_bytes: device memory minus the reserve.
        state_share_ppm: share of the whole model state this rank holds, parts per million.
        state_bytes: bytes of state it holds.
        micro_batch_size: most samples per micro-batch (``HTJ_MICRO_BATCH_SIZE``).
        micro_batches: micro-batches of its local batch (``ceil(local_batch / micro_batch_size)``).
        activation_checkpointing: the rank recomputes its blocks' activations in backward.
        peak_bytes: planned peak: state + one micro-batch's activations.
        samples_that_fit: most samples whose activations fit beside the state (the memory bound,
            independent of the local batch; what ``HTJ_MICRO_BATCH_SIZE`` carries so a rebalanced
            batch stays within memory); 0 when activations are not modelled.
    """

    rank: int
    gpu_type: str
    usable_bytes: int
    state_share_ppm: int
    state_bytes: int
    micro_batch_size: int
    micro_batches: int
    activation_checkpointing: bool
    peak_bytes: int
    samples_that_fit: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class ModeOption:
    """How one sharding mode fares on this plan.

    Attributes:
        mode: one of :data:`MODES`.
        fits: every rank fits (possibly with micro-batches / checkpointing).
        cross_type_bytes: bytes one rank sends over the cross-type link per step (largest rank).
        cross_type_s: those bytes at the link's bandwidth, seconds (the cost ``Auto`` compares).
        shortfalls: per GPU type that does not fit, ``(gpu_type, short_bytes, usable_bytes)``.
        available: the worker can run the mode (see ``planning.WORKER_SHARDINGS``).
        predicted_step_s: the mode's predicted step, seconds (compute with recomputation,
            cross-type and in-group traffic per micro-batch; ``planning.steptime``); None when
            the mode does not fit or the plan has no seconds per sample (then ``Auto`` compares
            ``cross_type_s``).
        predicted_samples_per_s: global batch / ``predicted_step_s`` (what ``Auto`` maximises).
        step_cross_type_bytes: the step-time model's cross-type bytes per step (micro-batches
            counted); None where ``predicted_step_s`` is.
    """

    mode: str
    fits: bool
    cross_type_bytes: int
    cross_type_s: float
    shortfalls: tuple[tuple[str, int, int], ...] = ()
    available: bool = True
    predicted_step_s: float | None = None
    predicted_samples_per_s: float | None = None
    step_cross_type_bytes: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryPlan:
    """The planner's memory decision (``Plan.memory``).

    Attributes:
        requested: ``spec.training.sharding``.
        mode: the chosen mode (one of :data:`MODES`).
        state_bytes: the whole model's state (parameters, gradients, optimizer), bytes.
        bytes_per_parameter: state bytes per parameter used.
        ranks: per rank, ordered by rank.
        options: every mode considered, in :data:`MODES` order.
        reasons: one sentence per GPU type: what it holds and why (the plan prints them).
    """

    requested: str
    mode: str
    state_bytes: int
    bytes_per_parameter: int
    ranks: tuple[RankMemory, ...]
    options: tuple[ModeOption, ...]
    reasons: tuple[str, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class MemoryRefusal:
    """No allowed mode fits: the message names the shortfall per GPU type and the fix."""

    message: str
    options: tuple[ModeOption, ...]
