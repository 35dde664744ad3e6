#!/usr/bin/env python
"""Pipeline(+DP) vs Full sharding on a fast and a slow link between GPU types (issue 30, item 6).

Run as root from the repository root (network namespaces; about 6 minutes on 2 cores)::

    sudo .venv/bin/python bench/bench_pipeline.py

**The model and the cluster.** The byte-level LM of ``examples/lm-large.yaml`` (470 528
parameters, 7.5 MB of model state with AdamW), which does not fit the simulated T4 of
``examples/clusters/scaled-memory.yaml``, on one A100 and one T4 of that node list (2 ranks: the
pipelined worker runs the same number of replicas on every stage, so the pipeline takes one rank
of each type, and Full gets the same two devices):

- **Pipeline**: ``examples/lm-pipeline.yaml`` as it is (the LM as 4 blocks, 4 micro-batches,
  1F1B, ``sharding: None`` so that it always runs the pipeline; the planner puts 3 blocks on the
  A100 and 1 on the T4);
- **Full**: ``examples/lm-large.yaml`` with ``sharding: Full`` and ``gpus.ranks: 2``.

**The link.** Each rank runs in a network namespace of :mod:`netns` (the A100 in node ``A``, the
T4 in node ``B``), so every byte between the two GPU types crosses the veth between them: first
unshaped, then shaped to :data:`LINK_MBIT` Mbit/s per direction with ``tc tbf``. The ranks are
started by ``heterotrain run`` itself (plan, rank environments, statistics, ``prediction.json``);
the job's worker command is this script with ``--rank-in-netns``, which moves the rank into its
node's namespace and points ``MASTER_ADDR`` / ``GLOO_SOCKET_IFNAME`` at the veth. On the shaped
link the planner is told the link (``--link-inter-node-gbps 0.1``); on the unshaped one it keeps
its default (10 Gbit/s). Where namespaces cannot be made (not root, no iproute2) the ranks run on
loopback, and the 100 Mbit/s rows are reported as not measured (``details.not_measured``).

**Per link and mode**: one calibration run whose speeds are learned (its own learned-speeds
store, as a user's second run of the same job; :mod:`bench_memory` does the same), then
:data:`benchlib.REPEATS` runs of :data:`STEPS` steps, the modes alternating so that load drift
hits both. Figures per run:

- samples/s: ``prediction.json``'s ``measured_steady_samples_per_s`` (the sum over ranks of
  samples / step seconds over the training steps after the first; start-up, rendezvous and the
  first step's warm-up not counted);
- measured / predicted step time: measured step = global batch / those samples/s; predicted
  step = the plan's ``pipeline.step_s`` for Pipeline (the 1F1B schedule played on the stage
  times the earlier runs of this mode and link measured, ``planning.schedulesim`` and
  ``planning.stagetimes``, plus the replicas' all-reduce), and global batch / the Full mode's
  ``predicted_samples_per_s_by_mode`` for Full (the per-mode step-time model,
  ``planning.steptime``, with the speeds the earlier runs learned). Each run of a mode learns
  into the mode's store, so repeat ``r`` is predicted from the calibration run and repeats
  before it (as a user's next run is);
- Auto's choice: after the calibration runs, ``heterotrain plan`` of the pipelined job with
  ``sharding: Auto`` over both runs' learned figures (:func:`auto_choice`); its target row is the
  chosen layout's samples/s over the faster layout's, per repeat (at least 0.95: the issue's
  "within 5 %");
- bubble fraction: the plan's ``(s - 1) / (m + s - 1)``, and beside it the measured wait fraction
  (the largest over ranks of ``comm_wait_seconds / step_seconds``: the bubble and the transfers
  together; the worker does not time the bubble alone).

Writes ``bench/results/pipeline.json`` (:mod:`benchlib`; ``bench/report.py`` makes its table in
docs/benchmarks.md). A run that fails or passes the time limit ends the benchmark with no results.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import benchlib  # noqa: E402

sys.path.insert(0, str(ROOT / "common"))
from heterotrain_common.defaults import SIM_DELAY_PER_SAMPLE_S  # noqa: E402

PIPE_JOB = ROOT / "examples" / "lm-pipeline.yaml"
FULL_JOB = ROOT / "examples" / "lm-large.yaml"
NODES = ROOT / "examples" / "clusters" / "scaled-memory.yaml"
LINK_MBIT = 100
"""The slow link between GPU types, Mbit/s per direction (``tc tbf``)."""
LINK_LABELS = {None: "unshaped link", LINK_MBIT: f"{LINK_MBIT} Mbit/s link"}
MODES = ("Full", "Pipeline")
STEPS = 20
"""Training steps per run (``heterotrain run --max-steps``): enough for the T4 of a Full run (6
samples a step) to pass ``profiles.MIN_SAMPLES`` so that its speed is learned too."""
PYTHONPATH = os.pathsep.join([str(ROOT / "worker"), str(ROOT / "common"), str(ROOT / "operator")]
                             + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
"""``heterotrain run`` and its ranks import this tree's packages (a second checkout's too, before
any editable install), as :mod:`bench_speed`'s ranks do."""
RUN_TIMEOUT_S = 300.0
"""Longest one ``heterotrain run`` may take."""
NODE_A_PRODUCT = "A100"
"""A rank whose device product contains this runs in namespace ``A``, any other in ``B``."""
WRAPPER_FLAG = "--rank-in-netns"
"""The worker command's first argument: run the rest inside the rank's namespace."""


