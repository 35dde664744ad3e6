"""The chart's queue admission policy on the REAL API server (issue 32, F3): the
ValidatingAdmissionPolicy of charts/heterotrain/templates/queue-policy.yaml, rendered by helm and
applied with kubectl, refuses removing or changing a HeteroTrainingJob's queue label while the
job has not finished (today nothing stops it: the job then starts outside Kueue's quota while its
Workload stays queued), refuses a label that disagrees with spec.runPolicy.schedulingPolicy.queue,
and lets a finished job's label go and an unqueued job get one.  The operator's side (a job whose
label went never starts outside its admission) is tests/operator/test_queue_source.py."""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

import kubernetes
import pytest
import yaml
from realcluster import GROUP, PLURAL, REPO, VERSION, RealCluster

sys.path.insert(0, str(REPO / "tests" / "chart"))
from helm import helm  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
NS = "queue-policy"


def job(name: str, labels: dict[str, str] | None = None, spec_queue: str = "") -> dict[str, Any]:
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"] = {"name": name, "labels": dict(labels or {})}
    if spec_queue:
        body["spec"].setdefault("runPolicy", {}).setdefault("schedulingPolicy", {})["queue"] = spec_queue
    return body


def refusal(fn: Any) -> kubernetes.client.ApiException:
    with pytest.raises(kubernetes.client.ApiException) as err:
        fn()
    return err.value


@pytest.fixture(scope="module")
def policy(real: RealCluster) -> RealCluster:
    """The chart's policy and binding applied; the namespace; the policy in force (an update it
    refuses is refused: the API server loads policies asynchronously)."""
    text = helm("template", "htj", str(REPO / "charts" / "heterotrain"), "--namespace", "heterotrain-system",
                "--api-versions", "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy",
                "--show-only", "templates/queue-policy.yaml").stdout
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert [d["kind"] for d in docs] == ["ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    real.kubectl("apply", "-f", "-", input_text=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    real.namespace(NS)
    real.apply(job("probe", {QUEUE_LABEL: "team-q"}), NS)

    def in_force() -> bool:
        try:
            real.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "probe",
                                                       {"metadata": {"labels": {QUEUE_LABEL: "other"}}})
        except kubernetes.client.ApiException as exc:
            return exc.status in (403, 422) and "ValidatingAdmissionPolicy" in (exc.body or "")
        try:  # back; the policy may have come into force between the two patches (seen in CI)
            real.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "probe",
                                                       {"metadata": {"labels": {QUEUE_LABEL: "team-q"}}})
        except kubernetes.client.ApiException as exc:
            return exc.status in (403, 422) and "ValidatingAdmissionPolicy" in (exc.body or "")
        return False

    real.wait_for(in_force, 60, "the queue policy in force")
    return real


def patch(cl: RealCluster, name: str, body: dict[str, Any]) -> dict[str, Any]:
    return cl.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name, body)


def test_a_waiting_jobs_queue_label_cannot_be_removed_or_changed(policy: RealCluster) -> None:
    cl = policy
    cl.apply(job("waiting", {QUEUE_LABEL: "team-q"}), NS)
    removed = refusal(lambda: patch(cl, "waiting", {"metadata": {"labels": {QUEUE_LABEL: None}}}))
    assert removed.status == 403
    message = json.loads(removed.body)["message"]
    assert "the job is queued in LocalQueue team-q and has not finished" in message
    assert "delete the job and create it again to change its queue" in message
    changed = refusal(lambda: patch(cl, "waiting", {"metadata": {"labels": {QUEUE_LABEL: "team-free"}}}))
    assert changed.status == 403
    assert cl.job("waiting", NS)["metadata"]["labels"][QUEUE_LABEL] == "team-q"
    # other changes of the waiting job go through
    patch(cl, "waiting", {"metadata": {"labels": {"team": "vision"}}})
    # a running job (status from the operator) is held the same way
    cl.custom.patch_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, "waiting",
                                                    {"status": {"phase": "Running"}})
    assert refusal(lambda: patch(cl, "waiting", {"metadata": {"labels": {QUEUE_LABEL: None}}})).status == 403


def test_a_finished_jobs_label_may_go_and_an_unqueued_job_may_get_one(policy: RealCluster) -> None:
    cl = policy
    cl.apply(job("done", {QUEUE_LABEL: "team-q"}), NS)
    cl.custom.patch_namespaced_custom_object_status(GROUP, VERSION, NS, PLURAL, "done",
                                                    {"status": {"phase": "Succeeded"}})
    patch(cl, "done", {"metadata": {"labels": {QUEUE_LABEL: None}}})
    assert QUEUE_LABEL not in (cl.job("done", NS)["metadata"].get("labels") or {})
    cl.apply(job("unqueued"), NS)
    patch(cl, "unqueued", {"metadata": {"labels": {QUEUE_LABEL: "team-q"}}})
    assert cl.job("unqueued", NS)["metadata"]["labels"][QUEUE_LABEL] == "team-q"


def test_the_scheduling_policy_queue_is_the_same_one_queue(policy: RealCluster) -> None:
    cl = policy
    disagree = refusal(lambda: cl.apply(job("two-queues", {QUEUE_LABEL: "team-q"}, spec_queue="team-r"), NS))
    assert disagree.status == 422
    assert ("metadata.labels[kueue.x-k8s.io/queue-name] (team-q) and spec.runPolicy.schedulingPolicy.queue "
            "(team-r) name different queues") in json.loads(disagree.body)["message"]
    cl.apply(job("spec-queued", spec_queue="team-r"), NS)
    body = copy.deepcopy(cl.job("spec-queued", NS))
    body["spec"]["runPolicy"]["schedulingPolicy"]["queue"] = "team-s"
    moved = refusal(lambda: cl.custom.replace_namespaced_custom_object(GROUP, VERSION, NS, PLURAL,
                                                                       "spec-queued", body))
    assert moved.status == 403 and "LocalQueue team-r" in json.loads(moved.body)["message"]
