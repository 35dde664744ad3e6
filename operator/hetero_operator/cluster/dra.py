"""GPUs published through Dynamic Resource Allocation: the inventory from ResourceSlices (requests as
ResourceClaimTemplates are rendered by :mod:`hetero_operator.render.claims`; pure: dicts in, dicts out).

NVIDIA's DRA driver for GPUs (driver name ``gpu.nvidia.com``, NVIDIA/k8s-dra-driver-gpu,
``cmd/gpu-kubelet-plugin/deviceinfo.go``) publishes one ResourceSlice per node (pool = node name)
whose devices carry, in the attribute domain ``gpu.nvidia.com``:

* whole GPUs (``type: gpu``, device ``gpu-<minor>``, DeviceClass ``gpu.nvidia.com``):
  ``uuid``, ``productName`` (the NVML name, ``"NVIDIA A100-SXM4-40GB"``), ``brand``,
  ``architecture``, ``cudaComputeCapability`` (version ``8.0.0``), ``driverVersion`` (version
  ``550.54.15``), ``cudaDriverVersion`` (version ``12.4.0``), ``pcieBusID``; capacity ``memory``
  (bytes);
* MIG devices (``type: mig``, device ``gpu-<minor>-mig-<giProfileId>-<start>-<size>``,
  DeviceClass ``mig.nvidia.com``): the parent's attributes plus ``parentUUID`` and ``profile``
  (``"1g.5gb"``); capacity ``memory`` and ``multiprocessors`` of the slice.

This module reads them into the planner's own :class:`~hetero_operator.api.types.NodeInventory`, so a
node is planned the same whether GFD labels and the device plugin or DRA describe it: product is
the GFD spelling of ``productName`` (spaces -> ``-``, as GFD writes ``nvidia.com/gpu.product``),
architecture comes from the compute capability by GFD's mapping, speed from the same table, and
``resource_name`` keeps the device plugin's spelling (``nvidia.com/gpu``,
``nvidia.com/mig-<profile>``) as the GPU type's key.
:func:`hetero_operator.render.claims.add_claims` replaces that
extended-resource request by a ResourceClaimTemplate per group whose CEL selector pins the planned
product (and MIG profile).

API version: ``resource.k8s.io/v1``. It is GA and served by default from Kubernetes 1.34 (the
``v1beta1``/``v1beta2`` versions are deprecated there and need feature gates or runtime-config
on older clusters); NVIDIA's driver publishes ``v1`` on 1.34+. The reader also accepts the
``v1beta1`` device shape (attributes under ``basic``), so slices listed from a 1.32/1.33 cluster
read the same; what we create (claim templates) is ``v1`` only.

A GPU in MIG mode is published both as its MIG devices and, by some driver versions, as a whole
GPU (``type: gpu``, ``uuid`` = the MIG devices' ``parentUUID``;
kubernetes-sigs/dra-driver-nvidia-gpu#719, shared case 39): such a parent is not capacity (CUDA
has no usable whole device there) and the node says so (``GpuOfferedTwice``).

Partitionable devices (dynamic MIG, KEP-4815): the pool's ``sharedCounters`` give each physical
GPU a counter set (memory slices, compute, ...), and each device that can be carved from it
``consumesCounters``; the scheduler allocates any devices whose consumption fits.  Per counter
set, what allocated devices consume is subtracted, and the rest is offered once: the whole GPU
when nothing of it is allocated (the fastest use of a card for training), else the largest
partitions that still fit, packed greedily without overlap, so no counter is offered twice
(:mod:`hetero_operator.cluster.dracounters`).  The claims of such classes are pinned to the GPUs
that offered them (:attr:`DraInventory.gpu_uuids`).

Devices marked taken by the driver (a ``NoSchedule``/``NoExecute`` device taint, e.g. an
unhealthy GPU) and devices allocated to ResourceClaims are not free; the unschedulable message
names both (:mod:`hetero_operator.planning.unschedulable`).  Node health (cordon, NotReady,
taints) is checked as for GFD nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetero_operator.api import types as model
from hetero_operator.api.types import (Device, ExcludedNode, Inventory, InventoryWarning,
                                       NodeInventory)
from hetero_operator.cluster import dracounters, gfd
from hetero_operator.cluster.cudatable import cuda_for_driver
from hetero_operator.cluster.driverupgrade import DRIVER_UPGRADE
from hetero_operator.cluster.gputable import base_speed, mig_speed
from hetero_operator.cluster.inventory import DEFAULT_TOLERATED_TAINT_KEYS, build_inventory

API_VERSION = "resource.k8s.io/v1"
DRIVER = "gpu.nvidia.com"
"""Driver name of NVIDIA's DRA driver for GPUs, also the attribute domain of its devices."""
COUNTERS_MISSING = "DraCountersMissing"
"""Warning: partitionable devices draw on a counter set no slice of their pool publishes (a pool
being re-published, or a driver fault): they are not offered."""
POOL_INCOMPLETE = "DraPoolIncomplete"
"""Warning: fewer slices of a pool's newest generation are listed than its ``resourceSliceCount``."""
HEALTH_REASONS = (model.UNSCHEDULABLE, model.NOT_READY, model.TAINTED, model.MIG_PENDING,
                  model.MIG_FAILED, DRIVER_UPGRADE)
