"""The Trainer runs a pipelined job when the contract says so (issue 30, acceptance): the planner's
3-stage plan across 3 GPU types (examples/clusters/mixed.yaml: 12 equal blocks split 8 / 3 / 1),
rendered into the rank env contract and run by 3 real Gloo rank processes through ``ht.init``,
``t.wrap``, ``t.loader`` and ``t.step``, trains equal to one process in float64 (within 1e-6 per
step, with the same micro-batching); and 2 replicas per stage on 2 GPU types (two pipelines side
by side, a stage's replicas reducing their gradients) likewise."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from builders import job_manifest, make_node

from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.plan import plan_job
from hetero_operator.render.env import render_rank_envs
from hetero_worker.runtime.simulation import free_port
from rankproc import read_rank_json, run_ranks

SCRIPT = Path(__file__).parent / "pipeline_trainer_ranks.py"
ROOT = Path(__file__).resolve().parents[2]
MIXED = yaml.safe_load((ROOT / "examples" / "clusters" / "mixed.yaml").read_text())["items"]
TOL = 1e-6
STEPS = 3


def _run(tmp: Path, nodes: list[dict], *, ranks: int, global_batch: int, pipeline: dict,
         precision: str = "Auto", args: tuple[str, ...] = ()) -> list[dict]:
    job = parse_job(job_manifest(ranks=ranks, global_batch=global_batch, gpus={"selection": "All"},
                                 training={"memoryReserveMiB": 0, "pipeline": pipeline,
                                           "precision": precision}))
    plan = plan_job(job, build_inventory(nodes))
    assert plan.pipeline is not None, plan.message
    envs = render_rank_envs(plan, job, master_addr="127.0.0.1", master_port=free_port(),
                            simulated=True)
    envs = [{**env, "HTJ_METRICS_PORT": "0"} for env in envs]  # no port shared between tests
    runs = run_ranks([sys.executable, str(SCRIPT), "--out", str(tmp), "--steps", str(STEPS), *args],
                     envs, timeout_s=170)
    failed = [f"rank {r.rank} exit {r.returncode}:\n{r.stderr[-1500:]}" for r in runs if r.returncode]
    assert not failed, "\n".join(failed)
    return read_rank_json(tmp, len(envs))


@pytest.mark.timeout(200)
@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
def test_three_stages_on_three_gpu_types_train_equal_to_one_process(
        tmp_path: Path, schedule: str) -> None:
    facts = _run(tmp_path, MIXED, ranks=3, global_batch=24,
                 pipeline={"blocks": 12, "microBatches": 4, "schedule": schedule})
    assert [(f["stage"], f["replica"], f["blocks"]) for f in facts] == [(0, 0, 8), (1, 0, 3), (2, 0, 1)]
    assert {f["dtype"] for f in facts} == {"torch.float64"}
    for rank, f in enumerate(facts):
        assert (f["steps"], f["global_step"], f["batch_sizes"]) == (STEPS, STEPS, [24] * STEPS)
        assert max(f["diffs"]) < TOL, (rank, f["diffs"])
        assert max(f["loss_diffs"]) < TOL, (rank, f["loss_diffs"])  # every rank reports the loss
        assert f["moved"] > 1e-3, rank  # the steps really changed the stage
        _assert_stage_times(f, total_blocks=12, pipeline_batch=24, micro_batches=4, stages=3)


def _assert_stage_times(f: dict, *, total_blocks: int, pipeline_batch: int, micro_batches: int,
                        stages: int) -> None:
    """The stage's compute (its forward and backward, the optimizer) holds at least its simulated
    device's sleep (blocks / total of the whole model's per-sample delay, hetero_worker.stages.
    simdelay), the rest of the step is waiting (bubble, transfers, reductions), and the pipeline
    gauges say so."""
    sleep_s = f["blocks"] / total_blocks * pipeline_batch * f["delay_per_sample_s"] / f["speed"]
    for step_s, compute_s, wait_s in f["times"]:
        assert sleep_s <= compute_s <= step_s, (sleep_s, compute_s, step_s)
        assert wait_s == pytest.approx(step_s - compute_s, abs=1e-9)
        assert wait_s > 0  # every stage of a 2+ stage pipeline waits on a send or a receive
    last_step_s, _, last_wait_s = f["times"][-1]
    assert f["gauges"] == {"stage": f["stage"],
                           "planned_bubble_ratio": (stages - 1) / (micro_batches + stages - 1),
                           "wait_ratio": pytest.approx(last_wait_s / last_step_s)}


@pytest.mark.timeout(200)
def test_two_replicas_per_stage_train_equal_to_one_process(
        tmp_path: Path) -> None:
    nodes = [make_node("node-a", count=2),
             make_node("node-t", product="Tesla-T4", count=2, memory_mib=15360, cc="7.5")]
    facts = _run(tmp_path, nodes, ranks=4, global_batch=24, pipeline={"blocks": 6, "microBatches": 3})
    assert [(f["stage"], f["replica"], f["blocks"]) for f in facts] == [
        (0, 0, 5), (0, 1, 5), (1, 0, 1), (1, 1, 1)]
    assert facts[0]["pipeline_batches"] == [12, 12]
    assert [f["batch_sizes"] for f in facts] == [[12] * STEPS] * 4
    for rank, f in enumerate(facts):
        assert max(f["diffs"]) < TOL, (rank, f["diffs"])
        assert max(f["loss_diffs"]) < TOL, (rank, f["loss_diffs"])
        assert f["moved"] > 1e-3, rank
        _assert_stage_times(f, total_blocks=6, pipeline_batch=12, micro_batches=3, stages=2)


@pytest.mark.timeout(200)
def test_fp16_one_loss_scale_spans_the_stages_and_an_inf_in_one_stage_skips_the_step_everywhere(
        tmp_path: Path) -> None:
    """spec.training.precision FP16 on the 3-stage plan: the last stage scales the loss by 65536,
    every stage unscales (exact in float64: autocast leaves float64 alone, the scale is a power of
    two), so every step still equals one process's; an inf in stage 1's gradients at step 1 makes
    every stage skip that step (the reference skips it too) and halves the one scale everywhere."""
    facts = _run(tmp_path, MIXED, ranks=3, global_batch=24, precision="FP16",
                 pipeline={"blocks": 12, "microBatches": 4}, args=("--inf-step", "1", "--inf-stage", "1"))
    assert [(f["stage"], f["blocks"]) for f in facts] == [(0, 8), (1, 3), (2, 1)]
    for rank, f in enumerate(facts):
        assert f["skipped"] == [False, True, False], rank
        assert f["scales"] == [65536.0, 32768.0, 32768.0], rank
        assert max(f["diffs"]) < TOL, (rank, f["diffs"])
        assert max(f["loss_diffs"]) < TOL, (rank, f["loss_diffs"])  # the unscaled loss
        assert f["moved"] > 1e-3, rank
