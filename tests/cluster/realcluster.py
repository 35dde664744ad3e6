"""The real control plane for tests: etcd, kube-apiserver, kube-controller-manager, kube-scheduler
(``hetero_operator.devcluster.controlplane``), the local kubelet in a thread of its own, optionally
Kueue, and the operator (kopf) in process, as ``tests/k8s/harness.py`` runs it.

Tests here are synchronous: they talk to the API server with the ``kubernetes`` client and poll
with :meth:`RealCluster.wait_for` (never a fixed sleep).
"""

from __future__ import annotations

import asyncio
import copy
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import kubernetes
import yaml
from waiting import wait_until

from builders import e2e_config
from inprocess import OperatorThread
from hetero_operator.devcluster import controlplane
from hetero_operator.devcluster.controlplane import Options
from hetero_operator.devcluster.kubeapi import Api
from hetero_operator.devcluster import kubeletlogs
from hetero_operator.devcluster.kubelet import LocalKubelet

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "heterotrain.io", "v1alpha1", "heterotrainingjobs"
SPARE = "node-t4-b"
CONFIG = e2e_config({"restart.unschedulable_retry_s": 1.0})
"""The in-process operator's settings (tests/operator/test_e2e.py's)."""
WAIT_FOR_PODS_READY_S = 40
"""Kueue's waitForPodsReady timeout in the test cluster, seconds: longer than a short job takes
to start and finish on a loaded 2-core machine (the operator sets no PodsReady yet: docs/cluster.md)."""
GRACE_S = 10
"""The node lifecycle controller's grace (seconds) in the test cluster; leases renew every 1 s."""


def test_nodes() -> list[dict[str, Any]]:
    """examples/clusters/mixed.yaml plus a cordoned spare T4 node (:data:`SPARE`)."""
    nodes = yaml.safe_load((REPO / "examples" / "clusters" / "mixed.yaml").read_text())["items"]
    spare = copy.deepcopy(nodes[2])
    spare["metadata"]["name"] = SPARE
    spare["spec"] = {"unschedulable": True}
    return [*nodes, spare]


