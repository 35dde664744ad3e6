"""``spec.training.pipeline`` in the plan (issue 30): every rank's stage and replica, the stages per
GPU type in ``heterotrain plan``'s JSON and table and in ``status.plan``, and the combinations the
pipelined worker does not run refused naming the field and the fix."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import job_manifest, make_node
from k8s import crdcheck

from hetero_operator.api import types as model
from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.lifecycle.status import plan_status
from hetero_operator.planning.plan import plan_job
from hetero_operator.render.env import render_rank_envs
from hetero_operator.planning.schedulesim import simulate
from heterotrain_common import envnames

ROOT = Path(__file__).resolve().parents[2]
MIXED = yaml.safe_load((ROOT / "examples" / "clusters" / "mixed.yaml").read_text())["items"]
PIPE = {"blocks": 12, "microBatches": 4}


def _manifest(*, ranks: int = 3, global_batch: int = 24, pipeline: dict | None = None,
              **training: Any) -> dict[str, Any]:
    return job_manifest(ranks=ranks, global_batch=global_batch, gpus={"selection": "All"},
                        training={"memoryReserveMiB": 0, "pipeline": pipeline or PIPE, **training})


def _plan(nodes: list[dict] = MIXED, **kwargs: Any) -> model.Plan | model.Unschedulable:
    return plan_job(parse_job(_manifest(**kwargs)), build_inventory(nodes))


def test_three_gpu_types_get_three_stages_with_uneven_blocks() -> None:
    plan = _plan()
    assert isinstance(plan, model.Plan), plan.message
    # A100 1.0, V100 0.40, T4 0.21: 12 equal blocks split 8 / 3 / 1 (slots 4.0, 3.74, 2.4)
    assert [(r.rank, r.gpu_type, r.stage, r.stage_replica, r.local_batch, r.precision)
            for r in plan.ranks] == [
        (0, "NVIDIA-A100-SXM4-40GB", 0, 0, 8, "fp32"),
        (1, "Tesla-V100-SXM2-16GB", 1, 0, 8, "fp32"),
        (2, "Tesla-T4", 2, 0, 8, "fp32")]
    pipe = plan.pipeline
    assert pipe is not None and plan.memory is None
    assert [(s.index, s.gpu_type, s.ranks, s.first_block, s.blocks) for s in pipe.stages] == [
        (0, "NVIDIA-A100-SXM4-40GB", (0,), 0, 8), (1, "Tesla-V100-SXM2-16GB", (1,), 8, 3),
        (2, "Tesla-T4", (2,), 11, 1)]
    assert (pipe.micro_batches, pipe.schedule, pipe.bubble_fraction) == (4, "1F1B", 0.333333)
    # the schedule played on the stages (planning.schedulesim; a third of each slot forward, the
    # transfers of 10 Gbit/s negligible): 20.56 s, less than the closed form's (4 + 3 - 1) slots
    # of the slowest stage (A100: 8 blocks of 1/12 s x 6 samples = 4 s; 24 s): the V100 and the
    # T4 are faster than the A100's stage, so the fill and drain take less than its slots
    slots = [s.slot_s for s in pipe.stages]
    played = simulate([x / 3 for x in slots], [2 * x / 3 for x in slots], [0.0, 0.0], 4)
    assert pipe.step_s == pytest.approx(played.step_s, rel=1e-3)
    assert pipe.step_s == pytest.approx(20.555, rel=1e-3)


def test_replicas_of_a_stage_split_the_batch_and_form_pipelines() -> None:
    nodes = [make_node("node-a", count=2),
             make_node("node-t", product="Tesla-T4", count=2, memory_mib=15360, cc="7.5")]
    plan = _plan(nodes, ranks=4, global_batch=26, pipeline={"blocks": 6, "microBatches": 13,
                                                           "schedule": "GPipe"})
    assert isinstance(plan, model.Plan), plan.message
    # pipelines of 13 samples; a pipeline's batch split over its 2 stages: 7 + 6
    assert [(r.rank, r.gpu_type, r.stage, r.stage_replica, r.local_batch) for r in plan.ranks] == [
        (0, "NVIDIA-A100-SXM4-40GB", 0, 0, 7), (1, "NVIDIA-A100-SXM4-40GB", 0, 1, 7),
        (2, "Tesla-T4", 1, 0, 6), (3, "Tesla-T4", 1, 1, 6)]
    assert [(s.ranks, s.first_block, s.blocks) for s in plan.pipeline.stages] == [
        ((0, 1), 0, 5), ((2, 3), 5, 1)]
    assert sum(r.local_batch for r in plan.ranks) == 26


def test_memory_moves_blocks_to_the_roomier_type() -> None:
    # 12 blocks of 1 M parameters each (16 MB of AdamW state per block): a 100 MiB T4 holds 6
    nodes = [make_node("node-a", memory_mib=1000),
             make_node("node-t", product="Tesla-T4", memory_mib=100, cc="7.5")]
    fast = _plan(nodes, ranks=2, pipeline={"blocks": 12, "microBatches": 4},
                 model={"parameters": 12_000_000})
    assert isinstance(fast, model.Plan), fast.message
    assert fast.pipeline.block_counts == [10, 2]  # speeds 1.0 / 0.21, the memory does not bind
    tight = _plan([make_node("node-a", memory_mib=100),
                   make_node("node-t", product="Tesla-T4", memory_mib=1000, cc="7.5")],
                  ranks=2, pipeline={"blocks": 12, "microBatches": 4},
                  model={"parameters": 12_000_000})
    assert isinstance(tight, model.Plan), tight.message
    assert tight.pipeline.block_counts == [6, 6]
    assert [s.memory_bytes for s in tight.pipeline.stages] == [6 * 16_000_000] * 2


def test_the_plan_json_and_status_give_every_rank_its_stage(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(_manifest()))
    out = subprocess.run([sys.executable, "-m", "hetero_operator.cli", "plan", str(job), "--nodes",
                          str(ROOT / "examples" / "clusters" / "mixed.yaml"), "-o", "json"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    data = json.loads(out)
    assert [(r["rank"], r["stage"], r["stage_replica"]) for r in data["ranks"]] == [
        (0, 0, 0), (1, 1, 0), (2, 2, 0)]
    assert [(s["gpu_type"], s["blocks"]) for s in data["pipeline"]["stages"]] == [
        ("NVIDIA-A100-SXM4-40GB", 8), ("Tesla-V100-SXM2-16GB", 3), ("Tesla-T4", 1)]
    table = subprocess.run([sys.executable, "-m", "hetero_operator.cli", "plan", str(job),
                            "--nodes", str(ROOT / "examples" / "clusters" / "mixed.yaml")],
                           capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert "Pipeline: 3 stages, 4 micro-batches, 1F1B, bubble 33.3% of the step" in table
    assert [line.split("│")[2:5] for line in table.splitlines() if "(8)" in line] == [
        [" NVIDIA-A100-SXM4-40GB ", "     0 ", "   0..7 (8) "]]
    plan = _plan()
    status = plan_status("pj", plan, master_addr="pj-0", master_port=29500)
    assert status["pipeline"] == {
        "microBatches": 4, "schedule": "1F1B", "bubbleFraction": "0.3333",
        "stages": [
            {"stage": 0, "gpuType": "NVIDIA-A100-SXM4-40GB", "ranks": [0], "firstBlock": 0,
             "blocks": 8, "memoryBytes": 0},
            {"stage": 1, "gpuType": "Tesla-V100-SXM2-16GB", "ranks": [1], "firstBlock": 8,
             "blocks": 3, "memoryBytes": 0},
            {"stage": 2, "gpuType": "Tesla-T4", "ranks": [2], "firstBlock": 11, "blocks": 1,
             "memoryBytes": 0}]}
    body = _manifest()
    body["status"] = {"plan": status}
    crdcheck.validate(copy.deepcopy(body), crd=crdcheck.load_crd())
    schema = crdcheck.load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    kept = crdcheck.prune(schema["properties"]["status"], {"plan": copy.deepcopy(status)})
    assert kept["plan"]["pipeline"] == status["pipeline"]  # declared, so not pruned


@pytest.mark.parametrize(("training", "pipeline", "needle"), [
    ({"sharding": "Full"}, PIPE, "spec.training.sharding Full does not combine with a pipeline"),
    ({"sharding": "Group"}, PIPE, "set spec.training.sharding None or Auto, or leave "
                                  "spec.training.pipeline out"),
    ({"compression": {"mode": "PowerSGD"}}, PIPE,
     "spec.training.compression.mode PowerSGD: the stage replicas' gradient all-reduce is not "
     "compressed: leave spec.training.compression out"),
    ({"rebalance": {"intervalSteps": 10}}, PIPE, "spec.training.rebalance.intervalSteps 10"),
    ({}, {"microBatches": 4}, "spec.training.pipeline.blocks is needed"),
    ({}, {"blocks": 12, "stages": 2, "microBatches": 4},
     "spec.training.pipeline.stages 2: the planner makes one stage per placed GPU type, 3 here"),
    ({}, {"blocks": 12, "microBatches": 9},
     "spec.training.pipeline.microBatches 9 exceeds a pipeline's batch (8 samples"),
    ({}, {"blocks": 12, "microBatches": 3},
     "spec.training.globalBatchSize 8 gives 1 pipeline(s) batches of 8 samples, not multiples of "
     "spec.training.pipeline.microBatches 3 (torch.distributed.pipelining cuts equal "
     "micro-batches): set globalBatchSize to a multiple of 3 (e.g. 6)"),
], ids=["full", "group", "compression", "rebalancing", "no blocks",
        "stages", "micro-batches", "uneven micro-batches"])
def test_unsupported_combinations_are_refused_naming_field_and_fix(
        training: dict, pipeline: dict, needle: str) -> None:
    result = _plan(pipeline=pipeline, global_batch=8, **training)
    assert isinstance(result, model.Unschedulable)
    assert result.reason == "PipelineNotPlanned"
    assert needle in result.message


def test_a_forced_precision_runs_every_stage_in_it_and_auto_plans_fp32() -> None:
    """One loss scale spans the stages (hetero_worker.pipelinepart), so FP16 is planned on every
    rank; Auto stays fp32 (the stage model's bytes and times are fp32's); BF16 leaves out the
    pre-Ampere types as for data parallelism, and the V100 and T4 here then leave one type."""
    fp16 = _plan(pipeline=PIPE, global_batch=8, precision="FP16")
    assert isinstance(fp16, model.Plan) and fp16.pipeline is not None
    assert {r.precision for r in fp16.ranks} == {"fp16"} and {g.precision for g in fp16.groups} == {"fp16"}
    auto = _plan(pipeline=PIPE, global_batch=8)
    assert isinstance(auto, model.Plan) and {r.precision for r in auto.ranks} == {"fp32"}
    bf16 = _plan(pipeline=PIPE, global_batch=8, precision="BF16")
    assert isinstance(bf16, model.Unschedulable)


def test_uneven_replicas_and_one_type_are_refused() -> None:
    uneven = _plan(ranks=4)  # A100 x1, V100 x1, T4 x2
    assert isinstance(uneven, model.Unschedulable) and uneven.reason == "PipelineNotPlanned"
    assert ("the worker runs the same number of replicas on every stage and the plan placed "
            "1 x NVIDIA-A100-SXM4-40GB, 1 x Tesla-V100-SXM2-16GB, 2 x Tesla-T4") in uneven.message
    alone = _plan([make_node("node-a", count=2)], ranks=2)
    assert isinstance(alone, model.Unschedulable)
    assert "makes one stage per GPU type and the plan placed one type" in alone.message


def test_checkpoint_path_is_planned_with_stages_and_reaches_every_rank() -> None:
    """Checkpoints per stage are built (hetero_worker.ckpt.stagestate): a pipelined job with
    spec.training.checkpoint.path is planned, and every rank's contract names the directory."""
    job = parse_job(_manifest(checkpoint={"path": "/ckpt"}))
    plan = plan_job(job, build_inventory(MIXED))
    assert isinstance(plan, model.Plan), plan.message
    assert [r.stage for r in plan.ranks] == [0, 1, 2]
    envs = render_rank_envs(plan, job, master_addr="127.0.0.1", master_port=29500, simulated=True)
    assert [env[envnames.CHECKPOINT_DIR] for env in envs] == ["/ckpt"] * 3


