"""The planner as a decision aid on the command line: inputs (prices, learned speeds, links) and
the per-GPU-type table of ``heterotrain plan`` and ``heterotrain run``.

Prices come from a YAML/JSON file (``--prices FILE``) mapping a GPU type, MIG profile or base
product to the price of one device per hour, e.g. ``{Tesla-T4: 0.35, NVIDIA-A100-SXM4-40GB: 2.9}``
(any currency; the output uses the same), or from the operator's ``HTJ_GPU_PRICES``
(``type=price,type=price``; Helm value ``gpuPricesPerHour``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from hetero_operator.api import labels
from hetero_operator.api.prices import load_prices
from hetero_operator.api.spec import JobSpec, profile_key
from hetero_operator.api.planvalue import PlanValue
from hetero_operator.api.types import Plan
from hetero_operator.planning import layoutchoice, linklearning, stagetimes
from hetero_operator.planning.marginal import LinkSettings, PlanInputs
from hetero_operator.planning.steadystate import steady
from hetero_operator.planning.profiles import (JOB_EFFICIENCY, TABLE_DIFFERENCE, FileStore,
                                               LearnedSpeed, Observation, batch_band,
                                               default_path, entry_key, observations_from_stats)
from heterotrain_common import contract, envnames, rundir


def add_arguments(parser: argparse.ArgumentParser, *, learn_help: str) -> None:
    """The decision-aid options shared by ``plan`` and ``run``."""
    parser.add_argument("--prices", metavar="FILE", default=None,
                        help="YAML/JSON: GPU type (or MIG profile, or product) -> price of one "
                             "device per hour; adds cost per million samples")
    parser.add_argument("--target-throughput", type=float, default=None, metavar="SAMPLES_PER_S",
                        help="also name the cheapest mix of priced GPU types reaching this throughput")
    parser.add_argument("--learned-speeds", metavar="FILE", default=None,
                        help=f"learned speeds file (default {default_path()}; '' turns it off); "
                             + learn_help)
    parser.add_argument("--link-intra-node-gbps", type=float, default=LinkSettings().intra_node_gbps,
                        metavar="GBPS", help="bandwidth between devices of one node, Gbit/s")
    parser.add_argument("--link-inter-node-gbps", type=float, default=LinkSettings().inter_node_gbps,
                        metavar="GBPS", help="one node's egress bandwidth, Gbit/s")


def store_for(args: argparse.Namespace) -> FileStore | None:
    """The file of ``--learned-speeds`` (default path; ``''`` = none)."""
    chosen = getattr(args, "learned_speeds", None)
    if chosen == "":
        return None
    return FileStore(Path(chosen) if chosen else default_path())


def plan_inputs(args: argparse.Namespace, job: JobSpec, *,
                reference_samples_per_s: float | None = None) -> PlanInputs:
    """:class:`PlanInputs` from the CLI options and the learned-speeds file.

    Raises:
        PriceError: a bad prices file.
    """
    prices = load_prices(Path(args.prices)) if getattr(args, "prices", None) else {}
    store = store_for(args)
    now = time.time()
    learned = store.load(profile_key(job), now_s=now) if store else {}
    resumed = getattr(args, "resume", None)
    return PlanInputs(learned=learned, prices=prices, now_s=now,
                      link=LinkSettings(intra_node_gbps=args.link_intra_node_gbps,
                                        inter_node_gbps=args.link_inter_node_gbps),
                      reference_samples_per_s=reference_samples_per_s,
                      target_samples_per_s=getattr(args, "target_throughput", None),
                      layout_pin=resumed_layout(Path(resumed)) if resumed else "")


def resumed_layout(run_dir: Path) -> str:
    """The layout of the checkpoints ``--resume RUNDIR`` continues from: ``Pipeline`` or the
    sharding mode of its ``plan.json``; ``""`` when it left no checkpoint (nothing to keep)."""
    checkpoints = run_dir / "checkpoints"
    if not checkpoints.is_dir() or not any(checkpoints.iterdir()):
        return ""
    plan = rundir.read_json(run_dir / "plan.json") or {}
    if plan.get("pipeline"):
        return layoutchoice.PIPELINE
    return str((plan.get("memory") or {}).get("mode") or "")


def print_value(value: PlanValue | None, console: Any, *, profile: str = "") -> None:
    """The per-GPU-type table, left-out devices, costs and the cheapest mix."""
    if value is None:
        return
    from rich.table import Table

    unit = "samples/s" if value.absolute else "A100-eq."
    priced = any(t.price_per_hour is not None for t in value.types)
    table = Table(title=f"Per GPU type ({unit}; profile {profile or '-'}): what each adds to the "
                        "job, from the planner's step-time model")
    # "batch share": the type's share of the global batch per step (share_of_step)
    cols = ["GPU type", "devices", "speed", "from", "per device", "batch share", "adds", "gain",
            "comm."]
    if priced:
        cols += ["price/h", "cost/M samples"]
    for col in cols:
        table.add_column(col, justify="left" if col in ("GPU type", "from") else "right",
                         overflow="fold")
    for t in value.types:
        source = t.speed_source
        if source == "learned":
            age = "" if t.age_s is None else f", {_age(t.age_s)}"
            source = f"learned ({t.observations}x{age})"
        row = [t.gpu_type, str(t.devices), f"{t.relative_speed:.3f}", source,
               _num(t.samples_per_s_per_device, "{:.1f}"), f"{100 * t.share_of_step:.1f}%",
               _num(t.throughput_added, "{:.1f}"), _num(t.gain_percent, "{:+.1f}%"),
               _num(t.communication_added_percent, "{:+.1f}%")]
        if priced:
            row += [_num(t.price_per_hour, "{:.2f}"), _num(t.cost_per_million_samples, "{:.3f}")]
        table.add_row(*row)
    console.print(table)
    step = (f"compute {value.compute_s * 1e3:.2f} ms + communication "
            f"{value.communication_s * 1e3:.2f} ms per step" if value.absolute else
            "compute-bound model")
    console.print(f"Predicted throughput: {value.predicted_throughput:.1f} {unit} ({step}); "
                  f"communication {value.communication_note}", highlight=False)
    for lo in value.left_out:
        console.print(f"[yellow]Note[/]: {lo.message}", highlight=False)
    for note in learned_far_from_table(value):
        console.print(f"[yellow]Note[/]: {note}", highlight=False)
    if value.cost_per_hour is not None:
        per_m = ("" if value.cost_per_million_samples is None
                 else f", {value.cost_per_million_samples:.3f} per million samples")
        console.print(f"Cost: {value.cost_per_hour:.2f} per hour{per_m}", highlight=False)
    if value.cheapest_mix is not None:
        console.print(f"Cheapest mix: {value.cheapest_mix.message}", highlight=False)


def learned_far_from_table(value: PlanValue) -> list[str]:
    """One sentence per learned figure more than :data:`TABLE_DIFFERENCE` times away from the
    built-in table (a throttled device, a co-tenant, a wrong table entry: worth a look)."""
    notes = []
    for t in value.types:
        if t.speed_source != "learned" or not t.table_speed or t.relative_speed <= 0:
            continue
        ratio = t.relative_speed / t.table_speed
        if ratio > TABLE_DIFFERENCE or ratio < 1 / TABLE_DIFFERENCE:
            by = f", last changed by job {t.observed_by}" if t.observed_by else ""
            notes.append(f"{t.gpu_type}'s learned speed {t.relative_speed:.3f} is "
                         f"{max(ratio, 1 / ratio):.1f}x {'above' if ratio > 1 else 'below'} the "
                         f"table's {t.table_speed:.3f} ({t.observations} obs.{by}); check those "
                         "devices (clocks, throttling, a co-tenant) or drop the entry from the "
                         "learned-speeds file")
    return notes


def learned_summary(entries: Mapping[str, LearnedSpeed], observations: Sequence[Observation]) -> str:
    """The figures a run updated, each GPU type's by its batch band, and which one plans use.

    Returns:
        e.g. ``"NVIDIA-A100-SXM4-40GB/bf16 batch 64-127 486.7 samples/s (1 obs.), job efficiency
        0.708 (1 obs.); plans take each rank's figure from the batch band nearest its local batch
        (at most one band away), older figures without a batch band only where no band is that
        near: NVIDIA-A100-SXM4-40GB/bf16 476.1 samples/s (2 obs.)"``; ``"nothing measured"``.
    """
    def words(e: LearnedSpeed) -> str:
        if (e.gpu_type, e.precision) == JOB_EFFICIENCY:
            return f"job efficiency {e.samples_per_s:.3f} ({e.observations} obs.)"
        if e.gpu_type == layoutchoice.LEARNED_LAYOUT:
            return (f"{e.precision} measured / predicted {e.samples_per_s:.3f} "
                    f"({e.observations} obs.)")
        if e.gpu_type == linklearning.LEARNED_LINK:
            return (f"{e.precision}'s cross-type exchange {e.samples_per_s * 8 / 1e9:.3f} Gbit/s "
                    f"effective (modelled bytes over measured seconds, {e.observations} obs.)")
        band = "" if e.band is None else f" batch {2 ** e.band}-{2 ** (e.band + 1) - 1}"
        return f"{e.gpu_type}/{e.precision}{band} {e.samples_per_s:.1f} samples/s ({e.observations} obs.)"

    keys = {entry_key(o.gpu_type, o.precision, batch_band(o.local_batch) if o.local_batch >= 1
                      else None) for o in observations}
    updated = [e for k, e in entries.items() if k in keys]
    types = {(e.gpu_type, e.precision) for e in updated if e.band is not None}
    older = [e for k, e in entries.items()
             if k not in keys and e.band is None and (e.gpu_type, e.precision) in types]
    if not updated:
        return "nothing measured"
    text = ", ".join(words(e) for e in updated)
    if types:
        text += ("; plans take each rank's figure from the batch band nearest its local batch (at "
                 "most one band away)")
    if older:
        text += (", older figures without a batch band only where no band is that near: "
                 + ", ".join(words(e) for e in older))
    return text


def layout_observations(plan: Plan, measured_samples_per_s: float, job: JobSpec,
                        learned: Mapping[tuple[str, str], Any] | None = None,
                        ) -> list[Observation]:
    """The run's layout (``Pipeline`` or its sharding mode) with its measured / predicted
    throughput (:func:`hetero_operator.planning.layoutchoice.layout_observation`; what ``Auto``
    weighs a pipeline with); ``[]`` without a measurement or an absolute prediction, and for a
    layout predicted from measured figures (its ratio calibrates the model's alone): a pipeline
    with measured stage times, a mode of :func:`layoutchoice.measured_flat_modes` over
    ``learned``, the table the run was planned with."""
    if plan.pipeline is not None:
        layout = layoutchoice.PIPELINE
        predicted = None
        if plan.pipeline.measured_stages:  # its ratio calibrates the modelled stage times only
            return []
        if plan.pipeline.absolute and plan.pipeline.step_s > 0:
            predicted = sum(r.local_batch for r in plan.ranks) / plan.pipeline.step_s
    elif plan.memory is not None:
        layout = plan.memory.mode
        if layout in layoutchoice.measured_flat_modes(plan, learned or {}):
            return []
        predicted = next((o.predicted_samples_per_s for o in plan.memory.options
                          if o.mode == layout), None)
    else:
        return []
    if not predicted or measured_samples_per_s <= 0:
        return []
    return [layoutchoice.layout_observation(
        layout, measured_samples_per_s=measured_samples_per_s, predicted_samples_per_s=predicted,
        unix_s=time.time(), job=job.name, namespace=job.namespace)]


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


# --- the embedded runner: simulated truth, learning, predicted vs measured ---------------------

SIMULATED_SPEED_ANNOTATION = labels.ANNOTATION_SIMULATED_SPEED
"""Node annotation read by ``heterotrain run`` when it simulates: the speed (percent of an A100)
the simulated devices of that node *really* run at, whatever the planner's table says.  It lets a
simulated cluster have a wrong table (learned speeds, rebalancing); the operator ignores it."""
PREDICTION_FILE = "prediction.json"
"""What ``heterotrain run`` leaves in the run directory about predicted vs measured throughput."""


def simulated_reference_samples_per_s(environ: Mapping[str, str]) -> float | None:
    """Samples/s of a simulated speed-1.0 device: ``1 / HTJ_SIM_DELAY_PER_SAMPLE_S`` (the ranks'
    real CPU compute comes on top, so this is an upper bound until speeds are learned)."""

    delay = contract.read_var(environ, envnames.SIM_DELAY_PER_SAMPLE_S)
    return 1.0 / delay if delay > 0 else None


def simulated_true_speeds(nodes: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``node -> relative speed`` from :data:`SIMULATED_SPEED_ANNOTATION` (malformed: ignored)."""
    out = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        raw = (meta.get("annotations") or {}).get(SIMULATED_SPEED_ANNOTATION)
        try:
            value = int(str(raw))
        except ValueError:
            continue
        if value > 0:
            out[str(meta.get("name"))] = value / 100.0
    return out


def apply_simulated_speeds(rank_envs: Sequence[dict[str, str]], plan: Plan,
                           speeds: Mapping[str, float]) -> None:
    """Make the simulated devices of annotated nodes run at their true speed (in place)."""

    for env, r in zip(rank_envs, plan.ranks):
        if r.node in speeds:
            profile = contract.DeviceProfile.from_json(env[envnames.DEVICE_PROFILE])
            env[envnames.DEVICE_PROFILE] = replace(profile, relative_speed=speeds[r.node]).to_json()


def steady_samples_per_s(stats: Sequence[Mapping[str, Any]]) -> float | None:
    """The job's samples/s over the steps after the first (the first step's warm-up left out):
    the sum over ranks of ``(samples - first_step_samples) / (step_seconds -
    first_step_seconds)``; None where a rank ran fewer than 2 steps or wrote no first step."""
    total = 0.0
    for s in stats:
        samples, seconds, steps = steady(s, "step_seconds")
        if steps == int(s.get("steps") or 0) or seconds <= 0:  # not steady: no first step kept
            return None
        total += samples / seconds
    return total or None


def after_run(console: Any, *, args: argparse.Namespace, job: JobSpec, plan: Plan,
              workdir: Path, exit_code: int,
              learned: Mapping[tuple[str, str], Any] | None = None) -> dict[str, Any]:
    """Predicted vs measured throughput, and the run's speeds into the learned store.

    Measured = the sum over ranks of samples / step seconds (every rank steps together) over the
    training steps of the last attempt, the first steps included, from the ranks' statistics
    (process start-up, rendezvous and evaluation are not steps); rank 0's last efficiency
    window (``htj_job_prediction_ratio``) gives the steady-state ratio. Observations (one device's
    compute samples/s per GPU type and precision) are recorded only for a job that succeeded.

    Args:
        learned: the learned table the plan was made with (``PlanInputs.learned``): whether the
            run's layout was predicted from measured figures (then it records no layout ratio)
            is decided on it, not on the store as it is after the run.

    Returns:
        What was written to ``prediction.json``.
    """


    stats = [rundir.read_json(rundir.rank_stats_path(workdir, r)) for r in range(plan.world_size)]
    stats_ok = [s for s in stats if s]
    measured = sum(float(s.get("samples") or 0) / float(s["step_seconds"])
                   for s in stats_ok if float(s.get("step_seconds") or 0) > 0)
    steady_rate = steady_samples_per_s(stats_ok) if len(stats_ok) == len(stats) else None
    value = plan.value
    predicted = value.predicted_throughput if value is not None and value.absolute else None
    ratio = measured / predicted if predicted and measured and len(stats_ok) == len(stats) else None
    window = (stats[0] or {}).get("job_prediction_ratio") if stats else None
    out: dict[str, Any] = {"profile_key": profile_key(job), "predicted_samples_per_s": predicted,
                           "measured_samples_per_s": round(measured, 3) if measured else None,
                           "measured_steady_samples_per_s": (None if steady_rate is None
                                                             else round(steady_rate, 3)),
                           "ratio_measured_to_predicted": None if ratio is None else round(ratio, 4),
                           "ratio_last_window": None if window is None else round(float(window), 4),
                           "speed_sources": {t.gpu_type: t.speed_source for t in value.types}
                           if value is not None else {}}
    mem = getattr(plan, "memory", None)
    mode_option = next((o for o in getattr(mem, "options", ()) if o.mode == getattr(mem, "mode", None)),
                       None)
    if mode_option is not None and mode_option.predicted_samples_per_s:
        # the sharding mode's own step-time model (planning.steptime), per mode
        mode_ratio = (measured / mode_option.predicted_samples_per_s
                      if measured and len(stats_ok) == len(stats) else None)
        out["sharding"] = {
            "mode": mem.mode,
            "predicted_samples_per_s_by_mode": {o.mode: None if o.predicted_samples_per_s is None
                                                else round(o.predicted_samples_per_s, 3)
                                                for o in mem.options},
            "ratio_measured_to_predicted": None if mode_ratio is None else round(mode_ratio, 4)}
        if mode_ratio is not None:
            console.print(f"Sharding {mem.mode}: measured / predicted = {mode_ratio:.2f} "
                          f"({mode_option.predicted_samples_per_s:.1f} samples/s predicted by its "
                          "step-time model: compute with recomputation, cross-type and in-group "
                          "traffic per micro-batch)", highlight=False)
    if predicted is not None and ratio is not None:
        steady = ("" if window is None else f"; {float(window):.2f} over rank 0's last window "
                  "(htj_job_prediction_ratio, start-up left out)")
        console.print(f"Prediction check: {measured:.1f} samples/s measured over the training steps "
                      "(process start-up, rendezvous and evaluation not counted), "
                      f"{predicted:.1f} predicted by the plan (measured / predicted = {ratio:.2f}"
                      f"{steady})", highlight=False)
    store = store_for(args)
    if store is not None and exit_code == 0:
        # a pipelined rank's samples / compute seconds is its stage's, not its device's speed:
        # its stage's forward and backward times are learned instead (planning.stagetimes)
        observations = (stagetimes.observations(
            plan.pipeline.stages, [s or {} for s in stats], micro_batches=plan.pipeline.micro_batches,
            unix_s=time.time(), job=job.name, namespace=job.namespace)
            if plan.pipeline is not None else observations_from_stats(
                stats_ok, unix_s=time.time(), job=job.name, namespace=job.namespace))
        observations += layout_observations(plan, measured if len(stats_ok) == len(stats) else 0.0,
                                            job, learned or {})
        link = (linklearning.observation(
            plan.memory.mode, step_cross_type_bytes=mode_option.step_cross_type_bytes,
            stats=stats_ok, job=job.name, namespace=job.namespace)
            if mode_option is not None and len(stats_ok) == len(stats) else None)
        observations += [link] if link is not None else []
        try:
            entries = store.record(profile_key(job), observations)
        except OSError as exc:
            console.print(f"[yellow]Learned speeds not saved[/] ({store.path}: {exc})")
        else:
            out["learned"] = {k: e.samples_per_s for k, e in entries.items()}
            console.print(f"Learned speeds for profile {profile_key(job)} in {store.path}: "
                          f"{learned_summary(entries, observations)}", highlight=False)
    rundir.write_json_atomic(workdir / PREDICTION_FILE, out)
    return out
