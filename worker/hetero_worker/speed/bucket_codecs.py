"""Codec state per bucket identity, kept across DDP's bucket rebuilds (issue 23).

In the pipelined hierarchy every DDP bucket is compressed on its own. A codec's state (int8's
error feedback, PowerSGD's errors and warm-started ``Q`` factors) belongs to the parameters of
its bucket, and DDP rebuilds its buckets after the first step (in the order gradients became
ready), which can put other parameters together under a bucket index. So a bucket's codec is
found by the *set* of parameters it holds (its identity), and a new identity takes its state from
the codecs that held those parameters before, piece by piece (per parameter), so nothing of the
error feedback is lost.

Codecs are stored under the smallest parameter index of their bucket (buckets are disjoint, so
the key is unique and equal on every leader; it is also the codec's seed), which is what the
checkpoint keeps (:func:`hetero_worker.ckpt.resume.codec_states`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from hetero_worker.speed.codec import InterGroupCodec, log_state_reset


def bucket_key(keys: Sequence[int]) -> int:
    """The store key of a bucket holding parameters ``keys`` (its smallest index).

    Raises:
        ValueError: ``keys`` is empty or holds an unknown parameter (index < 0).
    """
    if not keys or min(keys) < 0:
        raise ValueError(f"a bucket needs known parameter indices, got {list(keys)}")
    return min(keys)


def codec_for_bucket(codecs: dict[int, InterGroupCodec], keys: Sequence[int],
                     param_numels: Sequence[int],
                     make: Callable[[int], InterGroupCodec]) -> InterGroupCodec:
    """The codec of the bucket holding parameters ``keys`` (in the bucket's tensor order).

    Same parameter set as a stored codec: that codec, aligned to this order (``align_``). A new
    set: a new codec (``make(seed)``) whose state is composed of the per-parameter pieces of the
    codecs that held these parameters (:func:`regroup_state`); those codecs give their pieces up
    and are dropped once they hold no parameter. ``codecs`` is updated in place.

    Args:
        codecs: store key -> codec (``CodecReducer.codecs``).
        keys: parameter indices of the bucket's tensors, in buffer order.
        param_numels: elements of every parameter, by index.
        make: codec factory taking the seed (equal on every leader).

    Returns:
        The codec to reduce this bucket with.
    """
    key = bucket_key(keys)
    wanted = set(keys)
    codec = codecs.get(key)
    held = getattr(codec, "keys", None) if codec is not None else None
    if codec is not None and (held is None or set(held) == wanted):
        if hasattr(codec, "align_"):
            codec.align_(keys)
        return codec
    if codec is not None and held is not None and not wanted & set(held) and held:
        codecs[min(held)] = codecs.pop(key)  # an older key scheme (bucket index): re-key it
    sources = [(k, c) for k, c in codecs.items() if getattr(c, "keys", None) is not None
               and wanted & set(c.keys)]  # type: ignore[attr-defined]
    fresh = make(key)
    states = [c.state_dict() for _, c in sources if hasattr(c, "state_dict")]  # type: ignore[attr-defined]
    state = regroup_state(states, keys, param_numels) if states else None
    if state is not None:
        fresh.load_state_dict(state)  # type: ignore[attr-defined]
    else:
        if states:
            log_state_reset(f"codec state for parameters {sorted(wanted)} not found whole in "
                            f"{[sorted(c.keys) for _, c in sources]}")  # type: ignore[attr-defined]
        if hasattr(fresh, "align_"):
            fresh.align_(keys)
    for k, _ in sources:
        codecs.pop(k, None)  # DDP's buckets are disjoint: the old ones are gone
    codecs[key] = fresh
    return fresh


def regroup_state(states: Sequence[dict[str, Any]], keys: Sequence[int],
                  param_numels: Sequence[int]) -> dict[str, Any] | None:
    """One codec state for parameters ``keys`` (in that order) composed of others' pieces.

    Knows the ``int8`` state (``error``: one flat buffer in ``keys`` order) and the ``powersgd``
    state (``errors`` and ``qs``: one tensor per parameter; the iteration is the largest).

    Args:
        states: ``state_dict()`` of the codecs that held some of the parameters.
        keys: parameter indices of the new bucket, in buffer order.
        param_numels: elements per parameter index (to cut int8's flat buffer).

    Returns:
        The composed state, or None when some parameter of ``keys`` has no piece (or the states
        are of another kind, or hold no tensors yet).
    """
    kinds = {s.get("kind") for s in states}
    if len(kinds) != 1:
        return None
    kind = kinds.pop()
    pieces: dict[int, Any] = {}
    if kind == "int8":
        for s in states:
            if s.get("error") is None or s.get("keys") is None:
                return None
            sizes = [param_numels[k] for k in s["keys"]]
            if sum(sizes) != s["error"].numel():
                return None
            pieces.update(zip(s["keys"], torch.split(s["error"], sizes), strict=True))
        if any(k not in pieces for k in keys):
            return None
        return {"kind": "int8", "chunk": states[0]["chunk"], "keys": list(keys),
                "error": torch.cat([pieces[k] for k in keys])}
    if kind == "powersgd":
        for s in states:
            if s.get("errors") is None or s.get("keys") is None:
                return None
            pieces.update(zip(s["keys"], zip(s["errors"], s["qs"], strict=True), strict=True))
        if any(k not in pieces for k in keys):
            return None
        return {"kind": "powersgd", "rank": states[0]["rank"], "keys": list(keys),
                "iteration": max(int(s["iteration"]) for s in states),
                "errors": [pieces[k][0] for k in keys], "qs": [pieces[k][1] for k in keys]}
    return None
