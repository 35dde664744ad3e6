"""The end-of-run report of ``heterotrain run``: per-rank table, result and speed-up over equal.

Reads what the ranks left in the run directory (:mod:`hetero_worker.rundir`): ``rank-<R>.json``
written by every rank's :class:`~hetero_worker.metrics.WorkerMetrics`, and ``result.json`` written
by rank 0 of the job. Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero_worker import rundir


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
    samples = int(stats.get("samples") or 0)
    return RankRow(
        rank=int(stats["rank"]), device=str(stats.get("gpu_product", "?")),
        simulated=bool(stats.get("simulated", False)),
        relative_speed=float(stats.get("relative_speed", 1.0)),
        local_batch=int(stats.get("local_batch") or 0), steps=int(stats.get("steps") or 0),
        samples_per_s=samples / step_s if step_s > 0 else math.nan,
        wait_share=float(stats.get("comm_wait_seconds") or 0.0) / step_s if step_s > 0 else math.nan,
        compute_s_per_sample=float(stats.get("compute_seconds") or 0.0) / samples if samples else math.nan)


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


def read_result(directory: Path) -> dict[str, Any] | None:
    """Rank 0's ``result.json``, None when absent."""
    return rundir.read_json(directory / rundir.RESULT_FILE)


def print_report(console: Any, *, rows: Sequence[RankRow | None], result: Mapping[str, Any] | None,
                 planned_speedup: float, elapsed_s: float, exit_code: int) -> None:
    """Print the per-rank table, the result and the speed-up (a rich Console)."""
    from rich.table import Table

    table = Table(title="Ranks")
    for col, justify in (("rank", "right"), ("device", "left"), ("speed", "right"),
                         ("batch", "right"), ("steps", "right"), ("samples/s", "right"),
                         ("waiting", "right")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for rank, row in enumerate(rows):
        if row is None:
            table.add_row(str(rank), "(no statistics)", "", "", "", "", "")
            continue
        device = row.device + (" (simulated)" if row.simulated else "")
        table.add_row(str(row.rank), device, f"{row.relative_speed:.2f}", str(row.local_batch),
                      str(row.steps), _num(row.samples_per_s, "{:.1f}"), _num(row.wait_share, "{:.1%}"))
    console.print(table)
    known = [r for r in rows if r is not None]
    total = sum(r.samples_per_s for r in known if not math.isnan(r.samples_per_s))
    console.print(f"Throughput: {total:.1f} samples/s over {len(known)} ranks; "
                  f"wall time {elapsed_s:.1f} s", highlight=False)
    measured = measured_speedup_over_equal(known) if len(known) == len(rows) else math.nan
    console.print(f"Speed-up over an equal split: {_num(measured, '{:.2f}x')} measured "
                  f"(from each rank's compute time per sample), {planned_speedup:.2f}x planned",
                  highlight=False)
    if result:
        parts = [f"{k} {_fmt_value(k, v)}" for k, v in sorted(result.items())]
        console.print("Result: " + ", ".join(parts), highlight=False)
    status = "[green]succeeded[/]" if exit_code == 0 else f"[red]failed (exit code {exit_code})[/]"
    console.print(f"Job {status}")


def _num(value: float, fmt: str) -> str:
    return "-" if value is None or math.isnan(value) else fmt.format(value)


def _fmt_value(key: str, value: Any) -> str:
    if key == "accuracy" and isinstance(value, (int, float)):
        return f"{value:.2%}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
