"""The pipeline's stage layout in the rank env contract (issue 30): every rank of a pipelined plan
gets its stage, the blocks per stage, every stage's ranks, the micro-batches and the schedule, and
the worker's parser reads them back and cross-checks them."""

from __future__ import annotations

import pytest
from builders import job_manifest, make_node

from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.plan import plan_job
from hetero_operator.render.env import render_rank_envs
from heterotrain_common import contract as c
from heterotrain_common import envnames
from heterotrain_common.envread import ContractError
from heterotrain_common.pipelineenv import PipelineSettings, replica_of

NODES = [make_node("node-a", count=2),
         make_node("node-v", product="Tesla-V100-SXM2-16GB", count=2, memory_mib=16384, cc="7.0"),
         make_node("node-t", product="Tesla-T4", count=2, memory_mib=15360, cc="7.5")]


def _envs(pipeline: dict | None, ranks: int = 6, nodes: list[dict] = NODES) -> list[dict[str, str]]:
    training = {"memoryReserveMiB": 0, **({"pipeline": pipeline} if pipeline else {})}
    job = parse_job(job_manifest(ranks=ranks, global_batch=24, gpus={"selection": "All"},
                                 training=training))
    plan = plan_job(job, build_inventory(nodes))
    return render_rank_envs(plan, job, master_addr="127.0.0.1", master_port=29500, simulated=True)


def test_every_rank_gets_the_stage_layout() -> None:
    envs = _envs({"blocks": 12, "microBatches": 4, "schedule": "GPipe"})
    # 3 types x 2 ranks: stage i = ranks 2i, 2i + 1; 12 blocks by speed 1.0 / 0.40 / 0.21
    assert [{k: e[k] for k in envnames.PIPELINE_VARS if k in e} for e in envs] == [{
        "HTJ_PIPELINE_STAGE": str(stage), "HTJ_PIPELINE_STAGE_BLOCKS": "8,3,1",
        "HTJ_PIPELINE_STAGE_RANKS": "0,1;2,3;4,5", "HTJ_PIPELINE_MICRO_BATCHES": "4",
        "HTJ_PIPELINE_SCHEDULE": "GPipe"} for stage in (0, 0, 1, 1, 2, 2)]
    parsed = [c.parse_contract(e) for e in envs]
    assert [(p.pipeline.stage, replica_of(p.pipeline, p.dist.rank), p.local_batch)
            for p in parsed] == [(0, 0, 4), (0, 1, 4), (1, 0, 4), (1, 1, 4), (2, 0, 4), (2, 1, 4)]
    assert parsed[3].pipeline == PipelineSettings(
        stage=1, stage_blocks=(8, 3, 1), stage_ranks=((0, 1), (2, 3), (4, 5)), micro_batches=4,
        schedule="GPipe")
    # the pod form carries them (one stage per group)
    assert set(envnames.PIPELINE_VARS) <= set(c.pod_env(envs[2]))


def test_the_default_schedule_and_stage_are_written_too() -> None:
    one_each = [make_node("node-a"), make_node("node-t", product="Tesla-T4", memory_mib=15360,
                                               cc="7.5")]
    envs = _envs({"blocks": 3, "microBatches": 2}, ranks=2, nodes=one_each)
    assert {k: envs[0][k] for k in envnames.PIPELINE_VARS} == {
        "HTJ_PIPELINE_STAGE": "0", "HTJ_PIPELINE_STAGE_BLOCKS": "2,1",
        "HTJ_PIPELINE_STAGE_RANKS": "0;1", "HTJ_PIPELINE_MICRO_BATCHES": "2",
        "HTJ_PIPELINE_SCHEDULE": "1F1B"}


def test_a_job_without_a_pipeline_gets_none_of_them() -> None:
    envs = _envs(None)
    assert not set().union(*envs) & set(envnames.PIPELINE_VARS)
    assert not c.parse_contract(envs[0]).pipeline.enabled


@pytest.mark.parametrize(("change", "message"), [
    ({"HTJ_PIPELINE_STAGE_RANKS": "0,1;2,3"}, "HTJ_PIPELINE_STAGE_RANKS: has 2 stages but "
                                               "HTJ_PIPELINE_STAGE_BLOCKS has 3"),
    ({"HTJ_PIPELINE_STAGE_RANKS": "0,1;2,3;4,4"}, "must name every rank 0..5 once"),
    ({"HTJ_PIPELINE_STAGE_RANKS": "0,1,2;3,4;5"}, "every stage must have the same number of replicas"),
    ({"HTJ_PIPELINE_STAGE": "1"}, "HTJ_PIPELINE_STAGE: 1 but rank 0 is not among that stage's ranks"),
    ({"HTJ_PIPELINE_MICRO_BATCHES": "0"}, "HTJ_PIPELINE_MICRO_BATCHES: must be >= 1 under a pipeline"),
    ({"HTJ_PIPELINE_STAGE_BLOCKS": "8,0,1"}, "must be integers >= 1 separated by commas"),
    ({"HTJ_PIPELINE_SCHEDULE": "ZeroBubble"}, "HTJ_PIPELINE_SCHEDULE"),
])
def test_the_parser_cross_checks_the_layout(change: dict, message: str) -> None:
    env = {**_envs({"blocks": 12, "microBatches": 4})[0], **change}
    with pytest.raises(ContractError, match=message.replace("(", r"\(").replace(".", r"\.")):
        c.parse_contract(env)