# ================================ rank side =====================================================
def rank_in_netns(argv: list[str]) -> None:
    """Replace this process by ``argv`` inside the rank's namespace (never returns).

    The rank's node comes from its device profile (``HTJ_DEVICE_PROFILE``'s product); the
    rendezvous address becomes node ``A``'s veth address and Gloo binds to the node's veth end.
    ``BENCH_PIPELINE_NETNS=0`` (no namespaces here) runs ``argv`` as it is.
    """
    sys.path.insert(0, str(ROOT / "common"))
    from heterotrain_common import envnames

    from netns import VethLink
    command = [sys.executable if a == "python" else a for a in argv]
    if os.environ.get("BENCH_PIPELINE_NETNS") == "0":
        os.execvp(command[0], command)
    product = json.loads(os.environ[envnames.DEVICE_PROFILE])["product"]
    node = "A" if NODE_A_PRODUCT in product else "B"
    os.environ[envnames.MASTER_ADDR] = VethLink.address("A")
    os.environ["GLOO_SOCKET_IFNAME"] = VethLink.device(node)
    full = VethLink().exec_argv(node, command)
    os.execvp(full[0], full)


# ================================ driver side ===================================================
def _job(mode: str, workdir: Path) -> Path:
    """The mode's job file (see the module docstring), its worker wrapped by ``--rank-in-netns``."""
    import yaml
    doc = yaml.safe_load((PIPE_JOB if mode == "Pipeline" else FULL_JOB).read_text())
    if mode == "Full":
        doc["spec"]["training"]["sharding"] = "Full"
        doc["spec"]["gpus"]["ranks"] = 2
    worker = doc["spec"]["worker"]
    worker["command"] = ["python", str(Path(__file__).resolve().relative_to(ROOT)), WRAPPER_FLAG,
                         *worker["command"]]
    path = workdir / f"job-{mode}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def heterotrain_run(job: Path, workdir: Path, cache: Path, link_mbit: int | None, netns: bool,
                    deadline: benchlib.Deadline) -> dict[str, Any]:
    """One ``heterotrain run`` of ``job``; its figures (see the module docstring).

    Raises:
        BenchTimeout: no time left, or the run passed it.
        ValueError: the run failed, or wrote no measurement.
    """
    limit_s = min(deadline.left_s(f"run {job.name}"), RUN_TIMEOUT_S)
    cmd = [sys.executable, "-m", "hetero_operator.cli", "run", str(job), "--nodes", str(NODES),
           "--workdir", str(workdir), "--max-steps", str(STEPS)]
    if link_mbit is not None:
        cmd += ["--link-inter-node-gbps", str(link_mbit / 1000)]
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "BENCH_PIPELINE_NETNS": "1" if netns else "0",
           "PYTHONPATH": PYTHONPATH}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s, cwd=ROOT, env=env)
    except subprocess.TimeoutExpired:
        raise benchlib.BenchTimeout(f"run {job.name}: over {limit_s:.0f} s") from None
    if done.returncode != 0:
        raise ValueError(f"{job.name} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                         f"{done.stderr[-2000:]}")
    return figures(workdir)


def figures(workdir: Path) -> dict[str, Any]:
    """Measured and predicted figures of a finished run directory.

    Raises:
        ValueError: ``prediction.json`` holds no measurement, or the plan no prediction.
    """
    prediction = json.loads((workdir / "prediction.json").read_text())
    plan = json.loads((workdir / "plan.json").read_text())
    job_batch = sum(r["local_batch"] for r in plan["ranks"])
    stats = [json.loads((workdir / f"rank-{r}.json").read_text()) for r in range(plan["world_size"])]
    measured = prediction.get("measured_steady_samples_per_s")
    if not measured:
        raise ValueError(f"{workdir}: no measured steady samples/s in prediction.json")
    pipe = plan.get("pipeline")
    if pipe:
        predicted_step_s = pipe["step_s"]
        bubble = pipe["bubble_fraction"]
        # each stage's ranks count their share of a pipeline's samples: the batch is the global one
    else:
        by_mode = (prediction.get("sharding") or {}).get("predicted_samples_per_s_by_mode") or {}
        sps = by_mode.get("Full")
        if not sps:
            raise ValueError(f"{workdir}: no Full step-time prediction in prediction.json")
        predicted_step_s = job_batch / sps
        bubble = 0.0
    measured_step_s = job_batch / measured
    return {"samples_per_s": measured, "measured_step_s": measured_step_s,
            "predicted_step_s": predicted_step_s,
            "measured_over_predicted_step": measured_step_s / predicted_step_s,
            "planned_bubble_fraction": bubble,
            "wait_fraction": max(s["comm_wait_seconds"] / s["step_seconds"] for s in stats),
            "rank0_step_s": stats[0]["step_seconds"] / stats[0]["steps"],
            "measured_stages": pipe.get("measured_stages") if pipe else None,
            "global_batch": job_batch,
            "stages": [(s["gpu_type"], s["blocks"]) for s in pipe["stages"]] if pipe else None}


def auto_choice(link_mbit: int | None, caches: dict[str, Path], tmp: Path) -> dict[str, Any]:
    """What ``spec.training.sharding Auto`` plans for the pipelined job after the calibration runs.

    The learned figures of both calibration runs (Full's speeds and ``layout/Full`` ratio,
    Pipeline's ``layout/Pipeline`` ratio: the same model, so one profile, as a user's store would
    hold after running both layouts) go into one store under the pipelined job's profile; then
    ``heterotrain plan`` of ``examples/lm-pipeline.yaml`` with ``sharding: Auto`` and the run's link
    setting. Returns ``{"chosen": ..., "reasons": [...]}`` (``status.plan.layout``).
    """
    import yaml
    entries: dict[str, Any] = {}
    for mode in MODES:
        store = json.loads((caches[mode] / "heterotrain" / "profiles.json").read_text())
        for profile in store["profiles"].values():
            entries.update(profile)
    merged = tmp / f"learned-auto-{link_mbit or 'unshaped'}.json"
    merged.write_text(json.dumps({"version": 1, "profiles": {"lm-pipeline": entries}}))
    doc = yaml.safe_load(PIPE_JOB.read_text())
    doc["spec"]["training"]["sharding"] = "Auto"
    # the seconds per sample heterotrain run planned the calibration runs with (its simulated
    # delay's reference, which the learned ratios are relative to): a short run may be too short
    # to learn a device speed (profiles.MIN_COMPUTE_S)
    doc["spec"]["training"]["referenceSamplesPerSecond"] = round(1 / SIM_DELAY_PER_SAMPLE_S)
    job = tmp / "job-Auto.yaml"
    job.write_text(yaml.safe_dump(doc))
    cmd = [sys.executable, "-m", "hetero_operator.cli", "plan", str(job), "--nodes", str(NODES),
           "--learned-speeds", str(merged), "-o", "json"]
    if link_mbit is not None:
        cmd += ["--link-inter-node-gbps", str(link_mbit / 1000)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, check=True,
                          env={**os.environ, "PYTHONPATH": PYTHONPATH})
    layout = json.loads(done.stdout)["layout"]
    return {"chosen": layout["chosen"], "reasons": layout["reasons"]}


def measure_link(link_mbit: int | None, netns: bool, repeats: int, tmp: Path,
                 deadline: benchlib.Deadline) -> tuple[dict[str, list[dict[str, Any]]],
                                                       dict[str, Any]]:
    """Calibration run per mode, ``Auto``'s choice after them (:func:`auto_choice`), then
    ``repeats`` runs of each mode, the modes alternating."""
    label = LINK_LABELS[link_mbit].replace(" ", "-").replace("/", "")
    jobs = {mode: _job(mode, tmp) for mode in MODES}
    caches = {mode: tmp / f"learned-{label}-{mode}" for mode in MODES}
    for mode in MODES:
        cal = heterotrain_run(jobs[mode], tmp / f"{label}-{mode}-learn", caches[mode], link_mbit,
                              netns, deadline)
        print(f"{LINK_LABELS[link_mbit]}: {mode} calibration run {cal['samples_per_s']:.1f} "
              "samples/s", flush=True)
    auto = auto_choice(link_mbit, caches, tmp)
    print(f"{LINK_LABELS[link_mbit]}: Auto chooses {auto['chosen']}: {auto['reasons'][0]}",
          flush=True)
    out: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for r in range(repeats):
        for mode in MODES:
            fig = heterotrain_run(jobs[mode], tmp / f"{label}-{mode}-{r}", caches[mode], link_mbit,
                                  netns, deadline)
            out[mode].append(fig)
            print(f"{LINK_LABELS[link_mbit]}, repeat {r + 1}: {mode} {fig['samples_per_s']:.1f} "
                  f"samples/s, step {fig['measured_step_s'] * 1000:.1f} ms measured / "
                  f"{fig['predicted_step_s'] * 1000:.1f} ms predicted = "
                  f"{fig['measured_over_predicted_step']:.3f}, wait {fig['wait_fraction']:.3f}",
                  flush=True)
    return out, auto


def targets_of(links: dict[str, dict[str, list[dict[str, Any]]]],
               autos: dict[str, dict[str, Any]] | None = None) -> list[benchlib.Target]:
    """The issue's target rows (named so a reader finds them) and the figures beside them;
    ``autos``: per link, :func:`auto_choice`'s answer."""
    out: list[benchlib.Target] = []
    slow, fast = LINK_LABELS[LINK_MBIT], LINK_LABELS[None]

    def runs(link: str, mode: str, key: str) -> list[float]:
        return [f[key] for f in links[link][mode]]

    for link, auto in (autos or {}).items():
        chosen = "Pipeline" if auto["chosen"] == "Pipeline" else "Full"
        picked = [mine / max(p, f) for mine, p, f in zip(
            runs(link, chosen, "samples_per_s"), runs(link, "Pipeline", "samples_per_s"),
            runs(link, "Full", "samples_per_s"), strict=True)]
        out.append(benchlib.Target(
            f"Auto's choice / fastest measured samples/s, {link}", ">=", 0.95, "x", picked,
            f"Auto chose {auto['chosen']} after one calibration run of each layout (learned "
            "speeds and measured / predicted ratios); per repeat, the chosen layout's samples/s "
            "over the faster of the two"))

    if slow in links:
        ratios = [p / f for p, f in zip(runs(slow, "Pipeline", "samples_per_s"),
                                        runs(slow, "Full", "samples_per_s"), strict=True)]
        out.append(benchlib.Target(
            f"Pipeline / Full samples/s, {slow}", ">=", 2.0, "x", ratios,
            "per repeat, the two runs back to back; 2 ranks (1 A100 + 1 T4) each, netns veth "
            f"shaped with tc tbf, {STEPS} steps"))
    for link in (fast, slow):
        if link not in links:
            continue
        suffix = "" if link == fast else f", {link}"
        for mode in ("Pipeline", "Full"):
            values = runs(link, mode, "measured_over_predicted_step")
            note = ("plan.json pipeline.step_s: the schedule played on the stage times the "
                    "earlier runs measured (planning.schedulesim, planning.stagetimes)"
                    if mode == "Pipeline" else
                    "prediction.json's Full step-time model (planning.steptime) with the speeds "
                    "the earlier runs learned")
            out.append(benchlib.Target(f"measured / predicted, {mode}{suffix}", ">=", 0.90, "",
                                       values, f"step time, measured over predicted; {note}; "
                                       "the band is 0.90-1.10 (this row and the next)"))
            out.append(benchlib.Target(f"... measured / predicted, {mode}{suffix}: upper end",
                                       "<=", 1.10, "", values, "the same runs"))
    for link in (fast, slow):
        if link not in links:
            continue
        if link == fast:
            out.append(benchlib.Target(
                f"Pipeline / Full samples/s, {fast}", "info", 0.0, "x",
                [p / f for p, f in zip(runs(fast, "Pipeline", "samples_per_s"),
                                       runs(fast, "Full", "samples_per_s"), strict=True)],
                "per repeat; the issue's Auto picks the faster here"))
        for mode in MODES:
            out.append(benchlib.Target(f"{mode} samples/s, {link}", "info", 0.0, " samples/s",
                                       runs(link, mode, "samples_per_s"),
                                       "prediction.json measured_steady_samples_per_s (training "
                                       "steps after the first)"))
        out.append(benchlib.Target(
            f"planned bubble fraction, Pipeline, {link}", "info", 0.0, "",
            runs(link, "Pipeline", "planned_bubble_fraction"), "(s - 1) / (m + s - 1), s = 2, m = 4"))
        for mode in MODES:
            out.append(benchlib.Target(
                f"measured wait fraction, {mode}, {link}", "info", 0.0, "",
                runs(link, mode, "wait_fraction"),
                "largest over ranks of comm_wait_seconds / step_seconds (bubble and transfers)"))
    return out


def main() -> int:
    """Measure both links (or the unshaped one only), write the results, print the targets."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=benchlib.REPEATS)
    parser.add_argument("--timeout-s", type=float, default=1200.0)
    parser.add_argument("--out", type=Path, default=benchlib.RESULTS / "pipeline.json")
    args = parser.parse_args()
    from netns import VethLink, available
    deadline = benchlib.Deadline(args.timeout_s)
    run_meta = benchlib.meta()
    started = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    links: dict[str, dict[str, list[dict[str, Any]]]] = {}
    autos: dict[str, dict[str, Any]] = {}
    why_not = available()
    if why_not is None:
        with VethLink(rate_mbit=None) as link:
            for rate in (None, LINK_MBIT):
                link.set_rate(rate)
                links[LINK_LABELS[rate]], autos[LINK_LABELS[rate]] = measure_link(
                    rate, True, args.repeats, tmp, deadline)
    else:
        print(f"network namespaces cannot be made here ({why_not}): unshaped loopback only",
              flush=True)
        links[LINK_LABELS[None]], autos[LINK_LABELS[None]] = measure_link(
            None, False, args.repeats, tmp, deadline)
    details: dict[str, Any] = {
        "runs": links, "auto": autos, "steps_per_run": STEPS, "link_mbit": LINK_MBIT,
        "links": "netns veth (bench/netns.py)" if why_not is None else "loopback",
        "medians": {link: {mode: {k: statistics.median(f[k] for f in fs)
                                  for k in ("samples_per_s", "measured_step_s", "predicted_step_s")}
                           for mode, fs in by_mode.items()} for link, by_mode in links.items()}}
    if why_not is not None:
        details["not_measured"] = {f"Pipeline / Full samples/s, {LINK_LABELS[LINK_MBIT]}": why_not}
    run_meta["wall_s"] = round(time.monotonic() - started, 1)
    doc = benchlib.write_results(args.out, benchmark="pipeline", run_meta=run_meta,
                                 targets=targets_of(links, autos), details=details)
    benchlib.print_targets(doc)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == WRAPPER_FLAG:
        rank_in_netns(sys.argv[2:])
    sys.exit(benchlib.main_guard(main))
