#!/usr/bin/env python
"""Gloo's bytes on the wire per collective: what ``Full``'s step-time model counts (issue 30).

Run as root from the repository root (network namespaces; about 2 minutes on 2 cores)::

    sudo .venv/bin/python bench/bench_gloo_bytes.py

Two ranks, one in each namespace of :mod:`netns` (a veth shaped to 100 Mbit/s each way, so that
only the collective's own traffic crosses it), run each collective on a slice of ``SLICE_BYTES``
(1.64 MB of fp32, the size of ``lm-large``'s Full slices): ``all_gather_single`` (``Full``'s
gathers), ``reduce_scatter_single`` and the list ``reduce_scatter`` (its gradient reduction), and
``all_reduce`` of the whole two-slice buffer. Each rank reads its veth end's ``tx_bytes``
(``/sys/class/net/DEV/statistics``, inside its namespace) around ``OPS_PER_RUN`` timed calls
after one warm-up call; a fresh pair of processes per collective and repeat, 3 repeats.

The rows: bytes each rank sent per call over the slice's bytes (``steptime`` counts an
all-gather as 1 slice transfer and Gloo's reduce-scatter as
``GLOO_REDUCE_SCATTER_TRANSFERS`` = 2), and the all-gather's rate over the shaped 100 Mbit/s
(docs/memory.md: about 71 %). Writes ``bench/results/gloo-bytes.json`` in the shape of
:mod:`benchlib`; nothing where namespaces cannot be made (not root, no iproute2).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "operator"))

SLICE_BYTES = 1_640_000
"""One rank's slice, bytes (fp32: 410 000 elements)."""
OPS_PER_RUN = 4
"""Timed calls per run, after one warm-up call."""
RATE_MBIT = 100.0
"""The veth's shaped rate each way, Mbit/s."""
COLLECTIVES = ("all_gather_single", "reduce_scatter_single", "reduce_scatter", "all_reduce")


def _rank_main(args: argparse.Namespace) -> None:
    """One rank of one run: the collective ``OPS_PER_RUN`` times; one JSON line on stdout."""
    import torch
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = args.device
    dist.init_process_group("gloo", init_method=f"tcp://{args.addr}:{args.port}",
                            rank=args.rank, world_size=2)
    n = SLICE_BYTES // 4
    mine, both = torch.ones(n), torch.ones(2 * n)
    calls = {"all_gather_single": lambda: dist.all_gather_single(both, mine),
             "reduce_scatter_single": lambda: dist.reduce_scatter_single(mine, both),
             "reduce_scatter": lambda: dist.reduce_scatter(mine, list(both.chunk(2))),
             "all_reduce": lambda: dist.all_reduce(both)}
    call = calls[args.op]
    counter = Path(f"/sys/class/net/{args.device}/statistics/tx_bytes")
    call()
    dist.barrier()
    sent, start = int(counter.read_text()), time.perf_counter()
    for _ in range(OPS_PER_RUN):
        call()
    seconds = time.perf_counter() - start
    sent = int(counter.read_text()) - sent
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"rank": args.rank, "tx_bytes_per_op": sent / OPS_PER_RUN,
                      "seconds_per_op": seconds / OPS_PER_RUN}), flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(link: object, op: str, timeout_s: float = 120.0) -> dict[str, float]:
    """Both ranks of one run of ``op``: mean bytes sent per call per rank, slowest seconds per
    call.

    Raises:
        RuntimeError: a rank failed or printed no result.
    """
    port = _free_port()
    procs = []
    for rank, node in enumerate(("A", "B")):
        argv = [sys.executable, __file__, "--rank", str(rank), "--op", op, "--addr",
                link.address("A"), "--port", str(port), "--device", link.device(node)]
        procs.append(subprocess.Popen(link.exec_argv(node, argv), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=ROOT))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout_s)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"{op}: rank exited {proc.returncode}: {err[-2000:]}")
        results.append(json.loads(lines[-1]))
    return {"tx_bytes_per_op": sum(r["tx_bytes_per_op"] for r in results) / len(results),
            "seconds_per_op": max(r["seconds_per_op"] for r in results)}


def main() -> int:
    """Run the repeats, write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results", type=Path, default=ROOT / "bench/results/gloo-bytes.json")
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--op", choices=COLLECTIVES, help=argparse.SUPPRESS)
    parser.add_argument("--addr", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--device", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        _rank_main(args)
        return 0

    import benchlib
    import netns
    from hetero_operator.planning.steptime import GLOO_REDUCE_SCATTER_TRANSFERS

    why = netns.available()
    if why is not None:
        print(f"bench_gloo_bytes: {why}; nothing written", file=sys.stderr)
        return 1
    run_meta = benchlib.meta()
    started = time.monotonic()
    runs: dict[str, list[dict[str, float]]] = {op: [] for op in COLLECTIVES}
    with netns.VethLink(rate_mbit=RATE_MBIT) as link:
        for repeat in range(args.repeats):
            for op in COLLECTIVES:
                runs[op].append(one_run(link, op))
                print(f"repeat {repeat + 1}: {op} {runs[op][-1]}", flush=True)
    run_meta["wall_s"] = time.monotonic() - started
    how = (f"tx_bytes of each rank's veth end around {OPS_PER_RUN} calls on a "
           f"{SLICE_BYTES / 1e6:.2f} MB slice, 2 ranks, {RATE_MBIT:.0f} Mbit/s each way")
    targets = [benchlib.Target(f"bytes sent per call / slice bytes, {op}", "info", 0.0, "x",
                               [r["tx_bytes_per_op"] / SLICE_BYTES for r in runs[op]], how)
               for op in COLLECTIVES]
    targets.append(benchlib.Target(
        "reduce_scatter_single bytes / all_gather_single bytes", "info",
        float(GLOO_REDUCE_SCATTER_TRANSFERS), "x",
        [rs["tx_bytes_per_op"] / ag["tx_bytes_per_op"]
         for rs, ag in zip(runs["reduce_scatter_single"], runs["all_gather_single"])],
        f"steptime.GLOO_REDUCE_SCATTER_TRANSFERS = {GLOO_REDUCE_SCATTER_TRANSFERS}"))
    targets.append(benchlib.Target(
        "all_gather_single rate / shaped link rate", "info", 0.0, "x",
        [SLICE_BYTES * 8 / r["seconds_per_op"] / (RATE_MBIT * 1e6) for r in runs["all_gather_single"]],
        "slice bytes over the slowest rank's seconds per call"))
    for t in targets:
        print(t.as_dict(), flush=True)
    benchlib.write_results(args.results, benchmark="gloo-bytes", run_meta=run_meta, targets=targets,
                           details={"runs": runs, "slice_bytes": SLICE_BYTES,
                                    "ops_per_run": OPS_PER_RUN, "rate_mbit": RATE_MBIT})
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
