"""Sharded checkpoints under Group sharding with torch.distributed.checkpoint (issue 12).

Multi-process tests: real Gloo rank processes (tests/worker/shardckpt_ranks.py) with
``HTJ_SHARDING=group`` on groups [A100] [V100] [T4, T4]: FSDP2 shards the model inside the T4
pair, the groups are replicas. The reference is the same job never interrupted. Every rank records
the dataset indices it trained per step; the lost work after the checkpoint is redone, so the
samples of the epoch are the killed phase's records up to the checkpoint step plus the resumed
phase's, each index exactly once.

Single-process tests: what DCP would unpickle from the volume is refused (with the negative
control that DCP's own reader runs it), the writing group, a manifest whose DCP directory is
missing.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from epoch_checks import assert_every_sample_once
from rankproc import RankRun, assert_ok, mixed_cluster_envs, run_ranks
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from hetero_worker.ckpt import agreement, checkpoint, files, store
from hetero_worker.ckpt import sharded as shardckpt

HERE = Path(__file__).parent
SAMPLES = 108  # 6 steps of a global batch of 18
SPLIT4, SPLIT3 = [6, 4, 4, 4], [8, 6, 4]
FULL_NUMEL = 2 * (6 * 10 + 10 + 10 * 6 + 6) + 6 * 2 + 2  # 286 parameters
T4_PAIR_NUMEL = 143  # torch.chunk over 2 along dim 0 of every parameter: 5/5, 3/3, 1/1 rows


def cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(HERE / "shardckpt_ranks.py"), "--out", str(out),
            "--samples", str(SAMPLES), *extra]


def envs(split: list[int], ckpt: Path | None = None, sharding: str = "group",
         ) -> list[dict[str, str]]:
    made = mixed_cluster_envs(split, checkpoint_dir=str(ckpt) if ckpt else "")
    for env in made:
        env["HTJ_SHARDING"] = sharding
    return made


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for p, q in zip(a, b, strict=True) for x, y in zip(p, q, strict=True))


def reports(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def records(out: Path, world: int) -> list[dict]:
    return [json.loads(line) for r in range(world)
            for line in (out / f"steps-rank{r}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The job never interrupted: 4 ranks, one epoch (6 steps)."""
    out = tmp_path_factory.mktemp("reference")
    assert_ok(run_ranks(cmd(out), envs(SPLIT4), timeout_s=200))
    got = reports(out, 4)
    assert [(r["step"], r["epoch"]) for r in got] == [(6, 1)] * 4
    return got


def manifest(ckpt: Path) -> dict:
    """The newest checkpoint's file (weights_only=True)."""
    return files.load_file(store.newest_file(ckpt))


def assert_exact_epoch(phase1: list[dict], phase2: list[dict], saved_step: int) -> None:
    assert_every_sample_once(phase1, phase2, saved_step, SAMPLES)


