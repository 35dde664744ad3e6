"""The Trainer's stepping part (:class:`Stepper`): one optimizer step on every rank (forward and
loss under autocast, the weighted, scaled backward, micro-batches, token weighting, the sharded or
manual sync, global-norm clipping after the unscale, the optimizer step with the cross-rank skip
agreement), the work-stealing step, the step's accounting (:class:`StepResult`, totals, metrics,
the efficiency window) and the per-rank summaries."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hetero_worker.comm import clipping, tokens
from hetero_worker.efficiency import EfficiencyWindow
from hetero_worker.loading import TrainData
from hetero_worker.memory import microbatch
from hetero_worker.memory.caps import MemoryMeter
from hetero_worker.memory.wrap import ModelPart
from hetero_worker.precision import PrecisionPolicy
from hetero_worker.runtime.simulation import simulate_compute
from hetero_worker.speed import stealing
from hetero_worker.steps import StepCount
from hetero_worker.tracking import from_contract as tracker_for
from heterotrain_common.contract import Contract


@dataclass(frozen=True, kw_only=True, slots=True)
class StepResult:
    """What one :meth:`Trainer.step` did.

    Attributes:
        loss: this rank's mean loss over its local batch.
        skipped: True when the optimizer step was skipped on every rank (inf/NaN under fp16).
        step_s: wall seconds of the step; compute_s + comm_wait_s == step_s.
        compute_s: forward, backward, simulated delay and optimizer time.
        comm_wait_s: seconds inside collectives, including waiting for slower ranks.
        grad_norm: the full gradient's 2-norm over every rank before clipping (the same on every
            rank), when the step clipped (``max_grad_norm``); else None.
    """

    loss: float
    skipped: bool
    step_s: float
    compute_s: float
    comm_wait_s: float
    grad_norm: float | None = None


class Stepper:
    """One rank's steps: the part that runs ``Trainer.step`` and ``Trainer.steal_step``.

    Args:
        contract: the rank's contract (device, memory, the summaries' facts).
        model: the model part (wrapped model, module, sharded sync).
        data: the data part (this rank's local batch, the sampler for stealing).
        steps: the step count it advances.
        sync: the gradient sync.
        sync_mode: ``"hook"`` or ``"manual"``.
        precision: the rank's autocast policy.
        scaler: the agreed loss scaler (None: no fp16 rank in the job).
        metrics: the rank's metrics.
        window: the efficiency window.
        memory: the memory meter (None without a cap).
        profiler: the step profiler (None unless asked).
        delay_per_sample_s: simulated seconds per sample at speed 1.0.
        max_grad_norm: clip every step's gradient to this global 2-norm (None: no clipping).

    Attributes:
        speed: the speed controller (``after_step``, ``end_step``; None without one).
        totals: steps, samples, step/compute/wait seconds and skipped steps so far.
        tracker: experiment tracking (:mod:`hetero_worker.tracking`; None unless the contract
            asks for it).
        last_grad_norm: the global gradient norm :meth:`clip_grad_norm_` last saw (None before).

    Raises:
        ValueError: ``max_grad_norm`` is given and not positive.
    """

    def __init__(self, contract: Contract, *, model: ModelPart, data: TrainData,
                 steps: StepCount, sync: Any, sync_mode: str, precision: PrecisionPolicy,
                 scaler: Any, metrics: Any, window: EfficiencyWindow,
                 memory: MemoryMeter | None, profiler: Any, delay_per_sample_s: float,
                 max_grad_norm: float | None = None) -> None:
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be a positive number (or None: no clipping), "
                             f"got {max_grad_norm!r}")
        self.contract, self.model, self.data, self.steps = contract, model, data, steps
        self.sync, self.sync_mode, self.precision, self.scaler = sync, sync_mode, precision, scaler
        self.metrics, self.window, self.memory, self.profiler = metrics, window, memory, profiler
        self.delay_per_sample_s = delay_per_sample_s
        self.rank = contract.dist.rank
        self.speed: Any = None
        self.max_grad_norm = max_grad_norm
        self.last_grad_norm: float | None = None
        self._token_factor = 1.0  # this step's token weight on top of the sync's (comm.tokens)
        self.totals = {"steps": 0, "samples": 0, "step_s": 0.0, "compute_s": 0.0,
                       "comm_wait_s": 0.0, "skipped": 0}
        self.tracker = tracker_for(contract)

    def step(self, optimizer: torch.optim.Optimizer, loss_fn: Callable[..., torch.Tensor],
             batch: Sequence[Any] | None, num_tokens: Any = None) -> StepResult:
        """:meth:`hetero_worker.trainer.Trainer.step` without the stop agreement (see there)."""
        model, module, shard_sync = self.model.model, self.model.module, self.model.shard_sync
        assert model is not None and module is not None
        local = self.data.local_batch  # a split change decided after this step applies to the next
        self._token_factor = 1.0
        if num_tokens is not None:
            loss_fn, batch = self._weigh_tokens(num_tokens, loss_fn, batch)
        if self.profiler is not None:
            self.profiler.before_step(self.steps.global_step + 1)
        start = time.perf_counter()
        self.window.begin_step(start)
        optimizer.zero_grad(set_to_none=True)
        simulate_compute(self.contract.device, local, self.delay_per_sample_s)
        micro = self.contract.memory.micro_batch_size
        around = self.memory.micro_batch if self.memory is not None else None
        if batch is None:
            if 0 < micro < local:
                raise RuntimeError(
                    f"the plan runs this rank's {local} samples as micro-batches of {micro} "
                    "(HTJ_MICRO_BATCH_SIZE: they do not fit its memory at once): pass the batch, "
                    "t.step(opt, lambda m, x, y: loss(m(x), y), batch=(x, y))")
            with around() if around else contextlib.nullcontext():
                with self.precision.autocast():
                    loss = loss_fn(model)
                self._backward(loss)
        else:
            count = None
            if shard_sync is not None:  # ranks that share collectives run equally many
                count = shard_sync.micro_count(micro)
            loss = microbatch.accumulate(model, loss_fn, batch, micro,
                                         autocast=self.precision.autocast,
                                         backward=self._backward, around_micro=around, count=count)
        self.sync.end_of_backward()
        if shard_sync is not None:  # Group: the one cross-group reduction (Full: bookkeeping)
            shard_sync.reduce(list(module.parameters()))
            self.sync.add_comm_s(shard_sync.take_comm_s())
            self.metrics.add_inter_group_bytes(shard_sync.inter_group_bytes)
            shard_sync.inter_group_bytes = 0
        elif self.sync_mode == "manual":
            self.sync.sync_after_backward(model.parameters())
        self.last_grad_norm = None
        skipped = self.optimizer_step(optimizer)
        if self.memory is not None:
            self.memory.set_state(module.parameters(), optimizer)
            self.metrics.set_memory_peak(self.memory.peak_bytes, self.memory.cap_bytes)
        step_s = time.perf_counter() - start
        result = self._record(loss.detach().float().item(), skipped, step_s, local,
                              self.last_grad_norm)
        if self.speed is not None:
            self.speed.after_step(result.compute_s, local)
        if self.profiler is not None:
            self.profiler.after_step(self.steps.global_step)
        return result

    def _weigh_tokens(self, num_tokens: Any, loss_fn: Callable[..., torch.Tensor],
                      batch: Sequence[Any] | None
                      ) -> tuple[Callable[..., torch.Tensor], Sequence[Any] | None]:
        """Token weighting of this step (:mod:`hetero_worker.comm.tokens`): agree on the job's
        token count (one all-reduce) and set the rank's factor; with ``batch``, weigh each
        micro-batch by its tokens. Returns the step's ``(loss_fn, batch)``."""
        counts = None
        if batch is not None:
            counts = tokens.per_sample_counts(num_tokens, batch)
            rank_tokens = counts.sum().item()
        else:
            rank_tokens = float(torch.as_tensor(num_tokens).detach().double().sum().item())
        started = time.perf_counter()
        weights = tokens.agree_tokens(rank_tokens, local_batches=self.data.local_batches,
                                      rank=self.rank)
        self.sync.add_comm_s(time.perf_counter() - started)
        self._token_factor = weights.loss_factor
        if counts is None:
            return loss_fn, batch
        return tokens.micro_token_weighted(loss_fn, batch, counts)

    def _backward(self, loss: torch.Tensor) -> None:
        """Backward of one (micro-)batch loss: the rank weight where the flat fast path moved it
        into the loss (``loss_factor``, else 1), the step's token weight and the fp16 scaler."""
        shard_sync = self.model.shard_sync
        factor = shard_sync.loss_factor if shard_sync is not None else self.sync.loss_factor
        factor *= self._token_factor
        weighted = loss * factor if factor != 1.0 else loss
        root = self.scaler.scale(weighted) if self.scaler is not None else weighted
        if shard_sync is None and self.sync_mode == "hook":
            self.sync.watch_backward(root)  # wait timing: when the last gradient is ready
        root.backward()

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step unless any rank's scaler found inf/NaN; True when skipped (on every rank).

        The speed controller's codecs then keep the step's error feedback or, skipped, drop it
        (their state stays as it was), rescaled when the loss scale changed."""
        if self.scaler is None:  # no fp16 rank in the job: nothing to agree on
            self._clip()
            optimizer.step()
            skipped, ratio = False, 1.0
        else:
            start = time.perf_counter()
            self.scaler.unscale_(optimizer)  # all-reduces the found-inf flag
            self.sync.add_comm_s(time.perf_counter() - start)
            if not self.scaler.last_found_inf:  # agreed: every rank clips, or none does
                self._clip()
            self.scaler.step(optimizer)
            before = self.scaler.get_scale()
            self.scaler.update()
            skipped, ratio = self.scaler.last_found_inf, self.scaler.get_scale() / before
        if self.speed is not None:
            self.speed.end_step(skipped=skipped, scale_ratio=ratio)
        return skipped

    def _clip(self) -> None:
        """Clip to :attr:`max_grad_norm` when set (after the sync and the unscale)."""
        if self.max_grad_norm is not None:
            self.clip_grad_norm_(self.max_grad_norm)

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Scale the gradients so that the *full* gradient's 2-norm over every rank is at most
        ``max_norm`` (:func:`hetero_worker.comm.clipping.clip_grad_norm_`: every shard and group,
        each element once; collective). Returns the norm before clipping, also kept as
        :attr:`last_grad_norm`."""
        module, shard_sync = self.model.module, self.model.shard_sync
        if module is None:
            raise RuntimeError("call Trainer.wrap(model) before clip_grad_norm_()")
        shard_ranks = shard_sync.intra_ranks if shard_sync is not None else (self.rank,)
        start = time.perf_counter()
        self.last_grad_norm = clipping.clip_grad_norm_(module.parameters(), max_norm,
                                                       shard_ranks=shard_ranks)
        self.sync.add_comm_s(time.perf_counter() - start)
        return self.last_grad_norm

    def _record(self, loss: float, skipped: bool, step_s: float, local: int,
                grad_norm: float | None = None) -> StepResult:
        comm_s = min(self.sync.take_comm_s(), step_s)
        result = StepResult(loss=loss, skipped=skipped, step_s=step_s,
                            compute_s=step_s - comm_s, comm_wait_s=comm_s, grad_norm=grad_norm)
        self.steps.global_step += 1
        for key, value in (("steps", 1), ("samples", local), ("step_s", step_s),
                           ("compute_s", result.compute_s), ("comm_wait_s", comm_s),
                           ("skipped", int(skipped))):
            self.totals[key] += value
        self.metrics.observe_step(step_s, result.compute_s, comm_s, local, loss)
        self.track(result, local)
        if skipped:
            self.metrics.record_skipped_step()
        self.window.end_step(self.steps.global_step, local, result.compute_s)
        return result

    def track(self, result: StepResult, samples: int) -> StepResult:
        """Write the step just counted (``steps.global_step``) to the rank's experiment tracking
        (nothing without it); ``samples``: this rank's samples in it. Returns ``result``."""
        if self.tracker is not None:
            self.tracker.observe_step(self.steps.global_step, step_s=result.step_s,
                                      compute_s=result.compute_s, comm_wait_s=result.comm_wait_s,
                                      samples=samples, loss=result.loss,
                                      local_batches=self.data.local_batches)
        return result

    def staged(self, pipeline: Any, optimizer: torch.optim.Optimizer,
               loss_fn: Callable[..., torch.Tensor], batch: Sequence[Any] | None) -> StepResult:
        """A pipelined rank's step (:meth:`hetero_worker.pipelinepart.PipelinePart.step`: the
        job's loss on every rank, the rank's share of the batch as its samples), tracked like a
        data-parallel one (:meth:`track`)."""
        return self.track(pipeline.step(optimizer, loss_fn, batch, precision=self.precision,
                                        scaler=self.scaler), self.contract.local_batch)

    def steal_step(self, optimizer: torch.optim.Optimizer, dispenser: stealing.MicroBatchDispenser,
                   loss_sum_fn: Callable[[torch.nn.Module, list[int]], torch.Tensor]
                   ) -> stealing.StealResult:
        """One work-stealing optimizer step (:mod:`hetero_worker.speed.stealing`).

        The step's samples are the next ``global_batch`` positions of the sampler's order (epochs
        stay covered exactly as with the fixed split); micro-batches run on the unwrapped module
        on this rank's device, under its autocast and loss scaler, and are reduced once with the
        hierarchical groups. Call :meth:`wrap` and :meth:`loader` first.

        Args:
            optimizer: over the model's parameters.
            dispenser: a :class:`~hetero_worker.speed.stealing.MicroBatchDispenser` whose
                ``global_batch`` equals the trainer's global batch.
            loss_sum_fn: ``loss_sum_fn(module, dataset_indices)`` returns the *summed* loss of
                those samples (scalar tensor).

        With inter-group compression the reduction goes through the job's codec (its own codec
        state, slot ``CodecReducer.STEAL_KEY``); the sample count and loss sum stay exact.

        Returns:
            The :class:`~hetero_worker.speed.stealing.StealResult` (the optimizer step is taken, or
            skipped on every rank when the fp16 scaler found inf/NaN).

        Raises:
            RuntimeError: no model or loader yet, a stream's loader (no indices to take), or
                Group/Full sharding (refused before any collective: their collectives need the
                same micro-batches on every rank of a group, which stealing does not give).
        """
        sampler, module = self.data.sampler, self.model.module
        stealing.check_stealable(sampler, module, self.contract.memory.sharding)
        assert sampler is not None and module is not None and hasattr(sampler, "permutation")
        if sampler.num_samples - sampler.cursor < sampler.global_batch:
            sampler.set_epoch(sampler.epoch + 1)
        order = sampler.permutation(sampler.epoch)
        base = sampler.cursor
        optimizer.zero_grad(set_to_none=True)
        reducer = getattr(self.sync, "reducer", None)
        allreduce = (stealing.codec_allreduce(reducer)
                     if reducer is not None and hasattr(reducer, "sum_")
                     else stealing.hierarchical_allreduce(self.sync.groups))

        def compute(lo: int, hi: int) -> torch.Tensor:
            return loss_sum_fn(module, order[base + lo:base + hi].tolist())

        result = stealing.steal_step(step=self.steps.global_step, dispenser=dispenser,
                                     params=[p for p in module.parameters() if p.requires_grad],
                                     compute=compute, allreduce=allreduce,
                                     autocast=self.precision.autocast,
                                     scale=self.scaler.scale if self.scaler is not None else None)
        self.optimizer_step(optimizer)
        sampler.cursor += sampler.global_batch
        self.steps.global_step += 1
        return result

    # --- results ----------------------------------------------------------------------------
    def rank_summary(self) -> dict[str, Any]:
        """This rank's totals: device, batch, samples/s, share of step time spent waiting."""
        step_s = self.totals["step_s"] or float("nan")
        contract = self.contract
        return {"rank": self.rank, "group": contract.dist.group,
                "gpu_product": contract.device.product,
                "relative_speed": contract.device.relative_speed,
                "precision": contract.precision, "local_batch": self.data.local_batch,
                "steps": self.totals["steps"], "samples": self.totals["samples"],
                "samples_per_s": self.totals["samples"] / step_s,
                "wait_share": self.totals["comm_wait_s"] / step_s,
                "skipped_steps": self.totals["skipped"],
                "memory_peak_bytes": self.memory.peak_bytes if self.memory is not None else None}

    def gather_summaries(self) -> list[dict[str, Any]]:
        """Every rank's :meth:`rank_summary`, ordered by rank (collective)."""
        self.window.finish(wait=True)  # the last window's ratio is exported by now
        summaries: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(summaries, self.rank_summary())
        return summaries
