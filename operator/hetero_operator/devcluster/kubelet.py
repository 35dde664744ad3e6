"""The local kubelet: the node agent of ``heterotrain cluster up`` against the REAL API server.

For each Node of a NodeList file it registers the Node (labels, taints, capacity and allocatable,
``Ready=True``) and keeps its Lease in ``kube-node-lease`` renewed (:mod:`.nodeleases`), watches
the pods bound to its nodes (the real kube-scheduler binds them) and runs each container's
``command + args`` as a local process group (cwd: the checkout, or the container's ``workingDir``
mapped through its volumes; ``PATH`` starts with the project's .venv; a process that cannot be
started makes a ``Failed`` Warning Event and a ``RunContainerError``/``StartError`` status), with the pod's env (downward-API ``fieldRef``, ConfigMap/Secret keys; cluster
DNS names -> 127.0.0.1 and per-pod ports remapped: :mod:`.podenv`; in the args also Service
addresses -> the endpoint's real port: :mod:`.services`), its volumes as folders under the cluster
dir with paths under a ``mountPath`` rewritten (:mod:`.volumes`, which also provisions PVCs; a
hostPath is refused with a ``FailedMount`` Event), an ``httpGet`` readiness probe polled before the
pod is ``Ready`` (:mod:`.probes`).  It reports status as a
kubelet does (``Running`` with ``containerStatuses``, then ``Succeeded``/``Failed`` with exit
codes; ``restartPolicy: Always/OnFailure`` restarts with ``restartCount``) and honours graceful
deletion: SIGTERM, SIGKILL after the pod's grace, terminal status, then
``DELETE gracePeriodSeconds=0`` with the pod's uid as precondition.

Pods that talk to the API server (``automountServiceAccountToken`` not false) get a kubeconfig
with a TokenRequest token of their service account in ``$KUBECONFIG`` (:mod:`.podtoken`; no projected volume:
docs/cluster.md lists every difference from a real kubelet).  The real ports behind remapped
ones are written to the pod annotation :data:`~hetero_operator.api.labels.ANNOTATION_LOCAL_PORTS` (JSON).

With ``tls`` it serves the kubelet's log endpoint (``kubectl logs``: :mod:`.kubeletlogs`) and
posts its port in each Node's ``daemonEndpoints``.

With ``run_pods=False`` it only registers and heartbeats (2,000 nodes from one process for the
benchmark).  :meth:`LocalKubelet.stop_heartbeat` is a dead kubelet (its processes die, nothing
is reported any more: the node lifecycle controller turns the node ``Ready=Unknown``).

Run it: ``python -m hetero_operator.devcluster.kubelet --kubeconfig K --nodes FILE --dir DIR
[--tls-cert-file C --tls-private-key-file K --client-ca-file CA]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hetero_operator.api.labels import (ANNOTATION_LOCAL_NAMED_PORTS, ANNOTATION_LOCAL_PORTS, LABEL_ATTEMPT,
                                        LABEL_JOB)
from heterotrain_common.termination import TERMINATION_LOG_ENV

from . import podenv, podtoken, probes, services, volumes
from .controlplane import free_port_range, free_ports
from .kubeapi import Api, ApiError
from .kubeletlogs import KubeletTls, LogServer, LogSource
from .nodeleases import NodeLeases

REPO = Path(__file__).resolve().parents[3]
PORTS_ANNOTATION = ANNOTATION_LOCAL_PORTS


def load_nodes(path: Path) -> list[dict[str, Any]]:
    """The Node objects of a NodeList (or a single Node) YAML file."""
    doc = yaml.safe_load(path.read_text())
    return list(doc["items"]) if doc.get("kind", "NodeList").endswith("List") else [doc]


class _Pod:
    def __init__(self, pod: Mapping[str, Any]) -> None:
        self.pod = dict(pod)
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.started: dict[str, str] = {}
        self.restarts: dict[str, int] = {}
        self.exits: dict[str, int] = {}
        self.log_start: dict[str, int] = {}
        self.mounts: dict[str, list[volumes.Mount]] = {}
        self.terminating = False
        self.done = False


class LocalKubelet:
    """Registers ``nodes`` and runs their pods.

    Args:
        api: an open :class:`~.kubeapi.Api`.
        nodes: Node objects (a NodeList's items).
        pod_dir: logs (``<ns>_<pod>.log``), pid files and pod kubeconfigs go here.
        lease_s: the Lease's ``leaseDurationSeconds``.
        renew_s: seconds between renewals of every lease (spread over the interval).
        run_pods: watch and run pods (False: nodes and leases only).
        python_bin: the dir put first on the pods' ``PATH`` (default: this interpreter's).
        tls: serve the kubelet's log endpoint with it (``kubectl logs``, :mod:`.kubeletlogs`),
            its port in every Node's ``daemonEndpoints``; None serves nothing.
        cluster_dir: the only place volumes may live (:mod:`.volumes`; default ``pod_dir``'s parent).
    """

    def __init__(self, api: Api, nodes: list[Mapping[str, Any]], *, pod_dir: Path, lease_s: int = 40,
                 renew_s: float = 10.0, run_pods: bool = True, python_bin: Path | None = None,
                 tls: KubeletTls | None = None, cluster_dir: Path | None = None) -> None:
        self.api, self.nodes = api, {n["metadata"]["name"]: n for n in nodes}
        self.cluster_dir = (cluster_dir or pod_dir.parent).resolve()  # volumes live only under it
        self.pod_dir, self.lease_s, self.renew_s, self.run_pods = pod_dir, lease_s, renew_s, run_pods
        self.python_bin = python_bin or Path(sys.executable).parent
        self.pods: dict[tuple[str, str], _Pod] = {}
        self.master_ports: dict[tuple[str, str, str], int] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.registered = asyncio.Event()
        self.log_server = LogServer(tls, LogSource(log_path=self._log_path, has_container=self._has_container,
                                                   running=self._running)) if tls and run_pods else None
        self.leases = NodeLeases(api, self.nodes, lease_s=lease_s, renew_s=renew_s,
                                 log_port=lambda: self.log_server.port if self.log_server is not None else 0)
        self.dead = self.leases.dead  # the nodes whose kubelet died (the leases' own set)

    # --- lifecycle ------------------------------------------------------------------------

    async def run(self) -> None:
        """Register every node, then heartbeat and run pods until cancelled."""
        self.pod_dir.mkdir(parents=True, exist_ok=True)
        if self.log_server is not None:
            await self.log_server.start()
        await self.leases.register_all()
        self.registered.set()
        workers = [self._spawn(self.leases.heartbeat())]
        if self.run_pods:
            workers += [self._spawn(self._watch()), self._spawn(self._handle_loop()),
                        self._spawn(volumes.provision(self.api, volumes.volume_root(self.cluster_dir)))]
        try:
            await asyncio.gather(*workers)
        finally:
            await self.shutdown()

    async def shutdown(self) -> None:
        """Kill every pod process (SIGTERM, SIGKILL after 2 s), report nothing: a kubelet stopping."""
        for task in list(self._tasks):  # first: no pod task starts a process after the snapshot
            task.cancel()
        procs = [proc for state in list(self.pods.values()) for proc in list(state.procs.values())]
        for proc in procs:
            _killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 2
        for proc in procs:  # awaited: the pod tables may change meanwhile, the snapshot does not
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), max(0.01, deadline - time.monotonic()))
            _killpg(proc.pid, signal.SIGKILL)
        if self.log_server is not None:
            await self.log_server.stop()

    @property
    def renewals(self) -> int:
        """Lease renewals so far (the node side's count)."""
        return self.leases.renewals

    # --- node faults (tests) --------------------------------------------------------------

    def stop_heartbeat(self, name: str) -> None:
        """The node's machine dies: its pods' processes are killed, its lease is no longer
        renewed and nothing about its pods is reported any more."""
        self.dead.add(name)
        for state in self.pods.values():
            if (state.pod.get("spec") or {}).get("nodeName") == name:
                for proc in state.procs.values():
                    _killpg(proc.pid, signal.SIGKILL)
                state.done = True

    async def revive(self, name: str) -> None:
        """A new kubelet on the node: it posts Ready again and renews the lease."""
        await self.leases.revive(name)

    async def revive_registered(self, name: str) -> None:
        """A new kubelet on a node whose Node object was deleted: it registers the Node again."""
        await self.leases.revive_registered(name)

    # --- pods ------------------------------------------------------------------------------

    async def _watch(self) -> None:
        async for type_, pod in self.api.watch("/api/v1/pods", {"fieldSelector": "spec.nodeName!="}):
            if type_ != "SYNC" and (pod.get("spec") or {}).get("nodeName") in self.nodes:
                self._queue.put_nowait((type_, pod))

    async def _handle_loop(self) -> None:
        while True:
            type_, pod = await self._queue.get()
            try:
                await self._handle(type_, pod)
            except Exception as exc:  # noqa: BLE001 - a node agent reports and goes on
                print(f"kubelet: {type_} {pod['metadata'].get('name')}: {exc!r}", file=sys.stderr, flush=True)

    async def _handle(self, type_: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        state = self.pods.get(key)
        if state is not None and state.pod["metadata"]["uid"] != meta["uid"]:
            state = None  # a new pod of the same name
        if pod["spec"]["nodeName"] in self.dead:
            return
        if type_ == "DELETED":
            if state is not None:
                for proc in state.procs.values():
                    _killpg(proc.pid, signal.SIGKILL)
                self.pods.pop(key, None)
            volumes.remove_pod_folder(self.pod_dir, pod)
            return
        if meta.get("deletionTimestamp"):
            if state is None or not state.terminating:
                state = state or self._adopt(key, pod)
                state.terminating = True
                self._spawn(self._terminate(key, state, pod))
            return
        if state is not None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        state = self._adopt(key, pod)
        await self._start(key, state)

    def _adopt(self, key: tuple[str, str], pod: Mapping[str, Any]) -> _Pod:
        state = _Pod(pod)
        self.pods[key] = state
        return state

    async def _start(self, key: tuple[str, str], state: _Pod) -> None:
        pod = state.pod
        ports: dict[str, int] = {}
        try:
            for c in pod["spec"]["containers"]:
                state.mounts[c["name"]] = await volumes.prepare(self.api, pod, c, pod_dir=self.pod_dir,
                                                                cluster_dir=self.cluster_dir)
        except volumes.Refused as exc:  # a kubelet whose mount fails: Pending, a Warning Event
            with contextlib.suppress(ApiError):
                await self.api.create(f"/api/v1/namespaces/{key[0]}/events",
                                      volumes.refused_event(pod, str(exc), podenv.now()))
            await self._status(key, volumes.refused_status(pod, str(exc)))
            return
        kubeconfig = await podtoken.pod_kubeconfig(self.api, self.pod_dir, key, pod)
        try:
            for c in pod["spec"]["containers"]:
                await self._start_container(key, state, c, ports, kubeconfig)
        except podenv.StartFailed as exc:
            return await self._start_failed(key, state, exc)
        if ports:
            with contextlib.suppress(ApiError):
                named = {p["name"]: ports[str(p["containerPort"])] for c in pod["spec"]["containers"]
                         for p in c.get("ports") or () if p.get("name") and str(p.get("containerPort")) in ports}
                await self.api.patch(f"/api/v1/namespaces/{key[0]}/pods/{key[1]}", {"metadata": {"annotations": {
                    PORTS_ANNOTATION: json.dumps(ports, sort_keys=True),
                    ANNOTATION_LOCAL_NAMED_PORTS: json.dumps(named, sort_keys=True)}}})
        urls = {c["name"]: url for c in pod["spec"]["containers"] if (url := probes.readiness_url(c, ports))}
        running = podenv.running_status(pod, state.started, state.restarts)
        await self._status(key, probes.not_ready(running, set(urls)) if urls else running)
        if urls:
            self._spawn(self._probe(key, state, urls))

    async def _probe(self, key: tuple[str, str], state: _Pod, urls: dict[str, str]) -> None:
        """Report the pod ready once every readiness probe answers (:mod:`.probes`)."""
        period = {c["name"]: float((c.get("readinessProbe") or {}).get("periodSeconds", 1))
                  for c in state.pod["spec"]["containers"]}
        for name, url in urls.items():
            if not await probes.wait_ready(url, period[name], lambda: state.done or state.terminating):
                return
        await self._status(key, podenv.running_status(state.pod, state.started, state.restarts))

    async def _start_container(self, key: tuple[str, str], state: _Pod, c: Mapping[str, Any],
                               ports: dict[str, int], kubeconfig: Path | None) -> None:
        pod = state.pod
        labels = pod["metadata"].get("labels") or {}
        job_key = (key[0], labels.get(LABEL_JOB, key[1]), labels.get(LABEL_ATTEMPT, "0"))
        base = {k: os.environ[k] for k in ("HOME", "LANG", "TMPDIR", "USER", "XDG_CACHE_HOME",
                                           "HETEROTRAIN_CACHE_DIR") if k in os.environ}
        base.update(PATH=f"{self.python_bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
                    HOSTNAME=pod["spec"].get("hostname") or key[1], OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                    PYTHONUNBUFFERED="1")
        if kubeconfig is not None:
            base["KUBECONFIG"] = str(kubeconfig)
        secrets_cache: dict[tuple[str, str], dict[str, str]] = {}

        def port_for(name: str, count: int) -> int:
            original = int(_env_value(c, name) or 0)
            if name == "MASTER_PORT":
                if job_key not in self.master_ports:
                    self.master_ports[job_key] = free_ports(1)[0]
                port = self.master_ports[job_key]
            else:
                port = free_port_range(count)
            for i in range(count):
                ports[str(original + i)] = port + i
            return port

        env = podenv.container_env(pod, c, base, lookup=lambda kind, name, k: secrets_cache.get((kind, name), {}).get(k),
                                   port_for=port_for)
        for item in c.get("env") or ():  # ConfigMap / Secret keys (fetched only when asked for)
            ref = (item.get("valueFrom") or {})
            for kind, field in (("configmaps", "configMapKeyRef"), ("secrets", "secretKeyRef")):
                if field in ref:
                    obj = await self.api.get(f"/api/v1/namespaces/{key[0]}/{kind}/{ref[field]['name']}")
                    data = obj.get("data") or {}
                    if kind == "secrets":
                        data = {k: base64.b64decode(v).decode() for k, v in data.items()}
                    env[item["name"]] = data.get(ref[field]["key"], "")
        mounts = state.mounts.get(c["name"], [])  # mountPath -> the volume's folder (.volumes)
        env.update({k: volumes.rewrite(v, mounts) for k, v in env.items() if k not in base})
        argv = [podenv.resolve_dns(await services.resolve(self.api, volumes.rewrite(str(a), mounts)), key[0])
                for a in [*(c.get("command") or []), *(c.get("args") or [])]]  # Service addresses: .services
        if not argv:
            argv = ["sleep", "infinity"]  # an image's entrypoint cannot be known here
        term = self._termination_file(key, c["name"])  # the container's terminationMessagePath
        term.write_text("")
        env[TERMINATION_LOG_ENV] = str(term)
        log_path = self.pod_dir / f"{key[0]}_{key[1]}.log"
        with open(log_path, "ab") as log:
            log.write(f"--- {key[1]}/{c['name']} on {pod['spec']['nodeName']} ---\n".encode())
            log.flush()
            state.log_start[c["name"]] = log.tell()  # this run's part of the log starts here
            cwd = volumes.working_dir(c, mounts, REPO)
            try:
                proc = await asyncio.create_subprocess_exec(*argv, env=env, cwd=cwd, stdout=log,
                                                            stderr=asyncio.subprocess.STDOUT,
                                                            stdin=asyncio.subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:  # a runtime's RunContainerError: the pod's status and an Event say it
                raise podenv.StartFailed(c["name"], f"failed to start container {c['name']!r} ({argv[0]!r} "
                                         f"in {cwd!r}): {exc.strerror or exc}") from exc
        (self.pod_dir / f"{key[0]}_{key[1]}_{c['name']}.pid").write_text(str(proc.pid))
        state.procs[c["name"]] = proc
        state.started[c["name"]] = podenv.now()
        self._spawn(self._reap(key, state, c, proc, ports, kubeconfig))

    async def _reap(self, key: tuple[str, str], state: _Pod, c: Mapping[str, Any],
                    proc: asyncio.subprocess.Process, ports: dict[str, int], kubeconfig: Path | None) -> None:
        code = await proc.wait()
        (self.pod_dir / f"{key[0]}_{key[1]}_{c['name']}.pid").unlink(missing_ok=True)
        if state.done or state.terminating or self.pods.get(key) is not state:
            state.exits[c["name"]] = code if code >= 0 else 128 - code
            return
        exit_code = code if code >= 0 else 128 - code
        policy = state.pod["spec"].get("restartPolicy", "Always")
        if policy == "Always" or (policy == "OnFailure" and exit_code != 0):
            state.restarts[c["name"]] = state.restarts.get(c["name"], 0) + 1
            await asyncio.sleep(min(10.0, 0.5 * 2 ** state.restarts[c["name"]]))  # crash-loop back-off
            if not (state.done or state.terminating):
                try:
                    await self._start_container(key, state, c, ports, kubeconfig)
                except podenv.StartFailed as exc:
                    return await self._start_failed(key, state, exc)
                await self._status(key, podenv.running_status(state.pod, state.started, state.restarts))
            return
        state.procs.pop(c["name"], None)
        state.exits[c["name"]] = exit_code
        if not state.procs:
            state.done = True
            await self._status(key, podenv.terminated_status(state.pod, state.exits, state.started, state.restarts,
                                                             self._messages(key, state)))

    async def _start_failed(self, key: tuple[str, str], state: _Pod, exc: podenv.StartFailed) -> None:
        """A container that could not start: its siblings killed, a Warning Event ``Failed`` and
        the pod's status (:func:`podenv.start_failed_status`); not retried."""
        for proc in state.procs.values():
            _killpg(proc.pid, signal.SIGKILL)
        state.done = True
        with contextlib.suppress(ApiError):
            await self.api.create(f"/api/v1/namespaces/{key[0]}/events",
                                  podenv.warning_event(state.pod, "Failed", str(exc), podenv.now()))
        await self._status(key, podenv.start_failed_status(state.pod, exc.container, str(exc)))

    async def _terminate(self, key: tuple[str, str], state: _Pod, pod: Mapping[str, Any]) -> None:
        """Graceful deletion: SIGTERM, SIGKILL after the grace, terminal status, then the final
        ``DELETE gracePeriodSeconds=0`` (uid precondition)."""
        grace = pod["metadata"].get("deletionGracePeriodSeconds")
        grace = float(pod["spec"].get("terminationGracePeriodSeconds", 30) if grace is None else grace)
        procs = list(state.procs.values())
        for proc in procs:
            _killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), max(0.01, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                _killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
            code = proc.returncode or 0
            name = next(n for n, p in state.procs.items() if p is proc)
            state.exits[name] = code if code >= 0 else 128 - code
        state.done = True
        ns, name = key
        if procs and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            with contextlib.suppress(ApiError):
                await self._status(key, podenv.terminated_status(pod, state.exits, state.started, state.restarts))
        with contextlib.suppress(ApiError):
            await self.api.delete(f"/api/v1/namespaces/{ns}/pods/{name}",
                                  {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                                   "preconditions": {"uid": pod["metadata"]["uid"]}})
        if self.pods.get(key) is state:
            self.pods.pop(key, None)
        volumes.remove_pod_folder(self.pod_dir, pod)

    async def _status(self, key: tuple[str, str], status: Mapping[str, Any]) -> None:
        if key in self.pods and (self.pods[key].pod["spec"]["nodeName"] in self.dead):
            return
        with contextlib.suppress(ApiError):
            await self.api.patch(f"/api/v1/namespaces/{key[0]}/pods/{key[1]}/status", {"status": dict(status)})

    def log(self, namespace: str, name: str) -> str:
        path = self.pod_dir / f"{namespace}_{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # --- the log endpoint's questions (kubeletlogs.LogSource) -------------------------------

    def _termination_file(self, key: tuple[str, str], container: str) -> Path:
        """The file a container's termination message is written to (``HTJ_TERMINATION_LOG``:
        the process runs on the host, where ``/dev/termination-log`` cannot be its own)."""
        return self.pod_dir / f"{key[0]}_{key[1]}_{container}.termination-log"

    def _messages(self, key: tuple[str, str], state: _Pod) -> dict[str, str]:
        """Every ended container's termination message (:func:`podenv.termination_message`; the
        log tail is this run's part of the pod's log)."""
        log_path = self.pod_dir / f"{key[0]}_{key[1]}.log"
        out = {}
        for c in state.pod["spec"]["containers"]:
            if c["name"] not in state.exits:
                continue
            term = self._termination_file(key, c["name"])
            file_text = term.read_text(errors="replace") if term.exists() else ""
            log_text = ""
            if log_path.exists():
                with open(log_path, "rb") as f:
                    f.seek(state.log_start.get(c["name"], 0))
                    log_text = f.read().decode(errors="replace")
            out[c["name"]] = podenv.termination_message(c, state.exits[c["name"]], file_text, log_text)
        return out

    def _log_path(self, namespace: str, name: str) -> Path | None:
        path = self.pod_dir / f"{namespace}_{name}.log"
        return path if (namespace, name) in self.pods or path.exists() else None

    def _has_container(self, namespace: str, name: str, container: str) -> bool:
        state = self.pods.get((namespace, name))
        return state is None or container in {c["name"] for c in state.pod["spec"]["containers"]}

    def _running(self, namespace: str, name: str, container: str) -> bool:
        state = self.pods.get((namespace, name))
        proc = state.procs.get(container) if state is not None and not state.done else None
        return proc is not None and proc.returncode is None

    def metrics_url(self, pod: Mapping[str, Any], port: int) -> str | None:
        """Where the pod's container port ``port`` really is (the operator's metrics reader)."""
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        real = json.loads(ann.get(PORTS_ANNOTATION, "{}")).get(str(port))
        return f"http://127.0.0.1:{real}/metrics" if real else None

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _env_value(c: Mapping[str, Any], name: str) -> str | None:
    return next((str(e.get("value")) for e in c.get("env") or () if e.get("name") == name), None)


def _killpg(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _main(args: argparse.Namespace) -> int:
    nodes = load_nodes(Path(args.nodes))
    async with Api.from_kubeconfig(Path(args.kubeconfig)) as api:
        tls = KubeletTls(cert=Path(args.tls_cert_file), key=Path(args.tls_private_key_file),
                         client_ca=Path(args.client_ca_file)) if args.tls_cert_file else None
        kubelet = LocalKubelet(api, nodes, pod_dir=Path(args.dir), lease_s=args.lease_s, renew_s=args.renew_s,
                               run_pods=not args.no_pods, tls=tls)
        task = asyncio.ensure_future(kubelet.run())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await kubelet.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m hetero_operator.devcluster.kubelet``: run until SIGTERM."""
    p = argparse.ArgumentParser(prog="hetero_operator.devcluster.kubelet", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--nodes", required=True, help="NodeList YAML file")
    p.add_argument("--dir", required=True, help="pod logs, pid files, pod kubeconfigs")
    p.add_argument("--lease-s", type=int, default=40, help="leaseDurationSeconds (default 40)")
    p.add_argument("--renew-s", type=float, default=10.0, help="seconds between lease renewals (default 10)")
    p.add_argument("--no-pods", action="store_true", help="register and heartbeat only")
    p.add_argument("--tls-cert-file", help="serve the log endpoint (kubectl logs) with this certificate")
    p.add_argument("--tls-private-key-file", help="... and this key")
    p.add_argument("--client-ca-file", help="... taking client certificates of this CA only")
    return asyncio.run(_main(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