def assert_failed_after(runs: list[RankRun], killed: int) -> None:
    assert runs[killed].returncode == -9, f"rank {killed} was not killed"
    assert all(r.returncode != 0 for r in runs), "a rank finished although a peer was killed"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_kill_while_publishing_resumes_from_the_previous_checkpoint_bit_identical(
        tmp_path: Path, reference: list[dict]) -> None:
    """Rank 0 dies after the T4 pair wrote step 4's shards, before the manifest moved: the
    manifest still names step 2's complete directory; the job resumes from it on the same plan
    and ends bit-identical to the run never interrupted."""
    ckpt, out1, out2 = tmp_path / "ckpt", tmp_path / "phase1", tmp_path / "phase2"
    runs1 = run_ranks(cmd(out1, "--checkpoint-every", "2", "--kill-at-publish", "4"),
                      envs(SPLIT4, ckpt), timeout_s=200)
    assert_failed_after(runs1, 0)
    saved = manifest(ckpt)
    assert (saved["format"], saved["step"], saved["model"]) == (files.SHARDED_FORMAT, 2, None)
    assert saved["sharded"]["writers"] == [2, 3]  # the largest group writes
    assert sorted(os.listdir(store.newest_file(ckpt).parent / saved["sharded"]["dir"])) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]
    unpublished = [p for p in ckpt.iterdir() if p.name.endswith(".tmp")]
    assert len(unpublished) == 1 and [m.parent.parent for m in unpublished[0].glob("sharded-*/.metadata")] == [
        unpublished[0]], "step 4's data were complete: only publishing was cut"

    runs2 = run_ranks(cmd(out2, "--checkpoint-every", "2"), envs(SPLIT4, ckpt), timeout_s=200)
    assert_ok(runs2)
    got = reports(out2, 4)
    assert [r["resumed_step"] for r in got] == [2] * 4
    assert [r["held_numel"] for r in got] == [FULL_NUMEL, FULL_NUMEL, T4_PAIR_NUMEL, T4_PAIR_NUMEL]
    assert [r["optim_steps"] for r in got] == [[6.0]] * 4  # AdamW's step came back as 2
    for mine, ref in zip(got, reference, strict=True):
        assert mine["params"] == ref["params"], "continuation is not bit-identical"
    assert_exact_epoch(records(out1, 4), records(out2, 4), 2)
    final = manifest(ckpt)
    assert final["step"] == 6
    # the newest 2 verified checkpoints stay (steps 4 and 6), the dead save's .tmp is gone
    assert [c.step for c in store.candidates(ckpt)] == [6, 4]
    assert not [p for p in ckpt.iterdir() if p.name.endswith(".tmp")]
    newest = store.newest_file(ckpt).parent
    assert sorted(p.name for p in newest.iterdir()) == ["MANIFEST.json", "checkpoint.pt", final["sharded"]["dir"]]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_resume_on_one_rank_fewer_reshards_and_sees_every_sample_once(
        tmp_path: Path, reference: list[dict]) -> None:
    """A T4 is killed after step 3; the job resumes step 2 on [A100] [V100] [T4]: DCP reshards the
    T4 pair's two shards into one rank's whole state; exact epoch coverage, replicas equal, and
    the result equals the uninterrupted 4-rank run up to float64 rounding (same samples per
    step, another summation order). The same checkpoint also resumes into a job without
    sharding."""
    ckpt, out1, out2 = tmp_path / "ckpt", tmp_path / "phase1", tmp_path / "phase2"
    runs1 = run_ranks(cmd(out1, "--checkpoint-every", "2", "--kill-after", "3",
                          "--kill-rank", "3"), envs(SPLIT4, ckpt), timeout_s=200)
    assert_failed_after(runs1, 3)
    assert manifest(ckpt)["step"] == 2
    shutil.copytree(ckpt, tmp_path / "ckpt-unsharded")  # for the resume without sharding below

    runs2 = run_ranks(cmd(out2, "--checkpoint-every", "2"), envs(SPLIT3, ckpt), timeout_s=200)
    assert_ok(runs2)
    assert "resume_replanned: step 2, world 4 -> 3, split [6, 4, 4, 4] -> [8, 6, 4]" \
        in runs2[0].stderr
    got = reports(out2, 3)
    assert [(r["resumed_step"], r["step"], r["epoch"]) for r in got] == [(2, 6, 1)] * 3
    assert [r["held_numel"] for r in got] == [FULL_NUMEL] * 3  # the lone T4 holds it all
    assert all(r["params"] == got[0]["params"] for r in got), "replicas diverged"
    steps = records(out2, 3)
    assert sorted(len(r["idx"]) for r in steps if r["step"] == 3) == [4, 6, 8]
    assert_exact_epoch(records(out1, 4), steps, 2)
    assert max_diff(got[0]["params"], reference[0]["params"]) <= 1e-12
    assert manifest(ckpt)["plan"]["world_size"] == 3

    # The same checkpoint resumed by a job that no longer shards (HTJ_SHARDING=none, DDP): DCP
    # assembles whole tensors from the T4 pair's shards; it then writes a format-2 checkpoint.
    plain, out3 = tmp_path / "ckpt-unsharded", tmp_path / "phase2-unsharded"
    runs3 = run_ranks(cmd(out3, "--checkpoint-every", "2"), envs(SPLIT3, plain, "none"),
                      timeout_s=200)
    assert_ok(runs3)
    got = reports(out3, 3)
    assert [(r["resumed_step"], r["step"], r["sharded"]) for r in got] == [(2, 6, False)] * 3
    assert_exact_epoch(records(out1, 4), records(out3, 3), 2)
    assert max_diff(got[0]["params"], reference[0]["params"]) <= 1e-12
    assert manifest(plain)["format"] == files.FORMAT

