"""shared/cases/51 (copied to tests/fixtures/cases): a ReadWriteOnce checkpoint claim while the
ranks span 3 nodes.  Our policy (:mod:`hetero_operator.lifecycle.rwoclaims`): the job is planned
onto the one node that holds the most ranks (at least ``minRanks``), with a Warning naming the
claim and ``ReadWriteOnce``; when no node holds ``minRanks`` it waits ``Pending``
(``ReadWriteOnceClaim``) naming the claim and the fix.  A ReadWriteMany claim spreads as planned.

The case's job fields are illustrative (``checkpoint: {path, claim}``, ``podTemplate``); they map
onto ``spec.training.checkpoint.{path, persistentVolumeClaim}`` and ``spec.worker.template``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from hetero_operator.api import types as model
from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.lifecycle import rwoclaims
from hetero_operator.planning.plan import plan_job

REPO = Path(__file__).resolve().parents[2]
CASE = REPO / "tests" / "fixtures" / "cases" / "51-rwo-checkpoint-claim-across-nodes.yaml"
DOCS = [d for d in yaml.safe_load_all(CASE.read_text()) if d]
PVCS = {d["metadata"]["name"]: d for d in DOCS if d.get("kind") == "PersistentVolumeClaim"}
NODES = next(d for d in DOCS if d.get("kind") == "NodeList")["items"]
CASE_JOB = next(d for d in DOCS if d.get("kind") == "HeteroTrainingJob")


def _job(claim: str, *, min_ranks: int = CASE_JOB["spec"]["minRanks"], in_template: bool = False) -> Any:
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"] = {"name": CASE_JOB["metadata"]["name"], "namespace": CASE_JOB["metadata"]["namespace"]}
    body["spec"]["gpus"] = {"ranks": CASE_JOB["spec"]["ranks"], "minRanks": min_ranks}
    body["spec"]["training"]["checkpoint"] = {"path": CASE_JOB["spec"]["checkpoint"]["path"]}
    if in_template:  # the case's user claim in the pod template
        volume = copy.deepcopy(CASE_JOB["spec"]["podTemplate"]["volumes"][0])
        volume["persistentVolumeClaim"]["claimName"] = claim
        body["spec"]["worker"]["template"] = {"spec": {"volumes": [volume]}}
    else:
        body["spec"]["training"]["checkpoint"]["persistentVolumeClaim"] = claim
    return parse_job(body)


def _confined(job: Any, pvcs: dict[str, Any] = PVCS) -> tuple[model.Plan, rwoclaims.Confined]:
    plan = plan_job(job, build_inventory(NODES))
    assert isinstance(plan, model.Plan), plan
    claims = rwoclaims.one_node_claims(rwoclaims.claim_uses(job), pvcs)
    return plan, rwoclaims.confine(job.name, plan, claims, min_ranks=job.gpus.min_ranks, plan_on=lambda node: plan_job(
        job, build_inventory([n for n in NODES if n["metadata"]["name"] == node])))


@pytest.mark.parametrize("in_template", [False, True], ids=["checkpoint claim", "template volume"])
def test_51_a_rwo_claim_plans_the_job_onto_one_node_with_a_warning_naming_it(in_template: bool) -> None:
    whole, confined = _confined(_job("ckpt-rwo", in_template=in_template))
    assert whole.nodes == ("node-a", "node-b", "node-c") and whole.world_size == 4  # the case's spread
    plan = confined.plan
    assert isinstance(plan, model.Plan)
    assert plan.nodes == ("node-c",) and plan.world_size == 2  # the two T4s: the most ranks on one node
    path = "spec.worker.template.spec.volumes[0]" if in_template else "spec.training.checkpoint.persistentVolumeClaim"
    assert confined.warning == (
        f"PersistentVolumeClaim ckpt-rwo ({path}) is ReadWriteOnce: it attaches to one node at a time, so "
        "the job runs on node node-c only (2 ranks; the plan spans 3 nodes (node-a, node-b, node-c) with 4); "
        "use a ReadWriteMany claim (NFS, CephFS, a CSI file system) or object storage for what every rank "
        "shares to use them all.")


def test_51_a_rwo_claim_and_no_node_holding_min_ranks_waits_naming_the_claim_and_the_fix() -> None:
    _, confined = _confined(_job("ckpt-rwo", min_ranks=3))
    refusal = confined.plan
    assert isinstance(refusal, model.Unschedulable) and refusal.reason == "ReadWriteOnceClaim"
    assert refusal.message.startswith("PersistentVolumeClaim ckpt-rwo (spec.training.checkpoint.persistentVolumeClaim) "
                                      "is ReadWriteOnce: it attaches to one node at a time, the plan spans 3 nodes")
    assert "no one of them holds spec.gpus.minRanks=3; use a ReadWriteMany claim" in refusal.message
    assert confined.warning == ""


def test_51_control_a_rwx_claim_spreads_over_every_node_without_a_warning() -> None:
    whole, confined = _confined(_job("ckpt-rwx"))
    assert confined.plan is whole and confined.plan.nodes == ("node-a", "node-b", "node-c")
    assert confined.warning == ""


def test_51_a_read_write_once_pod_claim_refuses_a_plan_of_several_pods() -> None:
    pvcs = {"ckpt-rwo": copy.deepcopy(PVCS["ckpt-rwo"])}
    pvcs["ckpt-rwo"]["status"]["accessModes"] = ["ReadWriteOncePod"]
    _, confined = _confined(_job("ckpt-rwo"), pvcs)
    assert isinstance(confined.plan, model.Unschedulable)
    assert confined.plan.message.startswith("PersistentVolumeClaim ckpt-rwo (spec.training.checkpoint."
                                            "persistentVolumeClaim) is ReadWriteOncePod: one pod at a time, "
                                            "and the plan needs 3 pods")


def test_51_the_bound_volumes_modes_win_and_an_unknown_claim_is_left_to_the_kubelet() -> None:
    pvc = {"spec": {"accessModes": ["ReadWriteOnce"]}, "status": {"accessModes": ["ReadWriteMany"]}}
    assert rwoclaims.access_modes(pvc) == {"ReadWriteMany"}
    assert rwoclaims.access_modes({"spec": {"accessModes": ["ReadWriteOnce"]}}) == {"ReadWriteOnce"}
    uses = rwoclaims.claim_uses(_job("ckpt-rwo"))
    assert rwoclaims.one_node_claims(uses, {"ckpt-rwo": None}) == ()


def test_51_the_case_is_copied_into_the_project() -> None:
    assert CASE.with_suffix(".md").read_text().startswith("# 51 - A ReadWriteOnce claim")
    assert set(PVCS) == {"ckpt-rwo", "ckpt-rwx"} and len(NODES) == 3
