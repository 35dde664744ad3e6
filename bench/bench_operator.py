"""Benchmark the operator against the test API server (tests/k8s/fakeapi.py, kmock over HTTP).

1. Latency: time from creating a 64-rank job (8 nodes x 8 A100 + 8 nodes x 8 T4, one pod per
   node and GPU type) to all its pods existing in the API server; 10 repeats, median.  Target:
   <= 1 s beyond kopf's batching window (``settings.batching.batch_window``, 0.1 s by default).
2. Scale: 500 jobs of 8 ranks over 2,000 nodes (4 GPUs each), created back to back once the
   operator is ready (a warm-up job's pods exist: kopf runs no job handler before its node and
   pod indexes hold the initial listing; that time is reported on its own).  The run
   *settles* when every job has a plan and every planned pod exists; it must settle within
   ``--settle-timeout-s`` or the benchmark fails (exit 3, nothing written).  Reported: time from
   the last job's create to all of its pods, from the first create to the last pod, the operator's
   peak RSS (``VmHWM``; target <= 200 MB) and the CPU seconds of the operator and of the fake API
   server (this process) in that time: the fake API server is Python on the same 2 cores, so the
   operator's own share of the wall time says whether the operator or the test server bounds it.

The operator runs as a real subprocess (``heterotrain operator``, standalone, KUBECONFIG pointing
at the fake server), so its memory and CPU are its own.  No kubelet: pods stay unbound (the pending
timeout is raised to an hour so they are not re-planned during the run).  Each scale run is
repeated ``--repeats`` (3) times, each against a fresh server and operator.
Run from the repository root:

    .venv/bin/python bench/bench_operator.py            # writes bench/results/operator.json
    .venv/bin/python bench/bench_operator.py --quick    # fewer jobs/nodes (smoke)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import kmock
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "operator")]

import benchlib  # noqa: E402
from k8s import crdcheck  # noqa: E402
from k8s.fakeapi import CRDS, HTJ, FakeApiServer, kubeconfig  # noqa: E402

from hetero_operator.api.labels import LABEL_JOB  # noqa: E402

PODS = ("", "v1", "pods")
NODES = ("", "v1", "nodes")
BATCH_WINDOW_S = 0.1  # kopf's default settings.batching.batch_window
REAL_PEAK_RSS_MIB = 250.0  # issue 32, item 9: the operator at 2,000 nodes on the real API server


def node(name: str, product: str, cc: str, mem_mib: int, count: int, family: str) -> dict[str, Any]:
    """A GFD-labelled Node with ``count`` whole GPUs."""
    major, minor = cc.split(".")
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.family": family, "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": str(mem_mib), "nvidia.com/gpu.compute.major": major,
        "nvidia.com/gpu.compute.minor": minor, "nvidia.com/cuda.driver-version.full": "550.107.02",
        "nvidia.com/cuda.runtime-version.full": "12.4", "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "4"}},
        "status": {"capacity": {"nvidia.com/gpu": str(count)}, "allocatable": {"nvidia.com/gpu": str(count)},
                   "conditions": [{"type": "Ready", "status": "True"}]}}


def job(name: str, ranks: int) -> dict[str, Any]:
    """examples/digits.yaml renamed, ``ranks`` ranks, all or nothing."""
    body = yaml.safe_load((ROOT / "examples" / "digits.yaml").read_text())
    body["metadata"]["name"] = name
    body["spec"]["gpus"] = {"ranks": ranks, "minRanks": ranks}
    body["spec"]["training"]["globalBatchSize"] = 16 * ranks
    return body


def start_operator(kubeconfig_path: Path, log_path: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, KUBECONFIG=str(kubeconfig_path), HTJ_PEERING="", HTJ_METRICS_PORT="0",
               HTJ_HEALTH_PORT="0", HTJ_RESYNC_S="30", HTJ_PENDING_TIMEOUT_S="3600", PYTHONPATH=f"{ROOT / 'operator'}:{ROOT / 'worker'}")
    return subprocess.Popen([sys.executable, "-m", "hetero_operator.cli", "operator"], env=env,
                            stdout=log_path.open("wb"), stderr=subprocess.STDOUT)


async def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, keep serving the API while it shuts down, SIGKILL after 30 s."""
    proc.terminate()
    try:
        await asyncio.to_thread(proc.wait, 30)
    except subprocess.TimeoutExpired:
        proc.kill()
        await asyncio.to_thread(proc.wait)


