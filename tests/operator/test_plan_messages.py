"""Unschedulable messages that name the real cause (issue 22, point 6): a short product name in
``allowedProducts`` gets "did you mean", a product no node has is said to be absent."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from hetero_operator.api.spec import parse_job
from hetero_operator.api.types import Unschedulable
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.local.plan import load_objects
from hetero_operator.planning.plan import plan_job

ROOT = Path(__file__).parents[2]
DIGITS = yaml.safe_load((ROOT / "examples" / "digits.yaml").read_text())
NODES = load_objects(ROOT / "examples" / "clusters" / "mixed.yaml", "Node")


def _plan(allowed: list[str]) -> Unschedulable:
    doc = copy.deepcopy(DIGITS)
    doc["spec"]["gpus"].update(allowedProducts=allowed, minRanks=1)
    result = plan_job(parse_job(doc), build_inventory(NODES))
    assert isinstance(result, Unschedulable)
    return result


def test_a_short_product_name_gets_did_you_mean_the_full_one():
    result = _plan(["A100"])
    a100 = next(e for e in result.excluded if e.node == "node-a100")
    assert a100.message == (
        "NVIDIA-A100-SXM4-40GB is not in spec.gpus.allowedProducts; A100 matches no product: the "
        "list takes full product names as GPU Feature Discovery labels them "
        "(nvidia.com/gpu.product): did you mean NVIDIA-A100-SXM4-40GB?")
    t4 = next(e for e in result.excluded if e.node == "node-t4")
    assert t4.message == "Tesla-T4 is not in spec.gpus.allowedProducts"


def test_a_product_no_node_has_is_named_as_absent():
    result = _plan(["NVIDIA-H100-80GB-HBM3"])
    assert ("To plan: add 1 NVIDIA-H100-80GB-HBM3 GPU: no node has one of "
            "spec.gpus.allowedProducts (the nodes have NVIDIA-A100-SXM4-40GB, Tesla-T4, "
            "Tesla-V100-SXM2-16GB); or allow") in result.message


def test_too_little_memory_on_every_node_is_one_hint_naming_the_largest_device():
    doc = copy.deepcopy(DIGITS)
    doc["spec"]["gpus"]["minMemoryMiB"] = 50000
    result = plan_job(parse_job(doc), build_inventory(NODES))
    assert isinstance(result, Unschedulable)
    assert result.message.count("lower spec.gpus.minMemoryMiB") == 1
    assert result.message.endswith(
        "or lower spec.gpus.minMemoryMiB (NVIDIA-A100-SXM4-40GB has 40960 MiB < "
        "spec.gpus.minMemoryMiB 50000; 2 more nodes alike)")
