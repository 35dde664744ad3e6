"""Every pair of training features, tested together (issue 21).

Factors: precision (FP32, BF16, FP16 with the scaler and an overflow injected into the first step)
x compression (None, Int8, PowerSGD) x sharding (None, Group, Full) x layout (Flat, PerNode,
PerArchitecture) x work stealing x rebalancing x kill-and-resume.  :data:`ROWS` covers every pair
of values at least once (pairwise; :func:`test_rows_cover_every_pair_of_feature_values` checks it),
and every pair that does not by itself need a refusal is covered by a row that trains.

Each row is planned by the real planner on a 4-GPU cluster (2x A100 on node-a, one L4 on node-b
and one on node-c: Flat = one group, PerNode = {0,1},{2},{3}, PerArchitecture = {0,1},{2,3}).
A row either

* is refused when the plan is made, with the reason and the fix in the message (the planner's
  ``ModelDoesNotFit``: what the worker does not build, e.g. Full sharding with compression), or
* trains on 4 real Gloo rank processes from the plan's rendered contract: the full-data loss goes
  down, every rank ends with the same parameters, an fp16 row skips the injected overflow on every
  rank and keeps learning (its codec state stays finite), an FP32 row without compression or
  stealing ends where one process on the same batches ends (the exact reference), and a
  kill-and-resume row resumes exactly at its checkpoint in new processes and finishes.

Beside the pairwise rows, four rows train Group and Full sharding with global-norm clipping
(``max_grad_norm``) and with token-weighted steps (``num_tokens``, uneven split): each ends equal
to one float64 process with that feature, and far from the one without it (issue 29, item 7).

Work stealing is a call in the training loop (``Trainer.steal_step``), not part of the spec, so
the planner cannot see it: its refusal under Group/Full sharding comes from the trainer, before
any collective, naming the fix (rows ``steal-group`` and ``steal-full``).

All rows share two sets of 4 processes (tests/worker/matrix_ranks.py): phase a trains every row
and the interrupted copies, then every process SIGKILLs itself; phase b resumes.

Without the codec finiteness fix (int8's and PowerSGD's error feedback turning NaN after the first
fp16 overflow), the rows ``fp16-int8`` and ``fp16-powersgd`` fail here: every step after the
first is skipped, the loss never goes down.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from builders import make_node
from rankproc import base_env, wait_all

from hetero_operator.api import types as model
from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.planning.plan import plan_job
from hetero_operator.render.env import render_rank_envs
from hetero_worker.runtime.simulation import free_port
from hetero_worker.sampler import HeteroBatchSampler
from heterotrain_common import contract as c
from heterotrain_common import envnames

sys.path.insert(0, str(Path(__file__).parent))
import matrix_ranks as mr  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
HERE = Path(__file__).parent

FACTORS: dict[str, tuple[Any, ...]] = {
    "precision": ("fp32", "bf16", "fp16"), "compression": ("none", "int8", "powersgd"),
    "sharding": ("none", "group", "full"), "layout": ("flat", "node", "arch"),
    "stealing": (False, True), "rebalance": (False, True), "resume": (False, True)}


def row(id_: str, precision: str, compression: str, sharding: str, layout: str, *,
        stealing: bool = False, rebalance: bool = False, resume: bool = False,
        refused_by: str = "", clip: float | None = None, tokens: bool = False) -> dict[str, Any]:
    """One combination; ``refused_by`` is ``"plan"`` or ``"trainer"`` for a row that must not train;
    ``clip``: the trainer's ``max_grad_norm``; ``tokens``: token-weighted steps (``num_tokens``)."""
    return {"id": id_, "precision": precision, "compression": compression, "sharding": sharding,
            "layout": layout, "stealing": stealing, "rebalance": rebalance, "resume": resume,
            "refused_by": refused_by, "clip": clip, "tokens": tokens}