def rss_mib(pid: int) -> float:
    """Resident set size now (``VmRSS``) of a process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mib(pid: int) -> float:
    """Peak resident set size (``VmHWM``) of a process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def live(api: FakeApiServer, resource: tuple[str, str, str]) -> list[dict[str, Any]]:
    """Stored objects of ``resource`` without copying (cheap: the server shares our loop)."""
    return [o for (r, _, _), o in api.store.items() if r == resource]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_for(predicate: Any, timeout_s: float, poll_s: float = 0.01, what: str = "") -> float:
    """Seconds until ``predicate()`` held.

    Raises:
        BenchTimeout: it did not within ``timeout_s``.
    """
    start = time.perf_counter()
    while not predicate():
        if time.perf_counter() - start > timeout_s:
            raise benchlib.BenchTimeout(f"{what or 'condition'}: not reached in {timeout_s} s")
        await asyncio.sleep(poll_s)
    return time.perf_counter() - start


async def new_server_with_crd(api: FakeApiServer) -> None:
    """The operator refuses to start without the CRD (hetero_operator.controller.schemacheck)."""
    await api.create(CRDS, None, crdcheck.load_crd())


async def bench_latency(workdir: Path, repeats: int) -> dict[str, Any]:
    async with FakeApiServer() as api, kmock.Server(api) as server:
        await new_server_with_crd(api)
        cfg = workdir / "kubeconfig-latency.json"
        cfg.write_text(kubeconfig(str(server.url).rstrip("/")))
        for i in range(8):
            await api.create(NODES, None, node(f"a100-{i}", "NVIDIA-A100-SXM4-80GB", "8.0", 81920, 8, "ampere"))
            await api.create(NODES, None, node(f"t4-{i}", "Tesla-T4", "7.5", 15360, 8, "turing"))
        proc = start_operator(cfg, workdir / "operator-latency.log")
        try:
            await api.create(HTJ, "default", job("warmup", 8))
            await wait_for(lambda: len(live(api, PODS)) >= 1, 120, what="warm-up job's first pod")
            await api.delete(HTJ, "default", "warmup")
            times, created_unix = [], {}
            for r in range(repeats):
                name = f"job64-{r}"
                t0 = time.perf_counter()
                created_unix[name] = time.time()
                await api.create(HTJ, "default", job(name, 64))
                await wait_for(lambda: len([p for p in live(api, PODS)
                                            if p["metadata"]["name"].startswith(name + "-")]) == 8, 60,
                               what=f"{name}'s 8 pods")
                times.append(time.perf_counter() - t0)
                await api.delete(HTJ, "default", name)
                await wait_for(lambda: not live(api, PODS), 30, what=f"{name}'s pods gone")
        finally:
            await stop(proc)
        planned = planned_unix(workdir / "operator-latency.log")
        create_to_plan = [planned[n] - t for n, t in created_unix.items() if n in planned]
        return {"ranks": 64, "pods": 8, "repeats": repeats, "create_to_pods_s": times,
                "create_to_plan_logged_s": create_to_plan,
                "plan_logged_to_pods_s": [t - c for t, c in zip(times, create_to_plan)]}


def planned_unix(log: Path) -> dict[str, float]:
    """``{job: unix time}`` of the operator's "planned over" log lines (its local time = UTC here)."""
    out = {}
    for line in log.read_text(errors="replace").splitlines():
        if ": planned over " in line:
            stamp, rest = line[:23], line[24:]
            name = rest.split(": planned over ")[0].rsplit("/", 1)[-1]
            when = datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")
            out.setdefault(name, when.replace(tzinfo=datetime.timezone.utc).timestamp())
    return out