"""Exclusions of a node that hold whatever publishes its GPUs (GFD labels or DRA)."""
_MIB = 1024 * 1024
_SUFFIX = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50,
           "k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12, "P": 10 ** 15}


class DraError(ValueError):
    """A device whose attributes cannot be read (the node is excluded with ``MalformedLabels``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DraDevice:
    """One device of NVIDIA's driver as published in a ResourceSlice.

    Attributes:
        node: node name (``spec.nodeName``).
        pool: pool name (the node name for NVIDIA's driver).
        name: device name, e.g. ``"gpu-0"``, ``"gpu-0-mig-9-4-4"``.
        product_name: ``productName`` as published (NVML name, with spaces).
        mig_profile: ``profile`` of a MIG device, ``""`` for a whole GPU.
        compute_capability: ``"8.0"`` (from the version ``8.0.0``).
        driver_version: ``"550.54.15"``.
        cuda_driver: ``cudaDriverVersion`` as ``(12, 4)``.
        memory_mib: capacity ``memory`` in MiB.
        multiprocessors: capacity ``multiprocessors`` (MIG), else 0.
        uuid / parent_uuid: the device's ``uuid`` and a MIG device's ``parentUUID`` (``""`` when
            not published).
        consumes: ``((counter set, ((counter, amount), ...)), ...)`` of a partitionable device.
        taint: ``key=value:effect`` of a device taint that keeps pods off it, ``""`` when none.
    """

    node: str
    pool: str
    name: str
    product_name: str
    mig_profile: str
    compute_capability: str
    driver_version: str
    cuda_driver: tuple[int, int]
    memory_mib: int
    multiprocessors: int = 0
    uuid: str = ""
    parent_uuid: str = ""
    consumes: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = ()
    taint: str = ""

    @property
    def gpu_type(self) -> str:
        """GFD-style type, ``"NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"`` for MIG."""
        return model.gpu_type_name(gfd_product(self.product_name), self.mig_profile)


@dataclass(frozen=True, kw_only=True, slots=True)
class DraInventory:
    """The nodes whose GPUs DRA publishes.

    Attributes:
        inventory: the full inventory (GFD nodes, with DRA nodes read from their slices).
        dra_nodes: names of the nodes read from DRA.
        product_names: ``{(node, gpu_type): productName}`` for the CEL selectors.
        gpu_uuids: ``{(node, gpu_type): GPU uuids}`` of partitionable classes: the physical GPUs
            their free devices come from (whole GPUs: their ``uuid``; partitions: the
            ``parentUUID``), which the claims pin so that a partition is not carved from the GPU
            the plan takes whole.  Classes not listed are not pinned.
    """

    inventory: Inventory
    dra_nodes: frozenset[str] = frozenset()
    product_names: Mapping[tuple[str, str], str] = field(default_factory=dict)
    gpu_uuids: Mapping[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)


def gfd_product(product_name: str) -> str:
    """``productName`` -> the GFD product label value (``"Tesla T4"`` -> ``"Tesla-T4"``)."""
    return "-".join(str(product_name).split())


# --- reading slices ----------------------------------------------------------------------------

def read_slices(slices: Iterable[Mapping[str, Any]]) -> list[DraDevice | tuple[str, str]]:
    """The devices of NVIDIA's driver in ``slices``, in node then device order.

    Only slices of driver :data:`DRIVER` with ``spec.nodeName`` count, and of each pool only the
    slices of its newest ``pool.generation`` (older ones are being replaced, per the ResourceSlice
    API). Devices of other types (``vfio``) are skipped; partitionable devices carry what they
    consume (:attr:`DraDevice.consumes`).

    Returns:
        :class:`DraDevice` entries, and ``(node, message)`` for a device that cannot be read.
    """
    out: list[DraDevice | tuple[str, str]] = []
    for pool, spec in _newest_slices(slices):
        for dev in spec.get("devices") or ():
            try:
                read = _device(str(spec["nodeName"]), pool, dev)
            except DraError as exc:
                out.append((str(spec["nodeName"]), str(exc)))
                continue
            if read is not None:
                out.append(read)
    return out


def _newest_slices(slices: Iterable[Mapping[str, Any]], *,
                   node_only: bool = True) -> list[tuple[str, Mapping[str, Any]]]:
    """``(pool, spec)`` of the driver's slices of each pool's newest generation, by node: only
    slices with ``nodeName`` unless ``node_only`` is false (a pool's counter sets count whatever
    node selection their slice states)."""
    newest: dict[str, int] = {}
    ours = []
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != DRIVER or (node_only and not spec.get("nodeName")):
            continue
        pool = spec.get("pool") or {}
        gen = int(pool.get("generation") or 0)
        name = str(pool.get("name") or spec.get("nodeName") or "")
        newest[name] = max(newest.get(name, gen), gen)
        ours.append((name, gen, spec))
    return [(pool, spec) for pool, gen, spec in sorted(ours, key=lambda t: (str(t[2].get("nodeName") or ""), t[0]))
            if gen == newest[pool]]


def counter_sets(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, int]]:
    """``{(pool, counter set): {counter: capacity}}`` from the pools' ``sharedCounters`` (newest
    generation; a counter set may sit in a slice of its own, as Kubernetes 1.35 asks)."""
    return dracounters.counter_sets(_newest_slices(slices, node_only=False),
                                    lambda value, what: _quantity({"c": {"value": value}}, "c", what))


def incomplete_pools(slices: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """``{pool: (listed, resourceSliceCount)}`` of the driver's pools whose newest generation has
    fewer slices listed than it says it has (the driver is publishing; per the ResourceSlice API
    a consumer's view of such a pool is not complete yet)."""
    newest = _newest_slices(slices, node_only=False)
    listed: dict[str, int] = {}
    expected: dict[str, int] = {}
    for pool, spec in newest:
        listed[pool] = listed.get(pool, 0) + 1
        expected[pool] = max(expected.get(pool, 0), int((spec.get("pool") or {}).get("resourceSliceCount") or 1))
    return {p: (listed[p], expected[p]) for p in listed if listed[p] < expected[p]}


def _consumes(body: Mapping[str, Any], device: str) -> tuple[tuple[str, tuple[tuple[str, int], ...]], ...]:
    return tuple((str(c.get("counterSet")), tuple(sorted(
        (str(k), _quantity({"c": v}, "c", device)) for k, v in (c.get("counters") or {}).items())))
        for c in body.get("consumesCounters") or ())


def _taint(body: Mapping[str, Any]) -> str:
    for t in body.get("taints") or ():
        if t.get("effect") in ("NoSchedule", "NoExecute"):
            value = f"={t['value']}" if t.get("value") else ""
            return f"{t.get('key')}{value}:{t.get('effect')}"
    return ""


def _device(node: str, pool: str, dev: Mapping[str, Any]) -> DraDevice | None:
    body = dev.get("basic") or dev  # v1beta1 nests attributes/capacity under "basic"
    attrs = {_unqualified(k): v for k, v in (body.get("attributes") or {}).items()}
    capacity = {_unqualified(k): v for k, v in (body.get("capacity") or {}).items()}
    name = str(dev.get("name") or "")
    kind = _string(attrs, "type", name)
    if kind not in ("gpu", "mig"):
        return None
    profile = _string(attrs, "profile", name) if kind == "mig" else ""
    cc = _version(attrs, "cudaComputeCapability", name)
    cuda = _version(attrs, "cudaDriverVersion", name)
    return DraDevice(
        node=node, pool=pool, name=name, product_name=_string(attrs, "productName", name),
        mig_profile=profile, compute_capability=".".join(cc.split(".")[:2]),
        driver_version=_version(attrs, "driverVersion", name),
        cuda_driver=(int(cuda.split(".")[0]), int((cuda.split(".") + ["0"])[1])),
        memory_mib=_quantity(capacity, "memory", name) // _MIB,
        multiprocessors=_quantity(capacity, "multiprocessors", name) if kind == "mig" else 0,
        uuid=str((attrs.get("uuid") or {}).get("string") or ""),
        parent_uuid=str((attrs.get("parentUUID") or {}).get("string") or "") if kind == "mig" else "",
        consumes=_consumes(body, name), taint=_taint(body))


def _unqualified(key: str) -> str:
    return key[len(DRIVER) + 1:] if key.startswith(DRIVER + "/") else key


def _string(attrs: Mapping[str, Any], key: str, device: str) -> str:
    value = (attrs.get(key) or {}).get("string")
    if not isinstance(value, str) or not value:
        raise DraError(f"device {device}: attribute {DRIVER}/{key} (string) is missing")
    return value


def _version(attrs: Mapping[str, Any], key: str, device: str) -> str:
    value = (attrs.get(key) or {}).get("version")
    parts = str(value or "").split("+")[0].split("-")[0].split(".")
    if not value or not all(p.isdigit() for p in parts):
        raise DraError(f"device {device}: attribute {DRIVER}/{key} must be a version like "
                       f"8.0.0, got {value!r}")
    return ".".join(parts)


def _quantity(capacity: Mapping[str, Any], key: str, device: str) -> int:
    raw = str((capacity.get(key) or {}).get("value", "")).strip()
    number = raw.rstrip("KMGTPi")
    suffix = raw[len(number):]
    if not number.isdigit() or (suffix and suffix not in _SUFFIX):
        raise DraError(f"device {device}: capacity {key} must be an integer quantity such as "
                       f"40Gi, got {raw!r}")
    return int(number) * _SUFFIX.get(suffix, 1)


def allocated_devices(claims: Iterable[Mapping[str, Any]]) -> set[tuple[str, str]]:
    """``{(pool, device)}`` of NVIDIA's driver allocated to ResourceClaims (``status.allocation``)."""
    out = set()
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            if result.get("driver") == DRIVER:
                out.add((str(result.get("pool")), str(result.get("device"))))
    return out


def claim_owned_by_job(claim: Mapping[str, Any], job: str, namespace: str) -> bool:
    """True for a claim generated for one of the job's pods (owner pod ``<job>-g…``)."""
    meta = claim.get("metadata") or {}
    return meta.get("namespace") == namespace and any(
        ref.get("kind") == "Pod" and str(ref.get("name", "")).startswith(f"{job}-g")
        for ref in meta.get("ownerReferences") or ())


# --- inventory ---------------------------------------------------------------------------------

def build_dra_inventory(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]] = (),
                        slices: Iterable[Mapping[str, Any]] = (),
                        claims: Iterable[Mapping[str, Any]] = (), *,
                        tolerated_taint_keys: tuple[str, ...] = DEFAULT_TOLERATED_TAINT_KEYS,
                        tolerations: Sequence[Mapping[str, Any]] = ()) -> DraInventory:
    """The cluster's inventory with every node that has NVIDIA DRA devices read from DRA.

    GFD-labelled nodes are read by :func:`hetero_operator.cluster.inventory.build_inventory` as before. A
    node with devices of :data:`DRIVER` in ``slices`` is read from those devices only (a node
    should not publish the same GPUs through the device plugin and DRA; NVIDIA's driver docs ask
    to disable the plugin there), unless its health excludes it (cordoned, NotReady, tainted, MIG
    reconfiguration): then the GFD path's exclusion stands.

    Args:
        nodes: Node objects.
        pods: bound pods (extended-resource use, for GFD nodes).
        slices: ResourceSlice objects (``resource.k8s.io/v1``; v1beta1 shape accepted).
        claims: ResourceClaim objects; devices in their ``status.allocation`` are not free. Pass
            only claims that are not the job's own when re-planning it (:func:`claim_owned_by_job`).
        tolerated_taint_keys: taint keys that do not exclude a node.
        tolerations: the job's pod tolerations (a taint they tolerate does not exclude a node).

    Returns:
        The merged inventory, which nodes came from DRA, and their product names.
    """
    base = build_inventory(nodes, pods, tolerated_taint_keys=tolerated_taint_keys,
                           tolerations=tolerations)
    return merge_dra(base, slices, claims)


