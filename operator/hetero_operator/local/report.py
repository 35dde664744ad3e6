"""The end-of-run report of ``heterotrain run``: per-rank table, result and speed-up over equal.

Reads what the ranks left in the run directory (:mod:`heterotrain_common.rundir`): ``rank-<R>.json``
written by every rank's :class:`~hetero_worker.metrics.WorkerMetrics`, and ``result.json`` written
by rank 0 of the job. Planned numbers (speed, initial batch, speed-up) come from the plan and are
labelled "planned"; measured ones come only from those files. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heterotrain_common import rundir


@dataclass(frozen=True, kw_only=True, slots=True)
class RankRow:
    """One rank's line of the final table.

    Attributes:
        rank: global rank.
        device: GPU product (simulated or real).
        simulated: True for a simulated device.
        relative_speed: the plan's speed (A100 = 1.0).
        local_batch: samples per step at the end of the run.
        steps: optimizer steps taken.
        samples_per_s: samples / total step time, samples per second.
        wait_share: communication wait / total step time, 0..1.
        compute_s_per_sample: compute time / samples, seconds (NaN with no samples).
        compute_s_per_step: compute time / steps, seconds (NaN with no steps).
        samples_per_step: samples / steps, the mean local batch (NaN with no steps).
        rebalances: split changes this rank applied.
        job_efficiency_ratio: rank 0 only: the last ``htj_job_efficiency_ratio`` (NaN elsewhere
            or before the first window closed).
        memory_peak_bytes: peak model state + saved activations (``htj_memory_peak_bytes``,
            :mod:`hetero_worker.memory.caps`); None when the plan had no memory model.
        memory_cap_bytes: the device's usable bytes the peak is held to (0 = not enforced).
    """

    rank: int
    device: str
    simulated: bool
    relative_speed: float
    local_batch: int
    steps: int
    samples_per_s: float
    wait_share: float
    compute_s_per_sample: float
    compute_s_per_step: float = math.nan
    samples_per_step: float = math.nan
    rebalances: int = 0
    job_efficiency_ratio: float = math.nan
    memory_peak_bytes: int | None = None
    memory_cap_bytes: int = 0


def read_rows(directory: Path, world_size: int) -> list[RankRow | None]:
    """Every rank's row from ``rank-<R>.json``; None where a rank left no file."""
    rows: list[RankRow | None] = []
    for rank in range(world_size):
        stats = rundir.read_json(rundir.rank_stats_path(directory, rank))
        rows.append(None if stats is None else row_from_stats(stats))
    return rows


def row_from_stats(stats: Mapping[str, Any]) -> RankRow:
    """A :class:`RankRow` from one ``rank-<R>.json`` object."""
    step_s = float(stats.get("step_seconds") or 0.0)
    compute_s = float(stats.get("compute_seconds") or 0.0)
    samples = int(stats.get("samples") or 0)
    steps = int(stats.get("steps") or 0)
    return RankRow(
        rank=int(stats["rank"]), device=str(stats.get("gpu_product", "?")),
        simulated=bool(stats.get("simulated", False)),
        relative_speed=float(stats.get("relative_speed", 1.0)),
        local_batch=int(stats.get("local_batch") or 0), steps=steps,
        samples_per_s=samples / step_s if step_s > 0 else math.nan,
        wait_share=float(stats.get("comm_wait_seconds") or 0.0) / step_s if step_s > 0 else math.nan,
        compute_s_per_sample=compute_s / samples if samples else math.nan,
        compute_s_per_step=compute_s / steps if steps else math.nan,
        samples_per_step=samples / steps if steps else math.nan,
        rebalances=int(stats.get("rebalances") or 0),
        job_efficiency_ratio=float(stats.get("job_efficiency_ratio") or math.nan),
        memory_peak_bytes=(None if stats.get("memory_peak_bytes") is None
                           else int(stats["memory_peak_bytes"])),
        memory_cap_bytes=int(stats.get("memory_cap_bytes") or 0))


def measured_speedup_over_equal(rows: Sequence[RankRow]) -> float:
    """Step time with an equal split / step time with the run's split, from measured compute.

    Each rank's compute time per sample (simulated delay included) is taken as its cost model; a
    step lasts as long as its slowest rank's compute (communication is the same for both splits and
    left out): ``max_r(t_r * G / W) / max_r(t_r * b_r)`` with ``G`` the global batch and ``W``
    the world size.

    Returns:
        The ratio (> 1 means the run's split is faster), NaN without measurements.
    """
    if not rows or any(math.isnan(r.compute_s_per_sample) or r.local_batch < 1 for r in rows):
        return math.nan
    equal_batch = sum(r.local_batch for r in rows) / len(rows)
    actual_s = max(r.compute_s_per_sample * r.local_batch for r in rows)
    equal_s = max(r.compute_s_per_sample * equal_batch for r in rows)
    return equal_s / actual_s if actual_s > 0 else math.nan


