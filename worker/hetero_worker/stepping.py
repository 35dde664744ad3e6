"""The Trainer's step internals (a mixin of :class:`hetero_worker.trainer.Trainer`): the weighted,
scaled backward, the optimizer step with the cross-rank skip agreement, the step's accounting
(:class:`StepResult`, totals, metrics, the efficiency window) and the per-rank summaries."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hetero_worker.efficiency import EFFICIENCY_WINDOW_STEPS


@dataclass(frozen=True, kw_only=True, slots=True)
class StepResult:
    """What one :meth:`Trainer.step` did.

    Attributes:
        loss: this rank's mean loss over its local batch.
        skipped: True when the optimizer step was skipped on every rank (inf/NaN under fp16).
        step_s: wall seconds of the step; compute_s + comm_wait_s == step_s.
        compute_s: forward, backward, simulated delay and optimizer time.
        comm_wait_s: seconds inside collectives, including waiting for slower ranks.
    """

    loss: float
    skipped: bool
    step_s: float
    compute_s: float
    comm_wait_s: float


class Stepping:
    """The Trainer's backward, optimizer step, step record and summaries (a mixin of
    :class:`hetero_worker.trainer.Trainer`; :meth:`~hetero_worker.trainer.Trainer.step` runs them)."""

    def _backward(self, loss: torch.Tensor) -> None:
        """Backward of one (micro-)batch loss: the rank weight where the flat fast path moved it
        into the loss (``loss_factor``, else 1) and the fp16 scaler."""
        factor = self.shard_sync.loss_factor if self.shard_sync is not None else self.sync.loss_factor
        weighted = loss * factor if factor != 1.0 else loss
        root = self.scaler.scale(weighted) if self.scaler is not None else weighted
        if self.shard_sync is None and self.sync_mode == "hook":
            self.sync.watch_backward(root)  # wait timing: when the last gradient is ready
        root.backward()

    def _optimizer_step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Step unless any rank's scaler found inf/NaN; True when skipped (on every rank).

        The speed controller's codecs then keep the step's error feedback or, skipped, drop it
        (their state stays as it was), rescaled when the loss scale changed."""
        if self.scaler is None:  # no fp16 rank in the job: nothing to agree on
            optimizer.step()
            skipped, ratio = False, 1.0
        else:
            start = time.perf_counter()
            self.scaler.unscale_(optimizer)  # all-reduces the found-inf flag
            self.sync.add_comm_s(time.perf_counter() - start)
            self.scaler.step(optimizer)
            before = self.scaler.get_scale()
            self.scaler.update()
            skipped, ratio = self.scaler.last_found_inf, self.scaler.get_scale() / before
        if self.speed is not None:
            self.speed.end_step(skipped=skipped, scale_ratio=ratio)
        return skipped

    def _record(self, loss: float, skipped: bool, step_s: float) -> StepResult:
        comm_s = min(self.sync.take_comm_s(), step_s)
        result = StepResult(loss=loss, skipped=skipped, step_s=step_s,
                            compute_s=step_s - comm_s, comm_wait_s=comm_s)
        self.global_step += 1
        for key, value in (("steps", 1), ("samples", self.local_batch), ("step_s", step_s),
                           ("compute_s", result.compute_s), ("comm_wait_s", comm_s),
                           ("skipped", int(skipped))):
            self.totals[key] += value
        self.metrics.observe_step(step_s, result.compute_s, comm_s, self.local_batch, loss)
        if skipped:
            self.metrics.record_skipped_step()
        self._window["samples"] += self.local_batch
        self._window["compute_s"] += result.compute_s
        if self._efficiency_pending is not None:
            self._finish_efficiency(wait=False)
        if self.global_step % EFFICIENCY_WINDOW_STEPS == 0:
            self._publish_efficiency()
        return result

    # --- results ----------------------------------------------------------------------------
    def rank_summary(self) -> dict[str, Any]:
        """This rank's totals: device, batch, samples/s, share of step time spent waiting."""
        step_s = self.totals["step_s"] or float("nan")
        return {"rank": self.rank, "group": self.contract.dist.group,
                "gpu_product": self.contract.device.product,
                "relative_speed": self.contract.device.relative_speed,
                "precision": self.contract.precision, "local_batch": self.local_batch,
                "steps": self.totals["steps"], "samples": self.totals["samples"],
                "samples_per_s": self.totals["samples"] / step_s,
                "wait_share": self.totals["comm_wait_s"] / step_s,
                "skipped_steps": self.totals["skipped"],
                "memory_peak_bytes": self.memory.peak_bytes if self.memory is not None else None}

    def gather_summaries(self) -> list[dict[str, Any]]:
        """Every rank's :meth:`rank_summary`, ordered by rank (collective)."""
        self._finish_efficiency(wait=True)  # the last window's ratio is exported by now
        summaries: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(summaries, self.rank_summary())
        return summaries
