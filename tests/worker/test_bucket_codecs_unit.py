"""Codec state per bucket identity (issue 23): a rebuilt bucket's codec takes exactly the
per-parameter pieces of the codecs that held its parameters."""

from __future__ import annotations

import torch

from hetero_worker.speed.bucket_codecs import codec_for_bucket, regroup_state
from hetero_worker.speed.int8 import Int8Compression
from hetero_worker.speed.powersgd import PowerSGDCompression

NUMELS = [3, 2, 4]  # parameters 0, 1, 2


def test_int8_error_pieces_follow_their_parameters() -> None:
    old = {0: Int8Compression(), 1: Int8Compression()}
    old[0].keys, old[0].error = (2, 0), torch.tensor([20., 21, 22, 23, 0, 1, 2])
    old[1].keys, old[1].error = (1,), torch.tensor([10., 11])
    codec = codec_for_bucket(old, [1, 2], NUMELS, lambda seed: Int8Compression())
    assert list(old) == [1] and old[1] is codec  # the old buckets are gone, key = min param
    assert codec.keys == (1, 2)
    assert codec.error.tolist() == [10., 11, 20, 21, 22, 23]
    assert codec.restored  # its length is checked against the next call


def test_powersgd_errors_and_factors_follow_their_parameters() -> None:
    states = [{"kind": "powersgd", "rank": 2, "iteration": 5, "keys": [0],
               "errors": [torch.full((3,), 1.0)], "qs": [None]},
              {"kind": "powersgd", "rank": 2, "iteration": 5, "keys": [2, 1],
               "errors": [torch.full((2, 2), 2.0), torch.full((2,), 3.0)],
               "qs": [torch.full((2, 1), 4.0), None]}]
    state = regroup_state(states, [1, 0, 2], NUMELS)
    assert state is not None and state["keys"] == [1, 0, 2] and state["iteration"] == 5
    assert [e.tolist() for e in state["errors"]] == [[3., 3], [1., 1, 1], [[2., 2], [2, 2]]]
    assert state["qs"][0] is None and state["qs"][1] is None
    assert state["qs"][2].tolist() == [[4.], [4.]]
    codec = PowerSGDCompression(rank=2)
    codec.load_state_dict(state)
    assert codec.keys == (1, 0, 2)


def test_same_parameters_reuse_the_codec_and_a_missing_piece_starts_fresh() -> None:
    codecs = {0: Int8Compression()}
    codecs[0].keys, codecs[0].error = (0, 1), torch.arange(5.)
    same = codec_for_bucket(codecs, [1, 0], NUMELS, lambda seed: Int8Compression())
    assert same is codecs[0] and same._new_keys == (1, 0)  # permuted on its next call
    assert regroup_state([codecs[0].state_dict()], [0, 1, 2], NUMELS) is None
