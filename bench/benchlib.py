"""What every benchmark shares: repeats with median and spread, targets marked met or missed,
the machine's date and load, and a results writer that refuses NaN and timed-out runs.

A results file (``bench/results/<name>.json``) has this shape (``bench/report.py`` turns it
into the tables of docs/benchmarks.md)::

    {"benchmark": "balance", "status": "finished",
     "meta": {"date_utc": ..., "load_average": {"start": [1m, 5m, 15m], "end": [...]},
              "cpus": 2, "git_commit": ..., "python": ..., "torch": ..., "wall_s": ...},
     "targets": [{"name": ..., "unit": "x", "op": ">=", "target": 0.93,
                  "median": ..., "spread": [min, max], "runs": [...], "met": false}],
     "details": {...}}

A target is met when the *median* of its runs meets it.  A benchmark that runs out of time
raises :class:`BenchTimeout`; :func:`main_guard` turns that (and any other failure) into a
non-zero exit and writes no results file, so nothing is ever reported from a run that did not
finish.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
REPEATS = 3
"""Each comparison runs this many times within one invocation (issue 11)."""
EXIT_TIMEOUT = 3
"""Exit status of a benchmark that ran out of time (no results written)."""
EXIT_FAILED = 4
"""Exit status of a benchmark that failed otherwise, e.g. a measurement came out NaN."""


class BenchTimeout(RuntimeError):
    """A benchmark (or one of its runs) did not finish within its time limit."""


class Deadline:
    """A wall-clock budget for a whole benchmark.

    Args:
        timeout_s: seconds from now; ``math.inf`` for none.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.end = time.monotonic() + timeout_s

    def left_s(self, what: str = "benchmark") -> float:
        """Seconds left.

        Raises:
            BenchTimeout: none left (``what`` names the part that was running).
        """
        left = self.end - time.monotonic()
        if left <= 0:
            raise BenchTimeout(f"{what}: out of time (limit {self.timeout_s:g} s)")
        return left


def load_average() -> list[float]:
    """``[1 min, 5 min, 15 min]`` load averages of this machine (``os.getloadavg``)."""
    return [round(v, 2) for v in os.getloadavg()]


def meta() -> dict[str, Any]:
    """Date, machine and code version of a run (``load_average.start`` taken now)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                                capture_output=True, check=False).stdout.strip() or None
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "bench/*.py", "worker", "operator"],
                               cwd=ROOT, text=True, capture_output=True, check=False).stdout.strip()
        if commit and dirty:
            commit += "+uncommitted"
    except OSError:
        commit = None
    try:
        import torch
        torch_version: str | None = torch.__version__
    except ImportError:
        torch_version = None
    return {"date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "load_average": {"start": load_average()}, "cpus": os.cpu_count(),
            "git_commit": commit, "python": platform.python_version(), "torch": torch_version,
            "machine": platform.machine()}


def spread(values: Sequence[float]) -> dict[str, Any]:
    """Median, ``[min, max]`` and the runs themselves.

    Raises:
        ValueError: no values, or a NaN/inf among them (a measurement that did not happen).
    """
    runs = [float(v) for v in values]
    if not runs or not all(math.isfinite(v) for v in runs):
        raise ValueError(f"need finite measurements, got {runs}")
    return {"median": statistics.median(runs), "spread": [min(runs), max(runs)], "runs": runs}


@dataclass
class Target:
    """One target of the issue: its runs, the threshold and whether the median meets it.

    Attributes:
        name: what is measured, e.g. ``"proportional / ideal at 2 ms per sample"``.
        op: ``">="`` or ``"<="``; ``"info"`` for a figure reported without a target (``met``
            is then None).
        target: the threshold (same unit as the runs).
        unit: shown after numbers (``"x"``, ``"ms"``, ``"MiB"``, ``""`` for a ratio).
        runs: one value per repeat.
        note: how it was measured, one line.
    """

    name: str
    op: str
    target: float
    unit: str = ""
    runs: list[float] = field(default_factory=list)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON form (``met`` from the median).

        Raises:
            ValueError: no runs or a NaN among them.
        """
        if self.op not in (">=", "<=", "info"):
            raise ValueError(f"op must be '>=', '<=' or 'info', got {self.op!r}")
        s = spread(self.runs)
        met = (None if self.op == "info" else
               bool(s["median"] >= self.target if self.op == ">=" else s["median"] <= self.target))
        return {"name": self.name, "op": self.op, "target": self.target, "unit": self.unit,
                **s, "met": met, "note": self.note}


def finite(value: Any, path: str = "$") -> None:
    """Check that ``value`` (nested dicts/lists) holds no NaN or infinity.

    Raises:
        ValueError: naming the first non-finite number's path.
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"non-finite number at {path}: {value}")
    if isinstance(value, dict):
        for k, v in value.items():
            finite(v, f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            finite(v, f"{path}[{i}]")


def write_results(path: Path, *, benchmark: str, run_meta: dict[str, Any],
                  targets: Sequence[Target], details: dict[str, Any]) -> dict[str, Any]:
    """Write a finished benchmark's results (atomically) and return what was written.

    Raises:
        ValueError: a NaN/inf anywhere (nothing is written then).
    """
    run_meta = dict(run_meta)
    run_meta["load_average"] = {**run_meta.get("load_average", {}), "end": load_average()}
    doc = {"benchmark": benchmark, "status": "finished", "meta": run_meta,
           "targets": [t.as_dict() for t in targets], "details": details}
    finite(doc)
    text = json.dumps(doc, indent=1, allow_nan=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return doc


def print_targets(doc: dict[str, Any]) -> None:
    """One line per target: met/MISSED, median, spread."""
    for t in doc["targets"]:
        lo, hi = t["spread"]
        verdict = "info  " if t["met"] is None else "met   " if t["met"] else "MISSED"
        print(f"{verdict} {t['name']}: median {t['median']:.4g}{t['unit']} "
              f"(runs {', '.join(f'{v:.4g}' for v in t['runs'])}; range {lo:.4g}-{hi:.4g}) "
              + ("" if t["met"] is None else f" target {t['op']} {t['target']:g}{t['unit']}"))


def main_guard(fn: Callable[[], int]) -> int:
    """Run a benchmark's main; a timeout or failure exits non-zero and writes nothing.

    Returns:
        ``fn()``'s status, :data:`EXIT_TIMEOUT` on :class:`BenchTimeout`, :data:`EXIT_FAILED` on a
        ``ValueError`` (e.g. a NaN measurement).
    """
    try:
        return fn()
    except BenchTimeout as exc:
        print(f"BENCHMARK TIMED OUT, no results written: {exc}", file=sys.stderr)
        return EXIT_TIMEOUT
    except ValueError as exc:
        print(f"BENCHMARK FAILED, no results written: {exc}", file=sys.stderr)
        return EXIT_FAILED


def wait_procs(procs: Sequence[subprocess.Popen[Any]], deadline: Deadline, what: str) -> list[int]:
    """Wait for every process before ``deadline``; on timeout kill them all and raise.

    Raises:
        BenchTimeout: some process was still running at the deadline.
    """
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=max(0.01, deadline.left_s(what))))
    except (subprocess.TimeoutExpired, BenchTimeout):
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
        raise BenchTimeout(f"{what}: out of time (limit {deadline.timeout_s:g} s)") from None
    return codes
