"""Pure codec tests: quantisation error bounds, byte formulas, per-job configuration."""

from __future__ import annotations

import pytest
import torch

from hetero_worker.speed.codec import ring_allgather_bytes, ring_allreduce_bytes
from hetero_worker.speed.codecs import CompressionConfig, theoretical_bytes
from hetero_worker.speed.int8 import dequantize_int8, quantize_int8
from hetero_worker.speed.powersgd import compressible, orthonormalize_, powersgd_payload_elems


def test_int8_round_trip_error_is_at_most_half_a_step():
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * 3
    q, scales = quantize_int8(x, 4096)
    assert q.dtype == torch.int8 and scales.shape == (3,)
    err = (x - dequantize_int8(q, scales, 4096)).abs()
    step = scales.repeat_interleave(4096)[:10_000]
    assert bool((err <= step / 2 + 1e-7).all())


def test_int8_zero_chunk_stays_zero():
    q, scales = quantize_int8(torch.zeros(10), 4)
    assert dequantize_int8(q, scales, 4).abs().sum() == 0


def test_ring_byte_formulas():
    assert ring_allreduce_bytes(4000, 2) == 4000
    assert ring_allreduce_bytes(4000, 4) == 6000
    assert ring_allreduce_bytes(4000, 1) == 0
    assert ring_allgather_bytes(1000, 4) == 3000


@pytest.mark.parametrize(("shape", "rank", "expected"), [
    ((1024, 1024), 4, True), ((4, 1024), 4, False), ((1024,), 4, False), ((64, 3, 3, 3), 4, True),
], ids=["square matrix", "factor not smaller than the matrix", "bias", "conv kernel as 64 x 27"])
def test_compressible(shape, rank, expected):
    assert compressible(torch.Size(shape), rank) is expected


def test_theoretical_bytes_per_codec():
    shapes = [torch.Size([128, 32]), torch.Size([128]), torch.Size([4, 128])]
    numel = 128 * 32 + 128 + 4 * 128
    assert theoretical_bytes(CompressionConfig(mode="none"), shapes, 2) == 4 * numel
    assert theoretical_bytes(CompressionConfig(mode="fp16"), shapes, 2) == 2 * numel
    assert theoretical_bytes(CompressionConfig(mode="int8"), shapes, 2) == numel + 4 * 2
    assert powersgd_payload_elems(shapes, 4) == (128 * 4 + 128 + 4 * 128, 32 * 4)
    assert theoretical_bytes(CompressionConfig(mode="powersgd", powersgd_rank=4), shapes, 2) == \
        4 * (128 * 4 + 128 + 512) + 4 * 32 * 4


def test_orthonormalize():
    p = torch.randn(50, 4, generator=torch.Generator().manual_seed(1))
    orthonormalize_(p)
    assert torch.allclose(p.T @ p, torch.eye(4), atol=1e-5)


@pytest.mark.parametrize(("env", "expected"), [
    ({}, CompressionConfig(mode="none", powersgd_rank=16)),
    ({"HTJ_COMPRESSION": "PowerSGD", "HTJ_POWERSGD_RANK": "8"}, CompressionConfig(mode="powersgd", powersgd_rank=8)),
    ({"HTJ_COMPRESSION": "Int8"}, CompressionConfig(mode="int8")),
    ({"HTJ_COMPRESSION": "None"}, CompressionConfig(mode="none")),
], ids=["off by default", "spec spelling PowerSGD with rank", "Int8", "explicit None"])
def test_config_from_env(env, expected):
    assert CompressionConfig.from_env(env) == expected


@pytest.mark.parametrize("env", [{"HTJ_COMPRESSION": "zstd"}, {"HTJ_POWERSGD_RANK": "four"},
                                 {"HTJ_POWERSGD_RANK": "0"}],
                         ids=["unknown mode", "rank not a number", "rank zero"])
def test_config_from_env_rejects(env):
    with pytest.raises(ValueError):
        CompressionConfig.from_env(env)