def merge_dra(base: Inventory, slices: Iterable[Mapping[str, Any]] = (),
              claims: Iterable[Mapping[str, Any]] = ()) -> DraInventory:
    """:func:`build_dra_inventory` on an inventory already read from the nodes (the operator's
    node index keeps that one up to date).

    The Nodes are not read again: a node's health is the base inventory's exclusion when it is a
    health reason (:data:`HEALTH_REASONS`, as the job's tolerations saw its taints); a slice of a
    node the inventory does not know (gone, or not yet listed) is left out.
    """
    read = read_slices(slices)
    if not read:
        return DraInventory(inventory=base)
    slices = list(slices)
    taken = allocated_devices(claims)
    counters = counter_sets(slices)
    incomplete = incomplete_pools(slices)
    devices: dict[str, list[DraDevice]] = {}
    errors: dict[str, str] = {}
    for entry in read:
        if isinstance(entry, DraDevice):
            devices.setdefault(entry.node, []).append(entry)
        else:
            errors.setdefault(entry[0], entry[1])
    usable = {n.name: n for n in base.nodes}
    excluded = {e.node: e for e in base.excluded}
    warnings = [w for w in base.warnings if w.node not in devices and w.node not in errors]
    product_names: dict[tuple[str, str], str] = {}
    gpu_uuids: dict[tuple[str, str], tuple[str, ...]] = {}
    dra_nodes = set()
    for name in sorted(devices.keys() | errors.keys()):
        if name not in base.labels:  # a slice of a node that is gone (or not yet listed)
            continue
        health = excluded.get(name)
        if health is not None and health.reason in HEALTH_REASONS:
            if name in devices:  # name its GPU type for the unschedulable message, as GFD does
                health = ExcludedNode(node=name, reason=health.reason, message=health.message,
                                      gpu_type=health.gpu_type or devices[name][0].gpu_type)
            excluded[name] = health
            continue
        usable.pop(name, None)
        excluded.pop(name, None)
        if name in errors:
            excluded[name] = ExcludedNode(node=name, reason=model.MALFORMED_LABELS,
                                          message=f"ResourceSlice of {DRIVER}: {errors[name]}; "
                                                  "check the DRA driver's kubelet plugin")
            continue
        inv, node_warnings, pinned = _node_inventory(name, devices[name], taken, counters)
        usable[name] = inv
        warnings.extend(node_warnings)
        for pool in sorted({d.pool for d in devices[name]} & incomplete.keys()):
            listed, count = incomplete[pool]
            warnings.append(InventoryWarning(node=name, reason=POOL_INCOMPLETE, message=(
                f"{name}: {listed} of the {count} ResourceSlices of pool {pool} ({DRIVER}) are "
                "listed: the driver is publishing a new generation, so its devices may be "
                "incomplete until it finishes (the next plan reads them again)")))
        dra_nodes.add(name)
        for dev in devices[name]:
            product_names[(name, dev.gpu_type)] = dev.product_name
        for (product_name, profile), uuids in pinned.items():
            gpu_uuids[(name, model.gpu_type_name(gfd_product(product_name), profile))] = uuids
    inventory = Inventory(nodes=tuple(usable[k] for k in sorted(usable)),
                          excluded=tuple(excluded[k] for k in sorted(excluded)),
                          warnings=tuple(warnings), labels=base.labels)
    return DraInventory(inventory=inventory, dra_nodes=frozenset(dra_nodes),
                        product_names=product_names, gpu_uuids=gpu_uuids)


