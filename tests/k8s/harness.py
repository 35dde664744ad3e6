"""Run the operator in process against the fake API server with the local kubelet (tests, bench).

``async with Cluster(tmp_path) as cluster:`` starts the kmock server, a kubeconfig pointing at it
(``$KUBECONFIG``), the kubelet, and ``cluster.start_operator()`` runs kopf's ``operator()`` as
a task with the registrations of ``hetero_operator.controller.main``.
"""

from __future__ import annotations

import asyncio
import copy
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import kmock
import yaml
from inprocess import OperatorThread

from . import crdcheck
from .fakeapi import CRDS, HTJ, FakeApiServer, kubeconfig, now_iso
from .kubelet import LocalKubelet

REPO = Path(__file__).resolve().parents[2]
PODS = ("", "v1", "pods")
NODES = ("", "v1", "nodes")
SERVICES = ("", "v1", "services")
EVENTS = ("", "v1", "events")


def load_nodes(path: Path = REPO / "examples" / "clusters" / "mixed.yaml") -> list[dict[str, Any]]:
    """Node objects of a NodeList file."""
    return yaml.safe_load(path.read_text())["items"]


class Cluster:
    """A fake cluster: API server, kubelet (optional) and the operator (started on demand)."""

    def __init__(self, workdir: Path, *, kubelet: bool = True, kueue_version: str = "v1beta2") -> None:
        self.workdir = workdir
        self.api = FakeApiServer(kueue_version=kueue_version)
        self.server = kmock.Server(self.api)
        self.kubelet = LocalKubelet(self.api, log_dir=workdir / "pods") if kubelet else None
        self._operator: OperatorThread | None = None
        self._old_env: str | None = None

    async def __aenter__(self) -> Cluster:
        await self.api.__aenter__()
        await self.server.__aenter__()
        await self.api.create(CRDS, None, crdcheck.load_crd())  # the operator checks it at start-up
        cfg = self.workdir / "kubeconfig.json"
        cfg.write_text(kubeconfig(str(self.server.url).rstrip("/")))
        self._old_env = os.environ.get("KUBECONFIG")
        os.environ["KUBECONFIG"] = str(cfg)
        if self.kubelet is not None:
            await self.kubelet.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.api.release_stalls()
        await self.stop_operator()
        if self.kubelet is not None:
            await self.kubelet.__aexit__(*exc)
        await self.server.__aexit__(None, None, None)
        await self.api.__aexit__(None, None, None)
        if self._old_env is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = self._old_env

    async def start_operator(self, config: Any) -> None:
        """Run the operator in process (:class:`inprocess.OperatorThread`) and wait until kopf
        is up."""
        operator = OperatorThread(config, metrics_url=self.kubelet.metrics_url if self.kubelet else None)
        await asyncio.to_thread(operator.wait_ready, 30)
        self._operator, self.memo = operator, operator.memo

    async def stop_operator(self) -> None:
        """Stop kopf (like the operator pod going away) and wait for its thread."""
        if self._operator is None:
            return
        await asyncio.to_thread(self._operator.stop)
        self._operator = None

    async def add_nodes(self, nodes: list[Mapping[str, Any]]) -> None:
        for node in nodes:
            await self.api.create(NODES, None, node)

    async def apply(self, manifest: Mapping[str, Any], namespace: str = "default") -> dict[str, Any]:
        """``kubectl apply`` (create) of a job."""
        return await self.api.create(HTJ, namespace, copy.deepcopy(dict(manifest)))

    def job(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        return self.api.get(HTJ, namespace, name)

    def pods(self, namespace: str = "default", job: str | None = None) -> list[dict[str, Any]]:
        pods = self.api.objects(PODS, namespace)
        if job is not None:
            pods = [p for p in pods if p["metadata"].get("labels", {}).get("heterotrain.io/job-name") == job]
        return pods

    def events(self, name: str, namespace: str = "default") -> list[dict[str, Any]]:
        events = [e for e in self.api.objects(EVENTS, namespace) if e["involvedObject"]["name"] == name]
        return sorted(events, key=lambda e: int(e["metadata"]["resourceVersion"]))

    async def wait_for(self, predicate: Callable[[], Any], timeout_s: float, what: str = "") -> Any:
        """Poll ``predicate`` every 50 ms until it returns a truthy value; raise on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what or predicate}")

    async def idle(self, timeout_s: float = 60) -> None:
        """Wait until no pod anywhere holds a GPU (all finished or gone, none terminating)."""
        def quiet() -> bool:
            return all(p.get("status", {}).get("phase") in ("Succeeded", "Failed")
                       and not p["metadata"].get("deletionTimestamp")
                       for p in self.api.objects(PODS))
        await self.wait_for(quiet, timeout_s, "an idle cluster")
        rec = getattr(self, "memo", None) and self.memo.state.get("reconciler")
        if rec is not None:  # the operator's GPU-pod index has seen the last changes
            await self.wait_for(lambda: rec.gpu_pods() == [], timeout_s, "the operator's pod index to empty")

    # --- node faults, as the node lifecycle controller and the taint manager write them ----------

    async def node_unreachable(self, name: str) -> None:
        """The node lifecycle controller's view of a silent kubelet: ``Ready=Unknown``
        (``NodeStatusUnknown``) and the ``node.kubernetes.io/unreachable`` taints."""
        now = now_iso()
        await self.api.patch(NODES, None, name, {"status": {"conditions": [
            {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
             "message": "Kubelet stopped posting node status.", "lastTransitionTime": now}]}},
            subresource="status")
        node = self.api.get(NODES, None, name) or {}
        taints = [t for t in (node.get("spec") or {}).get("taints") or ()
                  if t.get("key") != "node.kubernetes.io/unreachable"]
        taints += [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule", "timeAdded": now},
                   {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": now}]
        await self.api.patch(NODES, None, name, {"spec": {"taints": taints}})

    async def node_healthy(self, name: str) -> None:
        """The node is back: ``Ready=True``, no unreachable/not-ready taints, a live kubelet."""
        node = self.api.get(NODES, None, name) or {}
        taints = [t for t in (node.get("spec") or {}).get("taints") or ()
                  if t.get("key") not in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")]
        await self.api.patch(NODES, None, name, {"spec": {"taints": taints or None}})
        await self.api.patch(NODES, None, name, {"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastTransitionTime": now_iso()}]}},
            subresource="status")
        if self.kubelet is not None:
            self.kubelet.revive_node(name)

    async def evict(self, namespace: str, name: str, reason: str = "DeletionByTaintManager") -> None:
        """Evict a pod as the taint manager does: a ``DisruptionTarget`` condition, then a
        graceful delete (which stays Terminating when the pod's kubelet is gone)."""
        pod = self.api.get(PODS, namespace, name) or {}
        conditions = [c for c in (pod.get("status") or {}).get("conditions") or ()
                      if c.get("type") != "DisruptionTarget"]
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": reason,
                           "message": "Taint manager: deleting due to NoExecute taint",
                           "lastTransitionTime": now_iso()})
        await self.api.patch(PODS, namespace, name, {"status": {"conditions": conditions}},
                             subresource="status")
        await self.api.delete(PODS, namespace, name)

    def phase(self, name: str, namespace: str = "default") -> str:
        job = self.job(name, namespace)
        return ((job or {}).get("status") or {}).get("phase", "")
