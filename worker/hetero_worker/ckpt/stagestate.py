"""Checkpoints of a pipelined job (issue 30): every stage's blocks saved once, resumed per stage.

Under a pipeline (:mod:`hetero_worker.pipelinepart`) no rank holds the whole model: stage ``i``'s
ranks hold blocks ``first_i <= j < end_i`` of the user's ``nn.Sequential``. A save is collective
over the checkpoint group, as :func:`hetero_worker.ckpt.checkpoint.save_checkpoint`'s is:

* **replica 0 of every stage** hands its stage's state (:func:`stage_state`) to rank 0 with its RNG
  state (the other replicas hold the same parameters and optimizer state after every step, since
  they apply the same reduced gradients, and hand their RNG state only);
* **rank 0** writes one ``checkpoint.pt`` of :data:`~hetero_worker.ckpt.files.FORMAT` through the
  same store (``.tmp``, fsync, manifest, rename, verify, prune, the job's owner,
  :mod:`hetero_worker.ckpt.store`, :mod:`hetero_worker.ckpt.ownership`): ``model`` is the whole
  model's state dict **keyed by the block's global index** (``"7.0.weight"`` is block 7's, whatever
  stage held it: the keys of the user's ``nn.Sequential``), ``optimizer`` is None, and
  ``pipeline`` holds the stage cut (``stage_blocks``) and each stage's optimizer state
  (``stages[str(i)]``: ``optimizer``, ``optimizer_fqns`` its parameters' global names, ``blocks``
  ``[first, end]``). Step, data position, plan, per-rank RNG and what ``Trainer.track`` registered
  are saved as for data parallelism.

A resume (:func:`load_stage_checkpoint`) agrees on the newest checkpoint every rank can read (and
this job may resume: another job's are passed over), then every rank loads its stage's blocks by
global key and its stage's optimizer state; the data position and the step continue, and under
the same plan every rank's RNG. On another stage cut of the same blocks (a re-plan onto other GPU
types) each parameter's optimizer state moves with it by its global name
(:func:`restaged_optimizer_state`); another number of blocks, or stage optimizers with several
parameter groups, is refused on every rank alike, naming both cuts; a checkpoint without
``pipeline`` (data parallelism) is refused by a pipelined job, and a pipelined
job's checkpoint by a data-parallel one
(:func:`hetero_worker.ckpt.files.refuse_pipeline_checkpoint`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hetero_worker.ckpt import store
from hetero_worker.ckpt.agreement import ResumeDisagreement, agree_on_newest, agree_on_resume
from hetero_worker.ckpt.checkpoint import agree_saved, read_file
from hetero_worker.ckpt.files import (CHECKPOINT_FILE, FORMAT, PIPELINE_KEY, fresh_rng,
                                      gather_to_rank0, manifest, rng_state, same_plan, save_atomic,
                                      set_rng_state)
from hetero_worker.ckpt.ownership import Owner
from hetero_worker.ckpt.pieces import optimizer_fqns
from hetero_worker.ckpt.saving import discard_tmp
from hetero_worker.comm import agree
from hetero_worker.runtime.ranklog import log
from heterotrain_common import defaults

__all__ = ["PIPELINE_KEY", "cut_problem", "global_key", "load_stage_checkpoint",
           "restaged_optimizer_state", "save_stage_checkpoint", "stage_state"]

def global_key(local_key: str, first_block: int) -> str:
    """A stage module's state-dict key as the whole ``nn.Sequential``'s: its leading block index
    shifted by the stage's first block (``"1.0.weight"`` of a stage from block 7 is
    ``"8.0.weight"``); ``""`` (a parameter that is not the module's) stays ``""``."""
    if not local_key:
        return local_key
    head, dot, rest = local_key.partition(".")
    return f"{int(head) + first_block}{dot}{rest}"


def stage_state(module: nn.Module, optimizer: torch.optim.Optimizer,
                first_block: int) -> dict[str, Any]:
    """One stage's state: ``model`` (its state dict by global key, detached copies),
    ``optimizer`` (``optimizer.state_dict()``) and ``optimizer_fqns`` (the optimizer's parameters'
    global names in its id order)."""
    return {"model": {global_key(k, first_block): v.detach().clone()
                      for k, v in module.state_dict().items()},
            "optimizer": optimizer.state_dict(),
            "optimizer_fqns": [global_key(n, first_block)
                               for n in optimizer_fqns(module, optimizer)]}


def _bounds(stage_blocks: Sequence[int], stage: int) -> tuple[int, int]:
    first = sum(stage_blocks[:stage])
    return first, first + stage_blocks[stage]


def save_stage_checkpoint(directory: str | Path, *, step: int, stage: int, replica: int,
                          stage_blocks: Sequence[int], module: nn.Module,
                          optimizer: torch.optim.Optimizer, sampler: Any = None,
                          plan: Mapping[str, Any] | None = None,
                          extra: Mapping[str, Any] | None = None,
                          keep: int = defaults.CHECKPOINT_KEEP, group: Any = None,
                          owner: Owner | None = None, scaler: Any = None) -> Path:
    """Write a pipelined job's checkpoint; collective: every rank at the same step.

    Args:
        directory: checkpoint directory (created if missing).
        step: optimizer steps taken (the step to resume after).
        stage, replica: this rank's stage and pipeline (replica 0 of each stage hands its state).
        stage_blocks: blocks per stage (the plan's cut).
        module: this rank's stage module (its blocks from 0).
        optimizer: over ``module``'s parameters.
        sampler: the pipeline data's sampler (its ``state_dict`` is the global data position).
        plan, extra, keep, group, owner: as :func:`hetero_worker.ckpt.checkpoint.save_checkpoint`.
        scaler: the job's loss scaler (fp16; one scale for every stage: rank 0's is saved).

    Returns:
        The published ``checkpoint.pt`` (on every rank, once rank 0 has verified it).

    Raises:
        hetero_worker.ckpt.saving.CheckpointSaveError: rank 0 could not write or verify it, or a
            stage's state did not arrive (on every rank, same message).
    """
    directory = Path(directory)
    first, _ = _bounds(stage_blocks, stage)
    mine = {"rng": rng_state(), "stage_index": stage,
            "stage": stage_state(module, optimizer, first) if replica == 0 else None}
    ranks = gather_to_rank0(mine, group)
    checkpoint_id = agree.agreed_token(group)
    error, path = "", directory / store.dir_name(step, checkpoint_id) / CHECKPOINT_FILE
    if ranks is not None:
        tmp = store.tmp_dir(directory, step, checkpoint_id)
        try:
            stages = {int(r["stage_index"]): r.pop("stage") for r in ranks if r.get("stage")}
            for r in ranks:
                r.pop("stage", None)
                r.pop("stage_index", None)
            if sorted(stages) != list(range(len(stage_blocks))):
                raise RuntimeError(f"stage states of {sorted(stages)} arrived, the plan has "
                                   f"{len(stage_blocks)} stages")
            tmp.mkdir(parents=True, exist_ok=True)
            state = manifest(checkpoint_id=checkpoint_id, step=step, model=None, optimizer=None,
                             scaler=scaler, sampler=sampler, plan=plan, ranks=ranks, extra=extra)
            model: dict[str, torch.Tensor] = {}
            for index in sorted(stages):
                model.update(stages[index].pop("model"))
                stages[index]["blocks"] = list(_bounds(stage_blocks, index))
            state["model"] = model
            state[PIPELINE_KEY] = {"stage_blocks": [int(b) for b in stage_blocks],
                                   "stages": {str(i): s for i, s in sorted(stages.items())}}
            save_atomic(state, tmp / CHECKPOINT_FILE)
            path = store.publish_verified(directory, tmp, step=step, checkpoint_id=checkpoint_id,
                                          fmt=FORMAT, keep=keep, owner=owner)
        except Exception as exc:  # noqa: BLE001 - any type (torch.save on a full disk: RuntimeError)
            discard_tmp(tmp)
            error = (f"saving the pipeline checkpoint of step {step} in {directory}: "
                     f"{type(exc).__name__}: {exc}")
    agree_saved(error[:agree.ERROR_BYTES], group)
    return path


def cut_problem(state: Mapping[str, Any], stage_blocks: Sequence[int]) -> str:
    """Why a pipelined job cannot resume ``state`` (``""``: it can): no ``pipeline`` entry (a
    data-parallel checkpoint), another number of blocks, or another stage cut whose optimizer
    state cannot be moved (a stage optimizer with several parameter groups)."""
    saved = state.get(PIPELINE_KEY)
    if not saved:
        return (f"the checkpoint of step {state.get('step')} was written by a data-parallel job "
                "(no stage states): a pipelined job resumes pipeline checkpoints only; point "
                "spec.training.checkpoint.path at a new directory")
    cut = [int(b) for b in saved["stage_blocks"]]
    if cut == [int(b) for b in stage_blocks]:
        return ""
    if sum(cut) != sum(int(b) for b in stage_blocks):
        return (f"the checkpoint of step {state.get('step')} holds a model of {sum(cut)} blocks "
                f"(stages of {cut}) and this plan cuts {sum(stage_blocks)} "
                f"({list(stage_blocks)}): set spec.training.pipeline.blocks to {sum(cut)}, or "
                "point spec.training.checkpoint.path at a new directory")
    groups = {len(s["optimizer"]["param_groups"]) for s in saved["stages"].values()}
    if groups != {1}:
        return (f"the checkpoint of step {state.get('step')} cuts the model into stages of "
                f"{cut} blocks and this plan into {list(stage_blocks)}, and its stage optimizers "
                "have several parameter groups, which are not moved between stages: resume on "
                "the same stage cut (the same GPU types and spec.training.pipeline) or use one "
                "parameter group")
    return ""


def restaged_optimizer_state(saved: Mapping[str, Any], module: nn.Module,
                             optimizer: torch.optim.Optimizer, first_block: int) -> dict[str, Any]:
    """The optimizer state of a stage of *another* cut than the checkpoint's: each parameter's
    state (momentum, Adam's moments and step) taken by its global name from whichever saved stage
    held it, in ``optimizer``'s parameter order, with the saved hyperparameters (one parameter
    group, :func:`cut_problem`). Load it with ``optimizer.load_state_dict``.

    Args:
        saved: the checkpoint's ``pipeline`` entry (``stages[str(i)]``: ``optimizer``,
            ``optimizer_fqns``).
        module, optimizer: this rank's new stage module and its optimizer (one parameter group).
        first_block: the new stage's first block.

    Raises:
        KeyError: a parameter of the new stage is in no saved stage (another model).
    """
    by_name: dict[str, Any] = {}
    group: dict[str, Any] = {}
    for stage in saved["stages"].values():
        sd = stage["optimizer"]
        ids = [i for g in sd["param_groups"] for i in g["params"]]
        group = group or {k: v for k, v in sd["param_groups"][0].items() if k != "params"}
        for pid, name in zip(ids, stage["optimizer_fqns"], strict=True):
            by_name[name] = sd["state"].get(pid)
    names = [global_key(n, first_block) for n in optimizer_fqns(module, optimizer)]
    missing = [n for n in names if n not in by_name]
    if missing:
        raise KeyError(f"parameters {missing[:3]} of this stage are in no stage of the checkpoint")
    return {"state": {i: by_name[n] for i, n in enumerate(names) if by_name[n] is not None},
            "param_groups": [{**group, "params": list(range(len(names)))}]}


def load_stage_checkpoint(directory: str | Path | None, *, stage: int,
                          stage_blocks: Sequence[int], module: nn.Module,
                          optimizer: torch.optim.Optimizer, sampler: Any = None,
                          plan: Mapping[str, Any] | None = None, seed: int = 0,
                          group: Any = None, accept: Any = None,
                          last_resume: dict[str, Any] | None = None,
                          scaler: Any = None) -> dict[str, Any] | None:
    """Agree on and restore this rank's stage from a pipelined job's checkpoint; collective.

    Args:
        directory: checkpoint directory (None or ``""``: none).
        stage, stage_blocks: this rank's stage and the plan's cut.
        module, optimizer: this rank's stage module and its optimizer, restored in place.
        sampler: the pipeline data's sampler (its data position is restored).
        plan, seed, group, accept: as :func:`hetero_worker.ckpt.checkpoint.load_checkpoint`.
        last_resume: updated like :data:`hetero_worker.ckpt.checkpoint.LAST_RESUME`.
        scaler: the job's loss scaler, restored when the checkpoint has one.

    Returns:
        The checkpoint dict with ``resumed_same_plan`` added, or None when no rank has one.

    Raises:
        hetero_worker.ckpt.agreement.ResumeDisagreement: the ranks found different checkpoints.
        ValueError: a data-parallel checkpoint, or a cut it cannot move to (:func:`cut_problem`).
    """
    last_resume = {} if last_resume is None else last_resume
    chosen, _, note = agree_on_newest(directory, group, accept)
    if chosen is None:
        last_resume.clear()
        return None
    state, finding = read_file(chosen.file)
    agree_on_resume(finding, group)
    if state is None:
        raise ResumeDisagreement([finding])
    last_resume.update(step=int(state["step"]), fallback=note, path=str(Path(chosen.file).parent))
    rank = dist.get_rank() if dist.is_initialized() else 0
    if note and rank == 0:
        log(f"checkpoint_fallback: resuming from step {state['step']} (checkpoint "
            f"{state['checkpoint_id']}); the newest is unreadable: {note}")
    problem = cut_problem(state, stage_blocks)
    if problem:
        raise ValueError(problem)
    first, _ = _bounds(stage_blocks, stage)
    full = state["model"]
    mine = {k: full[global_key(k, first)] for k in module.state_dict()}
    module.load_state_dict(mine)
    saved = state[PIPELINE_KEY]
    if [int(b) for b in saved["stage_blocks"]] == [int(b) for b in stage_blocks]:
        optimizer.load_state_dict(saved["stages"][str(stage)]["optimizer"])
    else:  # another cut (a re-plan onto other GPU types): each parameter's state by its name
        optimizer.load_state_dict(restaged_optimizer_state(saved, module, optimizer, first))
        if rank == 0:
            log(f"checkpoint: resuming step {state['step']} on stages of {list(stage_blocks)} "
                f"blocks (saved as {list(saved['stage_blocks'])}); the optimizer state moved "
                "with its parameters")
    if scaler is not None and state.get("scaler"):  # one loss scale for every stage (fp16)
        scaler.load_state_dict(state["scaler"])
    if sampler is not None and state["data"] is not None:
        sampler.load_state_dict(state["data"])
    state["resumed_same_plan"] = same_plan(state["plan"], plan)
    if state["resumed_same_plan"] and rank < len(state["ranks"]):
        set_rng_state(state["ranks"][rank]["rng"])
    else:
        fresh_rng(seed, int(state["step"]), rank)
    return state
