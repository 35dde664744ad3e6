"""The real API server takes what issue 33 (items 1, 2, 4) adds, and nothing of it is pruned:
``spec.training.checkpoint.resumeFrom`` (its pattern refuses a name that is none) and
``spec.worker.resourcesPerRank`` in the CRD; the worker container's
``terminationMessagePolicy: FallbackToLogsOnError`` on a rendered pod; ``status.result`` and the
final ``status.progress`` of a succeeded job as the operator writes them.  No operator runs here."""

from __future__ import annotations

import kubernetes
import pytest
import yaml
from realcluster import GROUP, PLURAL, REPO, VERSION, RealCluster

from hetero_operator.api.spec import parse_job
from hetero_operator.api.types import Plan
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.lifecycle import decisions as lc
from hetero_operator.lifecycle import status as st
from hetero_operator.planning.plan import plan_job
from hetero_operator.render import pods as rendering
from hetero_operator.render.env import render_rank_envs


def _body(name: str) -> dict:
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"]["name"] = name
    body["spec"]["worker"]["resourcesPerRank"] = {"requests": {"cpu": "500m", "memory": "1Gi"},
                                                  "limits": {"memory": "1Gi"}}
    body["spec"]["training"]["checkpoint"]["resumeFrom"] = "digits-old"
    return body


def test_resume_from_and_resources_per_rank_are_kept_and_a_bad_name_refused(real: RealCluster) -> None:
    ns = real.namespace("issue33-spec")
    created = real.apply(_body("digits"), ns)
    assert created["spec"]["training"]["checkpoint"]["resumeFrom"] == "digits-old"
    assert created["spec"]["worker"]["resourcesPerRank"] == {
        "requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}
    bad = _body("digits-bad")
    bad["spec"]["training"]["checkpoint"]["resumeFrom"] = "Digits Job"
    with pytest.raises(kubernetes.client.ApiException) as err:
        real.apply(bad, ns)
    assert err.value.status == 422 and "spec.training.checkpoint.resumeFrom" in err.value.body


def test_a_rendered_pod_keeps_fallback_to_logs_and_its_per_rank_resources(real: RealCluster) -> None:
    ns = real.namespace("issue33-pod")
    body = _body("digits")
    body["metadata"]["namespace"] = ns
    job = parse_job(body)
    nodes = yaml.safe_load((REPO / "examples" / "clusters" / "mixed.yaml").read_text())["items"]
    plan = plan_job(job, build_inventory(nodes))
    assert isinstance(plan, Plan)
    envs = render_rank_envs(plan, job, master_addr="m", master_port=29500, simulated=True)
    pods = rendering.render_pods(job, plan, envs, launcher=("heterotrain", "launch", "--"), attempt=1)
    t4 = next(p for p in pods if p["metadata"]["name"] == "digits-g2")  # 2 ranks
    made = real.client.sanitize_for_serialization(real.core.create_namespaced_pod(ns, t4))
    # the pod was made only to be read back: take it away so the next test finds an idle cluster
    real.core.delete_namespaced_pod("digits-g2", ns, grace_period_seconds=0)
    real.wait_for(lambda: not real.core.list_namespaced_pod(ns).items, 60, f"the pod of {ns} gone")
    worker = made["spec"]["containers"][0]
    assert worker["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert worker["resources"]["requests"]["cpu"] == "1"  # 2 x 500m, as the server writes it
    assert worker["resources"]["requests"]["memory"] == "2Gi"


def test_the_result_and_final_progress_are_accepted_and_kept(real: RealCluster) -> None:
    ns = real.namespace("issue33-status")
    real.apply(_body("digits"), ns)
    message = ('{"heterotrain.io/result": 1, "loss": 0.0512, "metrics": {"accuracy": 0.9722}, '
               '"step": 132, "totalSteps": 132}')
    rank0 = st.pod_state({"metadata": {"name": "digits-g0", "labels": {"heterotrain.io/rank": "0"}},
                          "status": {"phase": "Succeeded", "containerStatuses": [{
                              "name": "worker", "state": {"terminated": {
                                  "exitCode": 0, "reason": "Completed", "message": message}}}]}})
    d = lc.Decision(action=lc.SUCCEED, phase="Succeeded", reason="JobSucceeded", message="done.")
    new = st.decided_status({"progress": {"step": 37, "totalSteps": 132, "eta": "1m10s",
                                          "samplesPerSecond": "812.0"}}, d, [rank0],
                            generation=1, now_s=1_800_000_000.0)
    written = real.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, PLURAL, "digits",
        {"status": {k: new[k] for k in ("phase", "message", "result", "progress")}})["status"]
    assert written["result"] == {"step": 132, "totalSteps": 132, "loss": "0.0512",
                                 "metrics": {"accuracy": "0.9722"}}
    assert written["progress"] == {"step": 132, "totalSteps": 132, "loss": "0.0512",
                                   "samplesPerSecond": "812.0", "updateTime": "2027-01-15T08:00:00Z"}
