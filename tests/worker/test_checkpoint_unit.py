"""Atomic checkpoint writes and single-process save/load round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hetero_worker.ckpt import checkpoint, files
from hetero_worker.sampler import HeteroBatchSampler


class Boom:
    def __reduce__(self):  # fails half-way through torch.save
        raise RuntimeError("disk full")


def test_failed_write_keeps_the_previous_file_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.pt"
    files.save_atomic({"step": 1}, path)
    with pytest.raises(RuntimeError, match="disk full"):
        files.save_atomic({"step": 2, "x": Boom()}, path)
    assert torch.load(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_round_trip_restores_model_optimizer_sampler_and_rng(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    sampler = HeteroBatchSampler(40, [4, 6], 0)
    next(iter(sampler))
    checkpoint.save_checkpoint(tmp_path, step=7, model=model, optimizer=opt, sampler=sampler)
    expected_draw = torch.rand(3)

    other = torch.nn.Linear(3, 2)
    other_opt = torch.optim.Adam(other.parameters())
    other_sampler = HeteroBatchSampler(40, [4, 6], 0)
    state = checkpoint.load_checkpoint(tmp_path, model=other, optimizer=other_opt,
                                       sampler=other_sampler)
    assert state is not None and state["step"] == 7
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))
    assert other_opt.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]
    assert other_sampler.cursor == 10
    assert torch.equal(torch.rand(3), expected_draw)


def test_no_checkpoint_returns_none(tmp_path: Path) -> None:
    model = torch.nn.Linear(1, 1)
    assert checkpoint.load_checkpoint(tmp_path, model=model,
                                      optimizer=torch.optim.SGD(model.parameters(), 0.1)) is None
