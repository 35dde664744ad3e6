"""What every tracking backend writes, computed once: the run's metadata (:class:`RunInfo`) and one
optimizer step's series (:func:`step_scalars`), as ``{key: value}`` with the same keys for
TensorBoard, W&B and MLflow (docs/tracking.md).

Keys: ``job/loss``, ``job/samples_per_s``, ``job/global_batch`` (rank 0); ``gpu_type/<GPU>/...``
(the first rank of each GPU type): ``samples_per_s``, ``compute_samples_per_s_per_gpu``,
``batch_share``, ``local_batch``, ``step_s``, ``compute_s``, ``comm_wait_s``, ``ranks``, ``loss``
(and ``stage`` under a pipeline: the pipeline stage the type's first rank runs).
``<GPU>`` is :func:`gpu_tag` of the product. Every backend accepts ``/`` in a key (TensorBoard's tag
filter, W&B's panel sections and MLflow's metric names all group by it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from heterotrain_common.contract import Contract

EXTRAS = {"tensorboard": "tensorboard==2.21.0", "wandb": "wandb==0.31.0",
          "mlflow": "mlflow-skinny==3.18.0"}
"""The package (pinned as in pyproject's ``tracking`` extra) each backend imports."""

TYPE_SERIES: tuple[str, ...] = ("samples_per_s", "compute_samples_per_s_per_gpu", "batch_share",
                                "local_batch", "step_s", "compute_s", "comm_wait_s", "ranks", "loss")
"""The series under ``gpu_type/<GPU>/`` (a series is left out of a step where it is undefined:
a zero time, no loss)."""
JOB_SERIES: tuple[str, ...] = ("loss", "samples_per_s", "global_batch")
"""The series under ``job/``."""


def missing_extra(backend: str, exc: BaseException) -> RuntimeError:
    """The error of a rank asked to write ``backend`` whose library is not installed: it names the
    extra to install and the pinned package."""
    return RuntimeError(f"spec.training.tracking.{backend} needs {EXTRAS[backend].split('==')[0]}: "
                        f"pip install 'heterotrain[tracking]' ({EXTRAS[backend]}) ({exc})")


def gpu_tag(product: str) -> str:
    """``"Tesla T4"`` -> ``"Tesla-T4"``: a GPU product as one key segment (letters, digits,
    ``._-``; runs of anything else become one ``-``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", product).strip("-") or "unknown"


@dataclass(frozen=True)
class RunInfo:
    """One rank's place in the job, as the backends name and describe its run.

    Attributes:
        job: the job's name; job_uid: its ``metadata.uid`` (``""`` under ``heterotrain run``).
        rank, world_size: this rank and the job's rank count.
        product: this rank's GPU product; tag: :func:`gpu_tag` of it.
        type_ranks: the ranks of this GPU type, rank order.
        is_job: this rank writes the job's series (rank 0).
        is_type_leader: this rank writes its GPU type's series (its type's lowest rank).
        rows: every rank's ``(rank, group, node, product, local batch)``, the plan.
        prices_per_hour: the plan's price of one device per hour by GPU product, every product of
            ``rows`` (None: unpriced; ``HTJ_PRICES_PER_HOUR``).
        stages: every rank's pipeline stage, rank order; ``()`` without a pipeline.
    """

    job: str
    job_uid: str
    rank: int
    world_size: int
    product: str
    tag: str
    type_ranks: tuple[int, ...]
    is_job: bool
    is_type_leader: bool
    rows: tuple[tuple[int, int, str, str, int], ...]
    prices_per_hour: tuple[tuple[str, float | None], ...] = ()
    stages: tuple[int, ...] = ()

    @classmethod
    def of(cls, contract: Contract) -> RunInfo:
        """The run info of the rank ``contract`` describes."""
        rank, product = contract.dist.rank, contract.device.product
        type_ranks = tuple(e.rank for e in contract.topology if e.gpu_product == product) or (rank,)
        known = contract.run.prices_per_hour or {}
        prices = {e.gpu_product: known.get(e.gpu_product) for e in contract.topology}
        pipe = contract.pipeline
        stages = tuple(next(s for s, ranks in enumerate(pipe.stage_ranks) if e.rank in ranks)
                       for e in contract.topology) if pipe.enabled else ()
        return cls(job=contract.dist.job_name, job_uid=contract.dist.job_uid, rank=rank,
                   world_size=contract.dist.world_size, product=product, tag=gpu_tag(product),
                   type_ranks=type_ranks, is_job=rank == 0, is_type_leader=rank == min(type_ranks),
                   rows=tuple((e.rank, e.group, e.node, e.gpu_product, e.local_batch)
                              for e in contract.topology),
                   prices_per_hour=tuple(prices.items()), stages=stages)

    @property
    def writes(self) -> bool:
        """True when this rank writes anything (rank 0 or a GPU type's first rank)."""
        return self.is_job or self.is_type_leader

    @property
    def run_name(self) -> str:
        """``rank-<R>-<GPU>``: the name of this rank's run in every backend."""
        return f"rank-{self.rank}-{self.tag}"

    def gpu_mix(self) -> dict[str, int]:
        """Ranks per GPU product, in rank order of first appearance."""
        mix: dict[str, int] = {}
        for _, _, _, product, _ in self.rows:
            mix[product] = mix.get(product, 0) + 1
        return mix

    def mix_text(self) -> str:
        """``"1 x NVIDIA A100, 2 x Tesla T4"``."""
        return ", ".join(f"{n} x {p}" for p, n in self.gpu_mix().items())

    @property
    def stage(self) -> int | None:
        """This rank's pipeline stage, None without a pipeline."""
        return self.stages[self.rank] if self.stages else None

    def prices_text(self) -> str:
        """``"NVIDIA A100 2.5/h, Tesla T4 unpriced"``: the plan's price per device-hour by type."""
        return ", ".join(f"{p} {'unpriced' if v is None else f'{v:g}/h'}"
                         for p, v in self.prices_per_hour)

    def cost_per_hour(self) -> float | None:
        """The job's price per hour (every rank's device), None when a type is unpriced."""
        prices = dict(self.prices_per_hour)
        if any(prices.get(p) is None for _, _, _, p, _ in self.rows):
            return None
        return sum(prices[p] or 0.0 for _, _, _, p, _ in self.rows)

    def plan_markdown(self) -> str:
        """The run's metadata as a Markdown table: job, GPU mix, prices, every rank's type, batch
        (and pipeline stage)."""
        cost = self.cost_per_hour()
        lines = [f"job `{self.job}`, {self.world_size} ranks, GPU mix: {self.mix_text()}",
                 f"price per device-hour: {self.prices_text()}; job: "
                 + ("unpriced (a type has no price)" if cost is None else f"{cost:g}/h"), "",
                 "| rank | group | node | GPU | local batch |" + (" stage |" if self.stages else ""),
                 "|---|---|---|---|---|" + ("---|" if self.stages else "")]
        lines += [f"| {r} | {g} | {n} | {p} | {b} |" + (f" {self.stages[r]} |" if self.stages else "")
                  for r, g, n, p, b in self.rows]
        return "\n".join(lines)

    def metadata(self) -> dict[str, Any]:
        """The run's metadata as plain values (W&B's config, MLflow's params): the job, this
        rank's GPU type, the GPU mix and the planned split per type and per rank. Nothing from
        the environment (no credential can reach a run's metadata)."""
        per_type: dict[str, dict[str, Any]] = {}
        prices = dict(self.prices_per_hour)
        for rank, _, _, product, batch in self.rows:
            t = per_type.setdefault(gpu_tag(product), {"product": product, "ranks": 0,
                                                       "planned_batch": 0,
                                                       "price_per_hour": prices.get(product)})
            t["ranks"] += 1
            t["planned_batch"] += batch
        return {"job": self.job, "job_uid": self.job_uid, "rank": self.rank,
                "world_size": self.world_size, "gpu_type": self.product,
                "global_batch": sum(r[4] for r in self.rows), "gpu_mix": self.gpu_mix(),
                "gpu_types": per_type, "prices_per_hour": prices,
                "cost_per_hour": self.cost_per_hour(),
                "plan": [{"rank": r, "group": g, "node": n, "gpu": p, "local_batch": b,
                          **({"stage": self.stages[r]} if self.stages else {})}
                         for r, g, n, p, b in self.rows]}


def step_scalars(info: RunInfo, *, step_s: float, compute_s: float, comm_wait_s: float,
                 samples: int, loss: float | None, local_batches: Sequence[int]) -> dict[str, float]:
    """One optimizer step's series for ``info``'s rank (empty on a rank that writes nothing).

    Args:
        step_s, compute_s, comm_wait_s: the step's wall time and its split, seconds.
        samples: samples this rank processed in the step.
        loss: this rank's local mean loss (None: left out).
        local_batches: every rank's samples per step now (the split in use), rank order.
    """
    out: dict[str, float] = {}
    global_batch = sum(local_batches)
    if info.is_job:
        if loss is not None:
            out["job/loss"] = float(loss)
        if step_s > 0:
            out["job/samples_per_s"] = global_batch / step_s
        out["job/global_batch"] = float(global_batch)
    if info.is_type_leader:
        type_batch = sum(local_batches[r] for r in info.type_ranks if r < len(local_batches))
        t = f"gpu_type/{info.tag}"
        if step_s > 0:
            out[f"{t}/samples_per_s"] = type_batch / step_s
        if compute_s > 0:
            out[f"{t}/compute_samples_per_s_per_gpu"] = samples / compute_s
        if global_batch > 0:
            out[f"{t}/batch_share"] = type_batch / global_batch
        for name, value in (("local_batch", samples), ("step_s", step_s), ("compute_s", compute_s),
                            ("comm_wait_s", comm_wait_s), ("ranks", len(info.type_ranks))):
            out[f"{t}/{name}"] = float(value)
        if loss is not None:
            out[f"{t}/loss"] = float(loss)
        if info.stage is not None:  # a pipelined job: the stage this type's first rank runs
            out[f"{t}/stage"] = float(info.stage)
    return out
