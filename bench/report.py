"""Markdown tables of the benchmark results, generated from ``bench/results/*.json``.

Every row is one target of issue 11: the median of the runs, their range, the target and whether
the median met it.  Each table is headed by the run's date, the machine's load average at its
start and end, and how long it took.  Run from the repository root::

    .venv/bin/python bench/report.py                  # print the tables
    .venv/bin/python bench/report.py --readme docs/benchmarks.md
        # replace the text between <!-- bench-report:begin --> and <!-- bench-report:end -->

Only results files written by :func:`benchlib.write_results` (``"status": "finished"``) are read;
any other file is named as missing or not finished, never shown as a pass.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BEGIN, END = "<!-- bench-report:begin -->", "<!-- bench-report:end -->"
BENCHMARKS = [  # (results file stem, title, command)
    ("balance", "Batch split and sync overhead", "bench/bench_balance.py"),
    ("speed", "Speed features, full run (its link and codec rows are superseded by the link-part "
     "rerun in the next table)", "bench/bench_speed.py (as root: network namespaces)"),
    ("speed-link", "Speed features, link part only: rerun after Auto's trial margin (issue 11); "
     "its link and codec rows supersede those of the full run above, which ran the commit before",
     "bench/bench_speed.py --only link --out DIR; DIR/speed.json copied to "
     "bench/results/speed-link.json"),
    ("speed-hierarchy", "Pipelined hierarchy on the shaped link (issue 23)",
     "bench/bench_speed.py --only hierarchy (as root: network namespaces)"),
    ("speed-powersgd", "PowerSGD's trade-off curve, ranks 1-16 (issue 23)",
     "bench/bench_powersgd.py (as root: network namespaces)"),
    ("plan", "Planner", "bench/bench_plan.py"),
    ("operator", "Operator", "bench/bench_operator.py"),
    ("operator-real", "Operator against the real control plane, 2,000 lease-heartbeating nodes "
     "(issue 18)", "bench/bench_operator.py --real"),
    ("operator-real-loaded", "Operator against the real control plane after its own informers: "
     "2,000 nodes, 500 jobs, on the shared machine under load (issue 32, item 9)",
     "bench/bench_operator.py --real --machine-state loaded"),
    ("operator-real-idle", "The same, the machine idle at the start (issue 32, item 9)",
     "bench/bench_operator.py --real --out bench/results/operator-real-idle.json"),
    ("memory", "Memory and sharding (issue 12)", "bench/bench_memory.py"),
    ("memory-steptime", "Sharding modes: measured / predicted throughput (issue 23)",
     "bench/bench_memory.py --only steptime --output bench/results/memory-steptime.json"),
    ("memory-auto", "Largest model with precision Auto and checkpoints, beside FP32 (issue 29)",
     "bench/bench_memory.py --only auto --output bench/results/memory-auto.json"),
    ("sharded-checkpoint", "Sharded checkpoints (issue 12)", "bench/bench_sharded_checkpoint.py"),
    ("elastic", "Elastic shrink vs gang restart from the checkpoint, a T4 rank SIGKILLed (issue 31)",
     "bench/bench_elastic.py"),
    ("pipeline", "Pipeline stages vs Full sharding, 1 A100 + 1 T4, unshaped and 100 Mbit/s link "
     "between the GPU types (issue 30, item 6)", "bench/bench_pipeline.py (as root: network namespaces)"),
    ("gloo-bytes", "Gloo's bytes on the wire per collective, 2 ranks over a 100 Mbit/s veth (what "
     "Full's step-time model counts; issue 30)", "bench/bench_gloo_bytes.py (as root: network "
     "namespaces)"),
]


def _num(value: float, unit: str) -> str:
    if unit.strip() == "s" and abs(value) < 1:  # 0.036 s as "36.0 ms", not "0.0 s"
        return _num(value * 1000, " ms")
    if unit.strip() in ("ms", "MiB", "s"):
        u = unit.strip()
        return f"{value:.1f} {u}" if abs(value) < 1000 else f"{value:,.0f} {u}"
    if unit == "%":
        return f"{value:+.2f} %"
    text = f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return text + unit


def table(doc: dict[str, Any]) -> str:
    """One benchmark's markdown: a heading line and its targets table."""
    m = doc["meta"]
    load = m.get("load_average", {})
    start, end = load.get("start"), load.get("end")
    counts = sorted({len(t["runs"]) for t in doc["targets"]})
    runs = f"{' or '.join(map(str, counts))} runs per comparison" + (
        "" if len(counts) == 1 else " (by row)") + (
        "; rows with fewer than 3 say why in the results file (fewer_runs)" if counts and counts[0] < 3 else "")
    lines = [f"Run {m['date_utc']} at commit `{m.get('git_commit')}` on {m.get('cpus')} CPUs; "
             f"load average (1, 5, 15 min) {', '.join(map(str, start or []))} at the start, "
             f"{', '.join(map(str, end or []))} at the end; {runs}"
             + (f"; {m['wall_s']:.0f} s in all." if m.get("wall_s") else "."), "",
             "| measured | median | range of the runs | target | result |", "|---|---|---|---|---|"]
    for t in doc["targets"]:
        lo, hi = t["spread"]
        unit = t["unit"]
        target, result = ((f"{t['op']} {_num(t['target'], unit)}", "met" if t["met"] else "**missed**")
                          if t["op"] != "info" else ("(no target)", "-"))
        median = _num(t["median"], unit)
        if t["op"] != "info" and median == _num(t["target"], unit):  # 1.0503 vs 1.05: show why
            sep = " " if unit.strip() in ("ms", "MiB", "s", "%") else ""
            median = f"{t['median']:.4f}{sep}{unit.strip()}"
        lines.append(f"| {t['name']} | {median} | {_num(lo, unit)} - {_num(hi, unit)} "
                     f"| {target} | {result} |")
    return "\n".join(lines)


def report(results: Path) -> str:
    """All benchmarks' tables, in :data:`BENCHMARKS` order."""
    parts = []
    for stem, title, command in BENCHMARKS:
        path = results / f"{stem}.json"
        parts.append(f"**{title}** (`{command}`)")
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            parts.append(f"No results: `{path.name}` is missing or unreadable.")
            continue
        if doc.get("status") != "finished" or "targets" not in doc:
            parts.append(f"`{path.name}` is not from a finished run of this version of the "
                         "benchmark: nothing reported.")
            continue
        parts.append(table(doc))
    return "\n\n".join(parts) + "\n"


def replace_between_markers(text: str, new: str) -> str:
    """``text`` with the part between :data:`BEGIN` and :data:`END` replaced by ``new``.

    Raises:
        ValueError: the markers are missing or out of order.
    """
    a, b = text.find(BEGIN), text.find(END)
    if a < 0 or b < a:
        raise ValueError(f"need {BEGIN} ... {END} in the file")
    return text[:a + len(BEGIN)] + "\n" + new + text[b:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--readme", type=Path,
                        help="rewrite this file between the markers (docs/benchmarks.md)")
    args = parser.parse_args()
    text = report(args.results)
    if args.readme:
        args.readme.write_text(replace_between_markers(args.readme.read_text(), text))
        print(f"updated {args.readme}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