def measured_relative_speeds(rows: Sequence[RankRow]) -> list[float]:
    """Each rank's measured speed (1 / compute time per sample) on the plan's scale.

    The rank with the highest planned speed is the anchor: its measured value equals its planned
    one, the others are scaled by their measured samples per compute second relative to it. NaN
    where a rank has no measurement.
    """
    anchor = max(rows, key=lambda r: r.relative_speed, default=None)
    if anchor is None or math.isnan(anchor.compute_s_per_sample) or anchor.compute_s_per_sample <= 0:
        return [math.nan] * len(rows)
    return [anchor.relative_speed * anchor.compute_s_per_sample / r.compute_s_per_sample
            if r.compute_s_per_sample > 0 else math.nan for r in rows]


def read_result(directory: Path) -> dict[str, Any] | None:
    """Rank 0's ``result.json``, None when absent."""
    return rundir.read_json(directory / rundir.RESULT_FILE)


def print_report(console: Any, *, rows: Sequence[RankRow | None], result: Mapping[str, Any] | None,
                 planned_speedup: float, elapsed_s: float, exit_code: int,
                 initial_batches: Sequence[int] | None = None, rebalance_interval_steps: int = 0,
                 profile_traces: Sequence[Path] = (), verdict: bool = True) -> str:
    """Print the per-rank table, rebalancing, the speed-up, the result and the job's outcome.

    Args:
        console: a rich Console.
        rows: per rank, None where the rank left no statistics.
        result: rank 0's ``result.json``.
        planned_speedup: the plan's expected speed-up over an equal split.
        elapsed_s: wall time of the run, seconds.
        exit_code: the job's exit code.
        initial_batches: the plan's local batch per rank (shown beside the final one).
        rebalance_interval_steps: ``spec.training.rebalance.intervalSteps`` (0: off).
        profile_traces: profiler trace files the ranks wrote.
        verdict: print the last line (``Job succeeded`` ...) too; False leaves it to the caller,
            which prints the returned line after its own output.

    Returns:
        The verdict line (rich markup).
    """
    known = [r for r in rows if r is not None]
    if not known:
        return _print_no_statistics(console, len(rows), result, exit_code, verdict=verdict)
    console.print(_table(rows, initial_batches))
    total = sum(r.samples_per_s for r in known if not math.isnan(r.samples_per_s))
    console.print(f"Throughput: {total:.1f} samples/s over {len(known)} ranks, over the training "
                  f"steps only; wall time {elapsed_s:.1f} s, which also counts process start-up, "
                  "rendezvous and evaluation", highlight=False)
    efficiency = next((r.job_efficiency_ratio for r in known if r.rank == 0), math.nan)
    console.print(f"Efficiency: {_num(efficiency, '{:.1%}')} of the devices' standalone capacity "
                  "(htj_job_efficiency_ratio, last window of rank 0: job samples/s over the sum of "
                  "each rank's compute-only samples/s; docs/metrics.md)", highlight=False)
    _print_rebalancing(console, known, rebalance_interval_steps)
    measured = measured_speedup_over_equal(known) if len(known) == len(rows) else math.nan
    console.print(f"Speed-up over an equal split: {_num(measured, '{:.2f}x')} measured (from each "
                  "rank's compute time per sample with the final split, assuming compute time "
                  f"grows with the batch), {planned_speedup:.2f}x planned (from the plan's "
                  "relative speeds)", highlight=False)
    if profile_traces:
        console.print("Profiler traces (Chrome trace JSON; open in https://ui.perfetto.dev or "
                      f"chrome://tracing): {', '.join(str(p) for p in profile_traces)}",
                      highlight=False)
    _print_result(console, result)
    line = f"Job {ending(exit_code)}"
    if verdict:
        console.print(line)
    return line


