"""A local "kubelet" (and scheduler) for the fake API server: pods become local processes.

For every created pod it binds the pod to the node of its required node affinity (when that
Node object exists; otherwise the pod stays Pending, as on a full cluster), starts the
container's ``command + args`` as a local process group with the pod's env, and reports the
phases back through the API server (``Pending`` -> ``Running`` -> ``Succeeded``/``Failed`` with
container exit codes).  Pod networking is simulated: every pod's IP is 127.0.0.1, so the
Service name in ``MASTER_ADDR`` is rewritten to 127.0.0.1 and ports are remapped to free ones
(``MASTER_PORT`` per job attempt, ``HTJ_METRICS_PORT`` per pod), like a port-forward;
:meth:`LocalKubelet.metrics_url` tells the operator where rank 0's metrics really are.
Deleting a pod sends SIGTERM (SIGKILL after a grace period) and then removes it.

Node faults: :meth:`LocalKubelet.kill_node` is a node whose machine died (its pods' processes
end, but nobody reports it: the pods keep saying Running, and a deletion there never completes);
:meth:`LocalKubelet.shutdown_node` is the kubelet's graceful node shutdown (pods stopped and
marked ``Failed`` with reason ``Terminated`` and a ``DisruptionTarget`` condition, then the node
turns NotReady).  The scheduler part leaves pods Pending on a dead node or one tainted
unreachable/not-ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hetero_operator.devcluster.controlplane import free_port_range as free_port

from .fakeapi import FakeApiServer, now_iso

PODS = ("", "v1", "pods")
UNHEALTHY_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready",
                    "node.kubernetes.io/out-of-service")
NODES = ("", "v1", "nodes")
REPO = Path(__file__).resolve().parents[2]


class LocalKubelet:
    """Runs the pods of a :class:`FakeApiServer` as local processes.

    Args:
        api: the fake API server (its ``graceful_pods`` is turned on).
        log_dir: where each pod's output goes (``<namespace>_<pod>.log``).
        grace_s: SIGTERM -> SIGKILL delay on deletion.
    """

    def __init__(self, api: FakeApiServer, *, log_dir: Path, grace_s: float = 3.0) -> None:
        self.api, self.log_dir, self.grace_s = api, log_dir, grace_s
        api.graceful_pods = True
        api.listeners.append(self._on_event)
        self.procs: dict[tuple[str, str], asyncio.subprocess.Process] = {}
        self.metrics_ports: dict[tuple[str, str], int] = {}
        self.master_ports: dict[tuple[str, str, str], int] = {}
        self.started: list[tuple[str, str]] = []
        self.dead_nodes: set[str] = set()
        self.pod_nodes: dict[tuple[str, str], str] = {}
        self._queue: asyncio.Queue = asyncio.Queue()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._runner: asyncio.Task[Any] | None = None

    async def __aenter__(self) -> LocalKubelet:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._runner = asyncio.create_task(self._loop())
        for pod in self.api.objects(PODS):
            self._queue.put_nowait(("ADDED", pod))
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.api.listeners.remove(self._on_event)
        if self._runner:
            self._runner.cancel()
        for proc in list(self.procs.values()):
            _killpg(proc, signal.SIGKILL)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- test helpers -----------------------------------------------------------------------

    def metrics_url(self, pod: Mapping[str, Any], _port: int) -> str | None:
        """Where the pod's local rank 0 really serves metrics (for the operator's reader)."""
        meta = pod.get("metadata") or {}
        port = self.metrics_ports.get((meta.get("namespace"), meta.get("name")))
        return f"http://127.0.0.1:{port}/metrics" if port else None

    def kill(self, namespace: str, name: str, sig: int = signal.SIGKILL) -> None:
        """Kill the pod's processes (a crashing rank)."""
        _killpg(self.procs[(namespace, name)], sig)

    def kill_node(self, node: str) -> None:
        """The node's machine dies: its pods' processes end and nothing reports it any more."""
        self.dead_nodes.add(node)
        for key, on in list(self.pod_nodes.items()):
            proc = self.procs.pop(key, None) if on == node else None
            if proc is not None:
                _killpg(proc, signal.SIGKILL)

    def revive_node(self, node: str) -> None:
        """A new kubelet on ``node`` (its old pods are gone with the old machine)."""
        self.dead_nodes.discard(node)

    async def shutdown_node(self, node: str) -> None:
        """Graceful node shutdown, as the kubelet's shutdown manager does it (Kubernetes 1.26+):
        every pod gets a ``DisruptionTarget`` condition (``TerminationByKubelet``), its
        processes are stopped, it is marked ``Failed`` with reason ``Terminated``; then the Node
        reports ``Ready=False`` and the kubelet is gone."""
        for key, on in list(self.pod_nodes.items()):
            if on != node:
                continue
            proc = self.procs.pop(key, None)
            if proc is not None:
                _killpg(proc, signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), self.grace_s)
                except asyncio.TimeoutError:
                    _killpg(proc, signal.SIGKILL)
            pod = self.api.get(PODS, *key)
            if pod is None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            conditions = [c for c in (pod.get("status") or {}).get("conditions") or ()
                          if c.get("type") != "DisruptionTarget"]
            conditions.append({"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                               "message": "Pod was terminated in response to imminent node shutdown.",
                               "lastTransitionTime": now_iso()})
            await self.api.patch(PODS, *key, {"status": {
                "phase": "Failed", "reason": "Terminated", "conditions": conditions,
                "message": "Pod was terminated in response to imminent node shutdown."}},
                subresource="status")
        self.dead_nodes.add(node)
        await self.api.patch(NODES, None, node, {"status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
             "message": "node is shutting down", "lastTransitionTime": now_iso(),
             "lastHeartbeatTime": now_iso()}]}}, subresource="status")

    def log(self, namespace: str, name: str) -> str:
        path = self.log_dir / f"{namespace}_{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # --- event handling ---------------------------------------------------------------------

    def _on_event(self, resource: tuple[str, str, str], type_: str, obj: Mapping[str, Any]) -> None:
        if resource == PODS:
            self._queue.put_nowait((type_, obj))
        elif resource == NODES and type_ == "ADDED":
            for pod in self.api.objects(PODS):
                if not pod.get("spec", {}).get("nodeName"):
                    self._queue.put_nowait(("MODIFIED", pod))

    async def _loop(self) -> None:
        while True:
            type_, pod = await self._queue.get()
            try:
                await self._handle(type_, pod)
            except Exception as exc:  # noqa: BLE001 - a test helper: report and go on
                print(f"kubelet: {type_} {pod['metadata'].get('name')}: {exc!r}", file=sys.stderr)

    async def _handle(self, type_: str, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        if type_ == "DELETED":
            proc = self.procs.pop(key, None)
            if proc is not None:
                _killpg(proc, signal.SIGKILL)
            self.pod_nodes.pop(key, None)
            return
        if self.pod_nodes.get(key) in self.dead_nodes:
            return  # nobody on that node reports or finishes anything
        if meta.get("deletionTimestamp"):
            self._spawn(self._terminate(key))
            return
        if key in self.procs or pod.get("spec", {}).get("nodeName") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        node = _required_node(pod)
        if node is None or not self._schedulable(node):
            if not (pod.get("status") or {}).get("phase"):
                await self.api.patch(PODS, *key, {"status": {"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}},
                    subresource="status")
            return
        current = self.api.get(PODS, *key)
        if current is None or current["metadata"].get("deletionTimestamp"):
            return
        pod = await self.api.patch(PODS, *key, {"spec": {"nodeName": node}})
        self.pod_nodes[key] = node
        await self._start(key, pod)

    def _schedulable(self, node: str) -> bool:
        """The Node exists, its kubelet lives, no unreachable/not-ready/out-of-service taint."""
        obj = self.api.get(NODES, None, node)
        if obj is None or node in self.dead_nodes:
            return False
        return not any(t.get("key") in UNHEALTHY_TAINTS for t in (obj.get("spec") or {}).get("taints") or ())

    async def _start(self, key: tuple[str, str], pod: Mapping[str, Any]) -> None:
        container = pod["spec"]["containers"][0]
        env = self._env(key, pod, container)
        argv = [*container.get("command", []), *container.get("args", [])]
        log = open(self.log_dir / f"{key[0]}_{key[1]}.log", "ab")  # every attempt's output kept
        attempt = (pod["metadata"].get("labels") or {}).get("heterotrain.io/attempt", "?")
        log.write(f"--- {key[1]} attempt {attempt} on {pod['spec'].get('nodeName')} ---\n".encode())
        log.flush()
        proc = await asyncio.create_subprocess_exec(*argv, env=env, cwd=str(REPO), stdout=log,
                                                    stderr=asyncio.subprocess.STDOUT,
                                                    start_new_session=True)
        log.close()
        self.procs[key] = proc
        self.started.append(key)
        await self.api.patch(PODS, *key, {"status": {
            "phase": "Running", "podIP": "127.0.0.1", "hostIP": "127.0.0.1", "startTime": now_iso(),
            "containerStatuses": [{"name": container["name"], "ready": True, "restartCount": 0,
                                   "image": container.get("image", ""),
                                   "state": {"running": {"startedAt": now_iso()}}}]}},
            subresource="status")
        self._spawn(self._reap(key, proc, container["name"]))

    def _env(self, key: tuple[str, str], pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
        env = {k: os.environ[k] for k in ("HOME", "LANG", "TMPDIR", "USER") if k in os.environ}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
        env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        for item in container.get("env") or ():
            if "value" in item:
                env[item["name"]] = str(item["value"])
        labels = pod["metadata"].get("labels") or {}
        job_key = (key[0], labels.get("heterotrain.io/job-name", key[1]), labels.get("heterotrain.io/attempt", "0"))
        if "MASTER_ADDR" in env:
            env["MASTER_ADDR"] = "127.0.0.1"
            if job_key not in self.master_ports:
                self.master_ports[job_key] = free_port()
            env["MASTER_PORT"] = str(self.master_ports[job_key])
        if env.get("HTJ_METRICS_PORT", "0") not in ("", "0"):
            port = free_port(int(env.get("LOCAL_WORLD_SIZE", "1")))
            self.metrics_ports[key] = port
            env["HTJ_METRICS_PORT"] = str(port)
        return env

    async def _reap(self, key: tuple[str, str], proc: asyncio.subprocess.Process, name: str) -> None:
        code = await proc.wait()
        if self.procs.get(key) is not proc:
            return
        exit_code = code if code >= 0 else 128 - code
        phase = "Succeeded" if exit_code == 0 else "Failed"
        reason = "Completed" if exit_code == 0 else "Error"
        with contextlib.suppress(Exception):
            await self.api.patch(PODS, *key, {"status": {
                "phase": phase, "containerStatuses": [{"name": name, "ready": False, "restartCount": 0,
                                                       "state": {"terminated": {"exitCode": exit_code, "reason": reason,
                                                                                "finishedAt": now_iso()}}}]}},
                subresource="status")

    async def _terminate(self, key: tuple[str, str]) -> None:
        proc = self.procs.pop(key, None)
        if proc is not None and proc.returncode is None:
            _killpg(proc, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), self.grace_s)
            except asyncio.TimeoutError:
                _killpg(proc, signal.SIGKILL)
                await proc.wait()
        with contextlib.suppress(Exception):
            await self.api.delete(PODS, *key, grace_s=0)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _required_node(pod: Mapping[str, Any]) -> str | None:
    try:
        terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        return terms[0]["matchFields"][0]["values"][0]
    except (KeyError, IndexError, TypeError):
        return (pod.get("spec") or {}).get("nodeName")


def _killpg(proc: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
