"""Checkpoints kept and verified (hetero_worker/ckpt/store.py; issue 20), in one process: the
newest ``keep`` stay, each verifies against its manifest, a truncated or corrupt newest one falls
back to the previous (sharded DCP checkpoints too), the old single-file layout is still read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetero_worker.ckpt import checkpoint, files, store
from hetero_worker.ckpt import sharded as shardckpt


def _model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2).double()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _save(ckpt: Path, step: int, keep: int = 2) -> torch.nn.Module:
    model, opt = _model(step)
    checkpoint.save_checkpoint(ckpt, step=step, model=model, optimizer=opt, keep=keep)
    return model


def test_the_newest_keep_checkpoints_stay_and_each_verifies(tmp_path: Path) -> None:
    for step in (2, 4, 6):
        _save(tmp_path, step)
    kept = store.candidates(tmp_path)
    assert [c.step for c in kept] == [6, 4]
    assert all(store.verify(c) == "" for c in kept)
    manifest = kept[0].manifest
    assert manifest is not None and [f["path"] for f in manifest["files"]] == ["checkpoint.pt"]
    assert manifest["files"][0]["size"] == kept[0].file.stat().st_size
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    _save(tmp_path, 8, keep=3)
    assert [c.step for c in store.candidates(tmp_path)] == [8, 6, 4]


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path) -> None:
    _save(tmp_path, 2)
    previous = _save(tmp_path, 4)
    _save(tmp_path, 6)
    newest = store.candidates(tmp_path)[0]
    data = bytearray(newest.file.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte: same size, another checksum
    newest.file.write_bytes(bytes(data))
    assert "does not match its SHA-256" in store.verify(newest)
    model, opt = _model(99)
    state = checkpoint.load_checkpoint(tmp_path, model=model, optimizer=opt)
    assert state is not None and state["step"] == 4
    assert "step 6" in checkpoint.LAST_RESUME["fallback"] and "corrupt" in checkpoint.LAST_RESUME["fallback"]
    for a, b in zip(model.parameters(), previous.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_missing_manifest_is_no_checkpoint_and_a_failed_save_keeps_the_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _save(tmp_path, 2)
    _save(tmp_path, 4)
    (store.candidates(tmp_path)[0].path / store.MANIFEST).unlink()  # a save cut before its manifest
    model, opt = _model(1)
    assert checkpoint.load_checkpoint(tmp_path, model=model, optimizer=opt)["step"] == 2

    def disk_full(*_a: object, **_k: object) -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(checkpoint, "save_atomic", disk_full)
    with pytest.raises(OSError, match=r"saving the checkpoint of step 6 .*No space left on device"):
        _save(tmp_path, 6)
    assert [c.step for c in store.candidates(tmp_path) if c.manifest] == [2]


def test_the_single_file_layout_of_before_is_still_resumed(tmp_path: Path) -> None:
    model, opt = _model(3)
    files.save_atomic(files.manifest(checkpoint_id="ab", step=7, model=model, optimizer=opt, scaler=None,
                                     sampler=None, plan={"world_size": 1}, ranks=[{"rng": files.rng_state()}]),
                      tmp_path / files.CHECKPOINT_FILE)
    other, other_opt = _model(4)
    assert checkpoint.load_checkpoint(tmp_path, model=other, optimizer=other_opt)["step"] == 7
    # a new checkpoint is preferred, and the old file goes once `keep` new ones exist
    _save(tmp_path, 8)
    assert [c.step for c in store.candidates(tmp_path)] == [8, None]
    _save(tmp_path, 9)
    assert [c.step for c in store.candidates(tmp_path)] == [9, 8]


@pytest.fixture
def world_of_one():  # type: ignore[no-untyped-def]
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_a_truncated_sharded_checkpoint_falls_back_to_the_previous(tmp_path: Path, world_of_one) -> None:  # type: ignore[no-untyped-def]
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(1)
    model = fully_shard(torch.nn.Sequential(torch.nn.Linear(4, 3)).double(),
                        mesh=DeviceMesh.from_group(world_of_one, "cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 4, dtype=torch.float64)).sum().backward()
    opt.step()
    first = [p.full_tensor().clone() for p in model.parameters()]
    shardckpt.save_sharded_checkpoint(tmp_path, step=1, model=model, optimizer=opt, groups=[(0,)],
                                      group=world_of_one, rank=0)
    model(torch.ones(2, 4, dtype=torch.float64)).sum().backward()
    opt.step()
    shardckpt.save_sharded_checkpoint(tmp_path, step=2, model=model, optimizer=opt, groups=[(0,)],
                                      group=world_of_one, rank=0)
    newest = store.candidates(tmp_path)[0]
    listed = [f["path"] for f in newest.manifest["files"]]
    assert "checkpoint.pt" in listed and any(p.endswith(".distcp") for p in listed) and any(
        p.endswith("/.metadata") for p in listed)
    shard = next(newest.path.glob("sharded-*/*.distcp"))
    shard.write_bytes(shard.read_bytes()[:10])
    state = checkpoint.load_checkpoint(tmp_path, model=model, optimizer=opt)
    assert state is not None and state["step"] == 1 and "truncated" in checkpoint.LAST_RESUME["fallback"]
    for p, q in zip(model.parameters(), first, strict=True):
        assert torch.equal(p.full_tensor(), q)
