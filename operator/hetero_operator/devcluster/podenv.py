"""Pure helpers of the local kubelet: a container's environment, its pod's status objects.

Pod networking is simulated as in the stand-in ``tests/k8s/kubelet.py``: every pod's IP is
127.0.0.1, so a cluster DNS name of the pod's namespace (``<host>.<subdomain>.<ns>.svc``, with or
without ``.cluster.local``, as in ``MASTER_ADDR``) is rewritten to ``127.0.0.1``, and the ports
that several pods of one machine would all bind (``MASTER_PORT`` per job attempt,
``HTJ_METRICS_PORT`` .. ``+LOCAL_WORLD_SIZE-1`` per pod, ``HTJ_HEALTH_PORT``) are remapped to free
ones by the caller (``ports``), like a port-forward.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Mapping
from typing import Any

POD_IP = "127.0.0.1"
KUBELET_VERSION = "v1.35.4"
REMAPPED = ("MASTER_PORT", "HTJ_METRICS_PORT", "HTJ_HEALTH_PORT")
"""Env variables holding a port that the caller remaps per pod (or per job attempt)."""
STORE_AT_MASTER_PORT = "HTJ_ELASTIC_STORE"
"""``host:port`` of an elastic job's membership keeper, which listens on the job's ``MASTER_PORT``:
its port is remapped as that attempt's ``MASTER_PORT`` (the keeper pod's own ``MASTER_PORT``)."""


def now() -> str:
    """RFC 3339 UTC, seconds (as Kubernetes writes times)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def field_value(pod: Mapping[str, Any], path: str) -> str:
    """The downward API's ``fieldRef.fieldPath`` of ``pod`` (status fields as this kubelet
    reports them); ``""`` for an unknown path."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
              "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
              "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
              "status.podIP": POD_IP, "status.podIPs": POD_IP, "status.hostIP": POD_IP,
              "status.hostIPs": POD_IP}
    return str(simple.get(path) or "")


def resolve_dns(value: str, namespace: str) -> str:
    """``value`` with cluster DNS names of ``namespace`` (``a.b.<ns>.svc[.cluster.local]``,
    ``<svc>.<ns>.svc``) replaced by the pod IP 127.0.0.1."""
    pattern = rf"\b[a-z0-9]([-a-z0-9.]*[a-z0-9])?\.{re.escape(namespace)}\.svc(\.cluster\.local)?\b"
    return re.sub(pattern, POD_IP, value)


def container_env(pod: Mapping[str, Any], container: Mapping[str, Any], base: Mapping[str, str], *,
                  lookup: Callable[[str, str, str], str | None],
                  port_for: Callable[[str, int], int]) -> dict[str, str]:
    """The container's environment: ``base``, then its ``env`` in order (``value`` with
    ``$(VAR)`` expansion, ``fieldRef``, ``configMapKeyRef``/``secretKeyRef`` through
    ``lookup(kind, name, key)``), cluster DNS names rewritten, ports of :data:`REMAPPED` replaced
    by ``port_for(name, count)`` (``count`` consecutive ports for ``HTJ_METRICS_PORT``)."""
    ns = (pod.get("metadata") or {}).get("namespace", "default")
    env = dict(base)
    for item in container.get("env") or ():
        name = item["name"]
        if "value" in item:
            env[name] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                               lambda m: env.get(m.group(1), m.group(0)), str(item["value"]))
            continue
        src = item.get("valueFrom") or {}
        if "fieldRef" in src:
            env[name] = field_value(pod, src["fieldRef"]["fieldPath"])
        elif "configMapKeyRef" in src or "secretKeyRef" in src:
            kind = "configmaps" if "configMapKeyRef" in src else "secrets"
            ref = src.get("configMapKeyRef") or src.get("secretKeyRef")
            got = lookup(kind, ref["name"], ref["key"])
            if got is not None:
                env[name] = got
        elif "resourceFieldRef" in src:
            env[name] = "0"  # no cgroup limits here (docs/cluster.md)
    for name in list(env):
        if name in REMAPPED and env[name] not in ("", "0"):
            count = int(env.get("LOCAL_WORLD_SIZE", "1") or 1) if name == "HTJ_METRICS_PORT" else 1
            env[name] = str(port_for(name, count))
        elif name == STORE_AT_MASTER_PORT and ":" in env[name]:
            host, _, _port = env[name].rpartition(":")
            env[name] = f"{resolve_dns(host, ns)}:{port_for('MASTER_PORT', 1)}"
        elif name not in base:
            env[name] = resolve_dns(env[name], ns)
    return env


def node_status(node: Mapping[str, Any]) -> dict[str, Any]:
    """The status this kubelet posts for a Node of a node list: its capacity and allocatable
    (``pods: 110`` added where missing, as a kubelet's default maxPods), conditions
    Ready=True and no pressure, address 127.0.0.1, node info."""
    status = node.get("status") or {}
    capacity = {"pods": "110", **(status.get("capacity") or {})}
    allocatable = {"pods": "110", **(status.get("allocatable") or status.get("capacity") or {})}
    t = now()

    def cond(type_: str, value: str, reason: str, message: str) -> dict[str, str]:
        return {"type": type_, "status": value, "reason": reason, "message": message,
                "lastHeartbeatTime": t, "lastTransitionTime": t}
    return {
        "capacity": capacity, "allocatable": allocatable,
        "conditions": [cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                       cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                       cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                       cond("Ready", "True", "KubeletReady", "heterotrain local kubelet is posting ready status")],
        "addresses": [{"type": "InternalIP", "address": POD_IP},
                      {"type": "Hostname", "address": node["metadata"]["name"]}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
        "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
                     "osImage": "heterotrain local kubelet", "containerRuntimeVersion": "local://0",
                     "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
                     "architecture": "amd64"},
    }


def running_status(pod: Mapping[str, Any], started: Mapping[str, str], restarts: Mapping[str, int]) -> dict[str, Any]:
    """``status`` of a pod whose containers run (``started``: container name -> start time)."""
    t = now()
    return {
        "phase": "Running", "podIP": POD_IP, "podIPs": [{"ip": POD_IP}], "hostIP": POD_IP,
        "hostIPs": [{"ip": POD_IP}], "startTime": min(started.values(), default=t),
        "conditions": [_cond(c, "True", t) for c in ("PodReadyToStartContainers", "Initialized", "Ready",
                                                        "ContainersReady", "PodScheduled")],
        "containerStatuses": [
            {"name": c["name"], "image": c.get("image", ""), "imageID": "", "containerID": f"local://{c['name']}",
             "ready": True, "started": True, "restartCount": restarts.get(c["name"], 0),
             "state": {"running": {"startedAt": started.get(c["name"], t)}}}
            for c in pod["spec"]["containers"]],
    }


def terminated_status(pod: Mapping[str, Any], exits: Mapping[str, int], started: Mapping[str, str],
                      restarts: Mapping[str, int],
                      messages: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``status`` of a pod whose containers all ended: ``Succeeded`` when every exit code is 0,
    else ``Failed``; ``exits`` maps container name -> exit code (128 + signal when killed);
    ``messages`` maps container name -> its termination message (:func:`termination_message`)."""
    t = now()
    ok = all(code == 0 for code in exits.values())
    reason = "PodCompleted" if ok else "PodFailed"
    statuses = []
    for c in pod["spec"]["containers"]:
        code = exits.get(c["name"], 137)
        statuses.append({
            "name": c["name"], "image": c.get("image", ""), "imageID": "", "containerID": f"local://{c['name']}",
            "ready": False, "started": False, "restartCount": restarts.get(c["name"], 0),
            "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                     "startedAt": started.get(c["name"], t), "finishedAt": t,
                                     **({"message": (messages or {})[c["name"]]}
                                        if (messages or {}).get(c["name"]) else {})}}})
    conds = [_cond("PodReadyToStartContainers", "False", t), _cond("Initialized", "True", t),
             _cond("Ready", "False", t, reason), _cond("ContainersReady", "False", t, reason),
             _cond("PodScheduled", "True", t)]
    return {"phase": "Succeeded" if ok else "Failed", "podIP": POD_IP, "podIPs": [{"ip": POD_IP}],
            "hostIP": POD_IP, "hostIPs": [{"ip": POD_IP}], "conditions": conds, "containerStatuses": statuses}


