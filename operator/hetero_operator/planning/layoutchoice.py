"""``Auto`` between the pipeline and no pipeline (pure; issue 30).

A job with ``spec.training.pipeline`` and ``spec.training.sharding Auto`` (the default) gets two
plans on the same cluster: the pipelined one (:mod:`hetero_operator.planning.pipelineplan`) and the
one without a pipeline, where the memory model's ``Auto`` already took the fastest of ``None``,
``Group`` and ``Full`` that fits (:mod:`hetero_operator.planning.memory`). :func:`weigh` keeps the
one with the higher predicted throughput:

* the pipeline's ``global batch / PipelinePlan.step_s`` (the schedule played on the stages' times
  plus the replicas' all-reduce; :mod:`hetero_operator.planning.stages`);
* the chosen mode's ``predicted_samples_per_s`` (compute with recomputation, cross-type and
  in-group traffic; :mod:`hetero_operator.planning.steptime`).

Both come from the same seconds per sample (the learned speeds where earlier runs measured them,
else the table speeds at ``spec.training.referenceSamplesPerSecond``) and the same link settings.
Each is then multiplied by the **measured / predicted ratio learned for that layout** where an
earlier run of the job's ``profileKey`` measured one (a learned entry ``layout/<mode>`` beside the
speeds, :func:`layout_observation`): what the model leaves out (a precision the devices emulate,
per-collective costs, data loading) is then counted for the layout that paid it. A layout never
run is weighed by its model alone, so a job's first runs may try each layout once; the reasons
say which figure is calibrated and by how many runs. A pipeline whose stage times earlier runs
measured (``PipelinePlan.measured_stages``, :mod:`hetero_operator.planning.stagetimes`) is weighed
by that prediction without the ratio: the ratio was learned against the model's stage times, and
the measured ones already hold what it corrected. Likewise ``Full`` once every placed type's speed
and its cross-type link rate are learned (:func:`measured_flat_modes`,
:mod:`hetero_operator.planning.linklearning`); a run of a layout predicted so records no ratio.
A tie keeps the pipeline (the user configured it). Without seconds per sample the predictions
are relative and the link's seconds are not: the pipeline is kept and the reason says so. Where
no mode fits without a pipeline, the pipeline is kept and the reason names each type's shortfall.
``spec.training.sharding None`` with a pipeline runs the pipeline without weighing. A run that
resumes a checkpoint keeps that checkpoint's layout (``pin``): a pipelined checkpoint holds per
stage optimizer state that a data-parallel run refuses, and the other way round.
"""

from __future__ import annotations

import dataclasses

from collections.abc import Mapping
from typing import Any

from hetero_operator.api.memoryplan import ModeOption
from hetero_operator.api.pipelineplan import LayoutChoice
from hetero_operator.api.quantities import gib
from hetero_operator.api.types import Plan, Unschedulable
from hetero_operator.planning import linklearning
from hetero_operator.planning.profiles import LearnedSpeed, Observation

PIPELINE = "Pipeline"
"""``LayoutChoice.chosen`` for the pipelined plan."""
LEARNED_LAYOUT = "layout"
"""``gpu_type`` of the learned entries that hold a layout's measured / predicted throughput ratio
(``precision`` = the layout: ``Pipeline``, ``None``, ``Group`` or ``Full``; ``samples_per_s`` =
the ratio), as ``profiles.JOB_EFFICIENCY`` holds the job's efficiency."""


def layout_observation(layout: str, *, measured_samples_per_s: float,
                       predicted_samples_per_s: float, unix_s: float, job: str = "",
                       namespace: str = "") -> Observation:
    """The learned entry of one run: ``layout``'s measured / predicted throughput.

    Raises:
        ValueError: a figure is not positive.
    """
    if measured_samples_per_s <= 0 or predicted_samples_per_s <= 0:
        raise ValueError(f"{layout}: measured {measured_samples_per_s} and predicted "
                         f"{predicted_samples_per_s} samples/s must be positive")
    return Observation(gpu_type=LEARNED_LAYOUT, precision=layout, unix_s=unix_s, job=job,
                       namespace=namespace,
                       samples_per_s=measured_samples_per_s / predicted_samples_per_s)


