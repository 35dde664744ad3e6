"""Run inside each rank process by tests/worker/test_checkpoint_safety.py (issue 32, item 5).

``python ckptsafety_ranks.py SCENARIO OUT CKPT``; the rank's contract is in the environment.
Each scenario writes ``OUT/rank<R>.json`` with what this rank saw:

* ``quarantine`` (F6): save steps 100 and 200 (keep 2), rank 0 flips one byte of step 200's
  ``checkpoint.pt``, every rank resumes (falls back to 100), then saves step 150 with keep 2.
* ``save_error`` (F12, F7): save step 1; then rank 0's ``torch.save`` writes part of the file and
  raises ``RuntimeError("unexpected pos ...")`` (what a full disk gives) at step 2; every rank
  records the exception's type, message and how long the save took.
* ``periodic`` (F7): the real Trainer saving every step with ``HTJ_CHECKPOINT_MAX_FAILURES=2``;
  rank 0's write fails at steps 2, 4 and 5: training goes on after the first two failures (step 3
  saves and resets the count) and the job fails at step 5 on every rank.
* ``generation`` (F9): a gang of restart generation 1 saves step 10 (keep 1); then a stale gang of
  generation 0 of the same job tries to save step 12.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from hetero_worker.ckpt import checkpoint, store
from hetero_worker.ckpt.ownership import Owner

SAVE_TIMEOUT_S = 30.0
"""The checkpoint group's timeout here: a peer left waiting fails the test's time bound."""


def model_and_opt(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2).double()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def full_disk_at(rank: int, fail: set[int], step_of: list[int]) -> None:
    """On ``rank``, make ``torch.save`` into a file write 64 bytes and raise torch's full-disk error
    when the current step (``step_of[0]``) is in ``fail`` (``torch.save`` into memory, which
    pickling a tensor for ``gather_object`` uses, is left alone)."""
    if dist.get_rank() != rank:
        return
    real_save = torch.save

    def save(obj, f, *args, **kwargs):  # type: ignore[no-untyped-def]
        if step_of[0] in fail and not isinstance(f, io.BytesIO):  # the file, not a pickled tensor
            f.write(b"\0" * 64)
            raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0")
        return real_save(obj, f, *args, **kwargs)

    torch.save = save  # type: ignore[assignment]


def quarantine(ckpt: Path) -> dict:
    model, opt = model_and_opt(1)
    checkpoint.save_checkpoint(ckpt, step=100, model=model, optimizer=opt, keep=2)
    good = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    checkpoint.save_checkpoint(ckpt, step=200, model=model, optimizer=opt, keep=2)
    if dist.get_rank() == 0:
        newest = store.candidates(ckpt)[0].file
        data = bytearray(newest.read_bytes())
        data[len(data) // 2] ^= 0xFF  # same size, wrong SHA-256
        newest.write_bytes(bytes(data))
    dist.barrier()
    fresh, fresh_opt = model_and_opt(2)
    state = checkpoint.load_checkpoint(ckpt, model=fresh, optimizer=fresh_opt)
    resumed = int(state["step"]) if state else None
    same = all(torch.equal(a, b) for a, b in zip(fresh.parameters(), good, strict=True))
    checkpoint.save_checkpoint(ckpt, step=150, model=fresh, optimizer=fresh_opt, keep=2)
    dist.barrier()
    return {"resumed": resumed, "resumed_the_good_one": same,
            "steps": [c.step for c in store.candidates(ckpt)],
            "entries": sorted(p.name for p in ckpt.iterdir())}


def save_error(ckpt: Path) -> dict:
    model, opt = model_and_opt(1)
    step_of = [1]
    full_disk_at(0, {2}, step_of)
    checkpoint.save_checkpoint(ckpt, step=1, model=model, optimizer=opt)
    step_of[0] = 2
    start = time.monotonic()
    try:
        checkpoint.save_checkpoint(ckpt, step=2, model=model, optimizer=opt)
        error = {"type": None, "message": ""}
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        error = {"type": type(exc).__name__, "message": str(exc),
                 "is_oserror": isinstance(exc, OSError), "is_runtimeerror": isinstance(exc, RuntimeError)}
    elapsed = time.monotonic() - start
    dist.barrier()
    return {"error": error, "elapsed_s": elapsed, "steps": [c.step for c in store.candidates(ckpt)],
            "entries": sorted(p.name for p in ckpt.iterdir())}


def periodic(ckpt: Path) -> dict:
    from hetero_worker import trainer as ht
    from hetero_worker.metrics import mn

    t = ht.init(seed=3)
    model, opt = model_and_opt(1)
    t.wrap(model)
    opt = torch.optim.SGD(t.model.parameters(), lr=0.1)
    step_of = [0]
    full_disk_at(0, {2, 4, 5}, step_of)
    saved: dict[str, bool] = {}
    error: dict = {}
    x = torch.ones(t.local_batch, 4, dtype=torch.float64)
    for step in range(1, 7):
        t.step(opt, lambda m: m(x).pow(2).mean())
        step_of[0] = t.global_step
        try:
            saved[str(t.global_step)] = t.maybe_checkpoint(opt, 1)
        except Exception as exc:  # noqa: BLE001 - recorded for the test
            error = {"type": type(exc).__name__, "message": str(exc), "step": t.global_step}
            break
    failures = t.metrics.registry.get_sample_value(mn.CHECKPOINT_SAVE_FAILURES_TOTAL,
                                                   t.metrics.labels)
    dist.barrier()
    return {"saved": saved, "error": error, "failures_metric": failures,
            "steps": [c.step for c in store.candidates(ckpt)],
            "entries": sorted(p.name for p in ckpt.iterdir())}


def generation(ckpt: Path) -> dict:
    model, opt = model_and_opt(1)
    newer, stale = Owner(job_uid="uid-7", generation=1), Owner(job_uid="uid-7", generation=0)
    checkpoint.save_checkpoint(ckpt, step=10, model=model, optimizer=opt, keep=1, owner=newer)
    manifest = store.candidates(ckpt)[0].manifest
    try:
        checkpoint.save_checkpoint(ckpt, step=12, model=model, optimizer=opt, keep=1, owner=stale)
        error = {"type": None, "message": ""}
    except Exception as exc:  # noqa: BLE001 - recorded for the test
        error = {"type": type(exc).__name__, "message": str(exc),
                 "superseded": bool(getattr(exc, "superseded", False))}
    dist.barrier()
    return {"manifest_owner": {k: manifest.get(k) for k in ("job_uid", "restart_generation")},
            "error": error, "steps": [c.step for c in store.candidates(ckpt)],
            "entries": sorted(p.name for p in ckpt.iterdir())}


def main() -> None:
    scenario, out, ckpt = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if scenario != "periodic":  # the Trainer joins the job itself
        dist.init_process_group("gloo", timeout=timedelta(seconds=SAVE_TIMEOUT_S))
    result = {"quarantine": quarantine, "save_error": save_error, "periodic": periodic,
              "generation": generation}[scenario](ckpt)
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
