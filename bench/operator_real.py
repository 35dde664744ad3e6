"""``bench_operator.py --real``: the same two measurements against the REAL control plane.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler (hetero_operator.local,
built by scripts/build-controlplane.sh) instead of the kmock stand-in.  The nodes are registered
by the local kubelet in this process with ``run_pods=False``: Node, status and a Lease each,
leases renewed every 30 s (node lifecycle grace 120 s), no pod is run.  The real scheduler binds
the pods (they stay Pending: nobody runs them), the garbage collector deletes a deleted job's
pods.  Observed over the API (lists from the watch cache, ``resourceVersion=0``), so the numbers
include what the stand-in does not: admission, etcd writes, the scheduler's binds.

A new Node gets ``node.kubernetes.io/not-ready:NoSchedule`` from admission; the node lifecycle
controller removes it once the node is Ready, but only about 4-5 nodes a second with
kube-controller-manager's default client rate (tests/cluster/test_informer_real.py measured 200
nodes in about 40 s; it was last round's "about 90 more usable nodes every 20 s").  The harness
removes that taint itself once every node is Ready (what the controller would do, at the
harness's rate), so the operator starts on a settled cluster, as when it restarts on a real one.

Reported: the same rows as the stand-in, plus the CPU seconds of kube-apiserver, etcd,
kube-scheduler and kube-controller-manager in the scale run, and from the operator's log
(issue 32, item 9): operator start -> every registered node usable (its informer's "nodes synced"
line, or the first plan over all of them), and plans per job (its "planned over" lines).
"""

from __future__ import annotations

import asyncio
import datetime
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "operator")]

import benchlib  # noqa: E402

from hetero_operator.devcluster import controlplane  # noqa: E402
from hetero_operator.devcluster.controlplane import Options  # noqa: E402
from hetero_operator.devcluster.kubeapi import Api, ApiError  # noqa: E402
from hetero_operator.devcluster.kubelet import LocalKubelet  # noqa: E402