CLIP_NORM = 0.75
"""Clipping rows' ``max_grad_norm``: the reference's global norm runs 0.61-0.94, so about half
the steps clip."""
ROWS = [  # pairwise over FACTORS (greedy covering array; the test below checks the coverage)
    row("fp16-int8", "fp16", "int8", "none", "node"),
    row("fp16-powersgd", "fp16", "powersgd", "none", "arch", rebalance=True, resume=True),
    row("bf16-steal-resume", "bf16", "none", "none", "flat", stealing=True, resume=True),
    row("fp32-group-arch", "fp32", "none", "group", "arch"),
    row("fp32-powersgd-steal", "fp32", "powersgd", "none", "node", stealing=True, rebalance=True),
    row("bf16-full-node", "bf16", "none", "full", "node"),
    row("fp32-int8-resume", "fp32", "int8", "none", "flat", rebalance=True, resume=True),
    row("bf16-int8-steal", "bf16", "int8", "none", "arch", stealing=True, rebalance=True),
    row("fp16-full", "fp16", "int8", "full", "arch", stealing=True, rebalance=True, resume=True,
        refused_by="plan"),
    row("fp16-steal", "fp16", "none", "none", "flat", stealing=True, rebalance=True),
    row("fp16-group", "fp16", "powersgd", "group", "flat", rebalance=True, resume=True),
    row("fp32-group-resume", "fp32", "none", "group", "node", resume=True),
    row("bf16-powersgd-steal", "bf16", "powersgd", "none", "flat", stealing=True),
    row("fp32-full-arch", "fp32", "none", "full", "arch"),
    row("bf16-group-flat", "bf16", "none", "group", "flat"),
    row("bf16-int8-group", "bf16", "int8", "group", "node", stealing=True, rebalance=True,
        refused_by="trainer"),
    row("fp16-int8-group", "fp16", "int8", "group", "arch", rebalance=True),  # issue 29
    row("fp16-full-rebalance", "fp16", "none", "full", "node", rebalance=True),  # issue 29
    row("fp32-full-flat", "fp32", "none", "full", "flat"),
    row("fp32-powersgd-full", "fp32", "powersgd", "full", "arch", refused_by="plan"),
    row("full-resume", "bf16", "none", "full", "flat", resume=True),  # issue 29, item 2
    row("steal-group", "fp32", "none", "group", "arch", stealing=True, refused_by="trainer"),
    row("steal-full", "bf16", "none", "full", "node", stealing=True, refused_by="trainer"),
    # issue 29, item 7: sharding x global-norm clipping and x token weighting (exact references)
    row("clip-group", "fp32", "none", "group", "arch", clip=CLIP_NORM),
    row("clip-full", "fp32", "none", "full", "node", clip=CLIP_NORM),
    row("tokens-group", "fp32", "none", "group", "node", tokens=True),
    row("tokens-full", "fp32", "none", "full", "flat", tokens=True),
]
TRAINED = [r for r in ROWS if not r["refused_by"]]
SLOW_RANK = 3
"""In rows with rebalancing the L4 of rank 3 really runs at a quarter of its table speed."""
HIERARCHY = {"flat": "Flat", "node": "PerNode", "arch": "PerArchitecture"}


def needs_refusal(r: dict[str, Any]) -> bool:
    """What the planner and the trainer refuse (the model the rows are checked against)."""
    if r["sharding"] == "none":
        return False
    # fp16, rebalancing and compression under Group, checkpoints under Full: built (issue 29);
    # compression under Full is refused at plan time with the reason (no one cross-group
    # exchange to compress) and the fix
    return r["stealing"] or (r["sharding"] == "full" and r["compression"] != "none")


def test_rows_cover_every_pair_of_feature_values() -> None:
    base = {"precision": "fp32", "compression": "none", "sharding": "none", "layout": "flat",
            "stealing": False, "rebalance": False, "resume": False}
    for r in ROWS:
        assert bool(r["refused_by"]) == needs_refusal(r), r["id"]
    uncovered, untrained = [], []
    for a, b in itertools.combinations(FACTORS, 2):
        for va, vb in itertools.product(FACTORS[a], FACTORS[b]):
            rows = [r for r in ROWS if r[a] == va and r[b] == vb]
            if not rows:
                uncovered.append((a, va, b, vb))
            elif not needs_refusal({**base, a: va, b: vb}) and all(r["refused_by"] for r in rows):
                untrained.append((a, va, b, vb))
    assert not uncovered, f"pairs in no row: {uncovered}"
    assert not untrained, f"compatible pairs only in refused rows: {untrained}"


# --- planning ----------------------------------------------------------------------------------

def nodes() -> list[dict[str, Any]]:
    l4 = {"product": "NVIDIA-L4", "memory_mib": 23034, "cc": "8.9"}
    return [make_node("node-a", count=2), make_node("node-b", **l4), make_node("node-c", **l4)]


IMAGES = [{"image": "reg/worker:cu124", "cudaVersion": "12.4", "torchVersion": "2.13.0",
           "computeCapabilities": ["8.0", "8.9"]}]


