"""One queue source for a HeteroTrainingJob (issue 32, F3 and What-to-build 3), on the operator's
side: the queue is the ``kueue.x-k8s.io/queue-name`` label, or ``spec.runPolicy.schedulingPolicy.queue``
when the label is absent (today that field is parsed and never used: the job runs unqueued); the
two may not disagree; a job whose label is removed while it waits never starts outside its
Workload's admission (today it starts at once, its Workload still queued); ``HTJ_REQUIRE_QUEUE``
keeps an unqueued job waiting.  The admission policy that refuses the label change itself is
tested on the real API server (tests/cluster/test_queue_policy_real.py); these use the reconciler's
fake API object and the in-memory CustomObjectsApi (tests/operator/test_kueue_gate.py), where
Kueue's admission is written by hand."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from test_handlers import CONFIG, FakeApi, _reconciler
from test_kueue_gate import NODES, Custom, _true, job_body

from hetero_operator.api.errors import SpecError
from hetero_operator.api.spec import parse_job
from hetero_operator.render import workload as kueue

KEY = ("ml", "q")
ADMISSION = {"clusterQueue": "cq", "podSetAssignments": [
    {"name": "nvidia-a100-sxm4-40gb", "count": 1, "flavors": {"nvidia.com/gpu": "a100"}},
    {"name": "tesla-t4", "count": 2, "flavors": {"nvidia.com/gpu": "t4"}}]}


def cluster(body: dict[str, Any], config: Any = CONFIG) -> tuple[FakeApi, Custom, Any]:
    """The fake API with Kueue served (ResourceFlavors a100, t4) and a reconciler on NODES."""
    api = FakeApi(body)
    custom = Custom({"kueue.x-k8s.io", "scheduling.k8s.io"})
    custom.store[("scheduling.k8s.io", "priorityclasses", None, "training")] = {
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": "training"},
        "value": 1000}
    for name, product in (("a100", "NVIDIA-A100-SXM4-40GB"), ("t4", "Tesla-T4")):
        custom.store[("kueue.x-k8s.io", "resourceflavors", None, name)] = {
            "apiVersion": kueue.API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": {"nodeLabels": {"nvidia.com/gpu.product": product}}}
    api.custom = custom  # type: ignore[attr-defined]

    async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    api._call = call  # type: ignore[attr-defined]
    return api, custom, _reconciler(api, nodes=NODES, config=config)


def workloads(custom: Custom) -> list[dict[str, Any]]:
    return [o for (_, p, _, _), o in custom.store.items() if p == "workloads"]


def status(api: FakeApi) -> dict[str, Any]:
    return api.jobs[KEY].get("status") or {}


def test_a_label_and_a_scheduling_policy_queue_that_disagree_are_refused_naming_both() -> None:
    body = job_body()
    body["spec"]["runPolicy"]["schedulingPolicy"]["queue"] = "team-other"
    with pytest.raises(SpecError) as err:
        parse_job(body)
    assert err.value.path == "spec.runPolicy.schedulingPolicy.queue"
    assert "'team-other' and the label kueue.x-k8s.io/queue-name='team-q' name different queues" in str(err.value)
    body["spec"]["runPolicy"]["schedulingPolicy"]["queue"] = "team-q"
    assert parse_job(body).run_policy.queue == "team-q"


async def test_scheduling_policy_queue_alone_queues_the_job() -> None:
    """Today spec.runPolicy.schedulingPolicy.queue without the label runs the job outside Kueue."""
    body = job_body()
    del body["metadata"]["labels"]
    body["spec"]["runPolicy"]["schedulingPolicy"]["queue"] = "team-q"
    api, custom, rec = cluster(body)
    await rec.reconcile(*KEY)
    assert api.pods == {} and status(api)["phase"] == "Suspended"
    (wl,) = workloads(custom)
    assert wl["spec"]["queueName"] == "team-q"


async def test_a_waiting_job_whose_label_is_removed_never_starts_outside_its_admission() -> None:
    """Today removing the label from a waiting job starts it at once, its Workload still queued."""
    api, custom, rec = cluster(job_body())
    await rec.reconcile(*KEY)
    assert status(api)["phase"] == "Suspended" and api.pods == {}
    del api.jobs[KEY]["metadata"]["labels"][kueue.QUEUE_LABEL]
    for reconciler in (rec, cluster(copy.deepcopy(api.jobs[KEY]))[2]):  # this operator; a restarted one
        reconciler.api = api
        reconciler.kueue.objects.api = api
        await reconciler.reconcile(*KEY)
        assert api.pods == {}, "not started while its Workload is not admitted"
        st = status(api)
        assert st["phase"] == "Suspended" and next(
            c for c in st["conditions"] if c["type"] == "Suspended")["reason"] == "QueueLabelRemoved"
        assert st["message"].startswith("The job's kueue.x-k8s.io/queue-name label was removed, but it "
                                        "was queued in LocalQueue team-q, so it runs only when Kueue "
                                        "admits it there")
        assert "put the label back (kueue.x-k8s.io/queue-name=team-q)" in st["message"]
    assert [e[:2] for e in api.events if e[1] == "QueueLabelRemoved"] == [("Warning", "QueueLabelRemoved")]
    # Kueue admits the Workload: the job starts within the admission, label or not
    (wl,) = workloads(custom)
    wl["status"] = {"conditions": [_true("QuotaReserved"), _true("Admitted")], "admission": ADMISSION}
    await rec.reconcile(*KEY)
    assert status(api)["phase"] == "Created" and len(api.pods) == 2
    assert all(p["spec"]["nodeSelector"]["nvidia.com/gpu.product"] in ("NVIDIA-A100-SXM4-40GB", "Tesla-T4")
               for p in api.pods.values())


async def test_an_operator_that_requires_a_queue_keeps_an_unqueued_job_waiting_until_it_has_one() -> None:
    body = job_body()
    del body["metadata"]["labels"]
    api, custom, rec = cluster(body, config=CONFIG.with_({"kueue.require_queue": True}))
    await rec.reconcile(*KEY)
    st = status(api)
    assert (st["phase"], api.pods, workloads(custom)) == ("Suspended", {}, [])
    assert st["message"].startswith("This operator runs only queued jobs (HTJ_REQUIRE_QUEUE): label the "
                                    "job kueue.x-k8s.io/queue-name=<LocalQueue>")
    assert [e[:2] for e in api.events if e[1] == "QueueRequired"] == [("Warning", "QueueRequired")]
    api.jobs[KEY]["metadata"]["labels"] = {kueue.QUEUE_LABEL: "team-q"}
    await rec.reconcile(*KEY)
    assert len(workloads(custom)) == 1 and api.pods == {}
    assert next(c for c in status(api)["conditions"] if c["type"] == "Suspended")["reason"] == "WaitingForAdmission"


async def test_a_job_recreated_under_the_same_name_without_a_queue_is_not_taken_for_the_old_one() -> None:
    """The queue remembered for a job whose label went belongs to that job object (its UID): a
    job deleted and created again unqueued under the same name, before this operator saw the
    deletion, runs unqueued (its Workload name differs: the UID is in it)."""
    api, custom, rec = cluster(job_body())
    await rec.reconcile(*KEY)
    assert status(api)["phase"] == "Suspended"
    again = job_body()
    del again["metadata"]["labels"]
    again["metadata"]["uid"] = "5f1c2a4e-0000-4000-8000-000000000002"
    api.jobs[KEY] = again
    await rec.reconcile(*KEY)
    assert status(api)["phase"] == "Created" and len(api.pods) == 2