def pods_by_job(api: FakeApiServer) -> dict[tuple[str, str], int]:
    """``{(namespace, job): pods}`` from the ``heterotrain.io/job`` label."""
    out: dict[tuple[str, str], int] = {}
    for (r, ns, _), o in api.store.items():
        if r == PODS:
            key = (ns, (o["metadata"].get("labels") or {}).get(LABEL_JOB, ""))
            out[key] = out.get(key, 0) + 1
    return out


async def bench_scale(workdir: Path, n_jobs: int, n_nodes: int, settle_timeout_s: float) -> dict[str, Any]:
    async with FakeApiServer() as api, kmock.Server(api) as server:
        await new_server_with_crd(api)
        cfg = workdir / "kubeconfig-scale.json"
        cfg.write_text(kubeconfig(str(server.url).rstrip("/")))
        kinds = [("NVIDIA-A100-SXM4-80GB", "8.0", 81920, "ampere"), ("Tesla-T4", "7.5", 15360, "turing"),
                 ("Tesla-V100-SXM2-16GB", "7.0", 16384, "volta"), ("NVIDIA-H100-80GB-HBM3", "9.0", 81559, "hopper")]
        for i in range(n_nodes):
            product, cc, mem, family = kinds[i % len(kinds)]
            await api.create(NODES, None, node(f"node-{i:04d}", product, cc, mem, 4, family))
        proc = start_operator(cfg, workdir / "operator-scale.log")
        try:
            # Ready = one job planned and its pods created: kopf calls no job handler before its
            # node and pod indexes hold the initial listing.  Timed on its own (operator start).
            t_start = time.perf_counter()
            await api.create(HTJ, "warmup", job("warmup", 8))
            await wait_for(lambda: pods_by_job(api).get(("warmup", "warmup"), 0) >= 2, settle_timeout_s,
                           poll_s=0.1, what="the warm-up job's pods (operator start)")
            start_to_ready_s = time.perf_counter() - t_start
            start_cpu_s = cpu_s(proc.pid)
            ready_rss_mib = peak_rss_mib(proc.pid)  # the start: kopf's listing and indexing of every node
            await api.delete(HTJ, "warmup", "warmup")  # its pods go by owner reference
            await wait_for(lambda: ("warmup", "warmup") not in pods_by_job(api), 60, poll_s=0.1,
                           what="the warm-up job's pods gone")
            created: dict[tuple[str, str], float] = {}
            complete: dict[tuple[str, str], float] = {}
            cpu_op0, cpu_api0, t0 = cpu_s(proc.pid), time.process_time(), time.perf_counter()
            for j in range(n_jobs):
                key = (f"team-{j % 20}", f"job-{j:03d}")
                await api.create(HTJ, key[0], job(key[1], 8))
                created[key] = time.perf_counter()
            last = key

            def settled() -> bool:
                now, counts = time.perf_counter(), pods_by_job(api)
                for o in live(api, HTJ):
                    k = (o["metadata"]["namespace"], o["metadata"]["name"])
                    planned = len(((o.get("status") or {}).get("plan") or {}).get("pods") or ())
                    if k not in complete and planned and counts.get(k, 0) >= planned:
                        complete[k] = now
                return len(complete) == n_jobs

            await wait_for(settled, settle_timeout_s, poll_s=0.25, what=f"{n_jobs} jobs' pods")
            wall_s = time.perf_counter() - t0
            cpu_op, cpu_api = cpu_s(proc.pid) - cpu_op0, time.process_time() - cpu_api0
            per_job = sorted(complete[k] - created[k] for k in created)
            phases: dict[str, int] = {}
            for o in live(api, HTJ):
                phase = (o.get("status") or {}).get("phase", "")
                phases[phase] = phases.get(phase, 0) + 1
            return {"jobs": n_jobs, "nodes": n_nodes, "pods": len(live(api, PODS)), "phases": phases,
                    "operator_start_to_first_job_pods_s": start_to_ready_s,
                    "operator_start_cpu_s": start_cpu_s,
                    "last_job_create_to_all_pods_s": complete[last] - created[last],
                    "first_create_to_all_pods_s": wall_s,
                    "create_to_all_pods_median_s": statistics.median(per_job),
                    "create_to_all_pods_max_s": per_job[-1],
                    "operator_peak_rss_mib": peak_rss_mib(proc.pid),
                    "operator_peak_rss_at_first_job_mib": ready_rss_mib,
                    "operator_rss_settled_mib": rss_mib(proc.pid),
                    "operator_cpu_s": cpu_op, "fake_api_server_cpu_s": cpu_api,
                    "operator_cpu_share_of_wall": cpu_op / wall_s}
        finally:
            await stop(proc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 jobs over 200 nodes, 3 repeats")
    parser.add_argument("--repeats", type=int, default=benchlib.REPEATS,
                        help="scale runs; 0 runs the latency part only (the results say so)")
    parser.add_argument("--settle-timeout-s", type=float, default=600.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "operator.json"))
    parser.add_argument("--real", action="store_true",
                        help="against the real control plane (bench/operator_real.py); writes "
                             "bench/results/operator-real.json and prints it beside the stand-in's rows")
    parser.add_argument("--machine-state", default="idle",
                        help="--real: how loaded the machine was ('loaded: ...' when other work ran "
                             "meanwhile; the load average is in meta either way)")
    args = parser.parse_args()
    if args.real:
        return main_real(args)
    workdir = Path(tempfile.mkdtemp(prefix="bench-operator-"))  # kubeconfigs and operator logs
    run_meta = benchlib.meta()
    started = time.monotonic()
    latency = asyncio.run(bench_latency(workdir, 3 if args.quick else 10))
    print(f"64-rank job, create -> 8 pods created: "
          f"{', '.join(f'{t * 1000:.0f}' for t in latency['create_to_pods_s'])} ms; of which create -> "
          f"plan logged: {', '.join(f'{t * 1000:.0f}' for t in latency['create_to_plan_logged_s'])} ms",
          flush=True)
    n_jobs, n_nodes = (50, 200) if args.quick else (500, 2000)
    scale = []
    for r in range(args.repeats):
        s = asyncio.run(bench_scale(workdir, n_jobs, n_nodes, args.settle_timeout_s))
        scale.append(s)
        print(f"repeat {r}: {n_jobs} jobs over {n_nodes} nodes settled: {s['pods']} pods; last job's "
              f"create -> all pods {s['last_job_create_to_all_pods_s']:.1f} s, first create -> last pod "
              f"{s['first_create_to_all_pods_s']:.1f} s; operator peak RSS {s['operator_peak_rss_mib']:.0f} "
              f"MiB; CPU s operator {s['operator_cpu_s']:.1f} / fake API server "
              f"{s['fake_api_server_cpu_s']:.1f}", flush=True)
    scale_name = f"{n_jobs} jobs x 8 ranks over {n_nodes:,} nodes"
    latency_targets = [
        benchlib.Target("64-rank job: create -> all 8 pods, beyond kopf's 0.1 s batch window", "<=", 1.0,
                        " s", [t - BATCH_WINDOW_S for t in latency["create_to_pods_s"]],
                        f"{len(latency['create_to_pods_s'])} jobs one after the other, same operator"),
        benchlib.Target("... of which create -> the operator logs the plan", "info", 0.0, " s",
                        latency["create_to_plan_logged_s"], "watch event, kopf, reconcile, plan"),
    ]
    targets = latency_targets if not scale else latency_targets + [
        benchlib.Target(f"{scale_name}: operator peak RSS", "<=", 200.0, " MiB",
                        [s["operator_peak_rss_mib"] for s in scale], "VmHWM of the operator process"),
        benchlib.Target(f"{scale_name}: operator peak RSS at its first job's pods", "info", 0.0, " MiB",
                        [s["operator_peak_rss_at_first_job_mib"] for s in scale],
                        "VmHWM once the operator is ready: imports, kopf's listing and indexing of "
                        "every node (one worker task per object until all are indexed)"),
        benchlib.Target(f"{scale_name}: last job's create -> all its pods", "info", 0.0, " s",
                        [s["last_job_create_to_all_pods_s"] for s in scale],
                        "the jobs are created back to back; every run settled (all pods created)"),
        benchlib.Target(f"{scale_name}: first create -> every pod of every job", "info", 0.0, " s",
                        [s["first_create_to_all_pods_s"] for s in scale], ""),
        benchlib.Target(f"{scale_name}: operator CPU seconds / wall seconds", "info", 0.0, "",
                        [s["operator_cpu_share_of_wall"] for s in scale],
                        "the rest of 2 cores: the fake API server (Python, this process) and others"),
        benchlib.Target(f"{scale_name}: operator CPU seconds, first create -> every pod", "info", 0.0,
                        " s", [s["operator_cpu_s"] for s in scale], ""),
        benchlib.Target(f"{scale_name}: test API server CPU seconds, same time", "info", 0.0, " s",
                        [s["fake_api_server_cpu_s"] for s in scale],
                        "this process: kmock, the fake server, the benchmark's own polling"),
        benchlib.Target(f"{scale_name}: operator start -> a first job's pods", "info", 0.0, " s",
                        [s["operator_start_to_first_job_pods_s"] for s in scale],
                        "once per operator start: imports, CRD check, kopf's initial listing and "
                        "indexing of every node and pod before any job handler runs"),
    ]
    run_meta["wall_s"] = round(time.monotonic() - started, 1)
    fewer = {} if args.repeats >= benchlib.REPEATS or not scale else {
        t.name: f"{args.repeats} scale run(s) of {n_jobs} jobs: one takes many minutes on the shared "
                "2-core machine (--repeats)" for t in targets if t.name.startswith(scale_name)}
    doc = benchlib.write_results(Path(args.out), benchmark="operator", run_meta=run_meta, targets=targets,
                                 details={"latency": latency,
                                          "scale": scale or "not run (--repeats 0)",
                                          "batch_window_s": BATCH_WINDOW_S,
                                          "fewer_runs": fewer})
    benchlib.print_targets(doc)
    return 0