class StartFailed(Exception):
    """A container whose process could not be started (its command or its working directory does
    not exist, ...): what a runtime reports as ``RunContainerError`` / ``StartError``."""

    def __init__(self, container: str, message: str) -> None:
        super().__init__(message)
        self.container = container


START_FAILED_EXIT_CODE = 128
"""The exit code a runtime gives a container it could not start (``StartError``)."""


def start_failed_status(pod: Mapping[str, Any], container: str, message: str) -> dict[str, Any]:
    """``status`` of a pod whose container ``container`` could not be started (its siblings are
    killed, nothing is retried): with ``restartPolicy: Never`` the pod ``Failed``, the container
    terminated with reason ``StartError``, exit code 128 and ``message``; else the pod ``Pending``,
    the container waiting with reason ``RunContainerError`` and ``message`` (a real kubelet would
    retry into ``CrashLoopBackOff``), the others waiting in ``ContainerCreating``."""
    if pod["spec"].get("restartPolicy", "Always") == "Never":
        exits = {c["name"]: START_FAILED_EXIT_CODE if c["name"] == container else 137 for c in pod["spec"]["containers"]}
        status = terminated_status(pod, exits, {}, {}, {container: message})
        for cs in status["containerStatuses"]:
            if cs["name"] == container:
                cs["state"]["terminated"]["reason"] = "StartError"
        return status
    return {"phase": "Pending", "hostIP": POD_IP, "hostIPs": [{"ip": POD_IP}],
            "containerStatuses": [
                {"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False, "started": False,
                 "restartCount": 0, "state": {"waiting": {"reason": "RunContainerError", "message": message}
                                              if c["name"] == container else {"reason": "ContainerCreating"}}}
                for c in pod["spec"]["containers"]]}