def measured_flat_modes(flat: Plan | Unschedulable, learned: Mapping[tuple[str, str], Any],
                        ) -> frozenset[str]:
    """The modes without a pipeline whose prediction in ``flat`` is measured: ``Full`` and
    ``Group`` where every GPU type's speed is learned and the mode's cross-type rate too
    (:mod:`hetero_operator.planning.linklearning`; ``None`` keeps a configured link term, so its
    ratio still applies)."""
    if not isinstance(flat, Plan) or flat.value is None or not flat.value.types:
        return frozenset()
    speeds = all(t.speed_source == "learned" for t in flat.value.types)
    return frozenset(m for m in linklearning.learned_rates(learned) if speeds)


def learned_ratios(learned: Mapping[tuple[str, str], Any]) -> dict[str, LearnedSpeed]:
    """Layout -> its learned measured / predicted entry (``samples_per_s`` is the ratio)."""
    out: dict[str, LearnedSpeed] = {}
    for (gpu_type, layout), found in learned.items():
        if gpu_type != LEARNED_LAYOUT or not found:
            continue
        out[layout] = found if isinstance(found, LearnedSpeed) else found[-1]
    return out


def weigh(piped: Plan, flat: Plan | Unschedulable, *, global_batch: int,
          ratios: Mapping[str, LearnedSpeed] | None = None, pin: str = "",
          measured_modes: frozenset[str] = frozenset()) -> Plan:
    """The plan ``Auto`` keeps, with its :class:`LayoutChoice` as ``Plan.layout``.

    Args:
        piped: the pipelined plan (``Plan.pipeline`` set).
        flat: the same job planned without ``spec.training.pipeline``.
        global_batch: ``spec.training.globalBatchSize``, samples.
        ratios: layout -> learned measured / predicted (:func:`learned_ratios`); a layout
            without one is weighed by its model alone.
        pin: the layout of the checkpoint the run resumes (``""``: none): kept, not weighed
            (where the job still plans without a pipeline, for a data-parallel pin).
        measured_modes: modes without a pipeline whose prediction is measured
            (:func:`measured_flat_modes`): weighed without their ratio.

    Returns:
        ``piped`` or ``flat`` with ``layout`` set.

    Raises:
        ValueError: ``piped`` has no pipeline.
    """
    if piped.pipeline is None:
        raise ValueError("weigh needs the pipelined plan as its first argument")
    absolute = (isinstance(flat, Plan) and flat.memory is not None
                and any(o.predicted_step_s is not None for o in flat.memory.options))
    ratios = {m: r for m, r in (ratios or {}).items() if m not in measured_modes}
    pipe_model = (global_batch / piped.pipeline.step_s if absolute and piped.pipeline.step_s
                  else None)
    measured = piped.pipeline.measured_stages
    pipe_ratio = None if measured else ratios.get(PIPELINE)
    pipe_sps = _calibrated(pipe_model, pipe_ratio)
    predicted = (f"predicted {pipe_model:.4g} samples/s (the schedule played on the stage times "
                 f"earlier runs measured on {', '.join(measured)})" if measured and pipe_model
                 else _predicted_words(pipe_model, pipe_ratio))
    pipe_words = (f"{PIPELINE}: {predicted} "
                  f"({len(piped.pipeline.stages)} stages: {_stages_words(piped)}; bubble "
                  f"{100 * piped.pipeline.bubble_fraction:.1f}% of the step)" if pipe_sps else "")
    pinned = (f"the run resumes a checkpoint written under {pin}, which the other layout "
              f"would refuse (a pipelined checkpoint holds each stage's optimizer state): kept, "
              f"not weighed")
    if pin == PIPELINE:
        return _keep(piped, None, None, (f"{PIPELINE}: {pinned}",))
    if pin and isinstance(flat, Plan) and flat.memory is not None:
        return dataclasses.replace(flat, layout=LayoutChoice(
            chosen=flat.memory.mode, pipeline_samples_per_s=None, flat_samples_per_s=None,
            reasons=(f"{flat.memory.mode}: {pinned}",)))
    if isinstance(flat, Unschedulable):
        return _keep(piped, pipe_sps, None, (
            f"{PIPELINE}: kept, the job does not plan without a pipeline: {flat.message}",))
    mem = flat.memory
    if mem is None:
        return _keep(piped, pipe_sps, None, (
            f"{PIPELINE}: kept, no sharding decision to weigh it against (the job gives no "
            f"spec.training.model.parameters)",))
    reasons = [_mode_words(o, ratios.get(o.mode)) for o in mem.options]
    if not absolute:
        return _keep(piped, None, None, (
            f"{PIPELINE}: kept, not weighed: the planner has no seconds per sample (give "
            f"spec.training.referenceSamplesPerSecond, or run once so that speeds are learned), "
            f"and without them the compute and the link's seconds cannot be added",
            *reasons))
    chosen = next(o for o in mem.options if o.mode == mem.mode)
    flat_sps = _calibrated(chosen.predicted_samples_per_s, ratios.get(mem.mode))
    if flat_sps is not None and pipe_sps is not None and flat_sps > pipe_sps:
        choice = LayoutChoice(chosen=mem.mode, pipeline_samples_per_s=pipe_sps,
                              flat_samples_per_s=flat_sps,
                              reasons=(f"{mem.mode} chosen: predicted {flat_sps:.4g} samples/s, "
                                       f"{flat_sps / pipe_sps:.2f}x the pipeline's",
                                       pipe_words, *reasons))
        return dataclasses.replace(flat, layout=choice)
    head = (f"{PIPELINE} chosen: predicted {pipe_sps:.4g} samples/s, "
            + (f"{pipe_sps / flat_sps:.2f}x {mem.mode}'s (the best mode without a pipeline)"
               if flat_sps else "no mode without a pipeline has a prediction"))
    return _keep(piped, pipe_sps, flat_sps, (head, pipe_words, *reasons))


