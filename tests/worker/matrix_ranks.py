"""Run inside each rank process by tests/worker/test_feature_matrix.py; writes ``<out>/rank<R>.json``.

One process per rank runs *every* row of the feature matrix one after the other (one rendezvous,
then per row a fresh :class:`hetero_worker.trainer.Trainer` on the row's planner-rendered
contract, its groups destroyed afterwards), so the matrix costs two process starts, not one per
row.  Per row: the same MLP and data, ``STEPS`` steps, facts per step (loss, skipped, split) and
the row's final full parameters. A row with ``clip`` trains with ``Trainer(max_grad_norm=clip)``;
one with ``tokens`` steps with ``t.step(..., batch=(x, y), num_tokens=token_counts(x))`` on the
token mean :func:`token_loss`.

Phase ``a`` trains every row; a row with kill-and-resume also trains an interrupted copy that
checkpoints at step ``CHECKPOINT_EVERY`` and stops ``KILL_AFTER`` steps in (its later steps are
lost: the phase ends with every process killing itself with SIGKILL, no clean shutdown).  Phase
``b`` is a new set of processes that resume those rows from their checkpoints and finish them.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hetero_worker.runtime import rendezvous
from hetero_worker.speed.controller import attach
from hetero_worker.speed.stealing import MicroBatchDispenser, default_store
from hetero_worker.trainer import Trainer, wants_speed_features
from heterotrain_common import contract as c
from heterotrain_common import envnames

STEPS = 12
GLOBAL_BATCH = 32
SAMPLES = STEPS * GLOBAL_BATCH
CHECKPOINT_EVERY = 4
KILL_AFTER = 6
INJECT_RANK = 2
"""The rank whose first-step loss overflows in fp16 rows (a group leader in every layout)."""
LR = 0.3
START_S = time.monotonic()


def make_model() -> torch.nn.Module:
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))


def make_data() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(11)
    teacher = torch.randn(16, 4, generator=g)
    x = torch.randn(SAMPLES, 16, generator=g)
    return torch.utils.data.TensorDataset(x, (x @ teacher).argmax(dim=1))


def token_counts(x: torch.Tensor) -> torch.Tensor:
    """Valid tokens of each sample in token-weighted rows: 1..4, from the sample's features
    (``[B, 16]`` -> ``[B]`` int64; deterministic, so the reference sees the same counts)."""
    return 1 + (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()


def token_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The batch's mean over its valid tokens: sample ``i`` stands for ``token_counts(x)[i]``
    tokens of the same loss (a per-token loss summed and divided by the batch's token count)."""
    per_sample = torch.nn.functional.cross_entropy(model(x), y, reduction="none")
    counts = token_counts(x).to(per_sample.dtype)
    return (per_sample * counts).sum() / counts.sum()


def eval_loss(params: dict[str, torch.Tensor]) -> float:
    model = make_model()
    model.load_state_dict({k: v.float().cpu() for k, v in params.items()})
    x, y = make_data().tensors
    with torch.no_grad():
        return float(torch.nn.functional.cross_entropy(model(x), y))


def full_params(t: Trainer) -> dict[str, torch.Tensor]:
    """The model's full parameters by name (collective under Group and Full sharding)."""
    out = {}
    for name, value in sorted(t.full_state_dict().items()):
        if hasattr(value, "full_tensor"):  # Group sharding: DTensor shards
            value = value.full_tensor()
        out[name.removeprefix("module.")] = value.detach().float().cpu().clone()
    return out


def codec_tensors(t: Trainer) -> list[torch.Tensor]:
    """Every error-feedback tensor and PowerSGD ``Q`` factor this rank's codecs hold."""
    reducer = getattr(t.sync, "reducer", None)
    out: list[torch.Tensor] = []
    for codec in getattr(reducer, "codecs", {}).values():
        out += [x for x in [getattr(codec, "error", None), *(getattr(codec, "errors", None) or []),
                            *getattr(codec, "qs", [])] if x is not None]
    return out


def row_contract(env: dict[str, str], checkpoint_dir: str | None = None) -> c.Contract:
    env = {**env, envnames.MASTER_ADDR: os.environ[envnames.MASTER_ADDR],
           envnames.MASTER_PORT: os.environ[envnames.MASTER_PORT]}
    parsed = c.parse_contract(env)
    checkpoint = parsed.checkpoint if checkpoint_dir is None else replace(parsed.checkpoint,
                                                                           dir=checkpoint_dir)
    return replace(parsed, run=replace(parsed.run, metrics_port=0),  # no /metrics server per row
                   checkpoint=checkpoint)


def retire(t: Trainer) -> None:
    """Tear a row's trainer down without leaving the process group (the next row reuses it).

    The groups of a sharded row stay alive: torch 2.13's DTensor resolves a mesh's group by name,
    and a later row's mesh over a destroyed group's recycled name fails to resolve (one trainer per
    process never meets this)."""
    t.sync.close()
    dist.barrier()
    if t.contract.memory.sharding == "none":
        t.groups.destroy()