HTJ_PATH = "/apis/heterotrain.io/v1alpha1"
LABEL_JOB = "heterotrain.io/job-name"
NOT_READY = "node.kubernetes.io/not-ready"
SYNCED = re.compile(r"nodes synced: (\d+) node\(s\) listed, (\d+) usable")
PLANNED = re.compile(r"([\w.-]+)/([\w.-]+): planned over (\d+) usable node")


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Real:
    """A real control plane plus a lease-only kubelet for ``nodes``; ``async with``."""

    def __init__(self, workdir: Path, nodes: list[dict[str, Any]], name: str) -> None:
        self.dir, self.nodes, self.name = workdir / name, nodes, name

    async def __aenter__(self) -> Real:
        bins = controlplane.bin_dir()
        self.state = await asyncio.to_thread(controlplane.start, self.dir, bins,
                                             Options(node_monitor_grace_s=120, node_monitor_period_s=5))
        controlplane.kubectl(self.dir, "apply", "--server-side", "-f", str(ROOT / "crds"))
        try:
            controlplane.wait_crds_established(self.dir, ["heterotrainingjobs.heterotrain.io"])
            self.api = await Api.from_kubeconfig(Path(self.state["kubeconfig"]), connections=16).__aenter__()
            self.kubelet = LocalKubelet(self.api, self.nodes, pod_dir=self.dir / "pods", lease_s=120,
                                        renew_s=30.0, run_pods=False)
            self.kubelet_task = asyncio.ensure_future(self.kubelet.run())
            t0 = time.perf_counter()
            await asyncio.wait_for(self.kubelet.registered.wait(), 900)
            self.register_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            await self.untaint()
            self.untaint_s = time.perf_counter() - t0
        except BaseException:
            await asyncio.to_thread(controlplane.stop, self.dir)  # nothing keeps running
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.kubelet_task.cancel()
        await asyncio.gather(self.kubelet_task, return_exceptions=True)
        await self.api.__aexit__()
        await asyncio.to_thread(controlplane.stop, self.dir)

    async def untaint(self) -> None:
        """Remove the not-ready taint of every Ready node (see the module doc); return once the
        API server lists no node with it."""
        sem = asyncio.Semaphore(16)

        async def one(n: dict[str, Any]) -> None:
            taints = (n.get("spec") or {}).get("taints") or []
            kept = [t for t in taints if t.get("key") != NOT_READY]
            ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (n.get("status") or {}).get("conditions") or ())
            if ready and len(kept) != len(taints):
                async with sem:
                    await self.api.patch(f"/api/v1/nodes/{n['metadata']['name']}", {"spec": {"taints": kept}})

        async def tainted() -> list[dict[str, Any]]:
            listed = await self.api.get("/api/v1/nodes", params={"resourceVersion": "0"})
            return [n for n in listed["items"] if any(t.get("key") == NOT_READY
                                                       for t in (n.get("spec") or {}).get("taints") or ())]

        async def none_left() -> bool:
            left = await tainted()
            await asyncio.gather(*(one(n) for n in left))
            return not left

        await wait(none_left, 600, 1.0, "every node Ready without the not-ready taint")

    def pids(self) -> dict[str, int]:
        return {n: int(p["pid"]) for n, p in controlplane.read_state(self.dir)["processes"].items()}

    async def namespace(self, name: str) -> None:
        try:
            await self.api.create("/api/v1/namespaces", {"metadata": {"name": name}})
        except ApiError as exc:
            if exc.status != 409:
                raise

    async def create_job(self, ns: str, body: dict[str, Any]) -> None:
        await self.api.create(f"{HTJ_PATH}/namespaces/{ns}/heterotrainingjobs", body)

    async def delete_job(self, ns: str, name: str) -> None:
        await self.api.delete(f"{HTJ_PATH}/namespaces/{ns}/heterotrainingjobs/{name}",
                              {"propagationPolicy": "Background"})

    async def delete_pods(self, ns: str, job: str) -> None:
        """Delete the job's pods at once (``gracePeriodSeconds=0``: no kubelet runs them), as the
        garbage collector would after the job's delete."""
        listed = await self.api.get(f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": f"{LABEL_JOB}={job}"})
        for p in listed["items"]:
            try:
                await self.api.delete(f"/api/v1/namespaces/{ns}/pods/{p['metadata']['name']}",
                                      {"gracePeriodSeconds": 0})
            except ApiError as exc:
                if exc.status != 404:
                    raise

    async def pods_by_job(self) -> dict[tuple[str, str], int]:
        listed = await self.api.get("/api/v1/pods", params={"resourceVersion": "0", "labelSelector": LABEL_JOB})
        out: dict[tuple[str, str], int] = {}
        for p in listed["items"]:
            if p["metadata"].get("deletionTimestamp"):
                continue
            key = (p["metadata"]["namespace"], p["metadata"]["labels"][LABEL_JOB])
            out[key] = out.get(key, 0) + 1
        return out

    async def jobs(self) -> list[dict[str, Any]]:
        return (await self.api.get(f"{HTJ_PATH}/heterotrainingjobs", params={"resourceVersion": "0"}))["items"]


async def wait(predicate: Any, timeout_s: float, poll_s: float, what: str) -> float:
    """Seconds until the coroutine function ``predicate()`` returned true.

    Raises:
        benchlib.BenchTimeout: not within ``timeout_s`` (the run fails; nothing is written).
    """
    start = time.perf_counter()
    while not await predicate():
        if time.perf_counter() - start > timeout_s:
            raise benchlib.BenchTimeout(f"{what}: not reached in {timeout_s} s")
        await asyncio.sleep(poll_s)
    return time.perf_counter() - start


async def latency(workdir: Path, repeats: int, node: Any, job: Any, start_operator: Any, stop: Any) -> dict[str, Any]:
    """64-rank job (8x8 A100 + 8x8 T4 nodes): create -> its 8 pods exist, ``repeats`` times."""
    nodes = [node(f"a100-{i}", "NVIDIA-A100-SXM4-80GB", "8.0", 81920, 8, "ampere") for i in range(8)]
    nodes += [node(f"t4-{i}", "Tesla-T4", "7.5", 15360, 8, "turing") for i in range(8)]
    async with Real(workdir, nodes, "real-latency") as real:
        proc = start_operator(Path(real.state["kubeconfig"]), workdir / "operator-real-latency.log")
        try:
            await real.create_job("default", job("warmup", 8))
            await wait(lambda: _has(real, ("default", "warmup"), 1), 180, 0.05, "warm-up job's first pod")
            await real.delete_job("default", "warmup")
            await wait(lambda: _none(real), 60, 0.05, "warm-up pods gone")
            times = []
            for r in range(repeats):
                name = f"job64-{r}"
                t0 = time.perf_counter()
                await real.create_job("default", job(name, 64))
                await wait(lambda: _has(real, ("default", name), 8), 60, 0.01, f"{name}'s 8 pods")
                times.append(time.perf_counter() - t0)
                await real.delete_job("default", name)
                await wait(lambda: _none(real), 60, 0.05, f"{name}'s pods gone")
        finally:
            await stop(proc)
    return {"ranks": 64, "pods": 8, "repeats": repeats, "create_to_pods_s": times}


async def _has(real: Real, key: tuple[str, str], n: int) -> bool:
    return (await real.pods_by_job()).get(key, 0) >= n


async def _none(real: Real) -> bool:
    return not await real.pods_by_job()


async def scale(workdir: Path, n_jobs: int, n_nodes: int, settle_timeout_s: float, node: Any, job: Any,
                start_operator: Any, stop: Any, peak_rss_mib: Any, run: int = 0) -> dict[str, Any]:
    """500 jobs x 8 ranks over 2,000 nodes (4 GPUs each), created back to back: time to settle.

    Each ``run`` gets a control plane in a directory of its own: one reused would start on the
    last run's etcd data (its 500 jobs and 1,000 pods)."""
    kinds = [("NVIDIA-A100-SXM4-80GB", "8.0", 81920, "ampere"), ("Tesla-T4", "7.5", 15360, "turing"),
             ("Tesla-V100-SXM2-16GB", "7.0", 16384, "volta"), ("NVIDIA-H100-80GB-HBM3", "9.0", 81559, "hopper")]
    nodes = []
    for i in range(n_nodes):
        product, cc, mem, family = kinds[i % len(kinds)]
        nodes.append(node(f"node-{i:04d}", product, cc, mem, 4, family))
    async with Real(workdir, nodes, f"real-scale-{run}") as real:
        for t in range(20):
            await real.namespace(f"team-{t}")
        await real.namespace("warmup")
        log_path = workdir / f"operator-real-scale-{run}.log"
        started_unix = time.time()
        proc = start_operator(Path(real.state["kubeconfig"]), log_path)
        try:
            t_start = time.perf_counter()
            await real.create_job("warmup", job("warmup", 8))
            await wait(lambda: _has(real, ("warmup", "warmup"), 2), settle_timeout_s, 0.1, "warm-up job's pods")
            start_to_ready_s = time.perf_counter() - t_start
            await real.delete_job("warmup", "warmup")
            await real.delete_pods("warmup", "warmup")  # not left to the GC: slow on a loaded machine
            await wait(lambda: _none(real), 300, 0.2, "warm-up pods gone")
            pids = real.pids()
            cpu0 = {n: _cpu_s(p) for n, p in pids.items() if n != "kubelet"}
            cpu_op0, cpu_self0, t0 = _cpu_s(proc.pid), time.process_time(), time.perf_counter()
            created: dict[tuple[str, str], float] = {}
            complete: dict[tuple[str, str], float] = {}
            for j in range(n_jobs):
                key = (f"team-{j % 20}", f"job-{j:03d}")
                await real.create_job(key[0], job(key[1], 8))
                created[key] = time.perf_counter()
            last = key

            async def settled() -> bool:
                now, counts = time.perf_counter(), await real.pods_by_job()
                for o in await real.jobs():
                    k = (o["metadata"]["namespace"], o["metadata"]["name"])
                    planned = len(((o.get("status") or {}).get("plan") or {}).get("pods") or ())
                    if k not in complete and planned and counts.get(k, 0) >= planned:
                        complete[k] = now
                return len(complete) == n_jobs

            await wait(settled, settle_timeout_s, 0.5, f"{n_jobs} jobs' pods")
            wall_s = time.perf_counter() - t0
            cpu = {n: _cpu_s(p) - cpu0[n] for n, p in pids.items() if n in cpu0}
            cpu_op = _cpu_s(proc.pid) - cpu_op0
            per_job = sorted(complete[k] - created[k] for k in created)
            result = {"jobs": n_jobs, "nodes": n_nodes, "pods": sum((await real.pods_by_job()).values()),
                    "nodes_registered_s": real.register_s, "nodes_untainted_s": real.untaint_s,
                    "lease_renewals": real.kubelet.renewals,
                    "operator_start_to_first_job_pods_s": start_to_ready_s,
                    "last_job_create_to_all_pods_s": complete[last] - created[last],
                    "first_create_to_all_pods_s": wall_s,
                    "create_to_all_pods_median_s": statistics.median(per_job),
                    "create_to_all_pods_max_s": per_job[-1],
                    "operator_peak_rss_mib": peak_rss_mib(proc.pid), "operator_cpu_s": cpu_op,
                    "operator_cpu_share_of_wall": cpu_op / wall_s,
                    "kube_apiserver_cpu_s": cpu.get("kube-apiserver", float("nan")),
                    "etcd_cpu_s": cpu.get("etcd", float("nan")),
                    "kube_scheduler_cpu_s": cpu.get("kube-scheduler", float("nan")),
                    "kube_controller_manager_cpu_s": cpu.get("kube-controller-manager", float("nan")),
                    "bench_process_cpu_s": time.process_time() - cpu_self0}
        finally:
            await stop(proc)
    return {**result, **from_log(log_path, started_unix, n_nodes, [k for k in created])}


def _unix(line: str) -> float:
    """The unix time of an operator log line (``%Y-%m-%d %H:%M:%S,%f``, its local time = UTC here)."""
    when = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return when.replace(tzinfo=datetime.timezone.utc).timestamp()


def from_log(log: Path, started_unix: float, n_nodes: int, jobs: list[tuple[str, str]]) -> dict[str, Any]:
    """What the operator's log says (issue 32, item 9).

    ``operator_start_to_every_node_usable_s``: from the operator's process start to the earliest
    line saying all ``n_nodes`` nodes are usable: its informer's "nodes synced" line or a plan "over
    N usable node(s)"; ``inf`` when none does.  ``plans_per_job``: the "planned over" lines of the
    scale jobs (placements and unschedulable answers alike) per job; ``max_plans_of_a_job``.
    """
    every: list[float] = []
    synced: dict[str, Any] = {}
    plans: dict[tuple[str, str], int] = {}
    fewest = None
    wanted = set(jobs)
    for line in log.read_text(errors="replace").splitlines():
        m = SYNCED.search(line)
        if m:
            synced = {"listed": int(m.group(1)), "usable": int(m.group(2)), "after_start_s": _unix(line) - started_unix}
            if int(m.group(2)) >= n_nodes:
                every.append(_unix(line))
            continue
        m = PLANNED.search(line)
        if m:
            usable = int(m.group(3))
            if usable >= n_nodes:
                every.append(_unix(line))
            key = (m.group(1), m.group(2))
            if key in wanted:
                plans[key] = plans.get(key, 0) + 1
                fewest = usable if fewest is None else min(fewest, usable)
    counts = [plans.get(k, 0) for k in jobs]
    return {"operator_start_to_every_node_usable_s": (min(every) - started_unix) if every else float("inf"),
            "operator_synced_line": synced,
            "plans_per_job": sum(counts) / len(jobs), "max_plans_of_a_job": max(counts),
            "fewest_usable_nodes_in_a_plan": fewest}
