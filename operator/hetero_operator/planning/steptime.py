"""The planner's step time per sharding mode: what each mode moves and recomputes (pure; issue 23).

One step of a plan under sharding mode ``m`` (every figure per step, the slowest rank's):

* **compute** ``max_r b_r * s_T(r) * k_r``: ``b_r`` the rank's local batch, ``s_T`` seconds per
  sample of one device of its type (``1 /`` the learned samples/s where earlier jobs measured it,
  else the table speed at the reference samples/s: the same figures as the throughput model,
  :mod:`hetero_operator.planning.marginal`), ``k_r = 1 +`` :data:`RECOMPUTE_SHARE` where the rank
  recomputes its blocks' forward in backward (activation checkpointing, and always under ``Full``,
  whose blocks run under ``torch.utils.checkpoint``), else 1;
* **cross-type traffic**, at the cross-type link's bandwidth:

  - ``None`` and ``Group``: one ring all-reduce of the fp32 gradients among the ``G`` groups per
    step (micro-batches accumulate locally): ``2 (G - 1) / G x P`` bytes (``P`` parameter bytes);
  - ``Full``: per micro-batch, per block, an all-gather for forward, one for backward and a
    reduce-scatter of the gradients over all ``W`` ranks on Gloo, slices padded to the largest
    share (Gloo all-gathers equal sizes). Gloo runs the reduce-scatter as an all-reduce of the
    whole padded buffer (:data:`GLOO_REDUCE_SCATTER_TRANSFERS`), so
    ``(2 + 2) x (W - 1) x max_share x P`` bytes per micro-batch;

* **in-group traffic** (``Group`` only), at the intra-node bandwidth: per micro-batch, FSDP2's two
  all-gathers and one reduce-scatter inside each group of ``n`` ranks: ``3 (n - 1) / n x P``;

``step = compute + cross + in-group`` (not overlapped: conservative, as the throughput model).

**Learned link rate.** Where an earlier run of the job measured the rate its ``Full``
collectives, or ``Group``'s step-end exchange, moved the modelled cross-type bytes at
(``cross_bytes_per_s``;
:mod:`hetero_operator.planning.linklearning`), the cross-type seconds use it instead of the
configured bandwidth: Gloo's per-collective costs and a link slower than configured are then in
the figure, as the learned speeds put the device's real compute in it.
The micro-batch count of a mode is the largest of its ranks' (every rank runs as many units).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hetero_operator.api.memoryplan import RankMemory, RankSlot
from heterotrain_common.pipelineschedules import FORWARD_SHARE

RECOMPUTE_SHARE = FORWARD_SHARE
"""Extra compute of recomputing a block's forward in backward, as a share of forward + backward:
one extra forward (:data:`heterotrain_common.pipelineschedules.FORWARD_SHARE`)."""
TRANSFERS_PER_MICRO_BATCH = 3
"""Parameter-sized transfers per micro-batch under sharding inside a group (FSDP2 on the group's
backend, NCCL on GPUs): all-gather for forward, all-gather for backward, reduce-scatter of the
gradients."""
GLOO_REDUCE_SCATTER_TRANSFERS = 2
"""What a reduce-scatter costs on Gloo, in all-gathers of the same slice: PyTorch 2.13's Gloo runs
it as an all-reduce of the whole padded buffer. Measured (6 Dec 2026, 2 ranks in network
namespaces joined by a veth shaped to 100 Mbit/s, ``tc`` byte counters): a 1.64 MB slice moved
3.43 MB each way under ``reduce_scatter_single`` and under the list ``reduce_scatter`` alike, as
under ``all_reduce`` of the 3.28 MB buffer (3.42 MB), against 1.70 MB under
``all_gather_single``."""
FULL_TRANSFERS_PER_MICRO_BATCH = 2 + GLOO_REDUCE_SCATTER_TRANSFERS
"""Slice-sized transfers per micro-batch under ``Full`` (always Gloo: it crosses GPU types): two
all-gathers and the reduce-scatter."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModeStepTime:
    """One mode's predicted step.

    Attributes:
        mode: the sharding mode.
        compute_s: the slowest rank's compute (recomputation included), seconds.
        cross_type_bytes: bytes one rank sends over the cross-type link per step (largest rank).
        cross_type_s: those bytes at the cross-type bandwidth, seconds.
        in_group_s: ``Group``'s in-group gathers and reduce-scatters, seconds.
        micro_batches: micro-batches per step (the largest rank's).
        step_s: ``compute_s + cross_type_s + in_group_s``.
        samples_per_s: global batch / ``step_s``.
    """

    mode: str
    compute_s: float
    cross_type_bytes: int
    cross_type_s: float
    in_group_s: float
    micro_batches: int
    step_s: float
    samples_per_s: float