def manifest(r: dict[str, Any], ckpt: Path) -> dict[str, Any]:
    training: dict[str, Any] = {
        "globalBatchSize": mr.GLOBAL_BATCH, "precision": r["precision"].upper(),
        "hierarchy": HIERARCHY[r["layout"]], "sharding": r["sharding"].capitalize(),
        "model": {"parameters": "1k"},  # small: every sharding mode fits; its refusals are the worker's
        # rank 4: the 64 x 16 weight is factored ((64 + 16) x 4 < 64 x 16); at the default 16
        # nothing of this small model would be, and PowerSGD would keep no error feedback at all
        "compression": {"mode": {"none": "None", "int8": "Int8", "powersgd": "PowerSGD"}[r["compression"]],
                        "powerSGDRank": 4}}
    if r["rebalance"]:
        training["rebalance"] = {"intervalSteps": 2}
    if r["resume"]:
        training["checkpoint"] = {"path": str(ckpt), "intervalSteps": mr.CHECKPOINT_EVERY}
    return {"apiVersion": "heterotrain.io/v1alpha1", "kind": "HeteroTrainingJob",
            "metadata": {"name": f"mx-{r['id']}", "namespace": "default"},
            "spec": {"worker": {"command": ["python", "-m", "train"]}, "images": IMAGES,
                     "gpus": {"ranks": 4, "minRanks": 4, "selection": "All"}, "training": training}}


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("matrix")
    inventory = build_inventory(nodes())
    out: dict[str, Any] = {}
    for r in ROWS:
        ckpt = tmp / r["id"] / "ckpt"
        spec = parse_job(manifest(r, ckpt))
        result = plan_job(spec, inventory)
        entry = {**r, "result": result}
        if isinstance(result, model.Plan):
            envs = render_rank_envs(result, spec, master_addr="127.0.0.1", master_port=1,
                                    simulated=True)
            if r["rebalance"]:  # a device slower than the table says: the rebalancer must see it
                prof = c.DeviceProfile.from_json(envs[SLOW_RANK][envnames.DEVICE_PROFILE])
                envs[SLOW_RANK][envnames.DEVICE_PROFILE] = replace(
                    prof, relative_speed=prof.relative_speed / 4).to_json()
            entry.update(envs=envs, reference_dir=str(tmp / r["id"] / "reference"),
                         split=[p.local_batch for p in result.ranks])
        out[r["id"]] = entry
    out["_tmp"] = tmp
    return out


# --- the two phases of rank processes ------------------------------------------------------------

def spawn(phase: str, rows: list[dict[str, Any]], tmp: Path) -> list[dict[str, Any]]:
    out = tmp / f"phase-{phase}"
    out.mkdir()
    rows_file = out / "rows.json"
    rows_file.write_text(json.dumps([{k: v for k, v in r.items() if k != "result"} for r in rows]))
    port = free_port()
    started = time.time()
    procs = []
    for rank in range(4):
        env = base_env(HTJ_SIM_DELAY_PER_SAMPLE_S="0.0005", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="4")
        procs.append(subprocess.Popen([sys.executable, str(HERE / "matrix_ranks.py"), phase,
                                       str(rows_file), str(out)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, cwd=HERE.parent.parent))
    runs = wait_all(procs, timeout_s=300)
    for run in runs:  # kept for a look at per-row times (matrix: row ... at N s)
        (out / f"rank{run.rank}.log").write_text(f"spawned at {started:.1f}, done {time.time():.1f}\n"
                                                  + run.stderr)
    want = -9 if phase == "a" else 0  # phase a ends with SIGKILL (killed, no clean shutdown)
    for run in runs:
        assert run.returncode == want, f"phase {phase} rank {run.rank} exit {run.returncode}:\n{run.stderr[-6000:]}"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]


