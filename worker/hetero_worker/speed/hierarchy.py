"""The measured ``auto`` hierarchy: time the candidate layouts' collectives on the job's own links,
fit a link model, choose the cheapest layout."""


from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from hetero_worker.comm.collectives import gloo_collective_
from hetero_worker.comm.groups import ProcessGroups, hierarchical_all_reduce_
from hetero_worker.comm.sync import WeightedGradSync
from heterotrain_common.linkcost import FIXED_MODES, LinkModel, RankPlace, predict_modes


def places_of(topology: Sequence[Any]) -> list[RankPlace]:
    """:class:`RankPlace` per rank from the contract's topology entries."""
    return [RankPlace(node=e.node, arch=e.compute_capability, group=e.group) for e in topology]


BuildGroups = Callable[[str], ProcessGroups]
"""``build_groups(mode)``: the process groups of hierarchy ``mode`` under the communicator rule
(collective; ``Trainer.build_groups``)."""


def measure_and_choose(topology: Sequence[Any], device: torch.device, build_groups: BuildGroups,
                       *, grad_bytes: float | None = None,
                       probe_bytes: int = 1 << 20, trial_s: dict[str, float] | None = None,
                       ) -> tuple[LinkModel, dict[str, float], str]:
    """Measure intra- and inter-node bandwidth once, then pick the cheapest hierarchy.

    Collective on all ranks.  The probe builds the groups the ``node`` and ``flat`` layouts would
    train with (``build_groups``: the communicator rule's backends, NCCL inside a node of
    one GPU type, Gloo elsewhere) and times a ``probe_bytes`` all-reduce (and a 4-byte one, for
    latency) of tensors on the training device inside every node at once, among the node leaders,
    and over all ranks (the flat ring, whose measured bandwidth then stands in for the per-edge
    model of ``flat``); the times are MAX-reduced so every rank computes the same choice.  Every
    probe group is destroyed afterwards.

    Args:
        topology: the contract's topology entries (node, compute capability, group per rank).
        device: the training device.
        build_groups: builds a layout's groups (:data:`BuildGroups`).
        grad_bytes: fp32 gradient bytes per rank (default: 100 MiB; only the ratio between modes
            matters once bandwidth dominates).
        probe_bytes: bytes per probe all-reduce.
        trial_s: filled with the close-call trial's seconds per mode when one runs.

    Returns:
        ``(link model, predicted seconds per mode, chosen mode)``.
    """
    places = places_of(topology)
    node = build_groups("node")
    flat = build_groups("flat")
    try:
        times = torch.zeros(6, dtype=torch.float64)
        if len(node.intra_ranks) > 1 and not node.layout.is_flat:  # inside every node at once
            times[0] = _time_allreduce(probe_bytes, node.intra, node.intra_backend, device)
            times[1] = _time_allreduce(4, node.intra, node.intra_backend, device)
        dist.barrier()
        if node.leaders is not None:  # the node leaders' ring (Gloo, as in training)
            times[2] = _time_allreduce(probe_bytes, node.leaders, "gloo", device)
            times[3] = _time_allreduce(4, node.leaders, "gloo", device)
        dist.barrier()
        if dist.get_world_size() > 1:  # one ring over all ranks (what flat trains with)
            times[4] = _time_allreduce(probe_bytes, flat.intra, flat.intra_backend, device)
            times[5] = _time_allreduce(4, flat.intra, flat.intra_backend, device)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)  # every rank decides on the same numbers
    finally:
        node.destroy()
        flat.destroy()
    link = _link_from_times(times.tolist(), probe_bytes, node.layout, dist.get_world_size())
    size = grad_bytes or float(100 << 20)
    costs = predict_modes(places, size, link)
    return link, costs, _settle_close_calls(len(topology), device, build_groups, costs, size,
                                            record=trial_s)
FLAT_TRIAL_MARGIN = 0.15
"""A hierarchy must beat ``flat``'s trial sync by more than this share to be chosen over it."""


