"""``spec.elastic`` (issue 31, item 1): parsed with errors naming the field and the fix, declared in
the CRD (structural schema and the CEL rule minRanks <= maxRanks), and refused at plan time with a
Kueue queue, with sharded model state and with pipeline stages, each naming why and the fix."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import job_manifest
from k8s import crdcheck

from hetero_operator.api import types as model
from hetero_operator.api.elasticspec import ElasticSpec
from hetero_operator.api.errors import SpecError
from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.elasticplan import ELASTIC_NOT_PLANNED
from hetero_operator.planning.plan import plan_job

ROOT = Path(__file__).resolve().parents[2]
MIXED = yaml.safe_load((ROOT / "examples" / "clusters" / "mixed.yaml").read_text())["items"]


def _manifest(elastic: Any, **training: Any) -> dict[str, Any]:
    body = job_manifest(ranks=3, global_batch=24, gpus={"selection": "All"},
                        training={"memoryReserveMiB": 0, **training})
    body["spec"]["elastic"] = elastic
    return body


def test_parsed_with_defaults() -> None:
    assert parse_job(_manifest({"minRanks": 2})).elastic == ElasticSpec(min_ranks=2, max_ranks=3)
    assert parse_job(_manifest({})).elastic == ElasticSpec(min_ranks=1, max_ranks=3)
    body = _manifest(None)
    del body["spec"]["elastic"]
    assert parse_job(body).elastic is None


@pytest.mark.parametrize(("elastic", "field", "says"), [
    ({"minRank": 2}, "spec.elastic.minRank", "did you mean minRanks?"),
    ({"minRanks": 3, "maxRanks": 2}, "spec.elastic.minRanks", "lower minRanks to 2 or less"),
    ({"minRanks": 4, "maxRanks": 5}, "spec.elastic.minRanks", "above spec.gpus.ranks 3"),
    ({"maxRanks": 4}, "spec.elastic.maxRanks", "lower maxRanks to 3 or less, or raise spec.gpus.ranks"),
    ({"minRanks": 0}, "spec.elastic.minRanks", "must be in 1..65536"),
    ("yes", "spec.elastic", "e.g. elastic: {minRanks: 2}"),
])
def test_errors_name_the_field_and_the_fix(elastic: Any, field: str, says: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_job(_manifest(elastic))
    assert str(caught.value).startswith(f"{field}: ") and says in str(caught.value)


def test_the_crd_declares_it_with_the_cel_rule() -> None:
    crdcheck.validate(copy.deepcopy(_manifest({"minRanks": 2, "maxRanks": 3})),
                      crd=crdcheck.load_crd())
    with pytest.raises(crdcheck.Invalid, match="minRanks must be at most spec.elastic.maxRanks"):
        crdcheck.validate(copy.deepcopy(_manifest({"minRanks": 3, "maxRanks": 2})),
                          crd=crdcheck.load_crd())
    with pytest.raises(crdcheck.Invalid, match="spec.elastic"):
        crdcheck.validate(copy.deepcopy(_manifest({"minRanks": "two"})), crd=crdcheck.load_crd())


def test_an_elastic_job_plans_unsharded() -> None:
    plan = plan_job(parse_job(_manifest({"minRanks": 2}, sharding="None")), build_inventory(MIXED))
    assert isinstance(plan, model.Plan) and len(plan.ranks) == 3


@pytest.mark.parametrize(("change", "says"), [
    ({"queue": "team-a"}, "Kueue's elastic workloads must keep one ResourceFlavor"),
    ({"sharding": "Full"}, "set spec.training.sharding: None"),
    ({"sharding": "Group"}, "a lost rank's shard of the model state is held by no survivor"),
    ({"pipeline": {"blocks": 12, "microBatches": 4}}, "a lost stage's blocks are held by no other"),
    ({"rebalance": {"intervalSteps": 20}}, "remove spec.training.rebalance.intervalSteps or"),
    ({"compression": {"mode": "PowerSGD"}}, "remove spec.training.compression or spec.elastic"),
])
def test_refused_at_plan_time_naming_why_and_the_fix(change: dict[str, Any], says: str) -> None:
    body = _manifest({"minRanks": 2}, **{k: v for k, v in change.items() if k != "queue"})
    if "queue" in change:
        body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": change["queue"]}
    result = plan_job(parse_job(body), build_inventory(MIXED))
    assert isinstance(result, model.Unschedulable)
    assert result.reason == ELASTIC_NOT_PLANNED and says in result.message
    assert "spec.elastic" in result.message and ("remove" in result.message
                                                 or "sharding: None" in result.message)