@pytest.fixture(scope="module")
def runs(planned: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    rows = [planned[r["id"]] for r in ROWS if isinstance(planned[r["id"]]["result"], model.Plan)]
    a = spawn("a", rows, planned["_tmp"])
    b = spawn("b", [r for r in rows if r["resume"]], planned["_tmp"])
    out: dict[str, list[dict[str, Any]]] = {}
    for rid in {r["id"] for r in rows}:
        out[rid] = [{**a[rank][rid], **b[rank].get(rid, {})} for rank in range(4)]
    return out


# --- refusals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("r", [r for r in ROWS if r["refused_by"] == "plan"], ids=lambda r: r["id"])
def test_refused_rows_are_refused_when_the_plan_is_made_naming_the_fix(planned, r) -> None:
    result = planned[r["id"]]["result"]
    assert isinstance(result, model.Unschedulable), (r["id"], result)
    assert result.reason == "ModelDoesNotFit"
    assert result.message.startswith(f"spec.training.sharding {r['sharding'].capitalize()}: ")
    # the fix, checked by planning it (planning/remedies.py), or the static one where none plans
    checked = re.search(r"sharding is not built with .* yet: it plans if spec\.training\..* "
                        r"\(checked: \d+ ranks?, sharding \w+\)", result.message)
    static = (re.search(r"not built .*yet", result.message)
              and ("set spec.training." in result.message or "leave spec.training." in result.message))
    assert checked or static, result.message


@pytest.mark.parametrize("r", [r for r in ROWS if r["refused_by"] == "trainer"], ids=lambda r: r["id"])
def test_stealing_under_sharding_is_refused_by_the_trainer_naming_the_fix(planned, runs, r) -> None:
    assert isinstance(planned[r["id"]]["result"], model.Plan)  # the spec cannot say "stealing"
    for rank in runs[r["id"]]:
        refused = rank["run"]["refused"]
        assert refused and "work stealing under" in refused and "spec.training.sharding None" in refused
        assert rank["run"]["losses"] == []  # refused before its first step


# --- what every trained row shows ---------------------------------------------------------------

def initial_loss() -> float:
    return mr.eval_loss(dict(mr.make_model().state_dict()))


@pytest.mark.parametrize("r", TRAINED, ids=lambda r: r["id"])
def test_trained_rows_learn_and_every_rank_ends_identical(planned, runs, r) -> None:
    facts = [rank["run"] for rank in runs[r["id"]]]
    if r["compression"] != "none" and r["layout"] != "flat":  # the codec really ran, with state
        assert all(f["codec_state"] for f in facts if f["leader"]), (r["id"], facts[0])
    assert all(f["refused"] is None for f in facts), facts[0]["refused"]
    assert all(f["step"] == mr.STEPS for f in facts)
    assert facts[0]["eval_loss"] < 0.8 * initial_loss(), (r["id"], facts[0]["eval_loss"], initial_loss())
    for f in facts[1:]:
        assert f["params"] == facts[0]["params"], r["id"]
    assert all(f["codecs_finite"] for f in facts)
    assert all(sum(s) == mr.GLOBAL_BATCH for f in facts for s in f["splits"])


@pytest.mark.parametrize("r", [r for r in TRAINED if r["precision"] == "fp16"], ids=lambda r: r["id"])
def test_fp16_rows_skip_the_injected_overflow_on_every_rank_and_keep_learning(runs, r) -> None:
    facts = [rank["run"] for rank in runs[r["id"]]]
    for f in facts:
        assert f["skipped"][0] is True, r["id"]
        assert f["skipped"] == facts[0]["skipped"] and f["scale"] == facts[0]["scale"]
        # then it learns: a real fp16 overflow may skip another step or two (the scaler halves
        # again); without the codec fix every step after the first was skipped
        assert sum(f["skipped"][1:]) <= 2, (r["id"], f["skipped"])
        assert f["scale"] <= 2.0 ** 15  # the default 2^16, halved at least once


def reference_params(split: list[int]) -> dict[str, torch.Tensor]:
    """One process, the same samples per step (the step's global batch does not depend on the
    split or the layout), plain SGD: what an exact data-parallel update must equal."""
    model_ = mr.make_model()
    x, y = mr.make_data().tensors
    order = HeteroBatchSampler(mr.SAMPLES, split, 0, seed=0).permutation(0)
    opt = torch.optim.SGD(model_.parameters(), lr=mr.LR)
    for s in range(mr.STEPS):
        idx = order[s * mr.GLOBAL_BATCH:(s + 1) * mr.GLOBAL_BATCH]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model_(x[idx]), y[idx]).backward()
        opt.step()
    return {k: v.detach() for k, v in model_.state_dict().items()}


EXACT = [r for r in TRAINED if r["precision"] == "fp32" and r["compression"] == "none"
         and not r["stealing"] and r["clip"] is None and not r["tokens"]]


@pytest.mark.parametrize("r", EXACT, ids=lambda r: r["id"])
def test_fp32_rows_without_compression_equal_one_process_on_the_same_batches(planned, runs, r) -> None:
    want = reference_params(planned[r["id"]]["split"])
    got = runs[r["id"]][0]["run"]["params"]
    for name, tensor in want.items():
        diff = (torch.tensor(got[name]) - tensor).abs().max().item()
        assert diff <= 1e-5, (r["id"], name, diff)


