"""Round-4 node-side cases of ``shared/cases`` (copied to ``tests/fixtures/cases``) as planner tests,
in the style of tests/operator/test_cases.py: 52 (the GPU Operator's driver upgrade under way) and
54 (a GPU shared through MPS).

The cases' job fields are illustrative (``hetero.example.io``); each test maps them onto our CRD.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import make_job

from hetero_operator.api import types as model
from hetero_operator.cluster import driverupgrade
from hetero_operator.cluster.gputable import base_speed
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.plan import plan_job

CASES = Path(__file__).resolve().parent.parent / "fixtures" / "cases"


def case_docs(prefix: str) -> list[dict[str, Any]]:
    (path,) = CASES.glob(f"{prefix}-*.yaml")
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def case_nodes(prefix: str, *names: str) -> list[dict[str, Any]]:
    nodes = copy.deepcopy(case_docs(prefix)[0]["items"])
    return [n for n in nodes if not names or n["metadata"]["name"] in names]


def ranks_per_node(job: Any, nodes: list[dict[str, Any]]) -> dict[str, int]:
    plan = plan_job(job, build_inventory(nodes))
    assert isinstance(plan, model.Plan), getattr(plan, "message", plan)
    out: dict[str, int] = {}
    for r in plan.ranks:
        out[r.node] = out.get(r.node, 0) + 1
    return out


# --- 52 --------------------------------------------------------------------------------------

def _job52() -> Any:
    """Case 52's job: 4 ranks, all or nothing (its ``groups``/``minRanks`` in our fields)."""
    return make_job(ranks=4, min_ranks=4, global_batch=64)


def test_52_the_case_lists_the_upgrade_controller_s_in_progress_states() -> None:
    assert set(case_docs("52")[2]["in_progress_states"]) == driverupgrade.IN_PROGRESS_STATES


@pytest.mark.parametrize("state", sorted(driverupgrade.IN_PROGRESS_STATES))
def test_52_a_node_mid_upgrade_is_excluded_naming_the_label_even_uncordoned(state: str) -> None:
    nodes = case_nodes("52", "node-a", "node-c")
    nodes[0]["metadata"]["labels"][driverupgrade.UPGRADE_STATE_LABEL] = state
    assert ranks_per_node(_job52(), nodes) == {"node-c": 4}
    (excluded,) = build_inventory(nodes).excluded
    assert (excluded.node, excluded.reason) == ("node-a", driverupgrade.DRIVER_UPGRADE)
    assert f"nvidia.com/gpu-driver-upgrade-state={state}" in excluded.message


def test_52_upgrade_required_is_a_preference_not_a_refusal() -> None:
    assert ranks_per_node(_job52(), case_nodes("52", "node-b", "node-c")) == {"node-c": 4}
    assert ranks_per_node(_job52(), case_nodes("52", "node-b", "node-d")) == {"node-b": 4}
    # the control: the cordon rule alone
    assert ranks_per_node(_job52(), case_nodes("52", "node-c", "node-d")) == {"node-c": 4}


def test_52_a_node_waiting_for_its_upgrade_only_tops_up_what_the_others_lack() -> None:
    six = make_job(ranks=6, min_ranks=6, global_batch=60)
    assert ranks_per_node(six, case_nodes("52", "node-b", "node-c")) == {"node-c": 4, "node-b": 2}


# --- 54 --------------------------------------------------------------------------------------

L40S_SPEED = base_speed("NVIDIA-L40S", "ada-lovelace")[0]


def _job54(global_batch: int) -> Any:
    """Case 54's job: 2 ranks, 300 MiB per sample and a 2048 MiB reserve."""
    return make_job(ranks=2, min_ranks=2, global_batch=global_batch,
                    training={"memoryPerSampleMiB": 300, "memoryReserveMiB": 2048})


def test_54_an_mps_replica_has_its_share_of_the_card_s_memory_and_speed() -> None:
    inv = build_inventory(case_nodes("54"))
    assert [(d.node, d.product, d.memory_mib, round(d.relative_speed, 6), d.total, d.time_sliced_replicas,
             d.resource_name) for d in inv.devices()] == [
        ("node-a", "NVIDIA-A100-SXM4-40GB", 40960, 1.0, 1, 1, "nvidia.com/gpu"),
        ("node-b", "NVIDIA-L40S", 4606, round(L40S_SPEED / 10, 6), 1, 10, "nvidia.com/gpu")]


def test_54_the_mps_rank_gets_a_batch_its_share_holds() -> None:
    """The case's global batch 256 does not fit the A100's own cap either ((40960 - 2048) // 300 =
    129, + 8 = 137): we keep the global batch exact and refuse it (docs/planning.md, as in case
    15), so the rank figures are checked with 128."""
    plan = plan_job(_job54(128), build_inventory(case_nodes("54")))
    assert isinstance(plan, model.Plan), getattr(plan, "message", plan)
    (rank,) = [r for r in plan.ranks if r.node == "node-b"]
    assert (rank.memory_mib, rank.local_batch, rank.resource_name) == (4606, 8, "nvidia.com/gpu")
    assert rank.relative_speed <= 1.5 * L40S_SPEED / 10
    assert rank.local_batch <= (4606 - 2048) // 300
    refused = plan_job(_job54(256), build_inventory(case_nodes("54")))
    assert isinstance(refused, model.Unschedulable) and refused.reason == "InsufficientMemory"


def test_54_time_slicing_keeps_the_whole_card_and_a_renamed_resource_is_never_requested_as_gpu() -> None:
    control = case_nodes("54")
    control[1]["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] = "time-slicing"
    (_, l40s) = build_inventory(control).devices()
    assert (l40s.memory_mib, l40s.relative_speed) == (46068, L40S_SPEED)
    none = case_nodes("54")
    none[1]["metadata"]["labels"].update({"nvidia.com/gpu.sharing-strategy": "none",
                                          "nvidia.com/gpu.replicas": "1",
                                          "nvidia.com/gpu.product": "NVIDIA-L40S"})
    none[1]["status"]["allocatable"] = {"nvidia.com/gpu": "1"}
    assert [d.memory_mib for d in build_inventory(none).devices()] == [40960, 46068]
    renamed = case_nodes("54")
    renamed[1]["status"]["allocatable"] = {"nvidia.com/gpu.shared": "10"}
    inv = build_inventory(renamed)
    assert [d.node for d in inv.devices()] == ["node-a"]
    assert [(e.node, e.reason) for e in inv.excluded] == [("node-b", model.NO_GPUS)]


@pytest.mark.parametrize("prefix", ["52", "54"])
def test_every_round_4_node_case_is_copied_into_the_project(prefix: str) -> None:
    assert len(list(CASES.glob(f"{prefix}-*.yaml"))) == 1
    assert len(list(CASES.glob(f"{prefix}-*.md"))) == 1