def train(row: dict[str, Any], contract: c.Contract, *, tag: str, resume: bool = False,
          stop_after: int = STEPS) -> dict[str, Any]:
    print(f"matrix: row {row['id']} ({tag}) at {time.monotonic() - START_S:.1f} s", file=sys.stderr,
          flush=True)
    t = Trainer(contract, seed=0, max_grad_norm=row.get("clip"))
    if wants_speed_features(contract):
        attach(t)
    facts: dict[str, Any] = {"losses": [], "skipped": [], "splits": [], "refused": None}
    try:
        model = t.wrap(make_model())
    except RuntimeError as exc:
        facts["refused"] = str(exc)
        retire(t)
        return facts
    data = make_data()
    loader = t.loader(data)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    if resume:
        facts["resumed"] = t.resume(opt)
        facts["resumed_step"] = t.global_step
        facts["params_at_resume"] = {k: v.tolist() for k, v in full_params(t).items()}
    fp16 = row["precision"] == "fp16"

    def overflow(loss: torch.Tensor) -> torch.Tensor:
        return loss * float("inf") if fp16 and t.global_step == 0 else loss

    checkpointed: dict[str, Any] = {}

    def after_step() -> bool:
        facts["splits"].append(list(t.local_batches))
        if t.maybe_checkpoint(opt) and t.global_step == CHECKPOINT_EVERY:
            checkpointed.update({k: v.tolist() for k, v in full_params(t).items()})
        return t.global_step >= stop_after

    if row["stealing"]:
        disp = MicroBatchDispenser(store=default_store(), global_batch=GLOBAL_BATCH, micro_batch=4,
                                   prefix=f"mx/{row['id']}/{tag}")

        def loss_sum(module: torch.nn.Module, idx: list[int]) -> torch.Tensor:
            x, y = data[idx]
            loss = torch.nn.functional.cross_entropy(module(t.to_device(x)), t.to_device(y),
                                                     reduction="sum")
            return overflow(loss)
        try:
            while t.global_step < STEPS:
                result = t.steal_step(opt, disp, loss_sum)
                facts["losses"].append(result.loss_sum / max(result.total_samples, 1))
                facts["skipped"].append(bool(t.scaler is not None and t.scaler.last_found_inf))
                if after_step():
                    break
        except RuntimeError as exc:
            facts["refused"] = str(exc)
    else:
        for x, y in loader:
            if row.get("tokens"):  # token-weighted step: the batch and its tokens per sample
                result = t.step(opt, token_loss, batch=(t.to_device(x), t.to_device(y)),
                                num_tokens=token_counts(x))
                facts["losses"].append(result.loss)
                facts["skipped"].append(result.skipped)
                if after_step():
                    break
                continue

            def loss_fn(m: torch.nn.Module, x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
                loss = torch.nn.functional.cross_entropy(m(t.to_device(x)), t.to_device(y))
                return overflow(loss) if t.rank == INJECT_RANK else loss
            result = t.step(opt, loss_fn)
            facts["losses"].append(result.loss)
            facts["skipped"].append(result.skipped)
            if after_step():
                break
    if facts["refused"] is None:
        params = full_params(t)
        state = codec_tensors(t)
        facts.update(step=t.global_step, eval_loss=eval_loss(params), leader=t.groups.is_leader,
                     codec_state=sum(x.numel() for x in state),
                     codecs_finite=all(bool(torch.isfinite(x).all()) for x in state),
                     params={k: v.tolist() for k, v in params.items()},
                     scale=t.scaler.get_scale() if t.scaler is not None else None,
                     checkpointed=checkpointed or None)
    retire(t)
    return facts


def main(phase: str, rows_file: str, out: str) -> int:
    rows = json.loads(Path(rows_file).read_text())
    print(f"matrix: imports done at {time.time():.1f}", file=sys.stderr, flush=True)
    rank = int(os.environ[envnames.RANK])
    rendezvous.init_distributed(rank=rank, world_size=int(os.environ[envnames.WORLD_SIZE]),
                                master_addr=os.environ[envnames.MASTER_ADDR],
                                master_port=int(os.environ[envnames.MASTER_PORT]), backend="gloo",
                                timeout_s=120)
    results: dict[str, Any] = {}
    for row in rows:
        env = row["envs"][rank]
        if phase == "a":
            contract = row_contract(env, checkpoint_dir=row["reference_dir"]) if row["resume"] \
                else row_contract(env)
            results[row["id"]] = {"run": train(row, contract, tag="run")}
            if row["resume"]:  # the copy that is killed after KILL_AFTER steps
                results[row["id"]]["interrupted"] = train(row, row_contract(env), tag="cut",
                                                          stop_after=KILL_AFTER)
        elif row["resume"]:
            results[row["id"]] = {"resumed": train(row, row_contract(env), tag="resumed",
                                                   resume=True)}
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    print(f"matrix: rows done at {time.time():.1f}", file=sys.stderr, flush=True)
    dist.barrier()
    if phase == "a":
        os.kill(os.getpid(), signal.SIGKILL)  # killed: no clean shutdown, state after the checkpoint lost
    sys.stderr.flush()
    os._exit(0)  # every rank is past the barrier; Gloo's teardown adds seconds and nothing else


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