def reference_f64(split: list[int], *, clip: float | None = None, tokens: bool = False
                  ) -> tuple[dict[str, torch.Tensor], list[float]]:
    """:func:`reference_params` in float64, clipping the whole gradient to ``clip`` (2-norm) and/or
    taking each step's mean over all its tokens (:func:`matrix_ranks.token_loss` on the whole
    global batch). Returns the parameters and each step's gradient norm before the clip."""
    model_ = mr.make_model().double()
    x, y = mr.make_data().tensors
    x = x.double()
    order = HeteroBatchSampler(mr.SAMPLES, split, 0, seed=0).permutation(0)
    opt = torch.optim.SGD(model_.parameters(), lr=mr.LR)
    norms = []
    for s in range(mr.STEPS):
        idx = order[s * mr.GLOBAL_BATCH:(s + 1) * mr.GLOBAL_BATCH]
        opt.zero_grad()
        if tokens:
            mr.token_loss(model_, x[idx], y[idx]).backward()
        else:
            torch.nn.functional.cross_entropy(model_(x[idx]), y[idx]).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model_.parameters(), clip or float("inf"))))
        opt.step()
    return {k: v.detach() for k, v in model_.state_dict().items()}, norms


def max_diff(got: dict[str, Any], want: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference over every parameter."""
    return max((torch.tensor(got[k], dtype=torch.float64) - v).abs().max().item()
               for k, v in want.items())


@pytest.mark.parametrize("r", [r for r in TRAINED if r["clip"] is not None or r["tokens"]],
                         ids=lambda r: r["id"])
def test_sharded_clipping_and_token_rows_equal_a_float64_reference(planned, runs, r) -> None:
    """Group/Full sharding x ``max_grad_norm`` (the norm over every shard and group) and x
    ``num_tokens`` (the mean over every valid token of the uneven split): the rank's parameters
    equal one float64 process's; the reference without the feature is far off, so the row shows
    the feature worked (a per-shard norm or a sample-weighted mean fails here)."""
    split = planned[r["id"]]["split"]
    want, norms = reference_f64(split, clip=r["clip"], tokens=r["tokens"])
    plain, _ = reference_f64(split)
    if r["clip"] is not None:
        assert sum(n > r["clip"] for n in norms) >= 3, norms  # the clip really acts
    else:
        assert len(set(split)) > 1, split  # uneven: token and sample weighting differ
    for rank in runs[r["id"]]:
        got = rank["run"]["params"]
        assert max_diff(got, want) <= 1e-5, (r["id"], rank["run"]["step"], max_diff(got, want))
    assert max_diff(runs[r["id"]][0]["run"]["params"], plain) > 1e-3, r["id"]


RESUMED = [r for r in TRAINED if r["resume"]]


@pytest.mark.parametrize("r", RESUMED, ids=lambda r: r["id"])
def test_killed_rows_resume_exactly_at_their_checkpoint_in_new_processes(runs, r) -> None:
    for rank in runs[r["id"]]:
        cut, resumed, run = rank["interrupted"], rank["resumed"], rank["run"]
        assert cut["step"] == mr.KILL_AFTER and cut["checkpointed"] is not None
        assert resumed["resumed"] is True and resumed["resumed_step"] == mr.CHECKPOINT_EVERY
        assert resumed["params_at_resume"] == cut["checkpointed"]  # the checkpoint, bit for bit
        assert resumed["step"] == mr.STEPS
        assert len(resumed["losses"]) == mr.STEPS - mr.CHECKPOINT_EVERY
        assert resumed["eval_loss"] < 0.8 * initial_loss()
        assert resumed["codecs_finite"]
        if not r["rebalance"]:  # without a timing-driven split the resumed run ends near the unbroken one
            for name, values in run["params"].items():
                diff = (torch.tensor(resumed["params"][name]) - torch.tensor(values)).abs().max().item()
                assert diff <= 1e-4, (r["id"], name, diff)


@pytest.mark.parametrize("r", [r for r in TRAINED if r["rebalance"]], ids=lambda r: r["id"])
def test_rebalancing_rows_move_samples_off_the_slow_rank(planned, runs, r) -> None:
    """With work stealing the split is moot (each rank takes micro-batches as it can) and stays as
    planned; without it the rebalancer moves samples off the rank that is slower than planned."""
    planned_batch = planned[r["id"]]["split"][SLOW_RANK]
    splits = runs[r["id"]][0]["run"]["splits"]
    if r["stealing"]:
        assert all(s[SLOW_RANK] == planned_batch for s in splits)
    else:
        assert splits[-1][SLOW_RANK] < planned_batch, (r["id"], splits)