def _settle_close_calls(world: int, device: torch.device, build_groups: BuildGroups,
                        costs: dict[str, float], grad_bytes: float, *,
                        margin: float = 4.0, budget_s: float = 0.5, repeats: int = 5,
                        record: dict[str, float] | None = None) -> str:
    """The cost model's pick, or, when other modes are predicted within ``margin`` x of it and
    cheap to try (predicted under ``budget_s``), the fastest of them timed on a real sync.

    The link model ignores per-call software costs (a hierarchy runs three collectives per DDP
    bucket on the sync's Python thread, flat one all-reduce per bucket in DDP's C++), so the
    trial runs exactly those paths, with the training backends on the training device, on a
    gradient-sized buffer cut like DDP's buckets (1 MiB first, then up to 25 MiB).  The modes
    take turns, one sync each per round and each round starting with the next mode, after a
    barrier, so the load drift of a shared machine hits every mode alike (timed one mode after
    the other, a busy second on a 2-core machine picked the wrong layout); the median of
    ``repeats`` rounds counts (one more round opens the connections).  Collective; times are
    MAX-reduced so every rank picks the same.  The trial groups are destroyed.

    ``flat`` wins unless another mode's sync is more than :data:`FLAT_TRIAL_MARGIN` faster: the
    trial times the syncs alone, while in a step flat's all-reduce overlaps backward inside DDP
    and a hierarchy adds a Python communication thread next to autograd.  On the benchmark's
    unshaped link (2 cores, 4 ranks) the trial put ``node`` level with or ahead of ``flat``
    while the steps of ``node`` took 25-40 % longer.
    """
    best = min(FIXED_MODES, key=lambda m: (round(costs[m], 9), FIXED_MODES.index(m)))
    close = [m for m in ("flat", "node", "arch") if costs[m] <= margin * costs[best]
             and costs[m] <= budget_s]
    if len(close) < 2:
        return best
    numel = int(min(grad_bytes, 64 << 20) // 4)
    first = min(numel, (1 << 20) // 4)
    sizes = [first] + [min(25 << 18, numel - o) for o in range(first, numel, 25 << 18)]
    trials = []
    try:
        for mode in close:  # collective, same order on every rank
            groups = build_groups(mode)
            trials.append((groups, WeightedGradSync(groups, [1] * world)))
        samples: list[list[float]] = [[] for _ in close]
        for round_ in range(repeats + 1):  # round 0 opens the connections
            for i in [(round_ + k) % len(close) for k in range(len(close))]:
                groups, sync = trials[i]
                pieces = [torch.zeros(n, device=device) for n in sizes if n > 0]
                dist.barrier()
                start = time.perf_counter()
                if groups.layout.is_flat:  # DDP's own all-reduce per bucket, no Python thread
                    for piece in pieces:
                        hierarchical_all_reduce_(piece, groups)
                else:
                    for future in [sync.submit(piece) for piece in pieces]:
                        future.wait()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if round_:
                    samples[i].append(time.perf_counter() - start)
    finally:
        for groups, sync in trials:
            sync.close()
            groups.destroy()
    timed = torch.tensor([sorted(x)[len(x) // 2] for x in samples], dtype=torch.float64)
    dist.all_reduce(timed, op=dist.ReduceOp.MAX)
    if record is not None:
        record.update({mode: float(t) for mode, t in zip(close, timed)})
    fastest = int(torch.argmin(timed))
    if "flat" in close and timed[close.index("flat")] <= (1 + FLAT_TRIAL_MARGIN) * timed[fastest]:
        return "flat"
    return close[fastest]


def _time_allreduce(nbytes: int, group: Any, backend: str, device: torch.device,
                    repeats: int = 3) -> float:
    """Best of ``repeats`` SUM all-reduces of ``nbytes`` on ``device`` over ``group`` (seconds),
    the way training runs them (a Gloo group with CUDA tensors goes through a host copy)."""
    t = torch.zeros(max(nbytes // 4, 1), device=device)

    def once() -> None:
        gloo_collective_(t, lambda x: dist.all_reduce(x, group=group), gloo=backend == "gloo")
        if t.is_cuda:
            torch.cuda.synchronize(t.device)

    once()  # warm-up (connections, NCCL communicator)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        once()
        best = min(best, time.perf_counter() - start)
    return best


def _link_from_times(times: Sequence[float], probe_bytes: int, layout: Any, world: int) -> LinkModel:
    """Bandwidth = ring bytes per rank / (time - latency part); defaults where not measurable.

    ``times``: intra probe, intra 4-byte, leaders probe, leaders 4-byte, world probe, world 4-byte
    (seconds, 0 when not measured).
    """
    def model(total_s: float, small_s: float, n: int, default_bw: float) -> tuple[float, float]:
        if n < 2 or total_s <= 0:
            return default_bw, 20e-6
        latency_s = small_s / (2 * (n - 1))
        transfer_s = max(total_s - small_s, 1e-9)
        return 2 * (n - 1) / n * probe_bytes / transfer_s, latency_s
    node_size = max(len(g) for g in layout.groups)
    intra_bw, intra_lat = model(times[0], times[1], node_size, 10e9)
    inter_bw, inter_lat = model(times[2], times[3], len(layout.groups), intra_bw)
    ring_bw, ring_lat = model(times[4], times[5], world, 0.0)
    return LinkModel(intra_bw_bytes_per_s=intra_bw, inter_bw_bytes_per_s=inter_bw,
                     intra_latency_s=intra_lat, inter_latency_s=inter_lat,
                     ring_bw_bytes_per_s=ring_bw or None, ring_latency_s=ring_lat)
