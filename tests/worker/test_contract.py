"""The env contract: exact variable sets, round trips and one clear error per malformed variable."""

import json
from dataclasses import replace

import pytest

from heterotrain_common import contract as c
from heterotrain_common import envnames, envread


def _contract(**changes):
    """The base contract with some fields of its groups changed, e.g. ``dist={"rank": 0}``."""
    topo = (
        c.RankEntry(rank=0, group=0, node="n-a", gpu_product="A100", compute_capability="8.0", local_batch=5),
        c.RankEntry(rank=1, group=0, node="n-a", gpu_product="A100", compute_capability="8.0", local_batch=5),
        c.RankEntry(rank=2, group=1, node="n-b", gpu_product="Tesla-T4", compute_capability="7.5", local_batch=2),
    )
    base = c.Contract(
        dist=c.RankInfo(rank=1, world_size=3, local_rank=1, local_world_size=2, master_addr="job-0.job",
                        master_port=29500, job_name="j", group=0, group_rank=1, group_size=2),
        precision="bf16",
        comm=c.CommSettings(hierarchy="group"),
        device=c.DeviceProfile(product="A100", compute_capability="8.0", memory_mib=40960,
                               relative_speed=1.0),
        topology=topo)
    return replace(base, **{name: replace(getattr(base, name), **fields)
                            for name, fields in changes.items()})


_TOPOLOGY = c.topology_to_json(_contract().topology)


def test_rank_env_has_exactly_the_contract_variables():
    env = c.render_rank_env(_contract())
    assert set(env) == set(envnames.REQUIRED_VARS) | set(envnames.OPTIONAL_VARS)
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "3"
    assert json.loads(env["HTJ_TOPOLOGY"])[1]["local_batch"] == 5  # the rank's batch, once


def test_the_batch_is_derived_from_the_topology_alone():
    """The local and global batch are the topology's: this rank's entry and the sum; a stray
    HTJ_LOCAL_BATCH_SIZE or HTJ_GLOBAL_BATCH_SIZE (an older operator's) is not read."""
    env = dict(c.render_rank_env(_contract()), HTJ_LOCAL_BATCH_SIZE="99", HTJ_GLOBAL_BATCH_SIZE="1")
    parsed = c.parse_contract(env)
    assert (parsed.local_batch, parsed.global_batch, parsed.local_batches) == (5, 12, [5, 5, 2])
    assert not {"HTJ_LOCAL_BATCH_SIZE", "HTJ_GLOBAL_BATCH_SIZE"} & set(c.VARIABLES)


def test_round_trip_through_env():
    original = _contract()
    assert c.parse_contract(c.render_rank_env(original)) == original


def test_pod_form_expands_to_each_rank():
    rank0 = c.render_rank_env(_contract(dist={"rank": 0, "local_rank": 0, "group_rank": 0}))
    pod = c.pod_env(rank0)
    assert "RANK" not in pod and pod["HTJ_FIRST_RANK"] == "0"
    one = c.parse_contract(c.expand_pod_env(pod, 1))
    assert (one.dist.rank, one.dist.local_rank, one.dist.group_rank, one.local_batch) == (1, 1, 1, 5)


@pytest.mark.parametrize(
    ("variable", "value", "needle"),
    [
        ("RANK", "3", "outside WORLD_SIZE=3"),
        ("RANK", "one", "must be an integer"),
        ("MASTER_PORT", "70000", "must be in 1..65535"),
        ("HTJ_TOPOLOGY", _TOPOLOGY.replace('"local_batch":2', '"local_batch":0'),
         "rank 2 has local_batch 0; must be >= 1"),
        ("HTJ_TOPOLOGY", json.dumps([{k: v for k, v in e.items() if (i, k) != (1, "local_batch")}
                                     for i, e in enumerate(json.loads(_TOPOLOGY))]),
         "entry 1 has unexpected or missing keys"),
        ("HTJ_PRECISION", "fp8", "must be one of bf16, fp16, fp32"),
        ("HTJ_TOPOLOGY", "[", "is not valid JSON"),
        ("WORLD_SIZE", "4", "missing [3]"),  # the topology is what disagrees: it is named
        ("HTJ_DEVICE_PROFILE", '{"product": "x", "relative_speed": 0}', "relative_speed must be"),
        ("MASTER_ADDR", "", "is required but not set"),
    ],
    ids=["rank outside world", "rank not int", "port out of range", "a rank's batch below 1",
         "a rank's batch missing", "unknown precision", "topology not json",
         "rank missing from topology", "zero speed", "master addr missing"],
)
def test_malformed_variable_names_itself(variable, value, needle):
    env = c.render_rank_env(_contract())
    env[variable] = value
    with pytest.raises(envread.ContractError) as err:
        c.parse_contract(env)
    named = "HTJ_TOPOLOGY" if variable == "WORLD_SIZE" else variable
    assert err.value.variable == named
    assert needle in str(err.value)


# --- every HTJ_* name and its parsing lives here; init(environ=...) is honoured everywhere ------

