"""Real multi-process checks of the worker core (gloo on CPU), one spawn per scenario.

The 4-rank spawn runs ``rank_checks.py main`` on a simulated A100 / V100 / 2x T4 cluster with
uneven batches [3, 5, 8, 4] and asserts on what every rank wrote.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from rankproc import RANK_CHECKS, assert_ok, mixed_cluster_envs, read_rank_json, run_ranks

CASES = Path(__file__).parent.parent / "fixtures" / "cases"
TOL = 1e-6
BATCHES = [3, 5, 8, 4]


@pytest.fixture(scope="module")
def main_facts(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("main")
    runs = run_ranks([sys.executable, str(RANK_CHECKS), "main", "--out", str(out)],
                     mixed_cluster_envs(BATCHES), timeout_s=150)
    assert_ok(runs)
    return read_rank_json(out, len(BATCHES))


def load_case(name: str) -> list[dict]:
    return list(yaml.safe_load_all((CASES / name).read_text()))


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("key", ["hook/flat", "pyhook/flat", "hook/group", "hook/node",
                                 "hook/arch", "manual/group"],
                         ids=["flat fast path (weight in loss, DDP all-reduce)",
                              "flat through the Python hook", "hierarchical by topology group",
                              "hierarchical by node", "hierarchical by architecture",
                              "manual reduction after backward"])
def test_weighted_sync_equals_single_process_full_batch(main_facts: list[dict], key: str) -> None:
    """After two SGD steps with batches [3,5,8,4] (float64) params match one process on 20."""
    for facts in main_facts:
        assert facts["equivalence"][key] <= TOL


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_plain_ddp_averaging_is_wrong_for_uneven_batches(main_facts: list[dict]) -> None:
    """Negative control: DDP's 1/world averaging misses the reference by far more than 1e-6."""
    assert all(f["equivalence"]["plain_ddp"] > 1e-3 for f in main_facts)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_inter_group_bytes_counted_only_on_leaders(main_facts: list[dict]) -> None:
    """Groups [0] [1] [2,3]: leaders 0, 1, 2 send 53 float64 grads per step (2 hook + 2 manual
    steps); rank 3 sends nothing across groups."""
    sent = [f["equivalence"]["inter_group_bytes/group"] for f in main_facts]
    assert sent == [4 * 53 * 8] * 3 + [0]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_case16_hierarchical_groups_no_hang(main_facts: list[dict]) -> None:
    scenario = load_case("16-hierarchical-groups-new-group-deadlock.yaml")[0]
    for facts in main_facts:
        c16 = facts["case16"]
        assert c16["2,2"]["groups"] == scenario["expected_groups"]["intra"]
        assert [c16["2,2"]["leaders"]] == scenario["expected_groups"]["inter"]
        assert c16["3,1"]["groups"] == [[0, 1, 2], [3]] and c16["3,1"]["leaders"] == [0, 3]
        assert c16["2,2"]["sum"] == c16["3,1"]["sum"] == 10.0


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_inf_on_one_rank_makes_every_rank_skip(main_facts: list[dict]) -> None:
    """Rank 2 alone has an inf gradient: with agreement all skip; a plain scaler diverges."""
    for rank, facts in enumerate(main_facts):
        assert facts["inf_unit"]["agreeing"] == {"changed": False, "scale": 512.0}
        assert facts["inf_unit"]["plain"]["changed"] is (rank != 2)
        trainer = facts["inf_trainer"]
        assert trainer["steps"] == [{"skipped": True, "changed": False},
                                    {"skipped": False, "changed": True}]
        assert trainer["scale"] == 65536.0 / 2 and trainer["params_equal_all_ranks"]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_mixed_bf16_and_fp16_ranks_skip_together_without_hanging(main_facts: list[dict]) -> None:
    """Ranks 0-1 bf16, ranks 2-3 fp16: all share one loss scale; rank 2's inf makes all skip."""
    for rank, facts in enumerate(main_facts):
        mixed = facts["inf_mixed"]
        assert mixed["steps"] == [{"skipped": True, "changed": False},
                                  {"skipped": False, "changed": True}]
        assert mixed["scale"] == 32768.0  # every rank scales when one runs fp16
        assert mixed["params_equal_all_ranks"]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_loader_gives_equal_steps_and_covers_epoch_once(main_facts: list[dict]) -> None:
    """101 samples, global batch 20: 5 steps per epoch on every rank, 1 dropped; a split
    change after the third batch of epoch 1 keeps the epoch's indices distinct."""
    for facts in main_facts:
        assert facts["loader"]["counts"] == [5, 5] and facts["loader"]["epoch"] == 2
    for epoch in (0, 1):
        seen = [i for f in main_facts for e, idx in f["loader"]["seen"] if e == epoch for i in idx]
        assert len(seen) == len(set(seen)) == 100
        assert set(seen) <= set(range(101))
    steps_after_change = [len(idx) for e, idx in main_facts[0]["loader"]["seen"] if e == 1]
    assert steps_after_change == [3, 3, 3, 4, 4]


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_stream_trains_the_full_batch_update_on_uneven_ranks(tmp_path: Path) -> None:
    """An IterableDataset through ``t.loader`` (2 workers per rank), batches [3, 5, 8, 4] then
    reversed after step 1: every rank took its share of each 20 samples of the stream, the 7 left
    over were dropped on every rank, and the parameters equal one process on the full batches."""
    runs = run_ranks([sys.executable, str(RANK_CHECKS), "stream", "--out", str(tmp_path)],
                     mixed_cluster_envs(BATCHES), timeout_s=150)
    assert_ok(runs)
    facts = read_rank_json(tmp_path, len(BATCHES))
    assert [f["sizes"] for f in facts] == [[3, 4, 4], [5, 8, 8], [8, 5, 5], [4, 3, 3]]
    for f in facts:
        assert f["diff"] <= TOL
        assert (f["epoch"], f["position"]) == (1, {"stream": True, "epoch": 1, "consumed": 0})


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_case15_uneven_batches_12_and_6(tmp_path: Path) -> None:
    """Two gloo ranks with 12 and 6 of 18 samples equal one process on all 18 (within 1e-6);
    naive averaging (weights 1/2, 1/2) does not."""
    scenario = load_case("15-uneven-batch-gradient-weighting.yaml")[0]
    batches = [r["local_batch"] for r in scenario["ranks"]]
    assert batches == [12, 6] and scenario["global_batch"] == 18
    runs = run_ranks([sys.executable, str(RANK_CHECKS), "case15", "--out", str(tmp_path)],
                     mixed_cluster_envs(batches), timeout_s=90)
    assert_ok(runs)
    for facts in read_rank_json(tmp_path, 2):
        assert facts["weighted"] < scenario["tolerance"]
        assert facts["naive"] > scenario["tolerance"]
