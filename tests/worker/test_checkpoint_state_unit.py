"""Codec error feedback, loss scale and RNG through a weights-only checkpoint; the agreement text.

Codecs run over a one-rank Gloo group in this process (the leaders' group of a one-leader job):
their state, not the wire, is what a resume must carry.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hetero_worker.ckpt import checkpoint, files
from hetero_worker.ckpt.agreement import Finding, ResumeDisagreement, disagreement_message
from hetero_worker.precision import AgreeingGradScaler
from hetero_worker.speed.int8 import Int8Compression
from hetero_worker.speed.powersgd import PowerSGDCompression

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def gradients(steps: int) -> list[list[torch.Tensor]]:
    """A bucket per step: a 16x12 weight, a 12 bias, a 12x6 weight (float32)."""
    g = torch.Generator().manual_seed(3)
    return [[torch.randn(16, 12, generator=g), torch.randn(12, generator=g),
             torch.randn(12, 6, generator=g)] for _ in range(steps)]


def run(codec, bucket_steps, keys=(0, 1, 2), order=(0, 1, 2)):  # type: ignore[no-untyped-def]
    """Reduce each step's bucket in ``order``; returns the results back in (0, 1, 2) order."""
    outs = []
    for bucket in bucket_steps:
        tensors = [bucket[i].clone() for i in order]
        codec.align_([keys[i] for i in order])
        codec.allreduce_(tensors, None)
        back = [None] * 3
        for pos, i in enumerate(order):
            back[i] = tensors[pos]
        outs.append(back)
    return outs