def test_worker_knobs_are_parsed_into_the_contract_and_round_trip():
    knobs = _contract(run={"sim_delay_per_sample_s": 0.0125, "dir": "/runs/x",
                           "profile_steps": (20, 25), "predicted_samples_per_s": 812.5,
                           "tracking": {"tensorboard": {"logDir": "/tb"}},
                           "prices_per_hour": {"NVIDIA A100": 2.5, "Tesla T4": None}},
                      comm={"rendezvous_timeout_s": 42.0, "compression": "int8", "powersgd_rank": 8,
                            "rebalance_interval_steps": 3},
                      batch={"max_steps": 10, "epochs": 3})
    env = c.render_rank_env(knobs)
    assert {k: env[k] for k in envnames.KNOB_VARS} == {"HTJ_SIM_DELAY_PER_SAMPLE_S": "0.0125",
                                                "HTJ_RENDEZVOUS_TIMEOUT_S": "42.0",
                                                "HTJ_RUN_DIR": "/runs/x",
                                                "HTJ_PROFILE_STEPS": "20-25",
                                                "HTJ_PREDICTED_SAMPLES_PER_S": "812.5",
                                                "HTJ_MAX_STEPS": "10", "HTJ_EPOCHS": "3",
                                                "HTJ_TRACKING": '{"tensorboard":{"logDir":"/tb"}}',
                                                "HTJ_PRICES_PER_HOUR":
                                                    '{"NVIDIA A100":2.5,"Tesla T4":null}'}
    assert c.parse_contract(env) == knobs
    # defaults are not rendered (the operator's pods carry exactly the contract)
    assert not set(c.render_rank_env(_contract())) & set(envnames.KNOB_VARS)


@pytest.mark.parametrize(("variable", "value", "needle"), [
    ("HTJ_SIM_DELAY_PER_SAMPLE_S", "-1", "must be >= 0"),
    ("HTJ_RENDEZVOUS_TIMEOUT_S", "0", "must be > 0"),
    ("HTJ_COMPRESSION", "zip", "must be one of none, fp16, bf16, int8, powersgd; got 'zip'"),
    ("HTJ_REBALANCE_INTERVAL_STEPS", "x", "must be an integer"),
    ("HTJ_PROFILE_STEPS", "20..25", "must be steps like \"20-25\" or \"20\", got '20..25'"),
    ("HTJ_PROFILE_STEPS", "25-20", "must be FIRST-LAST with 1 <= FIRST <= LAST, got '25-20'"),
    ("HTJ_PROFILE_STEPS", "0-3", "must be FIRST-LAST with 1 <= FIRST <= LAST"),
    ("HTJ_PROFILE_STEPS", "1-500", "spans 500 steps; at most 100 per trace"),
    ("HTJ_PREDICTED_SAMPLES_PER_S", "fast", "must be a number of samples/s"),
    ("HTJ_MAX_STEPS", "0", "must be >= 1, got 0"),
    ("HTJ_EPOCHS", "three", "must be an integer, got 'three'"),
    ("HTJ_TRACKING", "{tensorboard", "is not JSON"),
    ("HTJ_TRACKING", '{"comet": {}}', "tracking.comet: unknown backend; use one of tensorboard, "
                                      "wandb, mlflow"),
    ("HTJ_PREDICTED_SAMPLES_PER_S", "-3", "must be a finite number >= 0"),
])
def test_malformed_knob_names_itself(variable, value, needle):
    env = dict(c.render_rank_env(_contract()), **{variable: value})
    with pytest.raises(envread.ContractError, match=needle) as err:
        c.parse_contract(env)
    assert err.value.variable == variable


def test_spec_spelling_of_compression_is_accepted():
    env = dict(c.render_rank_env(_contract()), HTJ_COMPRESSION="PowerSGD")
    assert c.parse_contract(env).comm.compression == "powersgd"


def test_no_worker_module_spells_an_htj_name_outside_the_contract():
    import re
    from pathlib import Path

    import hetero_worker
    root = Path(hetero_worker.__file__).parent
    literal = re.compile(r"""["'](HTJ_[A-Z0-9_]+)["']""")
    found = {}
    for path in sorted(root.rglob("*.py")):
        if path.name == "contract.py":
            continue
        names = literal.findall(path.read_text())
        if names:
            found[str(path.relative_to(root))] = names
    assert found == {}, "define HTJ_* names (and their parsing) in heterotrain_common/contract.py"


def test_modules_read_their_knobs_from_the_parsed_contract_not_os_environ(monkeypatch, tmp_path):
    """What init(environ=...) parsed wins over the process environment everywhere."""
    from hetero_worker.metrics import WorkerMetrics
    from hetero_worker.speed.codecs import CompressionConfig
    from hetero_worker.speed.controller import SpeedConfig

    for var, value in (("HTJ_COMPRESSION", "fp16"), ("HTJ_POWERSGD_RANK", "2"),
                       ("HTJ_REBALANCE_INTERVAL_STEPS", "9"), ("HTJ_RUN_DIR", "/elsewhere")):
        monkeypatch.setenv(var, value)
    parsed = c.parse_contract(c.render_rank_env(_contract(
        comm={"compression": "powersgd", "powersgd_rank": 6, "rebalance_interval_steps": 4},
        run={"dir": str(tmp_path)})))
    speed = SpeedConfig.from_contract(parsed)
    assert (speed.rebalance.interval_steps, speed.compression) == (
        4, CompressionConfig(mode="powersgd", powersgd_rank=6))
    metrics = WorkerMetrics(parsed)
    metrics.observe_step(0.5, 0.4, 0.1, 5, 1.0)
    metrics.flush()
    assert (tmp_path / "rank-1.json").is_file()
    # the module-level readers take an explicit mapping too and parse through the contract
    assert SpeedConfig.from_env({"HTJ_REBALANCE_INTERVAL_STEPS": "7"}).rebalance.interval_steps == 7
    with pytest.raises(envread.ContractError, match="HTJ_POWERSGD_RANK"):
        CompressionConfig.from_env({"HTJ_POWERSGD_RANK": "0"})
