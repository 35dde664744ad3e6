"""The communicator rule on real Gloo processes: every process group created is recorded and
checked (simulated A100 + V100 on node a, two T4 on node b; comm_ranks.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rankproc import assert_ok, mixed_cluster_envs, read_rank_json, run_ranks

from hetero_worker.comm.commplan import CommRank, rule_violations
from heterotrain_common.envnames import HIERARCHIES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
SCRIPT = Path(__file__).parent / "comm_ranks.py"
BATCHES = [6, 4, 3, 3]

# The same topology as "3 types" in test_commplan.py: what NCCL the plan picks per mode on CUDA.
NCCL_AS_CUDA = {"flat": [], "group": [[0], [1], [2, 3]], "node": [[2, 3]],
                "arch": [[0], [1], [2, 3]], "auto": [[0], [1], [2, 3]]}


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("comm")
    envs = mixed_cluster_envs(BATCHES, hierarchy="auto")
    runs = run_ranks([sys.executable, str(SCRIPT), str(out)], envs, timeout_s=200,
                     HTJ_COMPRESSION="int8", HTJ_REBALANCE_INTERVAL_STEPS="1")
    assert_ok(runs)
    return read_rank_json(out, len(BATCHES))


def _as_cuda_ranks(f: dict) -> list[CommRank]:
    return [CommRank(**{**r, "on_cuda": True}) for r in f["comm_ranks"]]


def test_default_group_is_gloo_only(facts: list[dict]) -> None:
    for f in facts:
        first_backend, first_ranks = f["created_by_trainer"][0]
        assert (first_backend, first_ranks) == ("gloo", None)


def test_every_group_the_trainer_created_obeys_the_rule(facts: list[dict]) -> None:
    """Start-up probes, auto's trial syncs, the chosen layout: all recorded, none violates."""
    for f in facts:
        ranks = [CommRank(**r) for r in f["comm_ranks"]]
        created = [(b, r) for b, r in f["created_by_trainer"]]
        assert len(created) > 5  # probes + trials + layout really went through the spy
        assert rule_violations(ranks, created) == []
        assert rule_violations(_as_cuda_ranks(f), created) == []  # all Gloo: holds even on CUDA


def test_probe_groups_are_destroyed(facts: list[dict]) -> None:
    """After auto's probes only the default group and the chosen layout's groups are alive."""
    for f in facts:
        assert f["destroyed_by_trainer"] > 0
        assert f["live_groups"] == f["expected_live"]
        assert f["live_after_modes"] == f["expected_live"]  # the per-mode groups went too


def test_ddp_is_built_on_a_group_that_obeys_the_rule(facts: list[dict]) -> None:
    for f in facts:
        assert f["ddp_backend"] == "gloo" and f["ddp_size"] == len(BATCHES)


@pytest.mark.parametrize("mode", HIERARCHIES)
def test_nccl_would_be_chosen_only_for_same_type_groups(facts: list[dict], mode: str) -> None:
    """With CUDA injected, the plan asks for NCCL exactly in the one-type groups."""
    for f in facts:
        got = f["as_cuda"][mode]
        assert got["world_backend"] == "gloo"
        nccl = [ranks for backend, ranks in got["planned"] if backend == "nccl"]
        # each in order; a hierarchy's multi-rank groups also get the pipeline's broadcast copy
        assert [r for i, r in enumerate(nccl) if r not in nccl[:i]] == NCCL_AS_CUDA[mode]
        assert rule_violations(_as_cuda_ranks(f), [tuple(p) for p in got["planned"]]) == []
        assert got["sum"] == 10.0  # 1 + 2 + 3 + 4 through the planned groups


def test_every_rank_reported_its_build(facts: list[dict]) -> None:
    import torch
    for f in facts:
        assert {r["torch_build"] for r in f["comm_ranks"]} == {torch.__version__}
        assert [r["gpu_type"] for r in f["comm_ranks"]] == [
            "NVIDIA-A100-SXM4-40GB", "Tesla-V100-SXM2-16GB", "Tesla-T4", "Tesla-T4"]
