"""Ownership on every create (issue 32, F1 and F4): an object of a name the job needs that is not
the job's (no controller ownerReference with the job's UID) is never patched, deleted, counted or
adopted; the start is refused with a Warning Event and a condition naming the object and the fix,
and retried with exponential backoff.  NetworkPolicy, Service, Pod, ResourceClaimTemplate and
Workload.

These use the reconciler's fake API object (tests/operator/test_handlers.py) and the in-memory
CustomObjectsApi of tests/operator/test_kueue_gate.py, because the faults are 409s on creates
that a test places by hand; tests/operator/test_ownership_http.py runs F1 and F4 through the real
API wrapper against the HTTP fake API server (tests/k8s/fakeapi.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from test_handlers import CONFIG, NOW, FakeApi, _job, _reconciler, _status
from test_kueue_gate import Custom

from hetero_operator.api.spec import parse_job
from hetero_operator.controller import ownership
from hetero_operator.controller.objects import (RESOURCE_CLAIM_TEMPLATES, KueueGate, Objects,
                                                replace_claim_templates)
from hetero_operator.render import workload as kueue

CONFIG_BACKOFF = CONFIG.with_({"restart.backoff_base_s": 10, "restart.backoff_max_s": 300})


def _foreign(kind: str, name: str, spec: dict[str, Any], owner: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "team-x", "uid": "someone-else",
                            "labels": {"app": "web"}}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": kind, "metadata": meta, "spec": spec}


def _conditions(api: FakeApi) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in _status(api).get("conditions") or ()}


# --- the rule ---------------------------------------------------------------------------------

def test_only_a_controller_reference_with_the_jobs_uid_makes_an_object_the_jobs() -> None:
    job = _job()
    ours = {"kind": "HeteroTrainingJob", "name": "digits", "uid": "uid-1", "controller": True}
    assert ownership.owned_by({"metadata": {"ownerReferences": [ours]}}, "uid-1")
    assert not ownership.owned_by({"metadata": {"ownerReferences": [{**ours, "controller": False}]}}, "uid-1")
    assert not ownership.owned_by({"metadata": {"ownerReferences": [{**ours, "uid": "uid-2"}]}}, "uid-1")
    assert not ownership.owned_by({"metadata": {}}, "uid-1")
    assert not ownership.owned_by({"metadata": {"ownerReferences": [{**ours, "uid": ""}]}}, "")
    with pytest.raises(ownership.NotOwned) as err:
        ownership.check_owned(_foreign("Pod", "digits-g0", {}, owner={
            "kind": "ReplicaSet", "name": "web-5d8", "uid": "rs", "controller": True}), job)
    assert str(err.value) == (
        "Pod team-x/digits-g0 exists and is not this job's (its controller: ReplicaSet web-5d8; a "
        "job's Pod carries the job's controller ownerReference), so the operator neither changes "
        "nor uses it: delete or rename that Pod, or re-create the job under another name than "
        "'digits'")


# --- F4: a pod of a planned name ----------------------------------------------------------------

async def test_f4_an_unowned_pod_of_a_planned_name_refuses_the_start_and_is_never_touched() -> None:
    """Today a 409 on a pod create counts as created: the job re-plans, deletes and starts again
    for ever (measured: 275 starts in 20 s).  Now the start is refused, the foreign pod is left
    alone and the next try waits 10 s, then 20 s."""
    api = FakeApi(_job())
    foreign = _foreign("Pod", "digits-g1", {"containers": [{"name": "web", "image": "nginx"}]})
    api.pods["digits-g1"] = copy.deepcopy(foreign)
    clock = [NOW]
    rec = _reconciler(api, config=CONFIG_BACKOFF)
    rec.clock = lambda: clock[0]
    assert await rec.reconcile("team-x", "digits") == 10
    status = _status(api)
    assert (status["phase"], status["createRefusals"]) == ("Pending", 1)
    created = _conditions(api)["Created"]
    assert (created["status"], created["reason"]) == ("False", "ObjectNotOwned")
    assert "Pod team-x/digits-g1 exists and is not this job's" in created["message"]
    assert api.pods == {"digits-g1": foreign}, "the job's own pods of this start are removed"
    assert "digits-g1" not in api.deleted_pods and sorted(api.deleted_pods) == ["digits-g0", "digits-g2"]
    warnings = [e for e in api.events if e[1] == "ObjectNotOwned"]
    assert len(warnings) == 1 and warnings[0][0] == "Warning"
    assert "delete or rename that Pod" in warnings[0][2] and "retries with exponential backoff" in warnings[0][2]
    # 20 s of looking: one more try (at 10 s), then the next waits 20 s; never a storm
    starts, creates = 1, api.create_calls
    while clock[0] < NOW + 20:
        clock[0] += 1
        wait = await rec.reconcile("team-x", "digits")
        if api.create_calls > creates:
            starts, creates = starts + 1, api.create_calls
    assert starts == 2 and _status(api)["createRefusals"] == 2 and wait == pytest.approx(10)
    assert api.pods == {"digits-g1": foreign}
    # the name is freed: the next try starts the job
    del api.pods["digits-g1"]
    clock[0] = NOW + 30
    await rec.reconcile("team-x", "digits")
    assert _status(api)["phase"] == "Created" and sorted(api.pods) == ["digits-g0", "digits-g1", "digits-g2"]


async def test_the_jobs_own_object_answered_409_is_its_own_a_freed_name_is_taken_again() -> None:
    """A retried start finds its own pod (409, then the read shows the job's UID): not created,
    not refused; a pod deleted between the 409 and the read is created once more."""
    job = _job()
    api = FakeApi(job)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "digits-g0", "namespace": "team-x", "labels": {},
        "ownerReferences": [{"kind": "HeteroTrainingJob", "name": "digits", "uid": "uid-1", "controller": True}]}}
    assert await ownership.create_core_owned(api, pod, job) is True
    assert await ownership.create_core_owned(api, pod, job) is False
    reads: list[str] = []
    real_read = api.read

    async def read_after_delete(obj: dict[str, Any]) -> dict[str, Any] | None:
        reads.append(obj["metadata"]["name"])
        if len(reads) == 1:
            api.pods.pop("digits-g0")
        return await real_read(obj) if len(reads) > 1 else None

    api.read = read_after_delete  # type: ignore[method-assign]
    assert await ownership.create_core_owned(api, pod, job) is True and reads == ["digits-g0"]


# --- Service and NetworkPolicy (F1) ---------------------------------------------------------------

async def test_an_unowned_service_of_the_jobs_name_refuses_the_start_before_any_pod() -> None:
    api = FakeApi(_job())
    foreign = _foreign("Service", "digits", {"selector": {"app": "web"}, "ports": [{"port": 80}]})
    api.services["digits"] = copy.deepcopy(foreign)
    assert await _reconciler(api, config=CONFIG_BACKOFF).reconcile("team-x", "digits") == 10
    assert api.services == {"digits": foreign} and api.pods == {}
    assert not [c for c in api.create_order if c.startswith("Pod/")]
    assert "Service team-x/digits exists and is not this job's" in _status(api)["message"]


async def test_f1_a_job_named_like_a_network_policy_never_changes_that_policy() -> None:
    """A job named ``default-deny`` took the create's 409 as its own policy and patched its spec,
    opening the namespace.  Now the policy stays as it was and the job waits, saying why."""
    body = _job()
    body["metadata"]["name"] = "default-deny"
    api = FakeApi(body)
    deny = _foreign("NetworkPolicy", "default-deny", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]})
    api.others["default-deny"] = copy.deepcopy(deny)
    await _reconciler(api, config=CONFIG_BACKOFF).reconcile("team-x", "default-deny")
    assert api.others["default-deny"] == deny
    assert api.pods == {}
    status = api.jobs[("team-x", "default-deny")]["status"]
    assert status["phase"] == "Pending" and "NetworkPolicy team-x/default-deny exists and is not" in status["message"]
    created = next(c for c in status["conditions"] if c["type"] == "Created")
    assert created["reason"] == "ObjectNotOwned"


async def test_the_jobs_own_network_policy_is_brought_up_to_date_on_a_restart() -> None:
    api = FakeApi(_job())
    await _reconciler(api).reconcile("team-x", "digits")
    api.others["digits"]["spec"] = {"podSelector": {}, "policyTypes": ["Ingress"]}  # an old start's
    api.pods.clear()
    api.jobs[("team-x", "digits")]["status"] = {}
    await _reconciler(api).reconcile("team-x", "digits")
    assert "ingress" in api.others["digits"]["spec"] and _status(api)["phase"] == "Created"


# --- ResourceClaimTemplate ---------------------------------------------------------------------

class CustomApi:
    def __init__(self, custom: Custom) -> None:
        self.custom = custom

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)


def _template(name: str, owner_uid: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "team-x"}
    if owner_uid is not None:
        meta["ownerReferences"] = [{"apiVersion": "heterotrain.io/v1alpha1", "kind": "HeteroTrainingJob",
                                    "name": "digits", "uid": owner_uid, "controller": True}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": meta,
            "spec": {"spec": {"devices": {"requests": []}}}}


async def test_claim_templates_of_another_owner_are_neither_deleted_nor_adopted() -> None:
    custom = Custom({"resource.k8s.io"})
    objects = Objects(CustomApi(custom))
    key = lambda name: ("resource.k8s.io", "resourceclaimtemplates", "team-x", name)  # noqa: E731
    stale_ours, stale_theirs = _template("digits-a1-g0", "uid-1"), _template("digits-a1-g1", "other")
    custom.store[key("digits-a1-g0")] = copy.deepcopy(stale_ours)
    custom.store[key("digits-a1-g1")] = copy.deepcopy(stale_theirs)
    custom.store[key("digits-a2-g1")] = _template("digits-a2-g1", None)
    custom.delete_namespaced_custom_object = lambda g, v, ns, p, name: custom.store.pop((g, p, ns, name))
    job = _job()
    with pytest.raises(ownership.NotOwned, match="ResourceClaimTemplate team-x/digits-a2-g1 exists"):
        await replace_claim_templates(objects, "team-x", ["digits-a1-g0", "digits-a1-g1"],
                                      [_template("digits-a2-g0", "uid-1"), _template("digits-a2-g1", "uid-1")],
                                      owner=job)
    assert key("digits-a1-g0") not in custom.store, "the job's stale template goes"
    assert custom.store[key("digits-a1-g1")]["metadata"] == stale_theirs["metadata"]
    assert key("digits-a2-g0") in custom.store
    assert await objects.create_owned(RESOURCE_CLAIM_TEMPLATES, _template("digits-a2-g0", "uid-1"), job) is False


# --- Workload ------------------------------------------------------------------------------------

def _kueue_api(job: dict[str, Any]) -> tuple[FakeApi, Custom]:
    api = FakeApi(job)
    custom = Custom({"kueue.x-k8s.io"})
    api.custom = custom  # type: ignore[attr-defined]

    async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    api._call = call  # type: ignore[attr-defined]
    return api, custom


async def test_a_workload_of_the_jobs_name_that_is_not_its_own_keeps_the_job_waiting_with_backoff() -> None:
    job = _job()
    job["metadata"]["labels"] = {**job["metadata"].get("labels", {}), kueue.QUEUE_LABEL: "team-q"}
    api, custom = _kueue_api(job)
    name = kueue.workload_name("digits", "uid-1")
    squatter = {"apiVersion": kueue.API_VERSION, "kind": "Workload",
                "metadata": {"name": name, "namespace": "team-x", "resourceVersion": "1"},
                "spec": {"queueName": "other-q", "podSets": []},
                "status": {"conditions": [{"type": "Admitted", "status": "True", "reason": "Admitted",
                                           "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}
    custom.store[("kueue.x-k8s.io", "workloads", "team-x", name)] = copy.deepcopy(squatter)
    rec = _reconciler(api)
    waits = [await rec.reconcile("team-x", "digits") for _ in range(4)]
    assert waits == [10, 20, 40, 80]
    assert api.pods == {} and custom.calls == [], "neither created, patched nor adopted"
    status = _status(api)
    assert status["phase"] == "Suspended" and f"Workload team-x/{name} exists and is not this job's" in status["message"]
    warnings = [e for e in api.events if e[1] == "ObjectNotOwned"]
    assert len(warnings) == 1 and warnings[0][0] == "Warning"
    gate = await KueueGate(CustomApi(custom)).check(job, parse_job(job), lambda: None)
    assert (gate.admitted, gate.not_owned, gate.reason) == (False, True, "ObjectNotOwned")
    # the squatter goes: the job's own Workload is created
    del custom.store[("kueue.x-k8s.io", "workloads", "team-x", name)]
    await rec.reconcile("team-x", "digits")
    assert custom.calls[0] == "create workloads"
    assert ownership.owned_by(custom.store[("kueue.x-k8s.io", "workloads", "team-x", name)], "uid-1")
