"""The operator's Kueue adapter (hetero_operator.controller.objects) over an in-memory CustomObjectsApi:
the Workload it creates (with the PriorityClass's value), what each Kueue state means for the
job, the status it writes back, and a cluster without Kueue."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from builders import CATALOG_118_124_128, make_node
from k8s import kueuecheck

from hetero_operator.api import conditions as c
from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.controller.objects import KueueGate
from hetero_operator.lifecycle import decisions as lc
from hetero_operator.planning.plan import plan_job
from hetero_operator.render import workload as kueue

NOW = "2026-12-01T09:00:00Z"


class ApiError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


class Custom:
    """The CustomObjectsApi calls the adapter makes, on a dict store; ``served`` lists the API
    groups the cluster has (others answer 404)."""

    def __init__(self, served: set[str], kueue_versions: tuple[str, ...] = ("v1beta2", "v1beta1")) -> None:
        self.store: dict[tuple[str, str, str | None, str], dict[str, Any]] = {}
        self.served = served
        self.kueue_versions = kueue_versions
        self.calls: list[str] = []
        self.rv = 0

    def _check(self, group: str) -> None:
        if group not in self.served:
            raise ApiError(404)

    def get_api_resources(self, group, version):
        self._check(group)
        if group == "kueue.x-k8s.io" and version not in self.kueue_versions:
            raise ApiError(404)
        return {"groupVersion": f"{group}/{version}", "resources": []}

    def _bump(self, obj):
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)

    def patch_namespaced_custom_object(self, group, version, namespace, plural, name, body):
        self._check(group)
        obj = self.store[(group, plural, namespace, name)]
        for part in ("metadata", "spec"):
            into = obj.setdefault(part, {})
            for k, v in (body.get(part) or {}).items():
                if isinstance(v, dict):
                    sub = into.setdefault(k, {})
                    for kk, vv in v.items():
                        if vv is None:
                            sub.pop(kk, None)
                        else:
                            sub[kk] = vv
                else:
                    into[k] = v
        self.calls.append(f"patch {plural}")
        self._bump(obj)
        return obj

    def get_cluster_custom_object(self, group, version, plural, name):
        self._check(group)
        obj = self.store.get((group, plural, None, name))
        if obj is None:
            raise ApiError(404)
        return obj

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        self._check(group)
        obj = self.store.get((group, plural, namespace, name))
        if obj is None:
            raise ApiError(404)
        return obj

    def list_cluster_custom_object(self, group, version, plural):
        self._check(group)
        return {"items": [o for (g, p, _, _), o in self.store.items() if (g, p) == (group, plural)]}

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        self._check(group)
        key = (group, plural, namespace, body["metadata"]["name"])
        if key in self.store:
            raise ApiError(409)
        self.calls.append(f"create {plural}")
        self.store[key] = copy.deepcopy(body)
        self._bump(self.store[key])
        return body

    def patch_namespaced_custom_object_status(self, group, version, namespace, plural, name, body):
        self._check(group)
        obj = self.store[(group, plural, namespace, name)]
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != (obj.get("metadata") or {}).get("resourceVersion"):
            raise ApiError(409)
        self._bump(obj)
        status = dict(obj.get("status") or {})
        for k, v in body["status"].items():
            if v is None:
                status.pop(k, None)
            else:
                status[k] = v
        obj["status"] = status
        self.calls.append(f"patch {plural}/status")
        return obj


class Api:
    """Just what kueue_gate uses of hetero_operator.controller.k8s.Api: ``custom`` and the bounded call."""

    def __init__(self, custom: Custom) -> None:
        self.custom = custom

    async def _call(self, fn, *args, **kwargs):
        return fn(*args, **kwargs)


def job_body() -> dict[str, Any]:
    return {"apiVersion": "heterotrain.io/v1alpha1", "kind": "HeteroTrainingJob",
            "metadata": {"name": "q", "namespace": "ml", "uid": "5f1c2a4e-0000-4000-8000-000000000001",
                         "labels": {kueue.QUEUE_LABEL: "team-q"}},
            "spec": {"worker": {"command": ["python", "-m", "train"]}, "images": CATALOG_118_124_128,
                     "gpus": {"ranks": 3}, "training": {"globalBatchSize": 48},
                     "runPolicy": {"schedulingPolicy": {"priorityClass": "training"}}}}


NODES = [make_node("a100-0", product="NVIDIA-A100-SXM4-40GB", count=1),
         make_node("t4-0", product="Tesla-T4", count=2, memory_mib=15360, cc="7.5")]


def capacity_plan():
    return plan_job(parse_job(job_body()), kueue.capacity_inventory(build_inventory(NODES)))


@pytest.fixture
def custom() -> Custom:
    cu = Custom({"kueue.x-k8s.io", "scheduling.k8s.io"})
    cu.store[("scheduling.k8s.io", "priorityclasses", None, "training")] = {
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": "training"}, "value": 1000}
    for name, product in (("a100", "NVIDIA-A100-SXM4-40GB"), ("t4", "Tesla-T4")):
        cu.store[("kueue.x-k8s.io", "resourceflavors", None, name)] = {
            "apiVersion": kueue.API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": {"nodeLabels": {"nvidia.com/gpu.product": product}}}
    return cu


def _true(type_: str, reason: str = "", message: str = "ok") -> dict[str, Any]:
    """A Workload condition ``type_`` with status True (its reason the type unless given)."""
    return {"type": type_, "status": "True", "reason": reason or type_, "message": message,
            "lastTransitionTime": NOW}


def the_workload(custom: Custom) -> dict[str, Any]:
    (wl,) = [o for (g, p, _, _), o in custom.store.items() if p == "workloads"]
    return wl


async def test_first_look_creates_the_workload_with_priority_and_waits(custom: Custom) -> None:
    body = job_body()
    gate = await KueueGate(Api(custom)).check(body, parse_job(body), capacity_plan)
    assert (gate.admitted, gate.reason) == (False, "WaitingForAdmission")
    wl = the_workload(custom)
    kueuecheck.validate(wl, "workloads")
    assert (wl["spec"]["priority"], wl["spec"]["priorityClassRef"]["name"]) == (1000, "training")
    assert [(ps["name"], ps["count"]) for ps in wl["spec"]["podSets"]] == [
        ("nvidia-a100-sxm4-40gb", 1), ("tesla-t4", 2)]
    again = await KueueGate(Api(custom)).check(body, parse_job(body), capacity_plan)
    assert again.reason == "WaitingForAdmission" and custom.calls == ["create workloads"]
    decision = gate.explain(lc.decide(lc.JobState(), gate.policy(parse_job(body)), [], nodes=None, now_s=0.0))
    assert (decision.action, decision.phase, decision.reason) == (lc.SUSPEND, c.SUSPENDED, "WaitingForAdmission")


async def test_admitted_gate_allows_the_flavors_and_finishing_marks_the_workload(custom: Custom) -> None:
    body = job_body()
    gate = KueueGate(Api(custom))
    await gate.check(body, parse_job(body), capacity_plan)
    wl = the_workload(custom)
    wl["status"] = {"conditions": [_true("QuotaReserved"), _true("Admitted")],
        "admission": {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "nvidia-a100-sxm4-40gb", "count": 1, "flavors": {"nvidia.com/gpu": "a100"}},
            {"name": "tesla-t4", "count": 2, "flavors": {"nvidia.com/gpu": "t4"}}]}}
    opened = await gate.check(body, parse_job(body), capacity_plan)
    assert opened.admitted and {t: p.flavor for t, p in opened.allowed.items()} == {
        "NVIDIA-A100-SXM4-40GB": "a100", "Tesla-T4": "t4"}
    assert opened.policy(parse_job(body)) == parse_job(body).run_policy
    done = lc.Decision(action=lc.CLEANUP, phase=c.SUCCEEDED, reason="JobSucceeded", message="done")
    await gate.after(opened, body, done, [], NOW)
    finished = next(x for x in the_workload(custom)["status"]["conditions"] if x["type"] == "Finished")
    assert (finished["status"], finished["reason"]) == ("True", "Succeeded")
    kueuecheck.validate(the_workload(custom), "workloads")


async def test_evicted_gate_clears_the_admission_only_when_no_pod_is_left(custom: Custom) -> None:
    body = job_body()
    gate = KueueGate(Api(custom))
    await gate.check(body, parse_job(body), capacity_plan)
    wl = the_workload(custom)
    wl["status"] = {"conditions": [
        _true("QuotaReserved"), _true("Evicted", "InactiveWorkload", "The workload is deactivated")],
        "admission": {"clusterQueue": "cq", "podSetAssignments": [
            {"name": "nvidia-a100-sxm4-40gb", "count": 1}, {"name": "tesla-t4", "count": 2}]}}
    evicted = await gate.check(body, parse_job(body), capacity_plan)
    assert (evicted.admitted, evicted.evicted, evicted.reason) == (False, True, "EvictedInactiveWorkload")
    suspend = lc.Decision(action=lc.SUSPEND, phase=c.SUSPENDED, reason="Suspended", message="")
    await gate.after(evicted, body, suspend, ["a pod still terminating"], NOW)
    assert "admission" in the_workload(custom)["status"]
    await gate.after(evicted, body, suspend, [], NOW)
    status = the_workload(custom)["status"]
    assert "admission" not in status
    requeued = next(x for x in status["conditions"] if x["type"] == "Requeued")
    assert requeued["status"] == "False"  # deactivated, not preempted: Kueue does not requeue it


async def test_without_kueue_the_job_waits_naming_the_fix() -> None:
    body = job_body()
    gate = await KueueGate(Api(Custom({"scheduling.k8s.io"}))).check(body, parse_job(body), capacity_plan)
    assert (gate.admitted, gate.reason) == (False, "KueueNotInstalled")
    assert gate.message == ("The job is queued (kueue.x-k8s.io/queue-name=team-q) but the cluster "
                            "serves no Kueue Workloads (kueue.x-k8s.io v1beta2 or v1beta1); install Kueue "
                            "or remove the label")
