"""Round-4 node-side cases of ``shared/cases`` (copied to ``tests/fixtures/cases``) as planner tests,
in the style of tests/operator/test_cases.py: 52 (the GPU Operator's driver upgrade under way).

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


@pytest.mark.parametrize("prefix", ["52"])
def test_every_round_4_node_case_is_copied_into_the_project(prefix: str) -> None:
    assert len(list(CASES.glob(f"{prefix}-*.yaml"))) == 1
    assert len(list(CASES.glob(f"{prefix}-*.md"))) == 1