def _without_mig_parents(name: str, devices: Sequence[DraDevice],
                         warnings: list[InventoryWarning]) -> list[DraDevice]:
    """``devices`` without the whole GPUs whose MIG devices are listed too (shared case 39)."""
    parents = {d.parent_uuid for d in devices if d.mig_profile and d.parent_uuid}
    dropped = [d for d in devices if not d.mig_profile and not d.consumes and d.uuid in parents]
    if dropped:
        names = ", ".join(d.name for d in dropped)
        warnings.append(InventoryWarning(
            node=name, reason=model.GPU_OFFERED_TWICE,
            message=f"{name}: {names} {'are' if len(dropped) > 1 else 'is'} in MIG mode (the "
                    f"ResourceSlice also lists {'their' if len(dropped) > 1 else 'its'} MIG devices "
                    "by parentUUID): not offered whole, only the MIG devices are (update the DRA "
                    "driver: it hands out the same hardware twice)"))
    return [d for d in devices if d not in dropped]


def _node_inventory(name: str, devices: Sequence[DraDevice], taken: set[tuple[str, str]],
                    counters: Mapping[tuple[str, str], Mapping[str, int]] | None = None,
                    ) -> tuple[NodeInventory, list[InventoryWarning], dict[tuple[str, str], tuple[str, ...]]]:
    """One node's device classes (devices of equal (product, profile) are one class), its
    warnings, and the GPUs its partitionable classes come from (``{(productName, profile): uuids}``,
    :attr:`DraInventory.gpu_uuids`)."""
    warnings: list[InventoryWarning] = []
    devices = _without_mig_parents(name, devices, warnings)
    static = [d for d in devices if not d.consumes]
    free_keys = {(d.pool, d.name) for d in static if (d.pool, d.name) not in taken and not d.taint}
    offer = dracounters.offered([d for d in devices if d.consumes], taken, counters or {})
    partitioned = offer.counted
    free_keys |= offer.free
    if offer.missing_sets:
        sets = ", ".join(offer.missing_sets)
        warnings.append(InventoryWarning(node=name, reason=COUNTERS_MISSING, message=(
            f"{name}: devices draw on counter set(s) {sets} that no ResourceSlice of the pool "
            "publishes: they are not offered (the driver may be re-publishing its slices; if it "
            "stays, check the DRA driver's kubelet plugin)")))
    classes: dict[tuple[str, str], list[DraDevice]] = {}
    for dev in [*static, *partitioned]:
        classes.setdefault((gfd_product(dev.product_name), dev.mig_profile), []).append(dev)
    out = []
    for (product, profile), members in classes.items():
        first = members[0]
        arch = gfd.architecture(first.compute_capability)
        speed, known = base_speed(product, arch)
        if not known:
            warnings.append(InventoryWarning(
                node=name, reason=model.UNKNOWN_GPU_SPEED,
                message=f"{product} is not in the speed table; using the {arch} default "
                        f"{speed:.2f} (set spec.gpus.speedOverrides to correct it)"))
        free = sum(1 for d in members if (d.pool, d.name) in free_keys)
        sick = sum(1 for d in members if d.taint and (d.pool, d.name) not in taken)
        common = {"node": name, "product": product, "compute_capability": first.compute_capability,
                  "architecture": arch, "total": len(members) - sick, "free": free,
                  "memory_mib": min(d.memory_mib for d in members),
                  "claimed": sum(1 for d in members if (d.pool, d.name) in taken),
                  "unhealthy": sick}
        if profile:
            slices = gfd.profile_slices(profile)
            out.append(Device(**common, mig_profile=profile,
                              resource_name=gfd.MIG_RESOURCE_PREFIX + profile,
                              relative_speed=mig_speed(speed, slices), compute_slices=slices,
                              multiprocessors=first.multiprocessors))
        else:
            out.append(Device(**common, resource_name=gfd.GPU_RESOURCE, relative_speed=speed))
    driver = devices[0].driver_version
    parts = driver.split(".")
    driver_cuda = cuda_for_driver(int(parts[0]), int(parts[1]) if len(parts) > 1 else None) or (0, 0)
    runtime = min(d.cuda_driver for d in devices)
    return NodeInventory(name=name, driver_version=driver, max_cuda=min(runtime, driver_cuda),
                         devices=tuple(sorted(out, key=lambda d: d.resource_name)),
                         driver_cuda=driver_cuda), warnings, offer.gpu_uuids


# --- requests ----------------------------------------------------------------------------------
