"""Memory model and sharding choice (issue 12): bytes per rank, each mode's choice, the refusals."""

from __future__ import annotations

import pytest
from builders import job_manifest, make_job, make_node

from hetero_operator.api import memoryplan, quantities
from hetero_operator.api import types as model
from hetero_operator.api.errors import SpecError
from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning import memory
from hetero_operator.planning import plan as planning
from hetero_operator.planning.plan import plan_job

A100_80 = "NVIDIA-A100-SXM4-80GB"
MIB = 2**20
T4_USABLE = (15360 - 1024 - 768) * MIB  # 15360 MiB label, 1024 MiB reserve, 5 % fragmentation
A100_USABLE = (81920 - 1024 - 4096) * MIB


def cluster() -> list[dict]:
    """1x A100-80GB next to 4x T4-16GB (the issue's example)."""
    return [make_node("a100", product=A100_80, count=1, memory_mib=81920),
            make_node("t4", product="Tesla-T4", count=4, memory_mib=15360, cc="7.5")]


def job(parameters, *, sharding="Auto", optimizer=None, act=None, ckpt=None, batch=64,
        precision="FP32", checkpoint=None):
    mdl = {"parameters": parameters}
    if act is not None:
        mdl["activationBytesPerSample"] = act
    if ckpt is not None:
        mdl["checkpointedActivationBytesPerSample"] = ckpt
    training = {"model": mdl, "sharding": sharding, **({"optimizer": optimizer} if optimizer else {}),
                **({"precision": precision} if precision else {}),
                **({"checkpoint": checkpoint} if checkpoint else {})}
    return make_job(ranks=5, global_batch=batch, training=training, gpus={"selection": "All"})


@pytest.fixture
def all_modes(monkeypatch):
    """Plan as if the worker ran every mode (the mode choice itself, independent of what is built)."""
    monkeypatch.setattr(planning, "WORKER_SHARDINGS", memoryplan.MODES)


def plan(j) -> model.Plan | model.Unschedulable:
    return plan_job(j, build_inventory(cluster()))


# --- quantities and bytes ----------------------------------------------------------------------

@pytest.mark.parametrize(("text", "binary", "value"), [
    ("1.3G", False, 1_300_000_000), ("1300M", False, 1_300_000_000), (7, False, 7),
    ("48Mi", True, 48 * MIB), ("1.5Gi", True, 3 * 2**29), ("2k", True, 2000), (".5k", False, 500)])
def test_quantities_are_exact(text, binary, value) -> None:
    assert quantities.parse_quantity(text, binary=binary) == value


@pytest.mark.parametrize(("text", "binary", "words"), [
    ("1.3", False, "whole number"), ("48Mi", False, "decimal suffix"), ("-1", True, "quantity"),
    (1.5, True, "integer or a quantity"), (True, True, "integer or a quantity"), ("1.5x", True, "quantity")])
def test_quantities_refused(text, binary, words) -> None:
    with pytest.raises(quantities.QuantityError, match=words):
        quantities.parse_quantity(text, binary=binary)


def test_state_bytes_per_parameter_by_optimizer_and_precision() -> None:
    assert [memory.state_bytes_per_parameter(o, "bf16") for o in ("SGD", "Momentum", "Adam", "AdamW")] \
        == [8, 12, 16, 16]
    assert {memory.state_bytes_per_parameter("AdamW", p) for p in ("bf16", "fp16", "fp32")} == {16}


def test_usable_memory_from_labels_including_mig() -> None:
    assert memory.usable_bytes(15360, 1024) == T4_USABLE
    # a MIG 3g.40gb slice: its own memory label (40192 MiB), the same reserve rule
    assert memory.usable_bytes(40192, 1024) == (40192 - 1024) * MIB - 40192 * MIB * 5 // 100
    assert memory.usable_bytes(1000, 1024) == 0


