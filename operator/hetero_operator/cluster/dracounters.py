"""Partitionable devices (KEP-4815, NVIDIA's DynamicMIG): what each GPU's shared counter set still
offers, once (pure; the devices are read by :mod:`hetero_operator.cluster.dra`).

NVIDIA's DRA driver with DynamicMIG (kubernetes-sigs/dra-driver-nvidia-gpu,
``cmd/gpu-kubelet-plugin/partitions.go``) publishes per physical GPU one counter set,
``gpu-<minor>-counter-set``: one counter per capacity dimension (``multiprocessors``,
``memory``, ``copy-engines``, ``decoders``, ...) at the maximum over the GPU's MIG profiles, plus
``memory-slice-0`` ... ``memory-slice-<n-1>`` of value 1.  Beside it, every device that can be
carved from the GPU draws on that set (``consumesCounters``): the whole GPU (``type: gpu``, named
``gpu-<minor>``) consumes all of it, each MIG profile at each placement (``type: mig``,
``gpu-<minor>-mig-<profile>-<giProfileId>-<start>``, no ``uuid`` until created) its capacities and
the memory slices of its placement.  On Kubernetes 1.35+ the counter sets sit in a ResourceSlice of
their own (a slice holds devices or counters, not both) and each GPU's devices in another; on 1.34
each GPU's slice holds both.  The scheduler allocates any device whose consumption still fits.

What is offered: per counter set, what the devices allocated to ResourceClaims consume is
subtracted; a set nothing is allocated from is offered as its whole GPU (the fastest use of a card
for training), never also as its partitions; a set partly consumed is offered only as the largest
partitions that still fit, packed greedily without overlap, never as the whole GPU.  So a node with
one free GPU and one partly used by MIG devices offers the first whole and the second as its free
partitions, and no counter is offered twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

CounterUse = tuple[tuple[str, tuple[tuple[str, int], ...]], ...]
"""``((counter set, ((counter, amount), ...)), ...)`` that a device consumes."""


class Partitionable(Protocol):
    """What this module reads of a device (:class:`hetero_operator.cluster.dra.DraDevice`)."""

    pool: str
    name: str
    product_name: str
    mig_profile: str
    memory_mib: int
    multiprocessors: int
    uuid: str
    parent_uuid: str
    consumes: CounterUse
    taint: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Offer:
    """What a node's partitionable devices offer.

    Attributes:
        counted: devices that count as capacity (allocated ones and the ones offered free).
        free: ``(pool, device)`` of the devices offered free.
        gpu_uuids: ``{(productName, mig_profile): GPU uuids}`` of the physical GPUs the free
            devices of each class come from (profile ``""``: the whole GPU): a claim pinned to
            them cannot take the class from another GPU of the node, whose counters the plan
            offered otherwise.
        missing_sets: counter sets that devices consume but no slice of their pool publishes.
    """

    counted: list[Any] = field(default_factory=list)
    free: set[tuple[str, str]] = field(default_factory=set)
    gpu_uuids: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    missing_sets: tuple[str, ...] = ()


def counter_sets(newest: Iterable[tuple[str, Mapping[str, Any]]],
                 quantity: Callable[[Any, str], int]) -> dict[tuple[str, str], dict[str, int]]:
    """``{(pool, counter set): {counter: capacity}}`` from the pools' ``sharedCounters``.

    Args:
        newest: ``(pool, slice spec)`` of each pool's newest generation, every slice of the
            driver's, with or without ``nodeName`` (a counter set belongs to its pool).
        quantity: ``(value, what) -> int`` reading a ``resource.Quantity`` (raises for a bad one).
    """
    out: dict[tuple[str, str], dict[str, int]] = {}
    for pool, spec in newest:
        for cs in spec.get("sharedCounters") or ():
            name = str(cs.get("name"))
            out[(pool, name)] = {str(k): quantity((v or {}).get("value"), f"counter set {name}")
                                 for k, v in (cs.get("counters") or {}).items()}
    return out


def _fits(need: Iterable[tuple[str, int]], left: Mapping[str, int]) -> bool:
    return all(left.get(k, 0) >= v for k, v in need)


def _take(left: dict[tuple[str, str], dict[str, int]], d: Partitionable) -> None:
    for cs, use in d.consumes:
        have = left.setdefault((d.pool, cs), {})
        for k, v in use:
            have[k] = have.get(k, 0) - v


def offered(devices: Sequence[Partitionable], taken: set[tuple[str, str]],
            counters: Mapping[tuple[str, str], Mapping[str, int]]) -> Offer:
    """What the partitionable ``devices`` of one node offer (see the module docstring).

    Args:
        devices: the node's devices with ``consumes``.
        taken: ``(pool, device)`` allocated to ResourceClaims.
        counters: the pools' counter sets (:func:`counter_sets`).

    Returns:
        :class:`Offer`.  A device tainted ``NoSchedule``/``NoExecute`` is never offered.
    """
    out = Offer(missing_sets=tuple(sorted({f"{d.pool}/{cs}" for d in devices for cs, _ in d.consumes
                                           if (d.pool, cs) not in counters})))
    by_set: dict[tuple[str, str], list[Partitionable]] = {}
    for d in devices:  # NVIDIA's devices draw on one set: their GPU's
        by_set.setdefault((d.pool, d.consumes[0][0]), []).append(d)
    left = {k: dict(v) for k, v in counters.items()}
    for d in devices:
        if (d.pool, d.name) in taken:
            out.counted.append(d)
            _take(left, d)
    uuids: dict[tuple[str, str], dict[str, None]] = {}
    for members in by_set.values():
        candidates = [d for d in members if (d.pool, d.name) not in taken and not d.taint]
        whole = [d for d in candidates if not d.mig_profile]
        order = whole[:1] + sorted((d for d in candidates if d.mig_profile),
                                   key=lambda d: (-d.multiprocessors, -d.memory_mib, d.name))
        for d in order:
            if all(_fits(use, left.get((d.pool, cs), {})) for cs, use in d.consumes):
                out.counted.append(d)
                out.free.add((d.pool, d.name))
                _take(left, d)
                gpu = d.parent_uuid if d.mig_profile else d.uuid
                if gpu:
                    uuids.setdefault((d.product_name, d.mig_profile), {})[gpu] = None
                if not d.mig_profile:
                    break  # the whole GPU took the counter set: not its partitions as well
    out.gpu_uuids.update({key: tuple(sorted(u)) for key, u in uuids.items()})
    return out