def main_real(args: argparse.Namespace) -> int:
    """``--real``: the same rows against etcd + kube-apiserver + scheduler + controllers, 2,000
    nodes heartbeating their leases from this process; a run that does not settle fails (exit 3)."""
    import operator_real

    out = Path(args.out) if args.out != str(ROOT / "bench" / "results" / "operator.json") else \
        ROOT / "bench" / "results" / "operator-real.json"
    workdir = Path(tempfile.mkdtemp(prefix="bench-operator-real-"))
    run_meta = benchlib.meta()
    started = time.monotonic()
    latency = asyncio.run(operator_real.latency(workdir, 3 if args.quick else 10, node, job, start_operator, stop))
    print(f"real: 64-rank job, create -> 8 pods: {', '.join(f'{t * 1000:.0f}' for t in latency['create_to_pods_s'])} ms",
          flush=True)
    n_jobs, n_nodes = (50, 200) if args.quick else (500, 2000)
    scale = []
    for run in range(args.repeats):
        s = asyncio.run(operator_real.scale(workdir, n_jobs, n_nodes, args.settle_timeout_s, node, job,
                                            start_operator, stop, peak_rss_mib, run=run))
        scale.append(s)
        print(f"real: {n_jobs} jobs over {n_nodes} nodes settled: {s['pods']} pods; last job's create -> all pods "
              f"{s['last_job_create_to_all_pods_s']:.1f} s; first create -> last pod {s['first_create_to_all_pods_s']:.1f} s; "
              f"operator peak RSS {s['operator_peak_rss_mib']:.0f} MiB; CPU s operator {s['operator_cpu_s']:.1f}, "
              f"kube-apiserver {s['kube_apiserver_cpu_s']:.1f}, etcd {s['etcd_cpu_s']:.1f}; every node usable "
              f"{s['operator_start_to_every_node_usable_s']:.1f} s after the operator's start; "
              f"{s['plans_per_job']:.2f} plans per job (at most {s['max_plans_of_a_job']})", flush=True)
    scale_name = f"{n_jobs} jobs x 8 ranks over {n_nodes:,} nodes"
    targets = [benchlib.Target("64-rank job: create -> all 8 pods, beyond kopf's 0.1 s batch window", "<=", 1.0,
                               " s", [t - BATCH_WINDOW_S for t in latency["create_to_pods_s"]],
                               "real kube-apiserver: admission and etcd writes included")]
    if scale:
        rows = [("operator peak RSS", "<=", REAL_PEAK_RSS_MIB, " MiB", "operator_peak_rss_mib",
                 "VmHWM of the operator (issue 32, item 9: <= 250 MiB)"),
                ("every registered node usable after operator start", "<=", 30.0, " s",
                 "operator_start_to_every_node_usable_s",
                 "process start -> the operator's log says all nodes usable (its informer's 'nodes synced' "
                 "line or a plan over all of them); the nodes are Ready and untainted before it starts"),
                ("plans per job", "<=", 1.2, "", "plans_per_job",
                 "the operator's 'planned over' log lines of the scale jobs (placements and "
                 "unschedulable answers) / jobs"),
                ("most plans of one job", "info", 0.0, "", "max_plans_of_a_job", ""),
                ("last job's create -> all its pods", "info", 0.0, " s", "last_job_create_to_all_pods_s", ""),
                ("first create -> every pod of every job", "info", 0.0, " s", "first_create_to_all_pods_s", ""),
                ("operator CPU seconds / wall seconds", "info", 0.0, "", "operator_cpu_share_of_wall", ""),
                ("operator CPU seconds, first create -> every pod", "info", 0.0, " s", "operator_cpu_s", ""),
                ("kube-apiserver CPU seconds, same time", "info", 0.0, " s", "kube_apiserver_cpu_s",
                 "the stand-in's row: test API server CPU seconds"),
                ("etcd CPU seconds, same time", "info", 0.0, " s", "etcd_cpu_s", ""),
                ("kube-scheduler CPU seconds, same time", "info", 0.0, " s", "kube_scheduler_cpu_s",
                 "binds every pod (the stand-in binds none)"),
                ("operator start -> a first job's pods", "info", 0.0, " s", "operator_start_to_first_job_pods_s", "")]
        targets += [benchlib.Target(f"{scale_name}: {name}", op, bound, unit, [s[key] for s in scale], note)
                    for name, op, bound, unit, key, note in rows]
    run_meta["wall_s"] = round(time.monotonic() - started, 1)
    fewer = {} if args.repeats >= benchlib.REPEATS else {
        t.name: f"{args.repeats} scale run(s) against the real control plane (--repeats)"
        for t in targets if t.name.startswith(scale_name)}
    doc = benchlib.write_results(out, benchmark="operator-real", run_meta=run_meta, targets=targets,
                                 details={"latency": latency, "scale": scale or "not run (--repeats 0)",
                                          "batch_window_s": BATCH_WINDOW_S, "fewer_runs": fewer,
                                          "machine_state": args.machine_state,
                                          "control_plane": "tests/controlplane (k8s v1.35.4, etcd v3.6.5)"})
    benchlib.print_targets(doc)
    _side_by_side(ROOT / "bench" / "results" / "operator.json", doc)
    return 0


def _side_by_side(stand_in: Path, real: dict[str, Any]) -> None:
    """Print each real row beside the stand-in's row of the same name (median), where it has one."""
    import json
    if not stand_in.exists():
        return
    theirs = {t["name"]: t.get("median") for t in json.loads(stand_in.read_text()).get("targets", [])}
    print(f"{'row':<80} {'stand-in':>10} {'real':>10}")
    for t in real["targets"]:
        name = t["name"].replace("kube-apiserver CPU", "test API server CPU")
        other = theirs.get(name)
        print(f"{t['name']:<80} {other if other is None else round(other, 3)!s:>10} {round(t['median'], 3)!s:>10}")


if __name__ == "__main__":
    sys.exit(benchlib.main_guard(main))
