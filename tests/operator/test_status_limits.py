"""Status lists that grow with the cluster stay within the CRD's ``maxItems`` (issue 18).

At 2,000 nodes ``bench_operator.py --real`` found 1,466 excluded nodes in ``status.plan.excluded``
against ``maxItems: 256``: the real API server refused every status write (422) and no job was
planned. The status builder now keeps at most :data:`limits.EXCLUDED_MAX` nodes, every reason in
turn, and counts all of them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import jsonschema
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from k8s import crdcheck  # noqa: E402

from hetero_operator.api import limits  # noqa: E402
from hetero_operator.api import types as model  # noqa: E402
from hetero_operator.api.spec import parse_job  # noqa: E402
from hetero_operator.cluster.inventory import build_inventory  # noqa: E402
from hetero_operator.lifecycle.status import excluded_status, plan_status  # noqa: E402
from hetero_operator.planning.plan import plan_job  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CHART_CRD = ROOT / "charts" / "heterotrain" / "crds" / "heterotrainingjobs.heterotrain.io.yaml"
PLAN_SCHEMA = crdcheck.openapi_schema(crdcheck.load_crd())["properties"]["status"]["properties"]["plan"]
KINDS = [("NVIDIA-A100-SXM4-80GB", "8.0", "81920", "ampere"), ("Tesla-T4", "7.5", "15360", "turing"),
         ("Tesla-V100-SXM2-16GB", "7.0", "16384", "volta"), ("NVIDIA-H100-80GB-HBM3", "9.0", "81559", "hopper")]


def _node(i: int) -> dict[str, Any]:
    product, cc, mem, family = KINDS[i % len(KINDS)]
    major, minor = cc.split(".")
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": f"node-{i:04d}", "labels": {
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.family": family, "nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": mem,
        "nvidia.com/gpu.compute.major": major, "nvidia.com/gpu.compute.minor": minor,
        "nvidia.com/cuda.driver-version.full": "550.107.02",
        "nvidia.com/cuda.runtime-version.full": "12.4", "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "4"}},
        "status": {"capacity": {"nvidia.com/gpu": "4"}, "allocatable": {"nvidia.com/gpu": "4"},
                   "conditions": [{"type": "Ready", "status": "True"}]}}


def _nodes_2000() -> list[dict[str, Any]]:
    """2,000 nodes, 1,466 of them unusable: 1,400 NotReady, 60 tainted, 6 with a bad label."""
    nodes = [_node(i) for i in range(2000)]
    for n in nodes[:1400]:
        n["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    for n in nodes[1400:1460]:
        n["spec"] = {"taints": [{"key": "example.com/maintenance", "effect": "NoSchedule"}]}
    for n in nodes[1460:1466]:
        n["metadata"]["labels"]["nvidia.com/gpu.memory"] = "lots"
    return nodes


def _job() -> dict[str, Any]:
    body = yaml.safe_load((ROOT / "examples" / "digits.yaml").read_text())
    body["spec"]["gpus"] = {"ranks": 8, "minRanks": 8}
    body["spec"]["training"]["globalBatchSize"] = 128
    return body


def _max_items(path: str) -> int:
    node: Any = PLAN_SCHEMA
    for key in path.split("."):
        node = node["properties"][key]
    return node["maxItems"]


def test_the_limits_are_the_crds_max_items_in_both_copies() -> None:
    assert _max_items("excluded") == limits.EXCLUDED_MAX == 256
    assert _max_items("excludedReasons") == limits.EXCLUDED_REASONS_MAX == 64
    assert CHART_CRD.read_text() == crdcheck.CRD_PATH.read_text()


def test_a_2000_node_plan_status_validates_against_the_crd() -> None:
    plan = plan_job(parse_job(_job()), build_inventory(_nodes_2000()))
    assert isinstance(plan, model.Plan)
    assert len(plan.excluded) == 1466
    status = {"plan": plan_status("digits", plan, master_addr="digits-0.digits", master_port=29500)}
    st = status["plan"]
    assert len(st["excluded"]) == 256
    assert st["excludedCount"] == 1466
    assert st["excludedReasons"] == [{"reason": "NotReady", "count": 1400},
                                     {"reason": "Tainted", "count": 60},
                                     {"reason": "MalformedLabels", "count": 6}]
    # every reason shown: the 6 and the 60 whole, NotReady fills the rest, in node order
    shown = [e["reason"] for e in st["excluded"]]
    assert (shown.count("NotReady"), shown.count("Tainted"), shown.count("MalformedLabels")) == (190, 60, 6)
    assert [e["node"] for e in st["excluded"]] == (
        [f"node-{i:04d}" for i in range(190)] + [f"node-{i:04d}" for i in range(1400, 1466)])
    status_schema = crdcheck.openapi_schema(crdcheck.load_crd())["properties"]["status"]
    assert crdcheck.prune(status_schema, status) == status  # excludedCount/-Reasons declared
    jsonschema.validate(status, crdcheck.to_json_schema(status_schema))


def _ex(node: str, reason: str) -> model.ExcludedNode:
    return model.ExcludedNode(node=node, reason=reason, message=f"{node} {reason}")


def test_a_list_within_the_limit_is_kept_whole_in_order() -> None:
    excluded = [_ex("a", "Tainted"), _ex("b", "NotReady"), _ex("c", "Tainted")]
    assert excluded_status(excluded) == {
        "excluded": [{"node": n, "reason": r, "message": f"{n} {r}"}
                     for n, r in (("a", "Tainted"), ("b", "NotReady"), ("c", "Tainted"))],
        "excludedCount": 3,
        "excludedReasons": [{"reason": "Tainted", "count": 2}, {"reason": "NotReady", "count": 1}]}
    assert excluded_status([]) == {"excluded": [], "excludedCount": 0, "excludedReasons": []}


def test_reasons_share_the_limit_in_turn() -> None:
    excluded = sorted([_ex(f"a{i:03d}", "A") for i in range(300)] + [_ex(f"b{i:03d}", "B") for i in range(200)],
                      key=lambda e: e.node)
    st = excluded_status(excluded)
    assert [e["node"] for e in st["excluded"]] == (
        [f"a{i:03d}" for i in range(128)] + [f"b{i:03d}" for i in range(128)])
    assert st["excludedCount"] == 500
    assert st["excludedReasons"] == [{"reason": "A", "count": 300}, {"reason": "B", "count": 200}]
