"""The contract's table: every variable declared once, as a field of its group, and the parser,
the renderer and ``read_var`` all walk the same declarations."""

import re
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path

import pytest

from heterotrain_common import contract as c
from heterotrain_common import defaults, envfields, envnames, envread


def _base() -> c.Contract:
    topo = (c.RankEntry(rank=0, group=0, node="n", gpu_product="A100", compute_capability="8.0", local_batch=3),
            c.RankEntry(rank=1, group=1, node="m", gpu_product="Tesla-T4", compute_capability="7.5", local_batch=1))
    return c.Contract(
        dist=c.RankInfo(rank=0, world_size=2, local_rank=0, local_world_size=1, master_addr="a",
                        master_port=29500, job_name="j", group=0, group_rank=0, group_size=1),
        precision="fp16",
        comm=c.CommSettings(hierarchy="flat"), device=c.DeviceProfile(product="A100"), topology=topo)


def test_groups_hold_the_variables_as_documented():
    assert [f.name for f in fields(c.Contract)] == [
        "dist", "batch", "precision", "device", "topology", "comm", "memory", "checkpoint", "run",
        "pipeline", "extra"]
    groups = {name: [f.name for f in fields(cls)] for name, cls in (
        ("dist", c.RankInfo), ("batch", c.BatchSettings), ("comm", c.CommSettings),
        ("memory", c.MemorySettings), ("checkpoint", c.CheckpointSettings), ("run", c.RunSettings),
        ("pipeline", c.PipelineSettings))}
    assert groups == {
        "dist": ["rank", "world_size", "local_rank", "local_world_size", "master_addr", "master_port",
                 "job_name", "group", "group_rank", "group_size", "restart_generation", "job_uid"],
        "batch": ["max_steps", "epochs"],
        "comm": ["hierarchy", "compression", "powersgd_rank", "rebalance_interval_steps",
                 "collective_timeout_s", "rendezvous_timeout_s"],
        "memory": ["sharding", "micro_batch_size", "activation_checkpointing", "cap_bytes", "shard_ppm"],
        "checkpoint": ["dir", "interval_steps", "keep", "timeout_s", "max_failures",
                       "resume_from"],
        "run": ["dir", "metrics_port", "profile_steps", "predicted_samples_per_s",
                "sim_delay_per_sample_s", "termination_grace_s", "tracking", "prices_per_hour"],
        "pipeline": ["stage", "stage_blocks", "stage_ranks", "micro_batches", "schedule"],
    }


def test_table_agrees_with_the_names_and_their_categories():
    table = envfields.walk(c.Contract)
    required = {v.name for _, v, default in table if default is MISSING}
    assert required == set(envnames.REQUIRED_VARS)
    categories = {*envnames.REQUIRED_VARS, *envnames.OPTIONAL_VARS, *envnames.KNOB_VARS,
                  *envnames.MEMORY_VARS, *envnames.RESILIENCE_VARS, *envnames.PIPELINE_VARS}
    assert set(c.VARIABLES) == categories
    assert len(c.VARIABLES) == len(set(c.VARIABLES)) == 48


def test_the_docs_table_names_every_variable_and_its_field():
    text = (Path(__file__).resolve().parents[2] / "docs" / "contract.md").read_text()
    rows = re.findall(r"^\| ((?:`[A-Z_]+` ?)+) \| `([a-z_.]+)` \|", text, re.M)
    documented = [(name, path) for names, path in rows for name in re.findall(r"`([A-Z_]+)`", names)]
    assert documented == [(name, path) for path, v, _ in envfields.walk(c.Contract)
                          for name in (v.name, *v.also)]


def test_defaults_come_from_defaults_py():
    empty = c.CheckpointSettings(), c.CommSettings(hierarchy="flat"), c.RunSettings()
    ckpt, comm, run = empty
    assert (ckpt.interval_steps, ckpt.keep, ckpt.timeout_s) == (
        defaults.CHECKPOINT_INTERVAL_STEPS, defaults.CHECKPOINT_KEEP, float(defaults.CHECKPOINT_TIMEOUT_S))
    assert (comm.powersgd_rank, comm.rebalance_interval_steps, comm.collective_timeout_s,
            comm.rendezvous_timeout_s) == (defaults.POWERSGD_RANK, defaults.REBALANCE_INTERVAL_STEPS,
                                           defaults.COLLECTIVE_TIMEOUT_S, defaults.RENDEZVOUS_TIMEOUT_S)
    assert (run.sim_delay_per_sample_s, run.termination_grace_s) == (
        defaults.SIM_DELAY_PER_SAMPLE_S, float(defaults.TERMINATION_GRACE_S))
    for name, value in ((envnames.POWERSGD_RANK, defaults.POWERSGD_RANK),
                        (envnames.REBALANCE_INTERVAL_STEPS, defaults.REBALANCE_INTERVAL_STEPS),
                        (envnames.CHECKPOINT_INTERVAL_STEPS, defaults.CHECKPOINT_INTERVAL_STEPS),
                        (envnames.SHARD_PPM, ()), (envnames.PROFILE_STEPS, None)):
        assert c.read_var({}, name) == value


