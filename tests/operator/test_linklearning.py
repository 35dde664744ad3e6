"""The learned cross-type link rate of Full sharding (issue 30, item 2: measured / predicted for
every mode): a run's collectives give the rate the next plan's Full step uses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hetero_operator.api import types as model
from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning import linklearning
from hetero_operator.planning.marginal import LinkSettings, PlanInputs
from hetero_operator.planning.plan import plan_job
from hetero_operator.planning.profiles import merge

ROOT = Path(__file__).resolve().parents[2]
NODES = yaml.safe_load((ROOT / "examples" / "clusters" / "scaled-memory.yaml").read_text())["items"]


def _stats(steps: int, wait_s: float) -> dict:
    return {"steps": steps, "comm_wait_seconds": wait_s}


def test_the_rank_that_waited_least_gives_the_rate() -> None:
    # 9.8 MB a step modelled, 20 steps; the A100 waited 2.0 s inside the collectives (only for
    # the bytes), the T4 3.5 s (for the A100's compute as well): 196 MB / 2.0 s
    got = linklearning.observation("Full", step_cross_type_bytes=9_800_000,
                                   stats=[_stats(20, 2.0), _stats(20, 3.5)], unix_s=1.0,
                                   job="lm", namespace="ns")
    assert got is not None
    assert (got.gpu_type, got.precision, got.samples_per_s) == ("link", "Full",
                                                                pytest.approx(98_000_000))
    assert (got.job, got.namespace, got.unix_s) == ("lm", "ns", 1.0)


def test_group_learns_the_effective_rate_of_its_step_end_exchange() -> None:
    # Group's 1.88 MB all-reduce among the groups a step (lm-large, 470 528 fp32 parameters,
    # 2 groups); the slowest rank waited 0.74 s over 20 steps (gather in its group, the leaders'
    # all-reduce, the broadcast): 37.6 MB / 0.74 s
    nbytes = 2 * (2 - 1) * 470_528 * 4 // 2
    got = linklearning.observation("Group", step_cross_type_bytes=nbytes,
                                   stats=[_stats(20, 0.74), _stats(20, 1.12), _stats(20, 1.14)])
    assert got is not None
    assert (got.gpu_type, got.precision) == ("link", "Group")
    assert got.samples_per_s == pytest.approx(20 * 1_882_112 / 0.74)


@pytest.mark.parametrize("mode, nbytes, stats", [
    ("None", 9_800_000, [_stats(20, 2.0)]),         # None reduces during backward (DDP's hooks)
    ("Full", 0, [_stats(20, 2.0)]),                  # one GPU type: nothing crosses
    ("Full", 9_800_000, [_stats(5, 2.0)]),           # too short to measure
    ("Full", 9_800_000, [_stats(20, 0.0)]),          # no wait recorded
    ("Full", 9_800_000, []),
])
def test_what_does_not_measure_the_link_is_not_learned(mode: str, nbytes: int, stats: list) -> None:
    assert linklearning.observation(mode, step_cross_type_bytes=nbytes, stats=stats) is None


def _roomy_nodes() -> list[dict]:
    """The example's nodes with the T4's memory label raised to 64 MiB (as bench_memory's
    steptime part), so that every mode fits."""
    nodes = yaml.safe_load((ROOT / "examples" / "clusters" / "scaled-memory.yaml").read_text())["items"]
    for node in nodes:
        if node["metadata"]["name"] == "node-t4":
            node["metadata"]["labels"]["nvidia.com/gpu.memory"] = "64"
    return nodes


@pytest.mark.parametrize("mode", ["Full", "Group"])
def test_the_next_plan_moves_its_bytes_at_the_learned_rate(mode: str) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "lm-large.yaml").read_text())
    doc["spec"]["training"]["sharding"] = mode
    doc["spec"]["training"]["referenceSamplesPerSecond"] = 500
    doc["spec"]["gpus"]["ranks"] = 2
    job = parse_job(doc)
    link = LinkSettings(inter_node_gbps=0.1)
    nodes = NODES if mode == "Full" else _roomy_nodes()
    before = plan_job(job, build_inventory(nodes), inputs=PlanInputs(link=link))
    assert isinstance(before, model.Plan) and before.memory is not None
    option = next(o for o in before.memory.options if o.mode == mode)
    nbytes = option.step_cross_type_bytes
    assert nbytes and option.predicted_step_s
    if mode == "Group":  # an A100 group and a T4 group: one all-reduce of the gradients
        assert nbytes == 2 * (2 - 1) * job.training.model_parameters * 4 // 2
    configured_s = nbytes * 8 / 0.1e9
    # the same plan with a learned rate of 8 MB/s (64 Mbit/s): the cross-type seconds grow from
    # bytes / 12.5 MB/s to bytes / 8 MB/s, the compute stays
    entries = merge({}, [linklearning.observation(mode, step_cross_type_bytes=nbytes,
                                                  stats=[_stats(20, 20 * nbytes / 8e6)],
                                                  unix_s=1.0)], now_s=1.0)
    learned = {(e.gpu_type, e.precision): (e,) for e in entries.values()}
    assert linklearning.learned_rates(learned) == {mode: pytest.approx(8e6)}
    after = plan_job(job, build_inventory(nodes), inputs=PlanInputs(link=link, learned=learned))
    assert isinstance(after, model.Plan) and after.memory is not None
    relearned = next(o for o in after.memory.options if o.mode == mode)
    assert relearned.step_cross_type_bytes == nbytes
    assert relearned.predicted_step_s == pytest.approx(
        option.predicted_step_s - configured_s + nbytes / 8e6, rel=1e-9)