def warning_event(pod: Mapping[str, Any], reason: str, message: str, now: str) -> dict[str, Any]:
    """A Warning Event of this kubelet on ``pod`` (``FailedMount``, ``Failed``, ...)."""
    meta = pod["metadata"]
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "reason": reason, "type": "Warning", "message": message,
            "source": {"component": "kubelet", "host": (pod.get("spec") or {}).get("nodeName", "")},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1}


MESSAGE_MAX_BYTES = 4096
"""A termination message is cut to this many bytes (the kubelet's limit per container)."""
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048
"""``FallbackToLogsOnError``: the last 80 lines or 2048 bytes of the log, whichever is smaller."""


def termination_message(container: Mapping[str, Any], exit_code: int, file_text: str,
                        log_text: str) -> str:
    """What the kubelet puts in ``state.terminated.message``: the file at
    ``terminationMessagePath`` (cut to 4096 bytes); when it is empty, the container failed and its
    ``terminationMessagePolicy`` is ``FallbackToLogsOnError``, the tail of its log
    (https://kubernetes.io/docs/tasks/debug/debug-application/determine-reason-pod-failure/)."""
    if file_text:
        return file_text.encode()[:MESSAGE_MAX_BYTES].decode(errors="ignore")
    if exit_code == 0 or container.get("terminationMessagePolicy") != "FallbackToLogsOnError":
        return ""
    tail = "\n".join(log_text.splitlines()[-FALLBACK_LOG_LINES:])
    return tail.encode()[-FALLBACK_LOG_BYTES:].decode(errors="ignore")


def _cond(type_: str, value: str, t: str, reason: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type_, "status": value, "lastTransitionTime": t, "lastProbeTime": None}
    if reason:
        out["reason"] = reason
    return out
