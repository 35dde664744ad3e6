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


@pytest.mark.parametrize("mode, nbytes, stats", [
    ("None", 9_800_000, [_stats(20, 2.0)]),         # None's wait holds the stragglers' compute
    ("Full", 0, [_stats(20, 2.0)]),                  # one GPU type: nothing crosses
    ("Full", 9_800_000, [_stats(5, 2.0)]),           # too short to measure
    ("Full", 9_800_000, [_stats(20, 0.0)]),          # no wait recorded
    ("Full", 9_800_000, []),
])
def test_what_does_not_measure_the_link_is_not_learned(mode: str, nbytes: int, stats: list) -> None:
    assert linklearning.observation(mode, step_cross_type_bytes=nbytes, stats=stats) is None


def test_the_next_full_plan_moves_its_bytes_at_the_learned_rate() -> None:
    doc = yaml.safe_load((ROOT / "examples" / "lm-large.yaml").read_text())
    doc["spec"]["training"]["sharding"] = "Full"
    doc["spec"]["training"]["referenceSamplesPerSecond"] = 500
    doc["spec"]["gpus"]["ranks"] = 2
    job = parse_job(doc)
    link = LinkSettings(inter_node_gbps=0.1)
    before = plan_job(job, build_inventory(NODES), inputs=PlanInputs(link=link))
    assert isinstance(before, model.Plan) and before.memory is not None
    full = next(o for o in before.memory.options if o.mode == "Full")
    nbytes = full.step_cross_type_bytes
    assert nbytes and full.predicted_step_s
    configured_s = nbytes * 8 / 0.1e9
    # the same plan with a learned rate of 8 MB/s (64 Mbit/s): the cross-type seconds grow from
    # bytes / 12.5 MB/s to bytes / 8 MB/s, the compute stays
    entries = merge({}, [linklearning.observation("Full", step_cross_type_bytes=nbytes,
                                                  stats=[_stats(20, 20 * nbytes / 8e6)],
                                                  unix_s=1.0)], now_s=1.0)
    learned = {(e.gpu_type, e.precision): (e,) for e in entries.values()}
    assert linklearning.learned_rates(learned) == {"Full": pytest.approx(8e6)}
    after = plan_job(job, build_inventory(NODES), inputs=PlanInputs(link=link, learned=learned))
    assert isinstance(after, model.Plan) and after.memory is not None
    relearned = next(o for o in after.memory.options if o.mode == "Full")
    assert relearned.step_cross_type_bytes == nbytes
    assert relearned.predicted_step_s == pytest.approx(
        full.predicted_step_s - configured_s + nbytes / 8e6, rel=1e-9)
