"""The operator's start on the REAL API server with many registered nodes (issue 32, item 9).

A control plane of its own (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) with
:data:`N_NODES` nodes registered by a lease-only local kubelet (``run_pods=False``: the pods stay
Pending, bound by the real scheduler), so this package's shared cluster keeps its own nodes.
Last round the operator's kopf indexes had no "complete" signal and jobs were planned while the
usable nodes grew (about 90 more every 20 s at 2,000 nodes, as the control plane cleared their
not-ready taints): up to 11 plans for one job.  Here the operator must know every node the moment
it is up (its informer's first LIST is done before kopf runs any job handler; the reconciler does
not exist before) and plan each job exactly once.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from waiting import wait_until

from builders import e2e_config, make_node
from inprocess import OperatorThread
from hetero_operator.cluster.nodeindex import build_indexed_inventory
from hetero_operator.devcluster import controlplane
from hetero_operator.devcluster.controlplane import Options
from hetero_operator.devcluster.kubeapi import Api
from hetero_operator.devcluster.kubelet import LocalKubelet

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "heterotrain.io", "v1alpha1", "heterotrainingjobs"
N_NODES = 200
"""Registered nodes (4 GPUs each): enough that a per-object pace shows, few enough to stay quick."""
N_JOBS = 20
"""Jobs of 8 ranks (two 4-GPU pods each), created back to back right after the operator is up."""
NAMESPACES = ("scale-a", "scale-b")


def nodes() -> list[dict[str, Any]]:
    kinds = [("NVIDIA-A100-SXM4-80GB", 81920, "8.0"), ("Tesla-T4", 15360, "7.5")]
    out = []
    for i in range(N_NODES):
        product, mem, cc = kinds[i % 2]
        out.append(make_node(f"node-{i:03d}", product=product, count=4, memory_mib=mem, cc=cc))
    return out


def job(name: str) -> dict[str, Any]:
    import yaml
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"]["name"] = name
    body["spec"]["gpus"] = {"ranks": 8, "minRanks": 8}
    body["spec"]["training"]["globalBatchSize"] = 128
    return body


class ManyNodes:
    """A control plane with :data:`N_NODES` lease-only nodes; its kubelet runs in a thread."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.state = controlplane.start(workdir, controlplane.bin_dir(),
                                        Options(node_monitor_grace_s=120, node_monitor_period_s=5))
        self.loop = asyncio.new_event_loop()
        self.registered = threading.Event()
        self._thread = threading.Thread(target=self._kubelet, name="kubelet-many", daemon=True)
        self._thread.start()
        cfg = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=self.state["kubeconfig"], client_configuration=cfg)
        self.client = kubernetes.client.ApiClient(cfg)
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.custom = kubernetes.client.CustomObjectsApi(self.client)
        controlplane.kubectl(workdir, "apply", "--server-side", "-f", str(REPO / "crds"))
        controlplane.wait_crds_established(workdir, ["heterotrainingjobs.heterotrain.io"])

    def _kubelet(self) -> None:
        async def main() -> None:
            async with Api.from_kubeconfig(Path(self.state["kubeconfig"]), connections=16) as api:
                kubelet = LocalKubelet(api, nodes(), pod_dir=self.dir / "pods", lease_s=120, renew_s=30.0,
                                       run_pods=False)
                task = asyncio.ensure_future(kubelet.run())
                await kubelet.registered.wait()
                self.registered.set()
                try:
                    await task
                except asyncio.CancelledError:
                    pass

        asyncio.set_event_loop(self.loop)
        self._task = self.loop.create_task(main())
        try:
            self.loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(30)
        controlplane.stop(self.dir)


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManyNodes]:
    cluster = ManyNodes(tmp_path_factory.mktemp("many-nodes"))
    try:
        assert cluster.registered.wait(180), f"{N_NODES} nodes not registered in 180 s"
        for ns in NAMESPACES:
            cluster.core.create_namespace({"metadata": {"name": ns}})
            wait_until(lambda ns=ns: _has_service_account(cluster, ns), timeout_s=60,
                       what=f"serviceaccount {ns}/default")
        # A registered node carries node.kubernetes.io/not-ready:NoSchedule until the node
        # lifecycle controller sees it Ready and removes the taint: about 4-5 nodes a second with
        # kube-controller-manager's default client rate (measured here; it was last round's "90
        # more usable nodes every 20 s").  The operator rightly leaves such a node out, as the
        # scheduler does; it starts below on a settled cluster, as when it restarts on a real one.
        wait_until(lambda: not _tainted(cluster), timeout_s=300,
                   what="the control plane to remove every node's not-ready taint")
        yield cluster
    finally:
        cluster.stop()


def _has_service_account(cluster: ManyNodes, ns: str) -> bool:
    try:
        cluster.core.read_namespaced_service_account("default", ns)
        return True
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return False
        raise


def _tainted(cluster: ManyNodes) -> list[str]:
    return [n.metadata.name for n in cluster.core.list_node().items if n.spec.taints]


def _plans(memo: Any, result: str) -> float:
    return memo.metrics.plans.labels(result=result)._value.get()


def test_every_registered_node_is_known_at_start_and_each_job_is_planned_once(many: ManyNodes) -> None:
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = many.state["kubeconfig"]  # the operator's login and client read it
    operator = OperatorThread(e2e_config({"restart.pending_timeout_s": 3600.0}), name="operator-many")
    try:
        rec = wait_until(lambda: operator.memo.state.get("reconciler"), timeout_s=120,
                         what="the operator's startup (its Node and Pod informers synced)")
        # The very moment jobs may be handled, every registered node is known and usable.
        known = rec.nodes()
        assert len(known) == N_NODES
        inventory = build_indexed_inventory(known, rec.gpu_pods())
        assert (len(inventory.nodes), len(inventory.excluded)) == (N_NODES, 0)
        assert all("managedFields" not in n["metadata"] for n in known)  # trimmed, not whole objects
        cache = operator.memo.state["cache"]
        assert cache.nodes.relists == 0

        names = [(NAMESPACES[j % 2], f"job-{j:02d}") for j in range(N_JOBS)]
        for ns, name in names:
            many.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job(name))

        def jobs() -> list[dict[str, Any]]:
            return [many.custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
                    for ns, name in names]

        def all_planned_with_pods() -> bool:
            pods = many.core.list_pod_for_all_namespaces(label_selector="heterotrain.io/job-name").items
            per_job: dict[tuple[str, str], int] = {}
            for p in pods:
                key = (p.metadata.namespace, p.metadata.labels["heterotrain.io/job-name"])
                per_job[key] = per_job.get(key, 0) + 1
            planned = {(j["metadata"]["namespace"], j["metadata"]["name"]):
                       len(((j.get("status") or {}).get("plan") or {}).get("pods") or ()) for j in jobs()}
            return all(planned[k] and per_job.get(k) == planned[k] for k in names)

        wait_until(all_planned_with_pods, timeout_s=180, what=f"{N_JOBS} jobs' planned pods")
        assert _plans(operator.memo, "planned") == N_JOBS  # once per job: never on a partial inventory
        assert _plans(operator.memo, "unschedulable") == 0
        done = jobs()
        assert [j["status"]["attempt"] for j in done] == [1] * N_JOBS
        gpus: dict[str, int] = {}
        for j in done:
            for g in j["status"]["plan"]["groups"]:
                gpus[g["node"]] = gpus.get(g["node"], 0) + g["ranks"]
        assert sum(gpus.values()) == 8 * N_JOBS and max(gpus.values()) <= 4  # no GPU given twice
    finally:
        operator.stop()
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old
