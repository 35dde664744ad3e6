"""Pipeline stages across GPU types (issue 30, item 3, first slice) on 3 real Gloo rank
processes: the planner's uneven split [8, 3, 1] of a 12-block float64 model, 4 micro-batches,
under GPipe and 1F1B; after each of 2 SGD steps every stage's parameters equal one process
training the whole model on the whole batch (within 1e-6), and the mean of the micro-batch
losses equals the whole-batch loss. Plus the cut itself and its refusals, in-process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from torch import nn

from hetero_worker.runtime.simulation import free_port
from hetero_worker.stages.layout import StageLayout
from hetero_worker.stages.split import stage_bounds, stage_module
from rankproc import assert_ok, read_rank_json, run_ranks

SCRIPT = Path(__file__).parent / "stages_ranks.py"
WORLD = 3
TOL = 1e-6


def run_stage_ranks(out: Path, world: int, replicas: int) -> list[dict]:
    port = str(free_port())
    envs = [{"RANK": str(r), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": port} for r in range(world)]
    runs = run_ranks([sys.executable, str(SCRIPT), "--out", str(out), "--replicas", str(replicas)],
                     envs, timeout_s=170)
    assert_ok(runs)
    return read_rank_json(out, world)


@pytest.fixture(scope="module")
def facts(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_stage_ranks(tmp_path_factory.mktemp("stages"), WORLD, 1)


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return run_stage_ranks(tmp_path_factory.mktemp("stages2"), 2 * WORLD, 2)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_three_uneven_stages_train_equal_to_one_process(facts: list[dict], schedule: str) -> None:
    runs = [f[schedule] for f in facts]
    assert [r["blocks"] for r in runs] == [8, 3, 1]
    assert {r["dtype"] for r in runs} == {"torch.float64"}
    for rank, run in enumerate(runs):
        assert len(run["diffs"]) == 2
        assert max(run["diffs"]) < TOL, (schedule, rank, run["diffs"])
        assert run["moved"] > 1e-3, (schedule, rank)  # the steps really changed the stage
    assert runs[0]["loss_diffs"] == runs[1]["loss_diffs"] == []
    assert len(runs[2]["loss_diffs"]) == 2 and max(runs[2]["loss_diffs"]) < TOL


@pytest.mark.timeout(200)
@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_two_replicas_per_stage_train_equal_to_one_process(replicated: list[dict],
                                                           schedule: str) -> None:
    # stage i = ranks i and i + 3; each pipeline takes half the batch, replicas average gradients
    assert [f["place"] for f in replicated] == [[0, 0], [1, 0], [2, 0], [0, 1], [1, 1], [2, 1]]
    for rank, f in enumerate(replicated):
        run = f[schedule]
        assert run["blocks"] == [8, 3, 1][rank % 3]
        assert len(run["diffs"]) == 2 and max(run["diffs"]) < TOL, (schedule, rank, run["diffs"])
        assert run["moved"] > 1e-3


@pytest.mark.parametrize(("stage_ranks", "message"), [
    (((0, 1), (2,)), r"same number of replicas in this version, got \[2, 1\]"),
    (((0, 1), (1, 2)), r"ranks must be 0..3, each once, got \[0, 1, 1, 2\]"),
    ((), "at least one rank"),
], ids=["uneven replicas", "a rank twice", "no stage"])
def test_a_bad_layout_is_refused(stage_ranks: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StageLayout(stage_ranks=stage_ranks)


def test_the_layout_places_ranks_and_pipelines() -> None:
    layout = StageLayout(stage_ranks=((0, 3), (1, 4), (2, 5)))
    assert layout.replicas == 2
    assert layout.pipelines() == [[0, 1, 2], [3, 4, 5]]
    assert [layout.place(r) for r in range(6)] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]


def test_the_cut_keeps_the_model_s_blocks() -> None:
    model = nn.Sequential(*[nn.Linear(2, 2) for _ in range(6)])
    assert stage_bounds([3, 2, 1], 6) == [(0, 3), (3, 5), (5, 6)]
    middle = stage_module(model, [3, 2, 1], 1)
    assert list(middle) == [model[3], model[4]]
    assert middle[0].weight is model[3].weight


@pytest.mark.parametrize(("model", "counts", "index", "error", "message"), [
    (nn.Sequential(*[nn.Linear(2, 2)] * 4), [2, 1], 0, ValueError, r"add up to 3, the model has 4"),
    (nn.Sequential(*[nn.Linear(2, 2)] * 4), [4, 0], 0, ValueError, "at least one block"),
    (nn.Sequential(*[nn.Linear(2, 2)] * 4), [2, 2], 2, ValueError, r"stage index 2 outside 0..1"),
    (nn.Linear(2, 2), [1], 0, TypeError, "nn.Sequential of blocks, got Linear"),
], ids=["counts short of the model", "an empty stage", "a stage past the last", "not a sequence"])
def test_a_bad_cut_is_refused(model: nn.Module, counts: list[int], index: int,
                              error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        stage_module(model, counts, index)  # type: ignore[arg-type]


def test_the_runner_runs_every_spec_schedule() -> None:
    from hetero_worker.stages.runner import SCHEDULE_CLASSES
    from heterotrain_common.pipelineschedules import SCHEDULES
    assert [SCHEDULE_CLASSES[s].__name__ for s in SCHEDULES] == ["Schedule1F1B", "ScheduleGPipe"]


def test_a_wrong_runner_is_refused_naming_the_fix(facts: list[dict]) -> None:
    for rank, f in enumerate(facts):
        assert f["refusals"] == [
            "spec.training.pipeline.schedule must be one of 1F1B, GPipe, got 'Interleaved'",
            "2 stages but 3 ranks in the pipeline group (one rank per stage)",
            f"stage {(rank + 1) % 3} runs on the group's rank {(rank + 1) % 3}, this rank is {rank}"]
