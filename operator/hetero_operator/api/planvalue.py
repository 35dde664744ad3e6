"""The step-time model's view of a plan (pure, frozen dataclasses): what each GPU type adds, what
``spec.gpus.selection: Throughput`` left out, the cheapest mix for a target throughput, and the
whole plan's predicted throughput and cost. Built by :mod:`hetero_operator.planning.marginal`,
carried as :attr:`hetero_operator.api.types.Plan.value`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class TypeValue:
    """What one GPU type contributes to a plan (from the step-time model).

    Attributes:
        gpu_type: GFD-style product (with ``-MIG-<profile>``).
        devices: devices of this type in the plan.
        relative_speed: speed used for the split (A100 = 1.0).
        speed_source: ``"learned"`` (measured by earlier jobs of the same profileKey),
            ``"override"`` (``spec.gpus.speedOverrides``) or ``"table"`` (built-in figures).
        samples_per_s_per_device: one device's compute throughput, samples/s; None when the
            plan has no absolute figure (table speeds without a reference throughput).
        observations: learned observations behind the figure (0 for table/override).
        age_s: seconds since the newest learned observation; None for table/override.
        table_speed: the built-in table's relative speed of a learned type (None otherwise):
            ``heterotrain plan`` points out a learned figure more than 2x away from it.
        observed_by: ``namespace/job`` that last changed the learned figure.
        share_of_step: this type's share of the global batch per step, 0..1.
        throughput_added: predicted job throughput with the type minus without it (samples/s,
            or A100-equivalents when not absolute).
        gain_percent: ``100 * (with / without - 1)``; None when no other type is in the plan
            or the others cannot hold the global batch.
        communication_added_percent: change of the predicted sync time per step from adding the
            type, percent; None when communication is not modelled or nothing else remains.
        price_per_hour: price of one device per hour (the configured currency); None when unpriced.
        cost_per_million_samples: what this type's devices cost per million samples they
            process; None without a price or an absolute throughput.
    """

    gpu_type: str
    devices: int
    relative_speed: float
    speed_source: str
    samples_per_s_per_device: float | None
    observations: int = 0
    age_s: float | None = None
    table_speed: float | None = None
    observed_by: str = ""
    share_of_step: float
    throughput_added: float
    gain_percent: float | None
    communication_added_percent: float | None
    price_per_hour: float | None = None
    cost_per_million_samples: float | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class LeftOut:
    """Devices ``spec.gpus.selection: Throughput`` did not use because they do not pay.

    Attributes:
        gpu_type: GFD-style product.
        devices: free eligible devices of the type that were left out.
        gain_percent: predicted throughput gain had they been used, percent.
        communication_added_percent: predicted increase of the sync time per step, percent
            (None when communication is not modelled).
        message: e.g. ``"left out 4x Tesla-K80: +2.0 % throughput, +30.0 % communication
            (below spec.gpus.minGainPercent 5)"``.
    """

    gpu_type: str
    devices: int
    gain_percent: float
    communication_added_percent: float | None
    message: str


@dataclass(frozen=True, kw_only=True, slots=True)
class CheapestMix:
    """The cheapest set of GPU types whose predicted throughput reaches a target.

    Attributes:
        target_samples_per_s: the target, samples/s.
        gpu_types: types used (each with all its devices the plan would take), in plan order.
        devices: devices used in total.
        predicted_samples_per_s: the mix's predicted throughput.
        cost_per_hour: the mix's price per hour.
        cost_per_million_samples: at the predicted throughput.
        message: one sentence (also when no mix reaches the target).
    """

    target_samples_per_s: float
    gpu_types: tuple[str, ...]
    devices: int
    predicted_samples_per_s: float | None
    cost_per_hour: float | None
    cost_per_million_samples: float | None
    message: str


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanValue:
    """The step-time model's view of a plan.

    Attributes:
        absolute: True when throughputs are samples/s (a learned figure or a reference
            throughput sets the scale); False: A100-equivalents (sum of relative speeds when the
            split is balanced), and communication is left out.
        predicted_throughput: global samples per second (or A100-equivalents).
        compute_s: predicted compute time of the slowest rank per step, seconds (or units).
        communication_s: predicted gradient sync time per step, seconds (0 when not modelled).
        hierarchy: the reduction layout the prediction assumed (``flat|group|node|arch``).
        communication_note: why communication is or is not modelled, one sentence.
        types: per GPU type in the plan, in plan order.
        left_out: types ``selection: Throughput`` left out, in the order they were dropped.
        cost_per_hour / cost_per_million_samples: the whole plan's, None without prices for
            every type (or without an absolute throughput for the latter).
        cheapest_mix: answer to a target throughput, None when none was asked.
    """

    absolute: bool
    predicted_throughput: float
    compute_s: float
    communication_s: float
    hierarchy: str
    communication_note: str
    types: tuple[TypeValue, ...]
    left_out: tuple[LeftOut, ...] = ()
    cost_per_hour: float | None = None
    cost_per_million_samples: float | None = None
    cheapest_mix: CheapestMix | None = None