def test_spec_fields_parse_and_refuse_with_the_field() -> None:
    t = job("1.3G", optimizer="Momentum", act="48Mi", ckpt="8Mi", sharding="Group").training
    assert (t.model_parameters, t.optimizer, t.activation_bytes_per_sample,
            t.checkpointed_activation_bytes_per_sample, t.sharding) == (
        1_300_000_000, "Momentum", 48 * MIB, 8 * MIB, "Group")
    assert make_job().training.model_parameters == 0  # no model: no memory model
    with pytest.raises(SpecError) as err:
        job("1.3Gi")
    assert err.value.path == "spec.training.model.parameters"
    with pytest.raises(SpecError) as err:
        job("1G", act="8Mi", ckpt="8Mi")
    assert err.value.path == "spec.training.model.checkpointedActivationBytesPerSample"
    with pytest.raises(SpecError) as err:
        parse_job(job_manifest(training={"model": {"parameters": 10}, "memoryPerSampleMiB": 5}))
    assert err.value.path == "spec.training.memoryPerSampleMiB"
    with pytest.raises(SpecError, match="Auto, None, Group, Full"):
        job("1G", sharding="Zero3")


# --- the mode choice -----------------------------------------------------------------------------

def test_no_model_no_memory_plan() -> None:
    p = plan(make_job(ranks=5, global_batch=64, gpus={"selection": "All"}))
    assert isinstance(p, model.Plan) and p.memory is None


def test_auto_keeps_none_when_the_model_fits_every_card() -> None:
    p = plan(job("100M"))
    assert isinstance(p, model.Plan)
    assert p.memory.mode == "None"
    assert [r.state_bytes for r in p.memory.ranks] == [1_600_000_000] * 5
    assert p.memory.reasons[1] == ("model state 1.5 GiB fits Tesla-T4 (13.2 GiB usable): None "
                                   "sharding; each holds all of it; planned peak 1.5 GiB")


def test_auto_chooses_group_when_the_state_does_not_fit_the_t4(all_modes) -> None:
    p = plan(job("1.15G"))
    assert isinstance(p, model.Plan), p.message
    m = p.memory
    assert (m.mode, m.state_bytes, m.bytes_per_parameter) == ("Group", 18_400_000_000, 16)
    assert [r.gpu_type for r in m.ranks] == [A100_80] + ["Tesla-T4"] * 4
    assert [r.state_bytes for r in m.ranks] == [18_400_000_000] + [4_600_000_000] * 4
    assert m.reasons[1] == ("model state 17.1 GiB does not fit Tesla-T4 (13.2 GiB usable): Group "
                            "sharding; each T4 holds 25 % of its group's state; planned peak 4.3 GiB")
    assert [o.fits for o in m.options] == [False, True, True]
    # Group and None move the same gradient reduction across types; Full moves 3x parameters
    none, group, full = m.options
    assert none.cross_type_bytes == group.cross_type_bytes == 2 * 1 * 1_150_000_000 * 4 // 2
    assert full.cross_type_bytes > group.cross_type_bytes


def test_auto_chooses_full_when_even_the_largest_card_cannot_hold_the_state(all_modes) -> None:
    p = plan(job("6G"))  # 96 GB of state: more than the A100's 75 GiB usable
    assert isinstance(p, model.Plan), p.message
    m = p.memory
    assert m.mode == "Full"
    usable = [A100_USABLE] + [T4_USABLE] * 4
    shares = [r.state_share_ppm for r in m.ranks]
    assert sum(shares) == 10**6
    # proportional to usable memory (largest remainders): the A100 holds 75 / (75 + 4 x 13.25)
    assert [abs(sh - 10**6 * u / sum(usable)) < 1 for sh, u in zip(shares, usable)] == [True] * 5
    assert all(r.state_bytes <= r.usable_bytes for r in m.ranks)
    assert "each T4 holds 10.4 % of the state"  # 13.25 / 128 in m.reasons[1]