def _costs(compute: list[int], parameters: int = 1000) -> list[dict]:
    return [{"parameters": parameters, "compute": c, "activationBytesPerSample": "1k"}
            for c in compute]


def test_block_costs_move_the_cut_where_equal_blocks_would_not() -> None:
    nodes = [make_node("node-a"), make_node("node-t", product="Tesla-T4", memory_mib=15360,
                                            cc="7.5")]
    equal = _plan(nodes, ranks=2, pipeline={"blocks": 4, "microBatches": 4})
    assert isinstance(equal, model.Plan), equal.message
    assert equal.pipeline.block_counts == [3, 1]  # A100 3/4 = 0.75 s, T4 (0.21) 1/4 -> 1.19 s
    # block 0 holds 10 of the 13 compute units: A100 blocks 0-1 (11/13 = 0.85) and T4 blocks
    # 2-3 (2/13 / 0.21 = 0.73) beat [3, 1] (12/13 = 0.92) and [1, 3] (3/13 / 0.21 = 1.10)
    heavy = _plan(nodes, ranks=2, pipeline={"microBatches": 4,
                                            "blockCosts": _costs([10, 1, 1, 1])})
    assert isinstance(heavy, model.Plan), heavy.message
    assert heavy.pipeline.block_counts == [2, 2]
    assert [s.memory_bytes > 0 for s in heavy.pipeline.stages] == [True, True]


def test_block_costs_that_disagree_with_the_model_size_are_refused_naming_both() -> None:
    refused = _plan(pipeline={"microBatches": 4, "blockCosts": _costs([1, 1, 1])},
                    model={"parameters": 5000})
    assert isinstance(refused, model.Unschedulable) and refused.reason == "PipelineNotPlanned"
    assert ("spec.training.pipeline.blockCosts count 3,000 parameters in all and "
            "spec.training.model.parameters says 5,000: make them agree") in refused.message
