"""``t.track(name, obj)``: an LR scheduler's and a user counter's state go into the checkpoints
and come back on resume, for both checkpoint backends (issue 22, point 12).

Multi-process: 2 real Gloo ranks (tests/worker/tracked_ranks.py; split [6, 4], 90 samples: 9
steps), SGD with ``StepLR(step_size=3, gamma=0.5)`` and a counter of samples trained, a
checkpoint every 2 steps; rank 1 SIGKILLs itself after step 5, the job resumes from step 4. The
resumed run's learning rate of every step, the scheduler's ``last_epoch`` and the counter equal
the run never interrupted. Negative control: the same resume without tracking uses another
learning rate from step 7 on (the schedule restarts at 0 while the optimizer's lr was restored).

Single-process: what the checkpoints cannot hold safely is refused naming the path and the fix.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from rankproc import assert_ok, mixed_cluster_envs, run_ranks

from hetero_worker.ckpt import files, store, tracked
from hetero_worker.ckpt.trainer_state import Checkpointing

HERE = Path(__file__).parent
SPLIT, SAMPLES, STEPS = [6, 4], 90, 9


def cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(HERE / "tracked_ranks.py"), "--out", str(out),
            "--samples", str(SAMPLES), "--checkpoint-every", "2", *extra]


def envs(ckpt: Path, sharding: str) -> list[dict[str, str]]:
    made = mixed_cluster_envs(SPLIT, checkpoint_dir=str(ckpt))
    for env in made:
        env["HTJ_SHARDING"] = sharding
    return made


def steps(out: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (out / f"steps-rank{rank}.jsonl").read_text().splitlines()]


def report(out: Path, rank: int) -> dict:
    return json.loads((out / f"rank{rank}.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("sharding", ["none", "group"], ids=["checkpoint.pt", "sharded (DCP)"])
def test_a_scheduler_and_a_counter_survive_a_crash_and_resume(tmp_path: Path, sharding: str) -> None:
    ref = tmp_path / "reference"
    assert_ok(run_ranks(cmd(ref), envs(tmp_path / "ref-ckpt", sharding), timeout_s=200))
    uninterrupted = steps(ref, 0)
    assert [s["lr"] for s in uninterrupted] == [0.2] * 3 + [0.1] * 3 + [0.05] * 3

    ckpt, out1, out2 = tmp_path / "ckpt", tmp_path / "phase1", tmp_path / "phase2"
    runs1 = run_ranks(cmd(out1, "--kill-after", "5", "--kill-rank", "1"), envs(ckpt, sharding),
                      timeout_s=200)
    assert runs1[1].returncode == -9 and runs1[0].returncode != 0
    saved = files.load_file(store.newest_file(ckpt))  # weights_only=True
    assert saved["step"] == 4
    assert saved["format"] == (files.SHARDED_FORMAT if sharding == "group" else files.FORMAT)
    assert saved["extra"]["tracked"]["lr_schedule"]["last_epoch"] == 4
    assert saved["extra"]["tracked"]["samples_seen"] == {"samples": 40, "per_step": [10] * 4}
    shutil.copytree(ckpt, tmp_path / "ckpt-control")

    assert_ok(run_ranks(cmd(out2), envs(ckpt, sharding), timeout_s=200))
    for rank in (0, 1):
        got, ref_report = report(out2, rank), report(ref, rank)
        assert (got["resumed_step"], got["last_epoch_after_resume"], got["samples_after_resume"],
                got["lr_after_resume"]) == (4, 4, 40, 0.1)
        assert steps(out2, rank) == uninterrupted[4:]  # lr, last_epoch and counter of every step
        assert (got["step"], got["lr"], got["last_epoch"], got["samples"], got["per_step"]) == (
            STEPS, ref_report["lr"], STEPS, SAMPLES, [10] * STEPS)
        assert got["params"] == ref_report["params"], "the resumed run is not bit-identical"

    control = tmp_path / "control"
    assert_ok(run_ranks(cmd(control, "--no-track"), envs(tmp_path / "ckpt-control", sharding),
                        timeout_s=200))
    lrs = [s["lr"] for s in steps(control, 0)]
    assert steps(control, 0)[0]["step"] == 5 and lrs != [s["lr"] for s in uninterrupted[4:]]
    assert lrs == [0.1, 0.1, 0.1, 0.05, 0.05]  # the schedule restarted: no decay after step 6


class Plain:
    def __init__(self, state) -> None:
        self.state = state

    def state_dict(self):
        return self.state

    def load_state_dict(self, state) -> None:
        self.state = state


def fake_trainer() -> SimpleNamespace:
    return SimpleNamespace()


def test_track_keeps_the_object_and_its_state_round_trips() -> None:
    t, counter = fake_trainer(), Plain({"n": 3, "t": torch.arange(2), "xs": [1.5, (2, "a")]})
    assert Checkpointing.track(t, "counter", counter) is counter
    state = tracked.states(t.tracked)
    counter.state = {"n": 0}
    assert tracked.restore(t.tracked, state) == ([], [])
    assert counter.state["n"] == 3 and torch.equal(counter.state["t"], torch.arange(2))
    assert tracked.restore(t.tracked, {"gone": {}}) == (["counter"], ["gone"])


def test_an_object_without_the_protocol_is_refused_naming_the_fix() -> None:
    with pytest.raises(TypeError, match=r"^Trainer.track\('n', int\): it has no state_dict\(\) and "
                                        r"no load_state_dict\(\); track objects with state_dict"):
        Checkpointing.track(fake_trainer(), "n", 5)
    with pytest.raises(TypeError, match="name must be a non-empty str"):
        Checkpointing.track(fake_trainer(), "", Plain({}))


@pytest.mark.parametrize(("state", "where", "what"), [
    ({"when": object()}, r"\['when'\]", "builtins.object"),
    ({"a": [1, {"b": {1, 2}}]}, r"\['a'\]\[1\]\['b'\]", "builtins.set"),
    ({"f": Path("x")}, r"\['f'\]", "pathlib"),
], ids=["an object", "a set deep inside", "a path"])
def test_a_state_weights_only_loading_refuses_is_refused_naming_where(state, where, what) -> None:
    with pytest.raises(TypeError, match=rf"^tracked state 'c': its state_dict\(\) holds a {what}.* "
                                        rf"at {where}; checkpoints hold tensors, .*convert it in "
                                        r"state_dict\(\)"):
        Checkpointing.track(fake_trainer(), "c", Plain(state))


def test_a_state_that_turns_unsafe_later_is_refused_at_the_save() -> None:
    t, obj = fake_trainer(), Plain({"n": 1})
    Checkpointing.track(t, "c", obj)
    obj.state = {"n": object()}
    with pytest.raises(TypeError, match=r"^tracked state 'c'"):
        tracked.states(t.tracked)  # every rank checks before the save's first collective


def test_a_second_object_under_one_name_and_track_after_resume_are_refused() -> None:
    t = fake_trainer()
    Checkpointing.track(t, "c", Plain({}))
    with pytest.raises(ValueError, match=r"that name tracks another Plain already"):
        Checkpointing.track(t, "c", Plain({}))
    t._resume_called = True
    with pytest.raises(RuntimeError, match=r"after resume\(\).*track it before t.resume\(opt\)"):
        Checkpointing.track(t, "d", Plain({}))


def test_real_schedulers_states_are_plain() -> None:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    for sched in (torch.optim.lr_scheduler.StepLR(opt, 3), torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 0.9 ** s), torch.optim.lr_scheduler.CosineAnnealingLR(opt, 10),
            torch.optim.lr_scheduler.OneCycleLR(opt, 1.0, total_steps=10)):
        tracked.check_plain(type(sched).__name__, sched.state_dict())
