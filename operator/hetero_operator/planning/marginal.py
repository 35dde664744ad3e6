"""The planner's step-time model: predicted throughput, what each GPU type adds, what to leave out.

Model of one synchronous data-parallel step (pure, no I/O):

* **Compute**: rank ``r`` with local batch ``b_r`` on a device of type ``T`` takes
  ``b_r * s_T`` seconds, ``s_T`` = seconds per sample of one device.  ``s_T`` is ``1 /`` the
  learned samples/s of ``T`` (measured by earlier jobs of the same ``profileKey``,
  :mod:`hetero_operator.planning.profiles`), else ``1 / (speed_T * R)`` with ``speed_T`` the table (or
  ``speedOverrides``) speed and ``R`` the reference samples/s of a speed-1.0 device (derived from
  the learned types, else ``spec.training.referenceSamplesPerSecond``, else what the caller knows,
  e.g. the embedded runner's simulated delay).  Without any ``R`` the model runs in
  *A100-equivalents* (``R = 1``) and leaves communication out.  The step's compute is the slowest
  rank's: ``max_r b_r * s_T(r)``, with the batch split the planner uses (proportional to speed,
  within memory caps, :func:`~heterotrain_common.split.split_batch`).
* **Communication**: one gradient sync of ``spec.training.gradientMiB`` over the chosen hierarchy
  (``Auto``: the cheapest fixed layout), from the worker's link cost model
  (:func:`heterotrain_common.linkcost.sync_cost_s`: ring all-reduce / reduce / broadcast in the
  alpha-beta model of Thakur, Rabenseifner and Gropp 2005, per-node egress shared), with the
  link bandwidths of :class:`LinkSettings`.  Not overlapped with compute (conservative).
* **Step** = compute + communication; throughput = global batch / step.

Marginal value of a type ``T`` = throughput with the plan's devices minus throughput without ``T``'s
(re-split among the rest, communication recomputed for fewer ranks and nodes).  The same model
decides ``spec.gpus.selection: Throughput``: drop the type with the smallest gain while that gain is
below ``minGainPercent`` and the rest still has ``minRanks`` ranks and memory for the batch.  Research
schedulers ask the same question with a full optimisation (Sia, Jayaram Subramanya et al., SOSP
2023; Metis, Um et al., USENIX ATC 2024); per GPU type a greedy pass is exact enough and explainable.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetero_operator.api.planvalue import CheapestMix, LeftOut, TypeValue
from heterotrain_common import linkcost
from heterotrain_common.split import split_batch

HIERARCHY_MODES: dict[str, str | None] = {
    "Flat": "flat", "Group": "group", "PerNode": "node", "PerArchitecture": "arch", "Auto": None}
"""``spec.training.hierarchy`` -> the link model's layout; ``Auto`` takes the cheapest."""
MAX_MIX_TYPES = 12
"""The cheapest-mix search enumerates subsets of at most this many GPU types (2^12 predictions)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanInputs:
    """What the planner may know besides the job and the inventory.

    Attributes:
        learned: ``(GPU type, precision) -> LearnedSpeed`` of the job's ``profileKey``
            (:mod:`hetero_operator.planning.profiles`).
        prices: price of one device per hour by full GPU type, MIG profile or base product.
        link: link bandwidths.
        reference_samples_per_s: samples/s of a speed-1.0 device when the job and the learned
            figures do not say (e.g. the embedded runner's simulated delay).
        target_samples_per_s: ask for the cheapest mix reaching this throughput.
        now_s: Unix seconds for the learned figures' age (None: not reported).
        layout_pin: the layout of a checkpoint the run resumes (``Pipeline``, or a sharding
            mode; ``""`` = none): ``Auto`` keeps it rather than weigh the pipeline again
            (:mod:`hetero_operator.planning.layoutchoice`).
    """

    learned: Mapping[tuple[str, str], Any] = field(default_factory=dict)
    prices: Mapping[str, float] = field(default_factory=dict)
    link: LinkSettings = field(default_factory=lambda: LinkSettings())
    reference_samples_per_s: float | None = None
    target_samples_per_s: float | None = None
    now_s: float | None = None
    layout_pin: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class LinkSettings:
    """Link bandwidths the planner assumes (operator settings ``HTJ_LINK_*``, CLI flags).

    Attributes:
        intra_node_gbps: between devices of one node, Gbit/s (PCIe 4.0 x16 ~ 256; NVLink more).
        inter_node_gbps: one node's egress to the others, Gbit/s (a 10 GbE NIC: 10).
        intra_latency_s / inter_latency_s: per ring round, seconds.
    """

    intra_node_gbps: float = 100.0
    inter_node_gbps: float = 10.0
    intra_latency_s: float = 20e-6
    inter_latency_s: float = 100e-6

    def model(self) -> linkcost.LinkModel:
        """As the worker's :class:`~heterotrain_common.linkcost.LinkModel` (bytes/s)."""
        return linkcost.LinkModel(intra_bw_bytes_per_s=self.intra_node_gbps * 1e9 / 8,
                                  inter_bw_bytes_per_s=self.inter_node_gbps * 1e9 / 8,
                                  intra_latency_s=self.intra_latency_s,
                                  inter_latency_s=self.inter_latency_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class Slot:
    """One rank of a candidate plan, as the model sees it.

    Attributes:
        gpu_type: GFD-style product (the unit of selection and of learned figures).
        node: node name (links).
        arch: compute capability (the ``arch`` layout).
        group: topology group index (the ``group`` layout).
        speed: relative speed used for the split (A100 = 1.0).
        cap: largest local batch the device's memory holds.
    """

    gpu_type: str
    node: str
    arch: str
    group: int
    speed: float
    cap: int


@dataclass(frozen=True, kw_only=True, slots=True)
class Prediction:
    """One prediction of :func:`predict`.

    Attributes:
        throughput: global samples per second (or A100-equivalents).
        compute_s: the slowest rank's compute per step.
        communication_s: the sync per step (0 when not modelled).
        hierarchy: layout the communication assumed.
        batches: the local batch per slot.
    """

    throughput: float
    compute_s: float
    communication_s: float
    hierarchy: str
    batches: tuple[int, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class StepModel:
    """Everything :func:`predict` needs besides the slots.

    Attributes:
        global_batch: samples per step.
        proportional: ``batchSplit: Proportional`` (else equal).
        sample_s: seconds per sample of one device, per GPU type (units when not absolute).
        absolute: whether ``sample_s`` is in seconds.
        grad_bytes: gradient bytes per sync (0: communication not modelled).
        link: link bandwidths.
        hierarchy: ``spec.training.hierarchy``.
        efficiency: the share of the devices' standalone throughput that earlier jobs of the
            profileKey turned into training (their ``htj_job_efficiency_ratio``: waiting for
            stragglers, synchronisation, data loading); 1.0 when unknown.  Throughputs are
            multiplied by it; gains (ratios) do not change.
    """

    global_batch: int
    proportional: bool
    sample_s: Mapping[str, float]
    absolute: bool
    grad_bytes: float = 0.0
    link: LinkSettings = field(default_factory=LinkSettings)
    hierarchy: str = "Auto"
    efficiency: float = 1.0

    @property
    def models_communication(self) -> bool:
        """Communication enters the step time only with seconds and a gradient size."""
        return self.absolute and self.grad_bytes > 0


def predict(slots: Sequence[Slot], model: StepModel) -> Prediction | None:
    """Predicted step of a set of ranks.

    Returns:
        The :class:`Prediction`; None when the slots cannot run the job (no slot, fewer samples
        than ranks, or memory caps below the global batch).
    """
    g = model.global_batch
    if not slots or g < len(slots) or sum(min(s.cap, g) for s in slots) < g:
        return None
    weights = [s.speed for s in slots] if model.proportional else [1.0] * len(slots)
    batches = split_batch(g, weights, [s.cap for s in slots])
    compute_s = max(b * model.sample_s[s.gpu_type] for b, s in zip(batches, slots))
    comm_s, mode = communication_s(slots, model)
    return Prediction(throughput=g / (compute_s + comm_s) * model.efficiency, compute_s=compute_s,
                      communication_s=comm_s, hierarchy=mode, batches=tuple(batches))


def communication_s(slots: Sequence[Slot], model: StepModel) -> tuple[float, str]:
    """Predicted sync seconds per step and the layout assumed (``Auto``: the cheapest)."""
    fixed = HIERARCHY_MODES.get(model.hierarchy)
    if not model.models_communication or len(slots) < 2:
        return 0.0, fixed or "group"
    places = [linkcost.RankPlace(node=s.node, arch=s.arch, group=s.group) for s in slots]
    costs = linkcost.predict_modes(places, model.grad_bytes, model.link.model())
    if fixed is None:
        fixed = min(linkcost.FIXED_MODES, key=lambda m: (round(costs[m], 12),
                                                         linkcost.FIXED_MODES.index(m)))
    return costs[fixed], fixed


def without(slots: Sequence[Slot], gpu_type: str) -> list[Slot]:
    """``slots`` minus every slot of ``gpu_type``."""
    return [s for s in slots if s.gpu_type != gpu_type]


def types_in_order(slots: Sequence[Slot]) -> list[str]:
    """GPU types in first-seen order."""
    return list(dict.fromkeys(s.gpu_type for s in slots))


def gain(slots: Sequence[Slot], gpu_type: str, model: StepModel,
         full: Prediction | None = None) -> tuple[float | None, float | None, float]:
    """What ``gpu_type`` adds to ``slots``.

    Returns:
        ``(gain_percent, communication_added_percent, throughput_added)``: gain None when the
        rest cannot run the job alone; communication None when not modelled (or nothing left).
    """
    full = full or predict(slots, model)
    rest = predict(without(slots, gpu_type), model)
    if full is None:
        return None, None, 0.0
    if rest is None:
        return None, None, full.throughput
    gain_pct = 100.0 * (full.throughput / rest.throughput - 1.0)
    comm_pct: float | None = None
    if model.models_communication:
        comm_pct = (100.0 * (full.communication_s / rest.communication_s - 1.0)
                    if rest.communication_s > 0 else (None if full.communication_s == 0 else math.inf))
    return gain_pct, comm_pct, full.throughput - rest.throughput


def leave_out_unpaying(slots: Sequence[Slot], model: StepModel, *, min_ranks: int,
                       min_gain_percent: float) -> tuple[list[Slot], list[LeftOut]]:
    """Greedy ``selection: Throughput``: drop the least-gaining type while its gain is below
    ``min_gain_percent`` and the rest keeps ``min_ranks`` ranks and memory for the batch.

    Returns:
        ``(kept slots, left out)``; the left-out messages say gain and added communication.
    """
    kept = list(slots)
    left: list[LeftOut] = []
    while True:
        full = predict(kept, model)
        if full is None:
            return kept, left
        candidates = []
        for t in types_in_order(kept):
            rest = without(kept, t)
            if len(rest) < min_ranks or not rest:
                continue
            g_pct, c_pct, _ = gain(kept, t, model, full)
            if g_pct is not None and g_pct < min_gain_percent:
                candidates.append((g_pct, t, c_pct))
        if not candidates:
            return kept, left
        g_pct, t, c_pct = min(candidates, key=lambda c: (c[0], c[1]))
        n = sum(1 for s in kept if s.gpu_type == t)
        comm = "" if c_pct is None else f", {_signed(c_pct)} communication"
        left.append(LeftOut(
            gpu_type=t, devices=n, gain_percent=round(g_pct, 3),
            communication_added_percent=None if c_pct is None else round(c_pct, 3),
            message=(f"left out {n}x {t}: {_signed(g_pct)} throughput{comm} (below "
                     f"spec.gpus.minGainPercent {min_gain_percent:g}; selection: All uses them)")))
        kept = without(kept, t)


def type_values(slots: Sequence[Slot], model: StepModel, *, figures: Mapping[str, SpeedFigure],
                prices: Mapping[str, float | None]) -> tuple[tuple[TypeValue, ...], Prediction | None]:
    """Per GPU type: devices, speed and its source, share of the step, marginal throughput, cost.

    Args:
        figures: per GPU type, where its speed came from.
        prices: per GPU type, price of one device per hour (None: unpriced).
    """
    full = predict(slots, model)
    if full is None:
        return (), None
    out = []
    for t in types_in_order(slots):
        n = sum(1 for s in slots if s.gpu_type == t)
        share = sum(b for b, s in zip(full.batches, slots) if s.gpu_type == t) / model.global_batch
        g_pct, c_pct, added = gain(slots, t, model, full)
        fig = figures[t]
        price = prices.get(t)
        cost = None
        if price is not None and model.absolute and share > 0:
            cost = price * n / (full.throughput * share * 3600.0) * 1e6
        out.append(TypeValue(
            gpu_type=t, devices=n, relative_speed=round(fig.relative_speed, 6),
            speed_source=fig.source,
            samples_per_s_per_device=(round(1.0 / model.sample_s[t], 6) if model.absolute else None),
            observations=fig.observations, age_s=fig.age_s, table_speed=fig.table_speed,
            observed_by=fig.observed_by, share_of_step=round(share, 6),
            throughput_added=round(added, 6), gain_percent=_round(g_pct),
            communication_added_percent=_round(c_pct), price_per_hour=price,
            cost_per_million_samples=_round(cost)))
    return tuple(out), full


def plan_cost(slots: Sequence[Slot], prices: Mapping[str, float | None], throughput: float,
              absolute: bool) -> tuple[float | None, float | None]:
    """``(cost per hour, cost per million samples)`` of all slots; None where unpriced/unknown."""
    per_device = [prices.get(s.gpu_type) for s in slots]
    if not slots or any(p is None for p in per_device):
        return None, None
    hourly = float(sum(p for p in per_device if p is not None))
    per_million = hourly / (throughput * 3600.0) * 1e6 if absolute and throughput > 0 else None
    return round(hourly, 6), _round(per_million)


def cheapest_mix(slots: Sequence[Slot], model: StepModel, prices: Mapping[str, float | None], *,
                 target_samples_per_s: float, min_ranks: int) -> CheapestMix:
    """The cheapest subset of GPU types (all their devices in ``slots``) reaching the target.

    Only priced types take part; ties in cost go to the higher throughput.  Needs absolute
    throughputs (a learned figure or a reference throughput).
    """
    def none(message: str) -> CheapestMix:
        return CheapestMix(target_samples_per_s=target_samples_per_s, gpu_types=(), devices=0,
                           predicted_samples_per_s=None, cost_per_hour=None,
                           cost_per_million_samples=None, message=message)

    if not model.absolute:
        return none("no absolute throughput (no learned speeds, no "
                    "spec.training.referenceSamplesPerSecond): cannot compare with a target")
    types = [t for t in types_in_order(slots) if prices.get(t) is not None]
    if not types:
        return none("no GPU type of the plan has a price")
    types = types[:MAX_MIX_TYPES]
    best: tuple[float, float, tuple[str, ...], Prediction] | None = None
    for k in range(1, len(types) + 1):
        for subset in itertools.combinations(types, k):
            chosen = [s for s in slots if s.gpu_type in subset]
            if len(chosen) < min_ranks:
                continue
            pred = predict(chosen, model)
            if pred is None or pred.throughput < target_samples_per_s:
                continue
            hourly = sum(prices[s.gpu_type] or 0.0 for s in chosen)
            key = (hourly, -pred.throughput)
            if best is None or key < (best[0], best[1]):
                best = (hourly, -pred.throughput, subset, pred)
    if best is None:
        top = predict([s for s in slots if s.gpu_type in types], model)
        reach = f"; all priced types together predict {top.throughput:.1f} samples/s" if top else ""
        return none(f"no mix of the priced types reaches {target_samples_per_s:g} samples/s{reach}")
    hourly, _, subset, pred = best
    devices = sum(1 for s in slots if s.gpu_type in subset)
    per_million = hourly / (pred.throughput * 3600.0) * 1e6
    return CheapestMix(
        target_samples_per_s=target_samples_per_s, gpu_types=subset, devices=devices,
        predicted_samples_per_s=round(pred.throughput, 6), cost_per_hour=round(hourly, 6),
        cost_per_million_samples=round(per_million, 6),
        message=(f"cheapest mix for {target_samples_per_s:g} samples/s: "
                 f"{' + '.join(f'{sum(1 for s in slots if s.gpu_type == t)}x {t}' for t in subset)}"
                 f", {pred.throughput:.1f} samples/s predicted, {hourly:.2f} per hour, "
                 f"{per_million:.3f} per million samples"))


@dataclass(frozen=True, kw_only=True, slots=True)
class SpeedFigure:
    """Where a GPU type's speed in the plan came from.

    Attributes:
        relative_speed: the speed used (A100 = 1.0).
        source: ``learned``, ``override`` or ``table``.
        samples_per_s: learned samples/s of one device (None for table/override).
        observations: learned observations (0 otherwise).
        age_s: seconds since the newest learned observation (None otherwise).
        table_speed: the table's relative speed of a learned type (None otherwise).
        observed_by: ``namespace/job`` that last changed a learned figure.
    """

    relative_speed: float
    source: str
    samples_per_s: float | None = None
    observations: int = 0
    age_s: float | None = None
    table_speed: float | None = None
    observed_by: str = ""


def price_for(prices: Mapping[str, float], gpu_type: str, product: str, mig_profile: str) -> float | None:
    """A device's price per hour: the full GPU type, then the MIG profile, then the base product
    (scaled by compute slices / 7 is *not* applied: price a MIG type explicitly)."""
    for key in (gpu_type, mig_profile, product):
        if key and key in prices:
            return float(prices[key])
    return None


def _signed(pct: float) -> str:
    return "+inf %" if math.isinf(pct) else f"{pct:+.1f} %"


def _round(value: float | None) -> float | None:
    if value is None or math.isinf(value) or math.isnan(value):
        return None
    return round(value, 6)


VALUE_STATUS_KEYS = frozenset({"prediction", "gpuTypeValues", "leftOut"})
"""Keys :func:`value_status` adds to ``status.plan`` (declared in the CRD's status schema)."""


def value_status(value: Any) -> dict[str, Any]:
    """The ``status.plan`` keys of a :class:`~hetero_operator.api.types.PlanValue` (decimals as
    strings: no floats in the API object); empty for None."""
    if value is None:
        return {}
    unit = "samples/s" if value.absolute else "A100-equivalents"
    prediction: dict[str, Any] = {
        "throughput": f"{value.predicted_throughput:.1f}", "unit": unit,
        "computeSeconds": f"{value.compute_s:.6f}", "communicationSeconds": f"{value.communication_s:.6f}",
        "hierarchy": value.hierarchy, "communication": value.communication_note}
    if value.cost_per_hour is not None:
        prediction["costPerHour"] = f"{value.cost_per_hour:.4f}"
    if value.cost_per_million_samples is not None:
        prediction["costPerMillionSamples"] = f"{value.cost_per_million_samples:.4f}"
    types = []
    for t in value.types:
        entry: dict[str, Any] = {
            "gpuType": t.gpu_type, "devices": t.devices, "speedSource": t.speed_source,
            "relativeSpeed": f"{t.relative_speed:.3f}", "shareOfStep": f"{t.share_of_step:.3f}",
            "throughputAdded": f"{t.throughput_added:.1f}", "observations": t.observations}
        if t.gain_percent is not None:
            entry["gainPercent"] = f"{t.gain_percent:.1f}"
        if t.cost_per_million_samples is not None:
            entry["costPerMillionSamples"] = f"{t.cost_per_million_samples:.4f}"
        types.append(entry)
    return {"prediction": prediction, "gpuTypeValues": types,
            "leftOut": [{"gpuType": lo.gpu_type, "devices": lo.devices, "message": lo.message}
                        for lo in value.left_out]}
