"""The stateful codecs never store a non-finite error, and a skipped step leaves their state as it
was (issue 21): an fp16 loss-scaler overflow used to turn int8's and PowerSGD's error feedback into
NaN for the rest of the job.  One leader (a world of one on Gloo); the multi-rank interplay (an
overflow on one rank of four, every layout) is the feature matrix, tests/worker/test_feature_matrix.py.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from hetero_worker.speed.int8 import Int8Compression
from hetero_worker.speed.powersgd import PowerSGDCompression

SHAPES = [(32, 24), (24,), (16, 32)]


@pytest.fixture()
def one_leader():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield None
    dist.destroy_process_group()


def grads(seed: int, *, bad: bool = False) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(s, generator=g) for s in SHAPES]
    if bad:  # what an fp16 overflow leaves: inf in one tensor, NaN (0 * inf) in another
        out[0][3, 5] = float("inf")
        out[2][0, 0] = float("nan")
    return out


def state(codec: Int8Compression | PowerSGDCompression) -> dict:
    return copy.deepcopy(codec.state_dict())


def same_state(a: dict, b: dict) -> bool:
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor):
            if not (isinstance(y, torch.Tensor) and torch.equal(x, y)):
                return False
        elif isinstance(x, list) and x and isinstance(x[0], torch.Tensor | None):
            if len(x) != len(y) or not all((u is None and v is None) or torch.equal(u, v)
                                           for u, v in zip(x, y, strict=True)):
                return False
        elif x != y:
            return False
    return True


def step(codec, tensors, *, transactional: bool = False, applied: bool | None = None,
         scale_ratio: float = 1.0) -> list[torch.Tensor]:
    codec.transactional = transactional
    out = [t.clone() for t in tensors]
    codec.allreduce_(out, None)
    if applied is not None:
        codec.end_step(applied=applied, scale_ratio=scale_ratio)
    return out


def make(kind: str):
    return Int8Compression(chunk=64) if kind == "int8" else PowerSGDCompression(rank=2, seed=1)


@pytest.mark.parametrize("kind", ["int8", "powersgd"])
def test_a_non_finite_gradient_leaves_the_error_as_it_was_and_the_output_non_finite(one_leader, kind):
    codec = make(kind)
    step(codec, grads(1))
    step(codec, grads(2))
    before = state(codec)
    out = step(codec, grads(3, bad=True))
    assert not all(bool(torch.isfinite(t).all()) for t in out)  # the scaler skips this step
    assert same_state(state(codec), before), kind
    errors = [codec.error] if kind == "int8" else codec.errors
    assert all(bool(torch.isfinite(e).all()) for e in errors)


@pytest.mark.parametrize("kind", ["int8", "powersgd"])
def test_an_overflowed_step_is_invisible_to_the_steps_after_it(one_leader, kind):
    """g1, overflow, g2 gives exactly what g1, g2 gives (the skipped step left no trace)."""
    with_bad, without = make(kind), make(kind)
    step(with_bad, grads(1))
    step(without, grads(1))
    step(with_bad, grads(9, bad=True))
    a = step(with_bad, grads(2))
    b = step(without, grads(2))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert same_state(state(with_bad), state(without))


@pytest.mark.parametrize("kind", ["int8", "powersgd"])
def test_after_an_overflow_the_next_steps_are_finite_again(one_leader, kind):
    """Before the fix the error kept ``(g + e) - decode(q)`` unchecked: after one inf every later
    output was non-finite, every step skipped, and the loss scale halved for ever."""
    codec = make(kind)
    step(codec, grads(1))
    step(codec, grads(9, bad=True))
    later = step(codec, grads(2))
    assert all(bool(torch.isfinite(t).all()) for t in later)  # with the fix: finite again


def test_int8_transactional_holds_the_new_error_until_the_step_is_known(one_leader):
    codec = make("int8")
    step(codec, grads(1), transactional=True, applied=True)
    before = state(codec)
    step(codec, grads(2), transactional=True)  # finite, but another bucket overflowed...
    assert same_state(state(codec), before)  # ...held, not stored
    codec.end_step(applied=False)
    assert same_state(state(codec), before)  # skipped: as it was
    step(codec, grads(2), transactional=True, applied=True)
    assert not same_state(state(codec), before)  # applied: stored


@pytest.mark.parametrize("kind", ["int8", "powersgd"])
def test_a_loss_scale_change_rescales_the_stored_error(one_leader, kind):
    """The error holds residuals of scaled gradients: halving the scale halves it (exactly)."""
    codec = make(kind)
    step(codec, grads(1), transactional=True, applied=True)
    errors = [codec.error.clone()] if kind == "int8" else [e.clone() for e in codec.errors]
    codec.end_step(applied=True, scale_ratio=0.5)
    now = [codec.error] if kind == "int8" else codec.errors
    assert all(torch.equal(n, e * 0.5) for n, e in zip(now, errors, strict=True))


def test_powersgd_skipped_step_keeps_iteration_and_factors(one_leader):
    codec = PowerSGDCompression(rank=2, seed=1, start_iter=1)
    step(codec, grads(1))  # warm-up, uncompressed
    step(codec, grads(9, bad=True))  # first compressed call overflows
    assert codec.iteration == 1  # still before its first compressed step
    step(codec, grads(2))
    assert codec.iteration == 2 and all(bool(torch.isfinite(q).all()) for q in codec.qs if q is not None)