def _table(rows: Sequence[RankRow | None], initial_batches: Sequence[int] | None) -> Any:
    from rich.table import Table

    table = Table(title="Ranks (speed relative to an A100 = 1.00)")
    for col, justify in (("rank", "right"), ("device", "left"), ("planned speed", "right"),
                         ("measured speed", "right"), ("batch (initial -> final)", "right"),
                         ("steps", "right"), ("samples/s", "right"), ("waiting", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    known = [r for r in rows if r is not None]
    memory = any(r.memory_peak_bytes is not None for r in known)
    if memory:  # the memory model's plans only (issue 12)
        table.add_column("memory peak / cap", justify="right")
    measured = dict(zip((r.rank for r in known), measured_relative_speeds(known)))
    for rank, row in enumerate(rows):
        if row is None:
            table.add_row(str(rank), "(no statistics)", "", "", "", "", "", "", *([""] if memory else []))
            continue
        device = row.device + (" (simulated)" if row.simulated else "")
        first = initial_batches[rank] if initial_batches is not None and rank < len(initial_batches) else None
        batch = (str(row.local_batch) if first is None or first == row.local_batch
                 else f"{first} -> {row.local_batch}")
        table.add_row(str(row.rank), device, f"{row.relative_speed:.2f}",
                      _num(measured.get(row.rank, math.nan), "{:.2f}"), batch, str(row.steps),
                      _num(row.samples_per_s, "{:.1f}"), _num(row.wait_share, "{:.1%}"),
                      *([_memory_cell(row)] if memory else []))
    return table


def _memory_cell(row: RankRow) -> str:
    """``"412.3 MiB / 640.0 MiB (simulated cap)"``; ``-`` without a figure."""
    if row.memory_peak_bytes is None:
        return "-"
    peak = f"{row.memory_peak_bytes / 2**20:.1f} MiB"
    if not row.memory_cap_bytes:
        return f"{peak} (no cap)"
    return f"{peak} / {row.memory_cap_bytes / 2**20:.1f} MiB" + (" (simulated cap)" if row.simulated else "")


def _print_rebalancing(console: Any, rows: Sequence[RankRow], interval_steps: int) -> None:
    if interval_steps <= 0:
        return
    changes = max(r.rebalances for r in rows)
    steps = max(r.steps for r in rows)
    by_interval = steps // interval_steps
    text = (f"Rebalancing: {changes} split change{'s' if changes != 1 else ''} in {steps} steps "
            f"(re-solved every {interval_steps} steps, and at once when the measured imbalance "
            "exceeds 15%; a new split is applied only when it cuts the predicted step time by more "
            "than 5%)")
    if changes > by_interval:
        text += (f"; at least {changes - by_interval} came from the imbalance threshold, not the "
                 "interval")
    console.print(text, highlight=False)


def _print_no_statistics(console: Any, world: int, result: Mapping[str, Any] | None,
                         exit_code: int, *, verdict: bool) -> str:
    """No rank left statistics. After a success, no rank used hetero_worker's Trainer: say what
    really happened instead of a speed-up. After a failure or a signal, the ranks may simply not
    have reached the Trainer: say only that, never that the script is plain DDP."""
    if exit_code != 0:
        console.print(
            f"[yellow]No rank reported statistics[/] ({world} ranks): the job ended "
            f"({_plain(ending(exit_code))}) before any rank reached hetero_worker's Trainer (or "
            "the worker does not use it), so there is no per-rank table.", highlight=False)
        _print_result(console, result)
        line = f"Job {ending(exit_code)}"
        if verdict:
            console.print(line)
        return line
    console.print(
        f"[yellow]No rank reported statistics[/] ({world} ranks): the worker does not use "
        "hetero_worker's Trainer, so it ran as plain DDP with its own batches and no heterogeneous "
        "balancing happened: the plan's split and expected speed-up were not applied. To use them, "
        "port the script as docs/torchrun.md shows (seven lines). Its wall time is not comparable "
        "with a ported run's: only the Trainer simulates the planned GPUs (the delay of batch / "
        "speed), so a plain script runs at this CPU's own speed.", highlight=False)
    _print_result(console, result)
    line = "Job [green]succeeded[/] as plain DDP (no heterogeneous balancing)"
    if verdict:
        console.print(line)
    return line


def _plain(markup: str) -> str:
    """``markup`` without rich tags."""
    from rich.text import Text
    return Text.from_markup(markup).plain


def _print_result(console: Any, result: Mapping[str, Any] | None) -> None:
    if result:
        parts = [f"{k} {_fmt_value(k, v)}" for k, v in sorted(result.items())]
        console.print("Result: " + ", ".join(parts), highlight=False)


def _num(value: float, fmt: str) -> str:
    return "-" if value is None or math.isnan(value) else fmt.format(value)


def _fmt_value(key: str, value: Any) -> str:
    if key == "accuracy" and isinstance(value, (int, float)):
        return f"{value:.2%}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


_STOPPED_BY = {130: "interrupted (Ctrl-C, SIGINT)", 143: "stopped (SIGTERM)", 129: "stopped (SIGHUP)"}
"""Exit codes 128 + signal of the signals ``heterotrain run`` forwards to its ranks."""


def ending(exit_code: int) -> str:
    """The last line's verdict: ``succeeded``, ``interrupted (Ctrl-C, SIGINT)``, ``failed (...)``."""
    if exit_code == 0:
        return "[green]succeeded[/]"
    if exit_code in _STOPPED_BY:
        return f"[yellow]{_STOPPED_BY[exit_code]}[/]"
    return f"[red]failed (exit code {exit_code})[/]"
