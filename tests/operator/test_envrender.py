"""Rendering a plan into the env contract: exact variables per rank, ports, hierarchy, pod form."""

from __future__ import annotations

import json

import pytest
from builders import a100_and_two_t4_plan, make_job, make_node

from hetero_operator.api import types as model
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.plan import plan_job
from hetero_operator.render.env import render_rank_envs
from heterotrain_common.contract import expand_pod_env, parse_contract, pod_env

A100 = "NVIDIA-A100-SXM4-40GB"


def _plan(job) -> model.Plan:
    return a100_and_two_t4_plan(job)


def test_exact_rank_env_of_the_second_t4() -> None:
    job = make_job(name="digits", ranks=3, global_batch=96, training={
        "hierarchy": "Group", "checkpoint": {"path": "/ckpt"}})
    compressed = make_job(ranks=3, global_batch=96, training={
        "compression": {"mode": "PowerSGD", "powerSGDRank": 8}, "rebalance": {"intervalSteps": 25},
        "checkpoint": {"intervalSteps": 7}})
    extra = parse_contract(render_rank_envs(_plan(compressed), compressed, master_addr="m",
                                            master_port=1, simulated=False)[0])
    assert (extra.comm.compression, extra.comm.powersgd_rank, extra.comm.rebalance_interval_steps,
            extra.checkpoint.interval_steps) == ("powersgd", 8, 25, 7)
    envs = render_rank_envs(_plan(job), job, master_addr="digits", master_port=29500, simulated=True)
    topology = [
        {"compute_capability": "8.0", "gpu_product": A100, "group": 0, "local_batch": 68, "node": "node-a100", "rank": 0},
        {"compute_capability": "7.5", "gpu_product": "Tesla-T4", "group": 1, "local_batch": 14, "node": "node-t4", "rank": 1},
        {"compute_capability": "7.5", "gpu_product": "Tesla-T4", "group": 1, "local_batch": 14, "node": "node-t4", "rank": 2}]
    assert envs[2] == {
        "RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "digits", "MASTER_PORT": "29500", "HTJ_JOB_NAME": "digits", "HTJ_GROUP": "1",
        "HTJ_GROUP_RANK": "1", "HTJ_GROUP_SIZE": "2", "HTJ_PRECISION": "fp16", "HTJ_HIERARCHY": "group",
        "HTJ_DEVICE_PROFILE": json.dumps({"compute_capability": "7.5", "memory_mib": 15360, "mig_profile": "",
                                          "product": "Tesla-T4", "relative_speed": 65 / 312,
                                          "simulated": True}, sort_keys=True),
        "HTJ_TOPOLOGY": json.dumps(topology, sort_keys=True, separators=(",", ":")),
        "HTJ_METRICS_PORT": "9481", "HTJ_CHECKPOINT_DIR": "/ckpt",
        "HTJ_CHECKPOINT_INTERVAL_STEPS": "50", "HTJ_REBALANCE_INTERVAL_STEPS": "0",
        "HTJ_COMPRESSION": "none", "HTJ_POWERSGD_RANK": "16", "HTJ_RESTART_GENERATION": "0",
        "TORCHELASTIC_RESTART_COUNT": "0"}
    assert [parse_contract(e).dist.rank for e in envs] == [0, 1, 2]
    assert [(parse_contract(e).local_batch, parse_contract(e).global_batch) for e in envs] == [
        (68, 96), (14, 96), (14, 96)]  # the batch once, in the topology


def test_metrics_ports_per_host_or_per_local_rank() -> None:
    job = make_job(ranks=3, global_batch=96)
    plan = _plan(job)
    local = render_rank_envs(plan, job, master_addr="m", master_port=1, simulated=False)
    one_host = render_rank_envs(plan, job, master_addr="m", master_port=1, simulated=False,
                                metrics_port_base=9600, checkpoint_dir="/tmp/x")
    assert [e["HTJ_METRICS_PORT"] for e in local] == ["9480", "9480", "9481"]
    assert [e["HTJ_METRICS_PORT"] for e in one_host] == ["9600", "9601", "9602"]
    assert {e["HTJ_CHECKPOINT_DIR"] for e in one_host} == {"/tmp/x"}
    off = make_job(ranks=3, global_batch=96)
    off = type(off)(**{**{f: getattr(off, f) for f in off.__slots__},
                       "worker": type(off.worker)(command=("x",), metrics_port=0)})
    assert {e["HTJ_METRICS_PORT"] for e in render_rank_envs(plan, off, master_addr="m", master_port=1,
                                                            simulated=False)} == {"0"}


@pytest.mark.parametrize(("spec_value", "contract_value"), [
    ("Auto", "auto"), ("Flat", "flat"), ("Group", "group"), ("PerNode", "node"), ("PerArchitecture", "arch")])
def test_hierarchy_mapping(spec_value: str, contract_value: str) -> None:
    job = make_job(ranks=3, global_batch=96, training={"hierarchy": spec_value})
    envs = render_rank_envs(_plan(job), job, master_addr="m", master_port=1, simulated=False)
    assert {parse_contract(e).comm.hierarchy for e in envs} == {contract_value}


def test_pod_form_of_local_rank_zero_expands_back_to_every_rank() -> None:
    """``expand_pod_env`` keeps the pod's metrics port; ``heterotrain launch`` adds the local rank."""
    job = make_job(ranks=3, global_batch=96)
    plan = _plan(job)
    envs = render_rank_envs(plan, job, master_addr="m", master_port=2, simulated=False)
    for group in plan.groups:
        pod = pod_env(envs[group.ranks[0]])
        for local, rank in enumerate(group.ranks):
            expanded = expand_pod_env(pod, local)
            expanded["HTJ_METRICS_PORT"] = str(int(pod["HTJ_METRICS_PORT"]) + local)
            assert expanded == envs[rank]


def test_a_plan_of_another_global_batch_is_refused() -> None:
    """The topology is the only place the batch is written: a plan whose local batches do not sum
    to the job's globalBatchSize is refused when rendered, never handed to the ranks."""
    plan = _plan(make_job(ranks=3, global_batch=96))
    with pytest.raises(ValueError, match="the plan's local batches sum to 96, not "
                                         "spec.training.globalBatchSize 97"):
        render_rank_envs(plan, make_job(ranks=3, global_batch=97), master_addr="m", master_port=2,
                         simulated=False)


def test_mig_rank_gets_p2p_disabled_and_mig_product_in_its_profile() -> None:
    node = make_node("mig", product="NVIDIA-A100-SXM4-80GB", memory_mib=81920, mig_mixed={"3g.40gb": (2, 40192)})
    job = make_job(ranks=2, global_batch=8)
    plan = plan_job(job, build_inventory([node]))
    envs = render_rank_envs(plan, job, master_addr="m", master_port=2, simulated=False)
    assert [e["NCCL_P2P_DISABLE"] for e in envs] == ["1", "1"]
    device = parse_contract(envs[0]).device
    assert (device.product, device.mig_profile, device.memory_mib) == (
        "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", "3g.40gb", 40192)
    assert device.relative_speed == pytest.approx(3 / 7)