def mode_step_time(slots: Sequence[RankSlot], ranks: Sequence[RankMemory], mode: str, *,
                   sample_s: Mapping[str, float], param_bytes: int, cross_gbps: float,
                   intra_gbps: float, cross_bytes_per_s: float | None = None) -> ModeStepTime:
    """Predicted step of ``mode`` for ranks that fit (see the module docstring).

    Args:
        slots: the plan's ranks (group, type, local batch), rank order.
        ranks: each rank's memory under ``mode`` (micro-batches, checkpointing, share), rank order.
        mode: ``None``, ``Group`` or ``Full``.
        sample_s: seconds per sample of one device, by GPU type.
        param_bytes: fp32 parameter bytes ``P`` (= gradient bytes).
        cross_gbps: bandwidth between GPU types, Gbit/s.
        intra_gbps: bandwidth inside a node (a ``Group`` is one node, one type), Gbit/s.
        cross_bytes_per_s: the rate an earlier run of the mode moved its cross-type bytes at,
            bytes/s (replaces ``cross_gbps``); None: not measured.

    Returns:
        The :class:`ModeStepTime`.

    Raises:
        ValueError: ``slots`` and ``ranks`` differ in length or are empty, or a rank's GPU type
            has no ``sample_s``.
    """
    if not slots or len(slots) != len(ranks):
        raise ValueError(f"need one memory entry per slot: {len(slots)} slots, {len(ranks)} ranks")
    missing = sorted({s.gpu_type for s in slots} - set(sample_s))
    if missing:
        raise ValueError(f"no seconds per sample for {', '.join(missing)}")
    recompute = [mode == "Full" or r.activation_checkpointing for r in ranks]
    compute_s = max(s.local_batch * sample_s[s.gpu_type] * (1 + RECOMPUTE_SHARE * rc)
                    for s, rc in zip(slots, recompute))
    micro = max(r.micro_batches for r in ranks)
    groups: dict[int, int] = {}
    for s in slots:
        groups[s.group] = groups.get(s.group, 0) + 1
    types = len({s.gpu_type for s in slots})
    world = len(slots)
    in_group_bytes = 0
    if mode in ("None", "Group"):
        g = len(groups)
        cross_bytes = 2 * (g - 1) * param_bytes // g if types > 1 else 0
        if mode == "Group":
            n = max(groups.values())
            in_group_bytes = micro * TRANSFERS_PER_MICRO_BATCH * (n - 1) * param_bytes // n
    elif mode == "Full":
        largest = max(r.state_share_ppm for r in ranks)
        cross_bytes = (micro * FULL_TRANSFERS_PER_MICRO_BATCH * (world - 1) * largest
                       * param_bytes // 10**6) if world > 1 else 0
    else:
        raise ValueError(f"unknown sharding mode {mode!r}")
    cross_s = (cross_bytes / cross_bytes_per_s if cross_bytes_per_s
               else cross_bytes * 8 / (cross_gbps * 1e9))
    in_group_s = in_group_bytes * 8 / (intra_gbps * 1e9)
    step_s = compute_s + cross_s + in_group_s
    return ModeStepTime(mode=mode, compute_s=compute_s, cross_type_bytes=cross_bytes,
                        cross_type_s=cross_s, in_group_s=in_group_s, micro_batches=micro,
                        step_s=step_s, samples_per_s=sum(s.local_batch for s in slots) / step_s)
