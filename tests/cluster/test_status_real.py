"""The real API server applies the status schema's ``maxItems`` (issue 18): the operator's capped
``status.plan.excluded`` of a 1,466-exclusion plan is accepted, the uncapped list it used to write
is refused with 422 (the stand-in never checked this; found by ``bench_operator.py --real``).
No operator runs here: the test writes the status itself."""

from __future__ import annotations

import kubernetes
import pytest
import yaml
from realcluster import GROUP, PLURAL, REPO, VERSION, RealCluster

from hetero_operator.api import types as model
from hetero_operator.lifecycle.status import excluded_status

REASONS = ("NotReady",) * 1400 + ("Tainted",) * 60 + ("MalformedLabels",) * 6
EXCLUDED = [model.ExcludedNode(node=f"node-{i:04d}", reason=r, message="node is not usable")
            for i, r in enumerate(REASONS)]


def _job(real: RealCluster, name: str) -> str:
    ns = real.namespace(name)
    body = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    body["metadata"]["name"] = name
    real.apply(body, ns)
    return ns


def _patch_status(real: RealCluster, ns: str, name: str, plan: dict) -> dict:
    return real.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, ns, PLURAL, name, {"status": {"phase": "Pending", "plan": plan}})


def test_the_capped_excluded_list_is_accepted_and_the_uncapped_one_refused(real: RealCluster) -> None:
    ns = _job(real, "many-excluded")
    written = _patch_status(real, ns, "many-excluded", {"worldSize": 8, **excluded_status(EXCLUDED)})
    plan = written["status"]["plan"]
    assert (len(plan["excluded"]), plan["excludedCount"]) == (256, 1466)
    assert plan["excludedReasons"] == [{"reason": "NotReady", "count": 1400},
                                       {"reason": "Tainted", "count": 60},
                                       {"reason": "MalformedLabels", "count": 6}]
    uncapped = [{"node": e.node, "reason": e.reason, "message": e.message} for e in EXCLUDED]
    with pytest.raises(kubernetes.client.ApiException) as err:
        _patch_status(real, ns, "many-excluded", {"worldSize": 8, "excluded": uncapped})
    assert err.value.status == 422
    assert "status.plan.excluded: Too many: 1466: must have at most 256 items" in err.value.body
