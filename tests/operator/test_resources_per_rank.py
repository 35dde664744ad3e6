"""CPU and memory per rank (issue 33, item 2): ``spec.worker.resourcesPerRank`` sized the Kubeflow
way (per replica, per GPU); a pod the plan gives n ranks gets n times it, exactly; the per-pod
``spec.worker.resources`` stays as it was.  And ``resumeFrom`` reaches every rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from hetero_operator.api.quantities import scale_quantity
from hetero_operator.api.spec import parse_job
from hetero_operator.api.types import Plan
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.plan import plan_job
from hetero_operator.render import pods as rendering
from hetero_operator.render.env import render_rank_envs
from hetero_operator.render.workload import render_workload
from heterotrain_common.envnames import RESUME_FROM

REPO = Path(__file__).resolve().parents[2]


def _body(**worker: Any) -> dict[str, Any]:
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["spec"]["worker"].update(worker)
    return body


def _pods(body: dict[str, Any]) -> tuple[Plan, list[dict[str, Any]]]:
    job = parse_job(body)
    nodes = yaml.safe_load((REPO / "examples" / "clusters" / "mixed.yaml").read_text())["items"]
    plan = plan_job(job, build_inventory(nodes))
    assert isinstance(plan, Plan), plan
    envs = render_rank_envs(plan, job, master_addr="m", master_port=29500, simulated=False)
    return plan, rendering.render_pods(job, plan, envs, launcher=("heterotrain", "launch", "--"),
                                       attempt=1)


def test_a_two_rank_pod_gets_twice_the_per_rank_resources() -> None:
    _, pods = _pods(_body(
        resourcesPerRank={"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"memory": "8Gi"}},
        resources={"requests": {"ephemeral-storage": "10Gi"}}))
    assert {p["metadata"]["name"]: p["spec"]["containers"][0]["resources"] for p in pods} == {
        "digits-g0": {"requests": {"ephemeral-storage": "10Gi", "cpu": "4", "memory": "8Gi",
                                   "nvidia.com/gpu": "1"},
                      "limits": {"memory": "8Gi", "nvidia.com/gpu": "1"}},
        "digits-g1": {"requests": {"ephemeral-storage": "10Gi", "cpu": "4", "memory": "8Gi",
                                   "nvidia.com/gpu": "1"},
                      "limits": {"memory": "8Gi", "nvidia.com/gpu": "1"}},
        "digits-g2": {"requests": {"ephemeral-storage": "10Gi", "cpu": "8", "memory": "16Gi",
                                   "nvidia.com/gpu": "2"},
                      "limits": {"memory": "16Gi", "nvidia.com/gpu": "2"}}}  # the T4 pod: 2 ranks
    shm = {p["metadata"]["name"]: next(v["emptyDir"]["sizeLimit"] for v in p["spec"]["volumes"]
                                       if v["name"] == "dshm") for p in pods}
    assert shm == {"digits-g0": "2Gi", "digits-g1": "2Gi", "digits-g2": "4Gi"}  # 2Gi a rank, < limit/2
    for pod in pods:
        kubernetes_validate.validate(pod, "1.30.0", strict=True)


def test_the_per_pod_form_is_unchanged_and_the_template_still_wins() -> None:
    template = {"spec": {"containers": [{"name": "worker", "resources": {"limits": {"cpu": "3"}}}]}}
    _, pods = _pods(_body(resources={"requests": {"cpu": "2"}},
                          resourcesPerRank={"limits": {"cpu": "1500m"}}, template=template))
    resources = [p["spec"]["containers"][0]["resources"] for p in pods]
    assert [r["requests"]["cpu"] for r in resources] == ["2", "2", "2"]  # per pod: as given
    assert [r["limits"]["cpu"] for r in resources] == ["3", "3", "3"]  # the template's container wins


def test_a_kueue_pod_set_of_one_gpu_requests_one_ranks_resources() -> None:
    body = _body(resourcesPerRank={"requests": {"cpu": "4", "memory": "8Gi"}})
    job = parse_job(body)
    nodes = yaml.safe_load((REPO / "examples" / "clusters" / "mixed.yaml").read_text())["items"]
    plan = plan_job(job, build_inventory(nodes))
    body["metadata"].update(namespace="default", uid="u-1")
    workload = render_workload(body, job, plan)
    requests = [ps["template"]["spec"]["containers"][0]["resources"]["requests"]
                for ps in workload["spec"]["podSets"]]
    assert requests and all((r["cpu"], r["memory"]) == ("4", "8Gi") for r in requests)


def test_scale_quantity_is_exact_in_the_same_unit() -> None:
    assert [scale_quantity(q, n) for q, n in (("4", 2), ("8Gi", 2), ("500m", 3), ("1.5", 2),
                                              (3, 2), ("1e3", 2), ("0.25", 4))] == [
        "8", "16Gi", "1500m", "3", 6, "2e3", "1"]


def test_resume_from_reaches_every_rank_and_is_absent_by_default() -> None:
    body = _body()
    plan, pods = _pods(body)
    assert all(RESUME_FROM not in {e["name"] for e in p["spec"]["containers"][0]["env"]} for p in pods)
    body["spec"]["training"]["checkpoint"]["resumeFrom"] = "digits-old"
    job = parse_job(body)
    envs = render_rank_envs(plan, job, master_addr="m", master_port=1, simulated=False)
    assert [e[RESUME_FROM] for e in envs] == ["digits-old"] * plan.world_size