def _keep(piped: Plan, pipe_sps: float | None, flat_sps: float | None,
          reasons: tuple[str, ...]) -> Plan:
    return dataclasses.replace(piped, layout=LayoutChoice(
        chosen=PIPELINE, pipeline_samples_per_s=pipe_sps, flat_samples_per_s=flat_sps,
        reasons=tuple(r for r in reasons if r)))


def _stages_words(piped: Plan) -> str:
    assert piped.pipeline is not None
    return ", ".join(f"{s.gpu_type} blocks {s.first_block}..{s.first_block + s.blocks - 1}"
                     for s in piped.pipeline.stages)


def _calibrated(model_sps: float | None, ratio: LearnedSpeed | None) -> float | None:
    """The model's samples/s times the layout's learned measured / predicted, where learned."""
    if model_sps is None:
        return None
    return model_sps * ratio.samples_per_s if ratio is not None else model_sps


def _predicted_words(model_sps: float | None, ratio: LearnedSpeed | None) -> str:
    if model_sps is None:
        return "no prediction"
    if ratio is None:
        return f"predicted {model_sps:.4g} samples/s (its model; no run of it measured yet)"
    return (f"predicted {model_sps * ratio.samples_per_s:.4g} samples/s ({model_sps:.4g} by its "
            f"model x {ratio.samples_per_s:.3f}, the measured / predicted ratio learned over "
            f"{ratio.observations} run{'s' if ratio.observations != 1 else ''})")


def _mode_words(o: ModeOption, ratio: LearnedSpeed | None) -> str:
    """One mode without a pipeline: its prediction, or why it is out, per GPU type."""
    if not o.available:
        return f"{o.mode}: not run by the worker for this job"
    if not o.fits:
        short = "; ".join(f"{t} short by {gib(b)} of {gib(u)} usable"
                          for t, b, u in o.shortfalls)
        return f"{o.mode}: does not fit ({short})"
    if o.predicted_samples_per_s is None:
        return f"{o.mode}: fits, {gib(o.cross_type_bytes)} per step across GPU types"
    return (f"{o.mode}: {_predicted_words(o.predicted_samples_per_s, ratio)}, "
            f"{gib(o.cross_type_bytes)} per step across GPU types")