def test_micro_batches_and_checkpointing_where_activations_do_not_fit(all_modes) -> None:
    # Group: T4 state 4.6 GB, budget 14.23 - 4.6 = 9.63 GB; 1 GiB per sample -> 8 per micro-batch
    p = plan(job("1.15G", act="1Gi", batch=512))
    m = p.memory
    t4 = m.ranks[1]
    budget = T4_USABLE - 4_600_000_000
    assert t4.micro_batch_size == budget // 2**30 == 8
    batch_t4 = p.ranks[1].local_batch
    assert batch_t4 > 8 and t4.micro_batches == -(-batch_t4 // 8) > 1
    assert t4.peak_bytes == 4_600_000_000 + 8 * 2**30 <= T4_USABLE
    assert "micro-batches of 8 (gradient accumulation, one synchronisation per step)" in m.reasons[1]
    # one sample of 12 GiB does not fit beside the T4's share; the checkpointed 2 GiB does
    p = plan(job("1.15G", act="12Gi", ckpt="2Gi", batch=64))
    t4 = p.memory.ranks[1]
    assert (t4.activation_checkpointing, t4.micro_batch_size) == (True, budget // (2 * 2**30))
    assert "activation checkpointing on" in p.memory.reasons[1]


def test_sharding_none_that_does_not_fit_is_refused_naming_the_shortfall(all_modes) -> None:
    result = plan(job("1.15G", sharding="None"))
    assert isinstance(result, model.Unschedulable)
    assert result.reason == "ModelDoesNotFit"
    short = 18_400_000_000 - T4_USABLE
    assert f"{short / 2**30:.1f}" == "3.9"
    assert result.message == (
        "spec.training.sharding None: model state 17.1 GiB (1,150,000,000 parameters x 16 B: fp32 "
        "parameters and gradients, AdamW state) does not fit: Tesla-T4 short by 3.9 GiB (13.2 GiB "
        "usable); set spec.training.sharding to Auto (it would choose Group)")


def test_auto_that_nothing_fits_is_refused_per_mode(all_modes) -> None:
    result = plan(job("20G"))
    assert isinstance(result, model.Unschedulable) and result.reason == "ModelDoesNotFit"
    assert result.message.startswith("spec.training.sharding Auto: no sharding mode fits model state 298.0 GiB")
    assert "None: NVIDIA-A100-SXM4-80GB short by 223.0 GiB (75.0 GiB usable); Tesla-T4 short by" in result.message
    assert "Full: " in result.message and "add GPUs with more memory" in result.message


def test_only_modes_the_worker_runs_are_planned() -> None:
    assert planning.WORKER_SHARDINGS == ("None", "Group", "Full")
    p = plan(job("1.15G", precision="FP32"))
    assert isinstance(p, model.Plan) and p.memory.mode == "Group"  # Group moves less across types
    p = plan(job("6G", precision="FP32"))  # only Full fits (hetero_worker.memory.full)
    assert isinstance(p, model.Plan) and p.memory.mode == "Full"


def test_full_sharding_env_carries_every_ranks_share() -> None:
    """Full: shares proportional to usable memory (A100 75.0 GiB, 4x T4 13.25 GiB; largest
    remainders), rendered job-wide as HTJ_SHARD_PPM and parsed back by the worker's contract."""
    from hetero_operator.render.env import render_rank_envs
    from heterotrain_common import contract as c
    from heterotrain_common import envnames, envread

    j = job("6G", precision="FP32")
    p = plan(j)
    assert [r.state_share_ppm for r in p.memory.ranks] == [585937, 103516, 103516, 103516, 103515]
    envs = render_rank_envs(p, j, master_addr="127.0.0.1", master_port=29500, simulated=True)
    assert {e["HTJ_SHARD_PPM"] for e in envs} == {"585937,103516,103516,103516,103515"}
    assert c.parse_contract(envs[1]).memory.shard_ppm == (585937, 103516, 103516, 103516, 103515)


FULL_COMPRESSION_REFUSAL = (
    "Full sharding is not built with compression (Full sharding reduce-scatters each block's "
    "gradients over all ranks inside backward, so there is no one cross-group exchange for Int8 or "
    "PowerSGD to compress; spec.training.sharding Group compresses its cross-group exchange) yet: "
    "it plans if spec.training.compression is left out")


@pytest.mark.parametrize("precision", ["FP32", "Auto"])
def test_full_sharding_plans_with_checkpoints(precision: str) -> None:
    """Checkpoints are built under Full (issue 29, item 2: every rank writes its slices with
    torch.distributed.checkpoint, hetero_worker.ckpt.flatdcp): no longer refused."""
    result = plan(job("6G", precision=precision, checkpoint={"path": "/ckpt"}, sharding="Full"))
    assert isinstance(result, model.Plan) and result.memory.mode == "Full"


def _training_job(parameters: str, sharding: str, **training) -> object:
    return parse_job(job_manifest(ranks=5, global_batch=64, gpus={"selection": "All"}, training={
        "model": {"parameters": parameters}, "sharding": sharding, **training}))


def test_full_sharding_plans_fp16_ranks_and_rebalancing_and_refuses_compression_naming_why() -> None:
    """fp16 ranks (T4s under precision Auto) and rebalancing plan under Full (issue 29, items 1
    and 3); compression is refused at plan time with the reason and both fixes (item 4)."""
    fp16 = plan(job("6G", precision="Auto", sharding="Full"))
    assert isinstance(fp16, model.Plan) and fp16.memory.mode == "Full"
    assert {r.precision for r in fp16.ranks if r.gpu_type == "Tesla-T4"} == {"fp16"}
    rebalancing = plan(_training_job("6G", "Full", precision="Auto", rebalance={"intervalSteps": 10}))
    assert isinstance(rebalancing, model.Plan) and rebalancing.memory.mode == "Full"
    for mode in ("Int8", "PowerSGD"):
        result = plan(_training_job("6G", "Full", precision="Auto", compression={"mode": mode}))
        assert isinstance(result, model.Unschedulable) and result.reason == "ModelDoesNotFit"
        assert result.message == (f"spec.training.sharding Full: {FULL_COMPRESSION_REFUSAL} "
                                  '(checked: 5 ranks, sharding Full) (docs/memory.md, "What is built")')


def test_group_sharding_plans_fp16_ranks_rebalancing_and_compression() -> None:
    """What Group refused before issue 29 (items 1, 3, 4) now plans: the T4s run fp16 under
    precision Auto, rebalancing and Int8 / PowerSGD compression of the cross-group exchange."""
    result = plan(job("1.15G", precision="Auto"))  # the T4s run fp16
    assert isinstance(result, model.Plan) and result.memory.mode == "Group"
    assert {r.precision for r in result.ranks if r.gpu_type == "Tesla-T4"} == {"fp16"}
    assert {r.precision for r in result.ranks if r.gpu_type != "Tesla-T4"} == {"bf16"}  # the A100
    # Group checkpoints are sharded (hetero_worker.ckpt.sharded, torch.distributed.checkpoint).
    result = plan(job("1.15G", precision="FP32", checkpoint={"path": "/ckpt"}, sharding="Group"))
    assert isinstance(result, model.Plan) and result.memory.mode == "Group"
    j = job("1.15G", sharding="Group")
    assert j.training.rebalance_interval_steps == 0
    for training in ({"rebalance": {"intervalSteps": 10}}, {"compression": {"mode": "Int8"}},
                     {"compression": {"mode": "PowerSGD"}, "rebalance": {"intervalSteps": 10}}):
        result = plan(_training_job("1.15G", "Group", precision="Auto", **training))
        assert isinstance(result, model.Plan) and result.memory.mode == "Group", training
    # Auto with compression: Group fits and compresses; Full is left out for it, not chosen
    result = plan(_training_job("1.15G", "Auto", precision="Auto", compression={"mode": "Int8"}))
    assert isinstance(result, model.Plan) and result.memory.mode == "Group"


def test_pure_choice_prefers_the_cheaper_mode_by_the_link_model() -> None:
    slots = [memoryplan.RankSlot(rank=r, group=0 if r < 2 else 1, node="a" if r < 2 else "b",
                             gpu_type="X" if r < 2 else "Y", memory_mib=16384, precision="bf16",
                             local_batch=4) for r in range(4)]
    m = memoryplan.ModelMemory(parameters=1_000_000_000, optimizer="AdamW")  # 16 GB: no card holds it
    chosen = memory.plan_memory(slots, m, "Auto", reserve_mib=1024, cross_gbps=10.0)
    assert chosen.mode == "Group"
    group = chosen.options[1]
    assert group.cross_type_bytes == 4_000_000_000  # 2 (G-1)/G x 4 GB with G = 2
    assert group.cross_type_s == pytest.approx(4_000_000_000 * 8 / 10e9)
    full = chosen.options[2]
    # a rank of share 0.25 gathers the other 0.75 twice, and Gloo's reduce-scatter (an
    # all-reduce) moves as much as two gathers: 4 x 0.75 x 4 GB
    assert full.cross_type_bytes == 4 * 750_000 * 4_000_000_000 // 10**6


def test_envrender_carries_the_memory_decision(all_modes) -> None:
    from hetero_operator.render.env import render_rank_envs
    from heterotrain_common import contract as c
    from heterotrain_common import envnames, envread

    j = job("1.15G", act="1Gi", batch=512)
    p = plan(j)
    envs = render_rank_envs(p, j, master_addr="127.0.0.1", master_port=29500, simulated=True)
    t4 = envs[1]
    assert {k: t4[k] for k in envnames.MEMORY_VARS if k in t4} == {
        "HTJ_SHARDING": "group", "HTJ_MICRO_BATCH_SIZE": "8", "HTJ_MEMORY_CAP_BYTES": str(T4_USABLE)}
    parsed = c.parse_contract(t4).memory
    assert (parsed.sharding, parsed.micro_batch_size, parsed.activation_checkpointing,
            parsed.cap_bytes) == ("group", 8, False, T4_USABLE)
    # no model in the spec: none of the memory variables
    j0 = make_job(ranks=5, global_batch=64, gpus={"selection": "All"})
    envs0 = render_rank_envs(plan(j0), j0, master_addr="h", master_port=1, simulated=True)
    assert not set(envs0[1]) & set(envnames.MEMORY_VARS)


@pytest.mark.parametrize(("variable", "value", "needle"), [
    ("HTJ_SHARDING", "zero3", "none, group, full"), ("HTJ_MICRO_BATCH_SIZE", "-1", ">= 0"),
    ("HTJ_ACTIVATION_CHECKPOINTING", "yes", "0 or 1"), ("HTJ_MEMORY_CAP_BYTES", "1e9", "integer")])
def test_memory_variables_refused_by_name(variable, value, needle) -> None:
    from heterotrain_common import contract as c
    from heterotrain_common import envnames, envread

    with pytest.raises(envread.ContractError) as err:
        c.read_var({variable: value}, variable)
    assert err.value.variable == variable and needle in str(err.value)


def test_memory_variables_survive_the_pod_form(all_modes) -> None:
    """The operator sends local rank 0's env as the pod form; every local rank gets the group's
    memory settings back (they are per group, not per rank)."""
    from hetero_operator.render.env import render_rank_envs
    from heterotrain_common import contract as c
    from heterotrain_common import envnames, envread

    j = job("1.15G", act="1Gi", batch=512)
    envs = render_rank_envs(plan(j), j, master_addr="svc", master_port=29500, simulated=False)
    pod = c.pod_env(envs[1])  # the T4 group's first rank
    for local in range(4):
        expanded = c.parse_contract(c.expand_pod_env(pod, local)).memory
        assert (expanded.sharding, expanded.micro_batch_size, expanded.cap_bytes) == (
            "group", 8, T4_USABLE)
