"""Run inside each rank process by tests/worker/test_sharded_fp16.py; writes ``<out>/rank<R>.json``.

Group or Full sharding (``HTJ_SHARDING``) with the features of issue 29 on: an fp16 loss scaler
(``HTJ_PRECISION=fp16``), rebalancing and compression as the contract says.  The model is
``full_ranks.Net`` in float64: autocast leaves float64 ops alone, so the fp16 path runs its whole
scaler logic (the loss scaled by the one agreed scale, the sharded gradients unscaled and checked
for inf on every rank, the step skipped together) while the arithmetic stays exact: scaling and
unscaling by a power of two are exact in float64.  ``--inject STEP`` multiplies rank
:data:`INJECT_RANK`'s loss by inf at that step (an fp16 overflow on one rank only).

Per step the facts: skipped, the split the step used, the loss scale, the micro-batches every rank
ran; at the end the full parameters (gathered), the optimizer state's dtypes, the codec state
(leaders) and the memory peak and cap.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
from torch import nn

from full_ranks import Block, make_data, make_net, make_opt
from hetero_worker import trainer as ht
from rank_main import run_and_write

INJECT_RANK = 2
"""The rank whose loss overflows at ``--inject`` (a T4, in the group of two under Group)."""


def full_params(t: ht.Trainer) -> dict[str, torch.Tensor]:
    """Full parameters by name (collective under Group and Full sharding)."""
    out = {}
    for name, value in sorted(t.full_state_dict().items()):
        if hasattr(value, "full_tensor"):  # Group: DTensor shards
            value = value.full_tensor()
        out[name.removeprefix("module.")] = value.detach().cpu().clone()
    return out


def codec_state(t: ht.Trainer) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Copies of this rank's codecs' error feedback (int8's ``error``, PowerSGD's ``errors``) and
    PowerSGD's ``Q`` factors."""
    reducer = getattr(t.sync, "reducer", None)
    errors: list[torch.Tensor] = []
    qs: list[torch.Tensor] = []
    for codec in getattr(reducer, "codecs", {}).values():
        errors += [x.detach().clone() for x in [getattr(codec, "error", None),
                                                *(getattr(codec, "errors", None) or [])]
                   if x is not None]
        qs += [x.detach().clone() for x in getattr(codec, "qs", None) or [] if x is not None]
    return errors, qs


def run(t: ht.Trainer, steps: int, inject: int, dtype: torch.dtype) -> dict[str, Any]:
    model = t.wrap(make_net().to(dtype), block=Block)
    opt = make_opt(model.parameters())
    big = sum(t.local_batches)
    x, y = (d.to(dtype) for d in make_data(big * steps))
    facts: dict[str, Any] = {"skipped": [], "splits": [], "scales": [], "micro_counts": [],
                             "codec_same_after_skip": None, "codec_finite": True,
                             "codec_numel": 0, "activation_peaks": []}
    before_skip: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
    losses: list[float] = []
    for s in range(steps):
        split = list(t.local_batches)
        lo = s * big + sum(split[:t.rank])
        # own storage: a view would make the memory meter count all steps' samples as saved
        xb, yb = x[lo:lo + split[t.rank]].clone(), y[lo:lo + split[t.rank]].clone()

        def loss_fn(m: nn.Module, xm: torch.Tensor, ym: torch.Tensor, s: int = s) -> torch.Tensor:
            loss = nn.functional.mse_loss(m(xm), ym)
            return loss * float("inf") if s == inject and t.rank == INJECT_RANK else loss

        if s == inject:
            before_skip = codec_state(t)
            scale_before = t.scaler.get_scale() if t.scaler is not None else 1.0
        facts["micro_counts"].append(t.shard_sync.micro_count(t.contract.memory.micro_batch_size))
        if t.memory is not None:  # this step's largest micro-batch activations
            t.memory.peak_activation_bytes = 0
        result = t.step(opt, loss_fn, batch=(xb, yb))
        facts["activation_peaks"].append(t.memory.peak_activation_bytes if t.memory else None)
        if s == inject and before_skip[0]:
            # the skipped step left the error feedback as it was, rescaled to the new loss scale
            # (it holds residuals of scaled gradients; a power of two: exact), and Q unchanged
            ratio = (t.scaler.get_scale() if t.scaler is not None else 1.0) / scale_before
            errors, qs = codec_state(t)
            facts["codec_same_after_skip"] = (
                ratio == 0.5 and len(errors) == len(before_skip[0]) and len(qs) == len(before_skip[1])
                and all(torch.equal(a, b * ratio) for a, b in zip(errors, before_skip[0], strict=True))
                and all(torch.equal(a, b) for a, b in zip(qs, before_skip[1], strict=True)))
        facts["skipped"].append(result.skipped)
        losses.append(result.loss)
        facts["splits"].append(split)
        facts["scales"].append(t.scaler.get_scale() if t.scaler is not None else None)
    state = [x for part in codec_state(t) for x in part]
    facts["codec_numel"] = sum(x.numel() for x in state)
    facts["codec_finite"] = all(bool(torch.isfinite(x).all()) for x in state)
    facts["params"] = {k: v.double().tolist() for k, v in full_params(t).items()}
    facts["losses"] = losses
    facts["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    facts["state_dtypes"] = sorted({str(v.dtype) for st in opt.state.values() for v in st.values()
                                    if torch.is_tensor(v)})
    facts["peak"] = t.memory.peak_bytes if t.memory else None
    facts["cap"] = t.contract.memory.cap_bytes
    facts["leader"] = t.groups.is_leader
    reducer = getattr(t.sync, "reducer", None)
    facts["codec_bytes"] = reducer.codec_bytes_sent if reducer is not None else None
    facts["shapes"] = [list(p.shape) for p in make_net().parameters()]
    return facts


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--inject", type=int, default=-1)
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"],
                        help="float32: real fp16 autocast on the fp16 ranks (float64 ops are not cast)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    return run_and_write(lambda t: run(t, args.steps, args.inject, dtype), args.out)


if __name__ == "__main__":
    sys.exit(main())