def test_every_group_round_trips_with_its_exact_variables():
    changed = replace(
        _base(),
        dist=replace(_base().dist, restart_generation=3),
        memory=c.MemorySettings(sharding="full", micro_batch_size=2, activation_checkpointing=True,
                                cap_bytes=123456, shard_ppm=(750000, 250000)),
        checkpoint=c.CheckpointSettings(dir="/ck", interval_steps=7, keep=4, timeout_s=90.0),
        comm=c.CommSettings(hierarchy="flat", collective_timeout_s=30.5),
        run=c.RunSettings(metrics_port=9400, termination_grace_s=12.0))
    env = c.render_rank_env(changed)
    assert {k: env[k] for k in set(env) - set(c.render_rank_env(_base()))} == {
        "HTJ_SHARDING": "full", "HTJ_MICRO_BATCH_SIZE": "2", "HTJ_ACTIVATION_CHECKPOINTING": "1",
        "HTJ_MEMORY_CAP_BYTES": "123456", "HTJ_SHARD_PPM": "750000,250000",
        "HTJ_CHECKPOINT_KEEP": "4", "HTJ_CHECKPOINT_TIMEOUT_S": "90",
        "HTJ_COLLECTIVE_TIMEOUT_S": "30.5", "HTJ_TERMINATION_GRACE_S": "12"}
    assert (env["HTJ_RESTART_GENERATION"], env["TORCHELASTIC_RESTART_COUNT"]) == ("3", "3")
    assert (env["HTJ_CHECKPOINT_DIR"], env["HTJ_CHECKPOINT_INTERVAL_STEPS"], env["HTJ_METRICS_PORT"]) == (
        "/ck", "7", "9400")
    assert c.parse_contract(env) == changed


def test_read_var_reads_as_the_parser_does():
    env = c.render_rank_env(_base())
    parsed = c.parse_contract(env)
    assert c.read_var(env, envnames.RANK) == parsed.dist.rank == 0
    assert c.read_var(env, envnames.TOPOLOGY) == parsed.topology
    assert c.read_var({envnames.COMPRESSION: "Int8"}, envnames.COMPRESSION) == "int8"
    with pytest.raises(envread.ContractError, match="HTJ_JOB_NAME: is required but not set"):
        c.read_var({}, envnames.JOB_NAME)
    with pytest.raises(KeyError):
        c.read_var({}, "HTJ_NOT_A_KNOB")


def test_a_new_knob_is_one_field():
    """What a knob declared with ``var`` gets: parsing with its default, rendering only when
    changed, errors naming it (the same machinery as the contract's)."""

    @dataclass(frozen=True, kw_only=True, slots=True)
    class Inner:
        knob_steps: int = envfields.var("HTJ_TEST_KNOB_STEPS", envfields.count(1), default=5)

    @dataclass(frozen=True, kw_only=True, slots=True)
    class Outer:
        name: str = envfields.var("HTJ_TEST_NAME", envfields.text)
        inner: Inner = envfields.group(Inner)

    assert envfields.read_fields(Outer, {"HTJ_TEST_NAME": "x"}) == Outer(name="x", inner=Inner())
    out: dict[str, str] = {}
    envfields.write_fields(Outer(name="x", inner=Inner(knob_steps=9)), out, always=())
    assert out == {"HTJ_TEST_NAME": "x", "HTJ_TEST_KNOB_STEPS": "9"}
    assert envfields.read_fields(Outer, out) == Outer(name="x", inner=Inner(knob_steps=9))
    with pytest.raises(envread.ContractError, match="HTJ_TEST_KNOB_STEPS: must be >= 1, got 0"):
        envfields.read_fields(Outer, {"HTJ_TEST_NAME": "x", "HTJ_TEST_KNOB_STEPS": "0"})