class RealCluster:
    """One real control plane for the test session (see the module doc)."""

    def __init__(self, cluster_dir: Path) -> None:
        self.dir = cluster_dir
        self.bins = controlplane.bin_dir()  # builds when missing; raises if a binary cannot be built
        self.state: dict[str, Any] = {}
        self.loop = asyncio.new_event_loop()
        self.kubelet: LocalKubelet | None = None
        self._kubelet_thread: threading.Thread | None = None
        self._operator: OperatorThread | None = None
        self.memo: Any = None
        self.kueue_pid: int | None = None

    # --- start / stop ---------------------------------------------------------------------

    def start(self) -> RealCluster:
        self.state = controlplane.start(self.dir, self.bins, Options(node_monitor_grace_s=GRACE_S))
        self._old_kubeconfig = os.environ.get("KUBECONFIG")
        os.environ["KUBECONFIG"] = self.state["kubeconfig"]  # kopf's login reads it (runner.login)
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=self.state["kubeconfig"], client_configuration=cfg)
        self.client = kubernetes.client.ApiClient(cfg)
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.custom = kubernetes.client.CustomObjectsApi(self.client)
        self.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
        controlplane.wait_crds_established(self.dir, ["heterotrainingjobs.heterotrain.io"])
        self._start_kubelet()
        self.wait_for(lambda: self.ready_nodes() >= {n["metadata"]["name"] for n in test_nodes()}, 60,
                      "every node Ready")
        return self

    def _start_kubelet(self) -> None:
        ready = threading.Event()

        async def main() -> None:
            async with Api.from_kubeconfig(Path(self.state["kubeconfig"])) as api:
                self.kubelet = LocalKubelet(api, test_nodes(), pod_dir=self.dir / "pods", lease_s=GRACE_S,
                                            renew_s=1.0, tls=kubeletlogs.tls_of(self.dir))
                task = asyncio.ensure_future(self.kubelet.run())
                ready.set()
                try:
                    await task
                except asyncio.CancelledError:
                    pass

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self._kubelet_task = self.loop.create_task(main())
            try:
                self.loop.run_until_complete(self._kubelet_task)
            except asyncio.CancelledError:
                pass

        self._kubelet_thread = threading.Thread(target=run, name="kubelet", daemon=True)
        self._kubelet_thread.start()
        ready.wait(30)

    def start_kueue(self) -> None:
        if self.kueue_pid is None:
            from hetero_operator.devcluster import kueue
            self.kueue_pid = kueue.start(self.dir, self.bins, wait_for_pods_ready_s=WAIT_FOR_PODS_READY_S)

    def stop(self) -> None:
        self.stop_operator()
        if self._kubelet_thread is not None:
            self.loop.call_soon_threadsafe(self._kubelet_task.cancel)
            self._kubelet_thread.join(30)
        controlplane.stop(self.dir)
        if getattr(self, "_old_kubeconfig", None) is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = self._old_kubeconfig

    def on_kubelet(self, coro: Any, timeout_s: float = 30) -> Any:
        """Run a coroutine on the kubelet's loop; returns its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    # --- the operator ---------------------------------------------------------------------

    def start_operator(self, config: Any) -> None:
        """Run the operator in process (:class:`inprocess.OperatorThread`) and wait until kopf
        is up."""
        assert self.kubelet is not None
        operator = OperatorThread(config, metrics_url=self.kubelet.metrics_url)
        operator.wait_ready(60)
        self._operator, self.memo = operator, operator.memo

    def stop_operator(self) -> None:
        if self._operator is None:
            return
        self._operator.stop()
        self._operator = None

    # --- API helpers ----------------------------------------------------------------------

    def kubectl(self, *args: str, check: bool = True, input_text: str | None = None) -> Any:
        return controlplane.kubectl(self.dir, *args, check=check, input_text=input_text)

    def namespace(self, name: str, labels: Mapping[str, str] | None = None) -> str:
        """Create a namespace and wait for its ``default`` service account (pods need it)."""
        self.core.create_namespace({"metadata": {"name": name, "labels": dict(labels or {})}})
        self.wait_for(lambda: _exists(lambda: self.core.read_namespaced_service_account("default", name)), 30,
                      f"serviceaccount {name}/default")
        return name

    def apply(self, body: Mapping[str, Any], namespace: str) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, copy.deepcopy(dict(body)))

    def job(self, name: str, namespace: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def phase(self, name: str, namespace: str) -> str:
        return ((self.job(name, namespace) or {}).get("status") or {}).get("phase", "")

    def pods(self, namespace: str | None = None, job: str | None = None) -> list[dict[str, Any]]:
        sel = f"heterotrain.io/job-name={job}" if job else None
        if namespace is None:
            items = self.core.list_pod_for_all_namespaces(label_selector=sel).items
        else:
            items = self.core.list_namespaced_pod(namespace, label_selector=sel).items
        return [self.client.sanitize_for_serialization(p) for p in items]

    def events(self, name: str, namespace: str) -> list[dict[str, Any]]:
        items = self.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
        events = [self.client.sanitize_for_serialization(e) for e in items]
        return sorted(events, key=lambda e: (e.get("firstTimestamp") or e.get("eventTime") or "",
                                             int(e["metadata"]["resourceVersion"])))

    def event_counts(self, name: str, namespace: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for e in self.events(name, namespace):
            out[e["reason"]] = out.get(e["reason"], 0) + int(e.get("count") or 1)
        return out

    def node(self, name: str) -> dict[str, Any]:
        return self.client.sanitize_for_serialization(self.core.read_node(name))

    def ready_nodes(self) -> set[str]:
        return {n.metadata.name for n in self.core.list_node().items
                if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or ())}

    def wait_for(self, predicate: Callable[[], Any], timeout_s: float, what: str = "") -> Any:
        """Poll ``predicate`` every 0.1 s until it returns a truthy value (tests/waiting.py)."""
        return wait_until(predicate, timeout_s=timeout_s, what=what or repr(predicate), poll_s=0.1)

    def finished(self, name: str, namespace: str, timeout_s: float = 150) -> dict[str, Any]:
        self.wait_for(lambda: self.phase(name, namespace) in ("Succeeded", "Failed"), timeout_s,
                      f"{namespace}/{name} to finish (now {self.phase(name, namespace)!r})")
        job = self.job(name, namespace)
        assert job is not None
        return job

    def idle(self, timeout_s: float = 90) -> None:
        """No pod anywhere holds a GPU (all finished or gone, none terminating) and the
        operator's GPU-pod index agrees."""
        def busy() -> list[str]:
            return [f"{p['metadata']['namespace']}/{p['metadata']['name']} "
                    f"({(p.get('status') or {}).get('phase')}"
                    f"{', terminating' if p['metadata'].get('deletionTimestamp') else ''})"
                    for p in self.pods() if p["metadata"]["namespace"] not in ("kube-system", "kueue-system")
                    and ((p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                         or p["metadata"].get("deletionTimestamp"))]
        last: list[list[str]] = [[]]

        def quiet() -> bool:
            last[0] = busy()
            return not last[0]
        try:
            self.wait_for(quiet, timeout_s, "an idle cluster")
        except AssertionError as exc:  # name what kept it busy
            raise AssertionError(f"{exc}; pods still busy: {', '.join(last[0])}") from None
        rec = self.memo and self.memo.state.get("reconciler")
        if rec is not None:
            self.wait_for(lambda: rec.gpu_pods() == [], timeout_s, "the operator's pod index to empty")

    def log(self, namespace: str, pod: str) -> str:
        assert self.kubelet is not None
        return self.kubelet.log(namespace, pod)


def _exists(fn: Callable[[], Any]) -> bool:
    try:
        fn()
        return True
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return False
        raise
