"""A rank of the elastic tests (tests/worker/test_elastic.py): float64 MLP, Adam, the Trainer's
loader over a synthetic dataset that carries each sample's index.

Usage: ``python elastic_ranks.py OUT_DIR EPOCHS KILL_MEMBER KILL_AT_STEP [HOLD_AT_STEP]``: the
member ``KILL_MEMBER`` SIGKILLs itself inside the forward of step ``KILL_AT_STEP`` (deterministic:
its completed steps are exactly those before; with ``ELASTIC_RANKS_SIGNAL=SIGSTOP`` it stops
instead, a machine gone without closing its connections). With ``HOLD_AT_STEP`` (the growing test) every rank
of generation 1 waits after that step until the member ``KILL_MEMBER``, started again to join
generation 2, says it is ready: the next step's stop agreement then lets it in (deterministic,
whatever the joiner's start-up time). Each rank appends one JSON line per completed step to
``OUT_DIR/member<m>.jsonl`` (its batch's sample indices, the epoch, the generation); the final
generation's rank 0 writes ``OUT_DIR/final.pt`` (the parameters).

Imported by the tests for the shared parts: :func:`start_member`, :func:`read_rows`,
:func:`assert_each_sample_once` and :func:`reference_params` (one float64 process's run).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from hetero_worker import trainer as ht
from heterotrain_common import envnames, membership

N_SAMPLES, N_IN, N_CLASSES = 60, 8, 4
SIGNAL_ENV = "ELASTIC_RANKS_SIGNAL"
"""The signal the victim sends itself (a ``signal`` name; default ``SIGKILL``)."""


def dataset() -> torch.utils.data.TensorDataset:
    """Fixed synthetic data: ``(index, x, y)`` per sample, float64."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(N_SAMPLES, N_IN, generator=g, dtype=torch.float64)
    y = torch.randint(0, N_CLASSES, (N_SAMPLES,), generator=g)
    return torch.utils.data.TensorDataset(torch.arange(N_SAMPLES), x, y)


def make_model() -> torch.nn.Module:
    """8 -> 16 -> 4, float64 (built after the same seed on every rank and in the reference)."""
    return torch.nn.Sequential(torch.nn.Linear(N_IN, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, N_CLASSES)).double()


def start_member(out: Path, env: dict[str, str], member: int, epochs: int, *args: int,
                 store: str, **extra: str) -> subprocess.Popen:
    """Start this script as member ``member`` (``args``: KILL_MEMBER KILL_AT_STEP [HOLD_AT_STEP])
    against the membership store at ``store`` (``host:port``), collectives timing out after 20 s."""
    from rankproc import start_rank

    return start_rank([sys.executable, __file__, str(out), str(epochs), *map(str, args)], env,
                      **{envnames.ELASTIC_STORE: store, envnames.ELASTIC_MEMBER: str(member),
                         envnames.COLLECTIVE_TIMEOUT_S: "20", **extra})


def read_rows(out: Path, members: int) -> list[dict]:
    """Every completed step's line of every member (``member<m>.jsonl``)."""
    return [json.loads(line) for m in range(members)
            for line in (out / f"member{m}.jsonl").read_text().splitlines()]


def assert_each_sample_once(rows: list[dict], global_batch: int, epochs: int) -> None:
    """Every sample of each epoch trained exactly once, each step over the whole global batch."""
    for epoch in range(epochs):
        seen = sorted(i for row in rows if row["epoch"] == epoch for i in row["indices"])
        assert seen == list(range(N_SAMPLES)), f"epoch {epoch}"
    per_step: dict[int, int] = {}
    for row in rows:
        per_step[row["step"]] = per_step.get(row["step"], 0) + len(row["indices"])
    steps = epochs * (N_SAMPLES // global_batch)
    assert per_step == {s: global_batch for s in range(1, steps + 1)}


def reference_params(global_batch: int, epochs: int) -> list[torch.Tensor]:
    """One float64 process: the same model, Adam, and each step's full global batch (the
    sampler's permutation, ``global_batch`` samples per step)."""
    from hetero_worker.runtime.startup import seed_everything
    from hetero_worker.sampler import HeteroBatchSampler

    data = dataset()
    seed_everything(0)
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    sampler = HeteroBatchSampler(len(data), [global_batch], 0, seed=0)
    for epoch in range(epochs):
        order = sampler.permutation(epoch)
        for s in range(len(data) // global_batch):
            _, x, y = data[order[s * global_batch:(s + 1) * global_batch]]
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    return [p.detach() for p in model.parameters()]


def main() -> int:
    out, epochs = Path(sys.argv[1]), int(sys.argv[2])
    kill_member, kill_at = int(sys.argv[3]), int(sys.argv[4])
    hold_at = int(sys.argv[5]) if len(sys.argv) > 5 else None
    member = int(os.environ[envnames.ELASTIC_MEMBER])
    t = ht.init(seed=0)
    model = t.wrap(make_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    loader = t.loader(dataset(), shuffle=True)
    log = (out / f"member{member}.jsonl").open("a")
    while t.epoch < epochs:
        for idx, x, y in loader:
            epoch, generation = t.epoch, t.membership.generation  # those the step runs in

            def loss_fn(m: torch.nn.Module) -> torch.Tensor:
                if member == kill_member and t.global_step + 1 == kill_at:
                    os.kill(os.getpid(), getattr(signal, os.environ.get(SIGNAL_ENV, "SIGKILL")))
                    # mid-step: after the batch, before backward
                return F.cross_entropy(m(x), y)

            result = t.step(optimizer, loss_fn)
            if result.loss != result.loss:  # NaN: interrupted by a lost member; redone next
                continue
            log.write(json.dumps({"step": t.global_step, "epoch": epoch,
                                  "generation": generation, "rank": t.rank,
                                  "indices": idx.tolist()}) + "\n")
            log.flush()
            if t.global_step == hold_at and t.membership.generation == 1:
                t.membership.store.wait([membership.READY_KEY.format(generation=2,
                                                                     member=kill_member)])
    if t.rank == 0:
        torch.save([p.detach().clone() for p in t.module.parameters()], out / "final.pt")
        (out / "membership.json").write_text(json.dumps({
            "generation": t.membership.generation, "members": list(t.membership.members),
            "steps_redone": t.membership.steps_redone, "recovery_s": t.membership.last_recovery_s,
            "split": t.local_batches, "global_step": t.global_step}))
    t.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