def through_file(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


CODECS = {"int8": lambda: Int8Compression(chunk=64, piece_chunks=2),
          "powersgd": lambda: PowerSGDCompression(rank=2, seed=1, start_iter=2)}


@pytest.mark.parametrize("name", sorted(CODECS))
def test_resumed_codec_continues_exactly_and_a_fresh_one_does_not(name, one_rank_group) -> None:
    steps = gradients(7)
    continuous = run(CODECS[name](), steps)
    first = CODECS[name]()
    run(first, steps[:4])
    resumed = CODECS[name]()
    resumed.load_state_dict(through_file(first.state_dict()))
    after = run(resumed, steps[4:])
    for a, b in zip(continuous[4:], after, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    fresh = run(CODECS[name](), steps[4:])  # negative control: state lost
    assert not all(torch.equal(x, y) for x, y in zip(continuous[4][0:1], fresh[0][0:1]))
    if name == "powersgd":
        assert (first.iteration, resumed.iteration) == (4, 7)  # no second warm-up


def test_powersgd_state_follows_parameters_when_the_bucket_order_changes(one_rank_group) -> None:
    steps = gradients(5)
    same = run(CODECS["powersgd"](), steps)
    codec = CODECS["powersgd"]()
    reordered = run(codec, steps[:3]) + run(codec, steps[3:], order=(2, 0, 1))  # DDP rebuild
    for a, b in zip(same, reordered, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_int8_error_is_permuted_with_its_parameters(one_rank_group) -> None:
    # Quantisation chunks follow the flat order, so outputs differ; the error must move along.
    codec = CODECS["int8"]()
    run(codec, gradients(3))
    error = codec.error.clone()
    pieces = torch.split(error, [16 * 12, 12, 12 * 6])
    bucket = gradients(1)[0]
    codec.align_((2, 0, 1))
    codec._reorder_error([bucket[2], bucket[0], bucket[1]])
    assert torch.equal(codec.error, torch.cat([pieces[2], pieces[0], pieces[1]]))
    assert codec.keys == (2, 0, 1)


@pytest.mark.parametrize("name", sorted(CODECS))
def test_state_for_other_parameters_is_discarded_and_said(name, one_rank_group, capsys) -> None:
    steps = gradients(4)
    codec = CODECS[name]()
    run(codec, steps[:3])
    restored = CODECS[name]()
    restored.load_state_dict(through_file(codec.state_dict()))
    run(restored, steps[3:], keys=(7, 8, 9))  # another model's bucket: never loaded into it
    assert "compression_state_reset" in capsys.readouterr().err
    assert restored.keys == (7, 8, 9)


def test_loss_scale_is_restored(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = AgreeingGradScaler("cpu", init_scale=1024.0)
    scaler.load_state_dict({"scale": 128.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                            "growth_interval": 2000, "_growth_tracker": 7})
    checkpoint.save_checkpoint(tmp_path, step=3, model=model, optimizer=opt, scaler=scaler)
    other = AgreeingGradScaler("cpu", init_scale=1024.0)
    checkpoint.load_checkpoint(tmp_path, model=model, optimizer=opt, scaler=other)
    assert (other.get_scale(), other._get_growth_tracker()) == (128.0, 7)


def test_new_plan_gets_fresh_rng_not_an_old_ranks(tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    plan = {"world_size": 1, "planned_split": [8], "devices": ["Tesla-T4"]}
    torch.manual_seed(1)
    checkpoint.save_checkpoint(tmp_path, step=5, model=model, optimizer=opt, plan=plan)
    saved_draw = torch.rand(4)
    state = checkpoint.load_checkpoint(tmp_path, model=model, optimizer=opt, plan=plan)
    assert state is not None and state["resumed_same_plan"]
    assert torch.equal(torch.rand(4), saved_draw)
    other_plan = {**plan, "planned_split": [6]}
    state = checkpoint.load_checkpoint(tmp_path, model=model, optimizer=opt, plan=other_plan,
                                       seed=9)
    assert state is not None and not state["resumed_same_plan"]
    fresh = torch.rand(4)
    files.fresh_rng(9, 5, 0)
    assert torch.equal(torch.rand(4), fresh) and not torch.equal(fresh, saved_draw)
    files.fresh_rng(9, 5, 1)
    assert not torch.equal(torch.rand(4), fresh)  # another rank, another stream


def test_unreadable_checkpoint_stops_rather_than_starting_at_step_0(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.pt").write_bytes(b"\x80\x02garbage")
    model = torch.nn.Linear(2, 1)
    with pytest.raises(ResumeDisagreement, match=r"rank 0 could not read .*checkpoint.pt") as err:
        checkpoint.load_checkpoint(tmp_path, model=model,
                                   optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert err.value.disagreeing == [0]


def test_disagreement_names_each_rank_and_what_it_found() -> None:
    findings = [Finding(rank=0, path="/c/checkpoint.pt", step=30, checkpoint_id="ab12"),
                Finding(rank=1, path="/c/checkpoint.pt", step=30, checkpoint_id="ab12"),
                Finding(rank=2, path="/d/checkpoint.pt", missing=True),
                Finding(rank=3, path="/c/checkpoint.pt", step=20, checkpoint_id="ff00")]
    assert disagreement_message(findings) == (
        "resume not agreed: rank 0 resumes from step 30 (checkpoint ab12 at /c/checkpoint.pt), "
        "but rank 2 found no checkpoint at /d/checkpoint.pt; rank 3 found step 20 (checkpoint "
        "ff00) at /c/checkpoint.pt. Every rank must read the same checkpoint: put "
        "HTJ_CHECKPOINT_DIR on a volume shared by all ranks.")
    fresh = [Finding(rank=0, path="/c/checkpoint.pt", missing=True), findings[1]]
    assert ResumeDisagreement(fresh).disagreeing == [1]
    assert "rank 0 starts from step 0" in str(ResumeDisagreement(fresh))


def test_no_unsafe_torch_load_in_the_repository() -> None:
    needle = "weights_only" + "=False"
    hits = [str(p.relative_to(REPO)) for top in ("worker", "operator", "tests", "bench",
                                                 "scripts", "docs")
            for p in (REPO / top).rglob("*") if p.is_file() and p.suffix in (".py", ".md", ".sh")
            and needle in p.read_text(errors="ignore")]
    hits += [p.name for p in REPO.glob("*.md") if needle in p.read_text()]
    assert hits == []


def test_finding_records_round_trip_and_fit_their_size() -> None:
    from hetero_worker.ckpt.agreement import FINDING_BYTES, decode_finding, encode_finding
    long = Finding(rank=3, path="/v/" + "d" * 2000 + "/checkpoint.pt", error="E: " + "x" * 2000)
    record = encode_finding(long)
    assert len(record) <= FINDING_BYTES
    back = decode_finding(record + b"\0" * (FINDING_BYTES - len(record)))
    assert back.rank == 3 and back.error.startswith("E: xx") and back.error.endswith("...")
    short = Finding(rank=1, path="/c/checkpoint.pt", step=7, checkpoint_id="ab")
    assert decode_finding(encode_finding(short)) == short
