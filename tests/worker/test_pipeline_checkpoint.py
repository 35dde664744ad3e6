"""Checkpoints per pipeline stage (issue 30, acceptance: "kill-and-resume under Pipeline ends
bit-identical to an uninterrupted run on the same plan").

The planner's 3-stage plan across 3 GPU types (examples/clusters/mixed.yaml: 12 blocks cut 8 / 3 /
1) with ``spec.training.checkpoint.path``, rendered into the rank env contract, run by 3 real Gloo
rank processes (tests/worker/pipeline_ckpt_ranks.py: SGD with momentum, a shuffled loader)
for 6 steps with a checkpoint every 2: killed after step 3 (the newest checkpoint is step 2's) and
started again, the resumed run ends with every stage's parameters ``torch.equal`` to an
uninterrupted run's. What the checkpoint holds per stage is checked on the file the run wrote, and
:mod:`hetero_worker.ckpt.stagestate`'s pieces in one process.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
import yaml
from builders import job_manifest, make_node
from torch import nn

from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.plan import plan_job
from hetero_operator.render.env import render_rank_envs
from hetero_worker.ckpt import stagestate, store
from hetero_worker.ckpt.files import load_file, refuse_pipeline_checkpoint
from hetero_worker.runtime.simulation import free_port
from heterotrain_common import envnames
from heterotrain_common.envnames import PREEMPTED_EXIT_CODE
from rankproc import run_ranks

SCRIPT = Path(__file__).parent / "pipeline_ckpt_ranks.py"
ROOT = Path(__file__).resolve().parents[2]
MIXED = yaml.safe_load((ROOT / "examples" / "clusters" / "mixed.yaml").read_text())["items"]
STEPS, INTERVAL, DIE_AFTER = 6, 2, 3


THREE_TYPES = {"nodes": MIXED, "ranks": 3, "pipeline": {"blocks": 12, "microBatches": 4}}
TWO_REPLICAS = {"nodes": [make_node("node-a", count=2),
                          make_node("node-t", product="Tesla-T4", count=2, memory_mib=15360,
                                    cc="7.5")],
                "ranks": 4, "pipeline": {"blocks": 6, "microBatches": 3}}


def _envs(checkpoint_dir: Path, layout: dict = THREE_TYPES) -> list[dict[str, str]]:
    job = parse_job(job_manifest(
        ranks=layout["ranks"], global_batch=24, gpus={"selection": "All"},
        training={"memoryReserveMiB": 0, "pipeline": layout["pipeline"],
                  "checkpoint": {"path": str(checkpoint_dir)}}))
    plan = plan_job(job, build_inventory(layout["nodes"]))
    assert plan.pipeline is not None, plan.message
    envs = render_rank_envs(plan, job, master_addr="127.0.0.1", master_port=free_port(),
                            simulated=True)
    return [{**env, "HTJ_METRICS_PORT": "0", envnames.MAX_STEPS: str(STEPS),
             envnames.CHECKPOINT_INTERVAL_STEPS: str(INTERVAL)} for env in envs]


def _run(out: Path, envs: list[dict[str, str]], *extra: str) -> list:
    port = str(free_port())  # a fresh rendezvous port for every start
    envs = [{**env, envnames.MASTER_PORT: port} for env in envs]
    return run_ranks([sys.executable, str(SCRIPT), "--out", str(out), *extra], envs, timeout_s=150)


def _ok(runs: list) -> None:
    failed = [f"rank {r.rank} exit {r.returncode}:\n{r.stderr[-1500:]}" for r in runs if r.returncode]
    assert not failed, "\n".join(failed)


def _kill_and_resume(base: Path, layout: dict) -> dict:
    """An uninterrupted run, and a run killed after step 3 then started again."""
    world = layout["ranks"]
    straight, resumed, ckpt, ckpt_straight = (base / n for n in ("straight", "resumed", "ckpt",
                                                                  "ckpt-straight"))
    for d in (straight, resumed):
        d.mkdir()
    _ok(_run(straight, _envs(ckpt_straight, layout)))
    envs = _envs(ckpt, layout)
    killed = _run(resumed, envs, "--die-after", str(DIE_AFTER))
    assert [r.returncode for r in killed] == [9] * world, [r.stderr[-800:] for r in killed]
    saved = [c.step for c in store.candidates(ckpt)]
    assert max(saved) == INTERVAL, saved  # step 3 was never saved: the resume redoes it
    state = load_file(store.candidates(ckpt)[0].file)  # what the killed run left
    again = _run(resumed, envs)
    _ok(again)
    return {"straight": [torch.load(straight / f"stage{r}.pt") for r in range(world)],
            "resumed": [torch.load(resumed / f"stage{r}.pt") for r in range(world)],
            "state": state, "stderr": again[0].stderr}


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _kill_and_resume(tmp_path_factory.mktemp("pipeckpt"), THREE_TYPES)


def _assert_bit_identical(runs: dict, world: int) -> None:
    straight, resumed = runs["straight"], runs["resumed"]
    for rank in range(world):
        assert straight[rank]["resumed_at"] is None
        assert resumed[rank]["resumed_at"] == INTERVAL  # from step 2's checkpoint
        assert straight[rank]["global_step"] == resumed[rank]["global_step"] == STEPS
        assert len(resumed[rank]["losses"]) == STEPS - INTERVAL
        assert resumed[rank]["losses"] == straight[rank]["losses"][INTERVAL:]  # same data, RNG
        params = list(zip(straight[rank]["params"], resumed[rank]["params"], strict=True))
        assert params and all(torch.equal(a, b) for a, b in params), rank
    assert f"resumed at step {INTERVAL}" in runs["stderr"]


@pytest.mark.timeout(480)
def test_killed_pipeline_resumes_bit_identical_to_an_uninterrupted_run(killed_and_resumed) -> None:
    _assert_bit_identical(killed_and_resumed, 3)


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_two_replicas_per_stage_save_each_stage_once_and_resume_bit_identical(
        tmp_path: Path) -> None:
    runs = _kill_and_resume(tmp_path, TWO_REPLICAS)
    _assert_bit_identical(runs, 4)
    for rank in (0, 2):  # each stage's replicas hold the same parameters again
        assert all(torch.equal(a, b) for a, b in zip(runs["resumed"][rank]["params"],
                                                      runs["resumed"][rank + 1]["params"]))
    saved = runs["state"][stagestate.PIPELINE_KEY]
    assert saved["stage_blocks"] == [5, 1] and sorted(saved["stages"]) == ["0", "1"]
    assert list(runs["state"]["model"]) == [f"{b}.0.{n}" for b in range(6)
                                            for n in ("weight", "bias")]
    assert len(runs["state"]["ranks"]) == 4


@pytest.mark.timeout(480)
def test_the_checkpoint_holds_every_stage_once_by_global_block(killed_and_resumed) -> None:
    state = killed_and_resumed["state"]
    assert state["step"] == INTERVAL and state["optimizer"] is None
    saved = state[stagestate.PIPELINE_KEY]
    assert saved["stage_blocks"] == [8, 3, 1]
    assert sorted(saved["stages"]) == ["0", "1", "2"]
    # the whole model's keys, each block once, in block order (Linear weight and bias per block)
    assert list(state["model"]) == [f"{b}.0.{n}" for b in range(12) for n in ("weight", "bias")]
    for index, (first, end) in enumerate([(0, 8), (8, 11), (11, 12)]):
        stage = saved["stages"][str(index)]
        assert stage["blocks"] == [first, end]
        assert stage["optimizer_fqns"] == [f"{b}.0.{n}" for b in range(first, end)
                                           for n in ("weight", "bias")]
        momenta = stage["optimizer"]["state"]
        assert sorted(momenta) == list(range(2 * (end - first)))  # momentum of every parameter
        assert all(s["momentum_buffer"].abs().sum() > 0 for s in momenta.values())
    assert len(state["ranks"]) == 3 and all(set(r) == {"rng"} for r in state["ranks"])


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_sigterm_under_a_pipeline_saves_the_agreed_step_and_resumes_bit_identical(
        killed_and_resumed, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    envs = [{**env, envnames.CHECKPOINT_INTERVAL_STEPS: "100"} for env in _envs(ckpt)]  # no periodic
    stopped_runs = _run(tmp_path, envs, "--sigterm-after", "2", "--step-s", "0.5")
    assert [r.returncode for r in stopped_runs] == [PREEMPTED_EXIT_CODE] * 3, \
        [r.stderr[-1500:] for r in stopped_runs]
    steps = {int(re.search(r"stopped after step (\d+) as every rank agreed", r.stderr).group(1))
             for r in stopped_runs}
    assert len(steps) == 1, steps
    (stopped,) = steps
    assert 3 <= stopped < STEPS
    assert [c.step for c in store.candidates(ckpt)] == [stopped]  # the stop's checkpoint only
    _ok(_run(tmp_path, envs))
    straight = killed_and_resumed["straight"]
    for rank in range(3):
        resumed = torch.load(tmp_path / f"stage{rank}.pt")
        assert resumed["resumed_at"] == stopped and resumed["global_step"] == STEPS
        params = list(zip(straight[rank]["params"], resumed["params"], strict=True))
        assert all(torch.equal(a, b) for a, b in params), rank


def test_stage_state_keys_blocks_by_global_index() -> None:
    stage = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 3)))
    opt = torch.optim.SGD(stage.parameters(), lr=0.1, momentum=0.9)
    stage(torch.ones(1, 2)).sum().backward()
    opt.step()
    state = stagestate.stage_state(stage, opt, first_block=7)
    assert list(state["model"]) == ["7.weight", "7.bias", "8.0.weight", "8.0.bias"]
    assert torch.equal(state["model"]["8.0.weight"], stage[1][0].weight)
    assert state["optimizer_fqns"] == ["7.weight", "7.bias", "8.0.weight", "8.0.bias"]
    assert sorted(state["optimizer"]["state"]) == [0, 1, 2, 3]
    assert stagestate.global_key("0.weight", 3) == "3.weight"
    assert stagestate.global_key("", 3) == ""


def test_another_cut_of_the_same_blocks_resumes_and_the_rest_is_refused_naming_both() -> None:
    one_group = {str(i): {"optimizer": {"param_groups": [{"params": []}]}} for i in range(3)}
    state = {"step": 4, stagestate.PIPELINE_KEY: {"stage_blocks": [8, 3, 1], "stages": one_group}}
    assert stagestate.cut_problem(state, [8, 3, 1]) == ""
    assert stagestate.cut_problem(state, [6, 6]) == ""  # the optimizer state moves by name
    assert "holds a model of 12 blocks (stages of [8, 3, 1]) and this plan cuts 10" in \
        stagestate.cut_problem(state, [5, 5])
    two_groups = {"0": {"optimizer": {"param_groups": [{"params": []}, {"params": []}]}}}
    several = {"step": 4, stagestate.PIPELINE_KEY: {"stage_blocks": [8, 4], "stages": two_groups}}
    assert "stages of [8, 4] blocks and this plan into [6, 6], and its stage optimizers have " \
        "several parameter groups" in stagestate.cut_problem(several, [6, 6])
    assert "written by a data-parallel job" in stagestate.cut_problem({"step": 4}, [6, 6])
    with pytest.raises(ValueError, match="written by a pipelined job"):
        refuse_pipeline_checkpoint(state)
    refuse_pipeline_checkpoint({"step": 4, "model": {}})  # data-parallel: fine


def _blocks(count: int) -> nn.Sequential:
    return nn.Sequential(*[nn.Sequential(nn.Linear(3, 3), nn.Tanh()) for _ in range(count)]).double()


def _stage_of(whole: nn.Sequential, whole_opt: torch.optim.Optimizer, make_opt, first: int,
              count: int, *, with_state: bool) -> tuple[nn.Sequential, torch.optim.Optimizer]:
    """Blocks ``first .. first+count`` of ``whole`` as a stage module of their own, and its
    optimizer (``with_state``: holding the whole optimizer's state of those parameters, as the
    stage's own optimizer would after the same steps)."""
    module = _blocks(count)
    module.load_state_dict({k: whole.state_dict()[stagestate.global_key(k, first)].clone()
                            for k in module.state_dict()})
    opt = make_opt(module.parameters())
    if with_state:
        named = dict(whole.named_parameters())
        for name, p in module.named_parameters():
            opt.state[p] = {k: (v.clone() if torch.is_tensor(v) else v)
                            for k, v in whole_opt.state[named[stagestate.global_key(name, first)]].items()}
    return module, opt


@pytest.mark.parametrize("make_opt", [lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                                      lambda ps: torch.optim.Adam(ps, lr=0.01)], ids=["sgd", "adam"])
def test_the_optimizer_state_moves_to_another_stage_cut_by_parameter_name(make_opt) -> None:
    """A model of 4 blocks trained 2 steps, saved as stages of [2, 2]; resumed as stages of
    [3, 1]: each new stage's optimizer state is the whole model's for its parameters, and the next
    step gives every block the same parameters as the whole model's next step (float64, exact)."""
    torch.manual_seed(3)
    whole, x = _blocks(4), torch.randn(6, 3, dtype=torch.float64)
    whole_opt = make_opt(whole.parameters())

    def gradients() -> None:
        whole_opt.zero_grad()
        whole(x).pow(2).mean().backward()

    for _ in range(2):
        gradients()
        whole_opt.step()
    saved = {"stage_blocks": [2, 2], "stages": {}}
    for i, first in enumerate((0, 2)):
        module, opt = _stage_of(whole, whole_opt, make_opt, first, 2, with_state=True)
        saved["stages"][str(i)] = stagestate.stage_state(module, opt, first)
    new = [(first, *_stage_of(whole, whole_opt, make_opt, first, count, with_state=False))
           for first, count in ((0, 3), (3, 1))]
    for first, module, opt in new:
        opt.load_state_dict(stagestate.restaged_optimizer_state(saved, module, opt, first))
    gradients()
    named = dict(whole.named_parameters())
    for first, module, opt in new:  # the same gradients, one step each
        for name, p in module.named_parameters():
            p.grad = named[stagestate.global_key(name, first)].grad.clone()
        opt.step()
    whole_opt.step()
    for first, module, _ in new:
        for name, p in module.named_parameters():
            assert torch.equal(p, named[stagestate.global_key(name, first)]), (first, name)
