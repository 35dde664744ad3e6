"""``Full`` sharding: uneven flat slices over all ranks, gathered per block (issue 12)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from rankproc import assert_ok, mixed_cluster_envs, read_rank_json, run_ranks
from torch import nn

from hetero_worker.memory import full as fullshard
from hetero_worker.memory import group as sharding
from heterotrain_common import contract as c
from heterotrain_common import envnames, envread

FULL_RANKS = Path(__file__).parent / "full_ranks.py"
TOL = 1e-6
SHARES = "500000,250000,125000,125000"


def test_slice_sizes_follow_the_shares_exactly() -> None:
    assert fullshard.slice_sizes(54, [500000, 250000, 125000, 125000]) == [27, 13, 7, 7]
    assert fullshard.slice_sizes(57, [500000, 250000, 125000, 125000]) == [29, 14, 7, 7]
    assert fullshard.slice_sizes(3, [10**6 - 2, 1, 1]) == [3, 0, 0]
    assert fullshard.slice_sizes(5, [1, 1, 1]) == [2, 2, 1]
    with pytest.raises(ValueError, match="sum to more than 0"):
        fullshard.slice_sizes(5, [0, 0])


def test_shard_ppm_is_parsed_checked_and_rendered() -> None:
    def shares(text: str | None) -> tuple[int, ...]:
        return c.read_var({} if text is None else {envnames.SHARD_PPM: text}, envnames.SHARD_PPM)

    assert shares("500000,250000,250000") == (500000, 250000, 250000)
    assert shares(None) == ()
    with pytest.raises(envread.ContractError, match="HTJ_SHARD_PPM.*sum to 1000000"):
        shares("500000,250000")
    with pytest.raises(envread.ContractError, match="HTJ_SHARD_PPM.*integers"):
        shares("5e5,5e5")
    env = mixed_cluster_envs([2, 5, 8, 4])[1]
    env.update({envnames.SHARDING: "full", envnames.SHARD_PPM: SHARES})
    parsed = c.parse_contract(env)
    assert parsed.memory.shard_ppm == (500000, 250000, 125000, 125000)
    assert c.render_rank_env(parsed)[envnames.SHARD_PPM] == SHARES
    env[envnames.SHARD_PPM] = "500000,500000"
    with pytest.raises(envread.ContractError, match="HTJ_SHARD_PPM.*2 shares for WORLD_SIZE=4"):
        c.parse_contract(env)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_full_sharding_equals_single_process_and_fits_each_cap(tmp_path: Path) -> None:
    """HTJ_SHARDING=full on A100 / V100 / T4 / T4 with shares 50/25/12.5/12.5 %, uneven batches
    [2, 5, 8, 4] in micro-batches of 2/2/3/3 (every rank runs 3, rank 0 one empty): two steps of
    SGD with momentum equal one process on 19 samples (float64, <= 1e-6), parameters and each
    rank's gradient slice; each rank holds exactly its slices of every unit, its state is 24 B
    per held element (parameter, gradient, momentum), its peak stays within a cap that the
    replicated state would not fit, and the bytes it exchanges across groups are exactly the
    slices of the other groups for 3 gathers per block (forward, recompute) and 2 per root unit."""
    envs = mixed_cluster_envs([2, 5, 8, 4])
    caps = [18432, 9216, 4608, 4608]  # bytes, proportional to the shares
    for r, env in enumerate(envs):
        env.update({envnames.SHARDING: "full", envnames.MICRO_BATCH_SIZE: "3" if r >= 2 else "2",
                    envnames.MEMORY_CAP_BYTES: str(caps[r]), envnames.SHARD_PPM: SHARES})
    runs = run_ranks([sys.executable, str(FULL_RANKS), "--out", str(tmp_path)], envs, timeout_s=180)
    assert_ok(runs)
    facts = read_rank_json(tmp_path, 4)
    block, root = [27, 13, 7, 7], [29, 14, 7, 7]  # 54 and 57 parameters
    held = [2 * b + r for b, r in zip(block, root, strict=True)]
    assert held == [83, 40, 21, 21]
    groups = [0, 1, 2, 2]
    for rank, f in enumerate(facts):
        assert f["unit_sizes"] == [block, block, root]
        assert f["param_diff"] <= TOL and f["grad_diff"] <= TOL and f["eval_diff"] <= TOL
        assert f["held_numel"] == held[rank]
        assert f["state_bytes"] == 24 * held[rank]
        assert 0 < f["peak"] <= f["cap"] == caps[rank]
        others = [r for r in range(4) if groups[r] != groups[rank]]
        per_micro = 2 * 3 * sum(block[r] for r in others) + 2 * sum(root[r] for r in others)
        assert f["inter_group_bytes"] == 8 * per_micro * 3 * 2  # float64, 3 micro-batches, 2 steps
    replicated = 24 * (2 * 54 + 57)
    for rank in (2, 3):  # a T4 could not hold the whole state next to its activations
        assert replicated + facts[rank]["peak"] - facts[rank]["state_bytes"] > caps[rank]


# --- one process (a Gloo world of one): recompute, RNG, layout, refusals ---------------------

@pytest.fixture
def world_of_one() -> Iterator[None]:
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class DropBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(torch.tanh(self.lin(x)))


def _net() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(5, 6), DropBlock(), DropBlock(), nn.Linear(6, 2)).double()


@pytest.mark.parametrize("block", [DropBlock, None])
def test_recompute_keeps_dropout_and_equals_the_plain_model(world_of_one: None,
                                                             block: type[nn.Module] | None) -> None:
    """Each block is gathered, run and freed, then re-gathered and recomputed in backward under
    the same RNG state (dropout masks match): gradients equal the unsharded model's (float64);
    ``parameters()`` are only the flat slices; the names of the full state are the original ones."""
    x = torch.randn(4, 5, dtype=torch.float64)
    plain = _net()
    torch.manual_seed(5)
    plain(x).square().mean().backward()
    model = _net()
    units = fullshard.shard_full(model, block=block, shares_ppm=[10**6], rank=0,
                                 groups_of_ranks=[0], device=torch.device("cpu"))
    assert [n for n, _ in model.named_parameters()] == (
        ["htj_shard", "1.htj_shard", "2.htj_shard"] if block else ["htj_shard"])
    torch.manual_seed(5)
    model(x).square().mean().backward()
    want = dict(plain.named_parameters())
    for unit in units:
        for name, grad, shape in zip(unit.names, unit.shard.grad.split(unit.numels), unit.shapes,
                                     strict=True):
            assert (grad.view(shape) - want[name].grad).abs().max().item() <= 1e-12
    assert sorted(fullshard.full_state_dict(units)) == sorted(want)
    assert model[1].lin.weight.numel() == 0  # freed outside its forward


def test_a_parameter_shared_between_units_is_refused(world_of_one: None) -> None:
    model = _net()
    model[3].weight = model[1].lin.weight  # tie a root parameter to a block's
    with pytest.raises(RuntimeError, match="shared between units 1 and <root>"):
        fullshard.shard_full(model, block=DropBlock, shares_ppm=[10**6], rank=0,
                             groups_of_ranks=[0], device=torch.device("cpu"))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"compression": "powersgd"}, "Full sharding with compression is not built: Full reduce-scatters"),
])
def test_full_refuses_what_it_does_not_build_naming_the_fix(kwargs: dict, message: str) -> None:
    args = {"checkpoint_dir": "", "sharding": "full", **kwargs}
    with pytest.raises(RuntimeError, match=message):
        sharding.check_supported(**args)
    sharding.check_supported(checkpoint_dir="", sharding="full")  # fp16, rebalancing: built


def test_full_checkpoints_are_built_and_not_refused() -> None:
    """Checkpoints under Full: every rank writes its slices with DCP (issue 29, item 2;
    hetero_worker.ckpt.flatdcp, tests/worker/test_checkpoint_layouts.py)."""
    sharding.check_supported(checkpoint_dir="/ckpt", sharding="full")
    sharding.check_supported(checkpoint_dir="/ckpt", sharding="group")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_slices_stage_through_cpu_and_equal_the_plain_model(world_of_one: None) -> None:
    """On a GPU the slices go through CPU tensors on the Gloo group (the communicator rule); the
    shards and their gradients stay on the device and equal the unsharded model's (float64)."""
    device = torch.device("cuda:0")
    x = torch.randn(4, 5, dtype=torch.float64, device=device)
    plain = _net().to(device).eval()  # eval: no dropout, so no CUDA RNG in the comparison
    plain(x).square().mean().backward()
    model = _net().to(device).eval()
    units = fullshard.shard_full(model, block=DropBlock, shares_ppm=[10**6], rank=0,
                                 groups_of_ranks=[0], device=device)
    model(x).square().mean().backward()
    want = dict(plain.named_parameters())
    for unit in units:
        assert unit.shard.device == device and unit.shard.grad.device == device
        for name, grad, shape in zip(unit.names, unit.shard.grad.split(unit.numels), unit.shapes,
                                     strict=True):
            assert (grad.view(shape) - want[name].grad).abs().max().item() <= 1e-12