# --- single process: what is read from the volume ------------------------------------------

class RunsOnLoad:
    """Pickles as ``os.mkdir(marker)``: unpickling it creates a directory (a harmless stand-in
    for code an attacker would run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.mkdir, (str(self.marker),))


pytestmark = pytest.mark.filterwarnings(  # dcp.save/load with no_dist=True say so
    "ignore:torch.distributed is disabled:UserWarning")


def _save_single(path: Path, state: dict) -> None:
    dcp.save(state, storage_writer=FileSystemWriter(path), no_dist=True)


def test_metadata_that_would_run_code_is_refused(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    _save_single(ckpt, {"w": torch.arange(6.0)})
    assert isinstance(shardckpt.load_metadata(ckpt / ".metadata"), dcp.Metadata)  # DCP's own: read
    marker = tmp_path / "ran"
    (ckpt / ".metadata").write_bytes(pickle.dumps(RunsOnLoad(marker)))
    target = {"w": torch.zeros(6)}
    with pytest.raises(CheckpointException, match=r"posix\.mkdir, which a checkpoint's metadata never holds"):
        dcp.load(target, storage_reader=shardckpt.SafeFileSystemReader(ckpt), no_dist=True)
    assert not marker.exists()
    # Negative control: DCP's own reader unpickles it (and runs it).
    with pytest.raises(CheckpointException):
        dcp.load(target, storage_reader=FileSystemReader(ckpt), no_dist=True)
    assert marker.is_dir()


def test_value_that_would_run_code_is_refused(tmp_path: Path) -> None:
    ckpt, marker = tmp_path / "ckpt", tmp_path / "ran"
    _save_single(ckpt, {"w": torch.arange(6.0), "lr": 0.5, "obj": RunsOnLoad(marker)})
    assert not marker.exists()
    fine = {"w": torch.zeros(6), "lr": 0.0}  # tensors and plain values load
    dcp.load(fine, storage_reader=shardckpt.SafeFileSystemReader(ckpt),
             planner=shardckpt.SafeLoadPlanner(allow_partial_load=True), no_dist=True)
    assert fine["lr"] == 0.5 and torch.equal(fine["w"], torch.arange(6.0))
    with pytest.raises(CheckpointException, match="Weights only load failed"):
        dcp.load({"obj": None}, storage_reader=shardckpt.SafeFileSystemReader(ckpt),
                 planner=shardckpt.SafeLoadPlanner(allow_partial_load=True), no_dist=True)
    assert not marker.exists()
    # Negative control: DCP's default planner loads values with weights-only loading off.
    dcp.load({"obj": None}, storage_reader=FileSystemReader(ckpt),
             planner=DefaultLoadPlanner(allow_partial_load=True), no_dist=True)
    assert marker.is_dir()


def test_largest_group_writes() -> None:
    assert shardckpt.saver_ranks([(0,), (1,), (2, 3)]) == (2, 3)
    assert shardckpt.saver_ranks([(0, 1), (2, 3)]) == (0, 1)
    assert shardckpt.saver_ranks([(0,), (1,)]) == (0,)


def test_manifest_without_its_sharded_directory_is_not_resumed(tmp_path: Path) -> None:
    """A manifest naming a missing (or outside) DCP directory is an unreadable checkpoint: the
    agreement stops every rank instead of resuming half a state."""
    ckpt = tmp_path / "ckpt"
    state = files.manifest(checkpoint_id="ab", step=4, model=None, optimizer=None,
                                scaler=None, sampler=None, plan={"world_size": 1},
                                ranks=[{"rng": files.rng_state()}],
                                sharded={"dir": "sharded-ab", "writers": [0]})
    files.save_atomic(state, ckpt / files.CHECKPOINT_FILE)
    got, finding = checkpoint.read_checkpoint(ckpt)
    assert got is None
    assert finding.error == (f"FileNotFoundError: sharded state {ckpt / 'sharded-ab' / '.metadata'} "
                             "is missing")
    with pytest.raises(agreement.ResumeDisagreement, match="rank 0 could not read"):
        agreement.agree_on_resume(finding)
    _save_single(ckpt / "sharded-ab", {"w": torch.zeros(1)})
    got, finding = checkpoint.read_checkpoint(ckpt)
    assert (got["step"], finding.step, finding.error) == (4, 4, "")
    state["sharded"]["dir"] = "../elsewhere"
    files.save_atomic(state, ckpt / files.CHECKPOINT_FILE)
    assert "not a sharded-<id> entry" in checkpoint.read_checkpoint(ckpt)[1].error


@pytest.fixture
def world_of_one():  # type: ignore[no-untyped-def]
    """A one-rank Gloo world in this process (FSDP2 and DCP need a process group)."""
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def _sharded_model(group) -> tuple[torch.nn.Module, torch.optim.Optimizer]:  # type: ignore[no-untyped-def]
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(1)
    model = fully_shard(torch.nn.Sequential(torch.nn.Linear(4, 3)).double(),
                        mesh=DeviceMesh.from_group(group, "cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 4, dtype=torch.float64)).sum().backward()
    opt.step()
    return model, opt


def test_failed_write_keeps_the_previous_checkpoint(tmp_path: Path, world_of_one,  # type: ignore[no-untyped-def]
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = tmp_path / "ckpt"
    model, opt = _sharded_model(world_of_one)
    saved = [p.full_tensor().clone() for p in model.parameters()]
    shardckpt.save_sharded_checkpoint(ckpt, step=1, model=model, optimizer=opt, groups=[(0,)],
                                      group=world_of_one, rank=0)
    first = manifest(ckpt)

    def disk_full(*_a: object, **_k: object) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(shardckpt.dcp, "save", disk_full)
    with pytest.raises(RuntimeError, match=r"^sharded checkpoint of step 2 failed on every rank's "
                       r"account \(rank 0: writing .*\.step-00000002-[0-9a-f]{16}\.tmp/sharded-[0-9a-f]{16}: "
                       r"OSError: No space "
                       r"left on device\); the previous checkpoint is kept$"):
        shardckpt.save_sharded_checkpoint(ckpt, step=2, model=model, optimizer=opt,
                                          groups=[(0,)], group=world_of_one, rank=0)
    monkeypatch.undo()
    assert manifest(ckpt)["checkpoint_id"] == first["checkpoint_id"]
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    state = checkpoint.load_checkpoint(ckpt, model=model, optimizer=opt)
    assert state is not None and state["step"] == 1
    for p, q in zip(model.parameters(), saved, strict=True):
        assert torch.equal(p.full_tensor(), q)
    assert all(torch.count_nonzero(s["momentum_buffer"].full_tensor()) > 0
               for s in opt.state.values())


def test_replicated_checkpoint_loads_into_a_sharded_model(tmp_path: Path,  # type: ignore[no-untyped-def]
                                                          world_of_one) -> None:
    """Case 62 in one process: a format-2 checkpoint (one full state dict) goes into an FSDP2
    model: parameters and SGD momentum by name (the optimizer's ids mapped through the recorded
    names), in place (it was refused before: "taken without sharding")."""
    plain = torch.nn.Sequential(torch.nn.Linear(4, 3)).double()
    opt_plain = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    plain(torch.ones(2, 4, dtype=torch.float64)).square().sum().backward()
    opt_plain.step()
    checkpoint.save_checkpoint(tmp_path, step=3, model=plain, optimizer=opt_plain)
    assert files.load_file(store.newest_file(tmp_path))["optimizer_fqns"] == ["0.weight", "0.bias"]
    model, opt = _sharded_model(world_of_one)
    state = checkpoint.load_checkpoint(tmp_path, model=model, optimizer=opt)
    assert state is not None and state["step"] == 3
    for p, q in zip(model.parameters(), plain.parameters(), strict=True):
        assert torch.equal(p.full_tensor(), q)
        assert torch.equal(opt.state[p]["momentum_buffer"].full_tensor(),
                           opt_plain.state[q]["momentum_buffer"])


def test_resume_under_full_sharding_takes_the_flat_pieces(tmp_path, world_of_one) -> None:  # type: ignore[no-untyped-def]
    """Under Full sharding (one rank here: one slice per unit) a format-2 checkpoint is cut into
    the unit's flat slice by parameter name, buffers (BatchNorm's running statistics) included (it
    was refused before: "does not resume"); the flat DCP layout of Full writes and reads it back."""
    from hetero_worker.ckpt import flatdcp, pieces
    from hetero_worker.memory import full as fullshard

    def net() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3),
                                   torch.nn.Linear(3, 2)).double()

    plain = net()
    opt_plain = torch.optim.AdamW(plain.parameters(), lr=0.1)
    plain(torch.arange(8.0, dtype=torch.float64).view(2, 4)).square().sum().backward()
    opt_plain.step()
    checkpoint.save_checkpoint(tmp_path / "plain", step=1, model=plain, optimizer=opt_plain)
    torch.manual_seed(3)
    model = net()
    units = fullshard.shard_full(model, block=None, shares_ppm=[10**6], rank=0,
                                 groups_of_ranks=[0], device=torch.device("cpu"))
    sync = fullshard.FullShardSync(units=units, local_batches=[2], micro_batch_sizes=[0], rank=0)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    state = checkpoint.load_checkpoint(tmp_path / "plain", model=model, optimizer=opt,
                                       shard_sync=sync)
    assert state is not None and state["step"] == 1
    flat = torch.cat([p.detach().reshape(-1) for p in plain.parameters()])
    moments = torch.cat([opt_plain.state[p]["exp_avg"].reshape(-1) for p in plain.parameters()])

    def assert_restored() -> None:
        assert torch.equal(units[0].shard.detach(), flat)
        assert torch.equal(opt.state[units[0].shard]["exp_avg"], moments)
        assert float(opt.state[units[0].shard]["step"]) == 1.0
        assert torch.equal(model[1].running_mean, plain[1].running_mean)
        assert int(model[1].num_batches_tracked) == 1

    assert_restored()
    held = pieces.held_pieces(model, sync)
    assert [(p.name, p.lo, p.hi) for p in held] == [
        ("0.weight", 0, 12), ("0.bias", 0, 3), ("1.weight", 0, 3), ("1.bias", 0, 3),
        ("2.weight", 0, 6), ("2.bias", 0, 2)]
    flatdcp.save_pieces(tmp_path / "flat", held, opt, buffers=pieces.persistent_buffers(model))
    with torch.no_grad():
        units[0].shard.zero_()
        opt.state[units[0].shard]["exp_avg"].zero_()
        model[1].running_mean.zero_()
        model[1].num_batches_tracked.zero_()
    flatdcp.load_pieces(tmp_path / "flat", held, opt, pieces.persistent_buffers(model))
    assert_restored()
