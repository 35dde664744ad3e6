"""Build the GPU inventory of a cluster from Node objects (dicts, exactly as the API returns them).

Per node: health (cordoned, NotReady, tainted against us, MIG reconfiguration pending or failed),
then the device classes from GPU Feature Discovery labels and ``status.allocatable``:

* whole GPUs: resource ``nvidia.com/gpu``; count from allocatable (``gpu.count`` only when the
  object has no allocatable map at all, as in trimmed fixtures);
* MIG **single** strategy: product ``<model>-MIG-<profile>``, resource ``nvidia.com/gpu``, memory
  from ``gpu.memory`` (the slice's); without the suffix but with ``gpu.memory`` far below the
  product's, the profile is read from ``mig.config=all-<profile>``;
* MIG **mixed** strategy: per-profile labels ``nvidia.com/mig-<profile>.*`` and resources
  ``nvidia.com/mig-<profile>``; the parent's ``gpu.memory`` is never a slice's budget;
* time-slicing / MPS (``-SHARED`` product, ``gpu.sharing-strategy`` not ``none``, or allocatable
  above ``gpu.count``): the device count is the number of *physical* GPUs (``gpu.count``), so a
  job gets at most one rank per physical GPU.  Memory is not partitioned by time-slicing: the
  budget stays the full GPU's, but other tenants' processes may use part of it.  Under MPS
  (``gpu.sharing-strategy=mps``) each client is pinned to memory / replicas and 100 / replicas %
  of the SMs, so a rank's memory and speed are the card's divided by ``gpu.replicas`` (case 54).

Devices requested by pods already bound to the node (not Succeeded/Failed) are subtracted.
A taint excludes a node unless its key is one the worker pods always tolerate or the job's pod
tolerations (``spec.worker.template``) tolerate it, so the node is read once, as the job's pods
see it; every node's labels stay in the inventory (:attr:`Inventory.labels`) for the filters
after it (the template's nodeSelector and affinity, a Kueue flavor's nodeLabels).
Malformed labels exclude the node with ``MalformedLabels``; this module never raises on labels.
Source for label names and semantics: see :mod:`hetero_operator.cluster.gfd`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from hetero_operator.api import types as model
from hetero_operator.api.types import ExcludedNode, Inventory, InventoryWarning, NodeInventory
from hetero_operator.cluster import gfd
from hetero_operator.cluster.cudatable import cuda_for_driver, format_cuda
from hetero_operator.cluster.driverupgrade import DRIVER_UPGRADE, upgrade_in_progress
from hetero_operator.cluster.gputable import GPU_MODELS, GpuModel, base_speed, lookup_model
from hetero_operator.cluster.mig import NodeExcluded, gpus_taken_by_mig, mixed_mig, whole_or_single

DEFAULT_TOLERATED_TAINT_KEYS: tuple[str, ...] = ("nvidia.com/gpu",)
"""Taint keys our worker pods tolerate (the usual ``nvidia.com/gpu:NoSchedule`` on GPU pools)."""

_BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
_MIG_PENDING_STATES = ("pending", "rebooting")
_DONE_PHASES = ("Succeeded", "Failed")


def build_inventory(nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]] = (), *,
                    tolerated_taint_keys: tuple[str, ...] = DEFAULT_TOLERATED_TAINT_KEYS,
                    tolerations: Sequence[Mapping[str, Any]] = ()) -> Inventory:
    """Read every node's schedulable GPU devices.

    Args:
        nodes: Node objects as dicts (``kubectl get nodes -o yaml`` items / API JSON).
        pods: Pod objects already bound to nodes (``spec.nodeName`` set); their ``nvidia.com/*``
            requests count as used.  Pods in phase Succeeded or Failed are skipped.  Pass only
            pods that are not the job's own when re-planning it.
        tolerated_taint_keys: taint keys that do not exclude a node.
        tolerations: the job's pod tolerations (``spec.worker.template.spec.tolerations``); a
            taint they tolerate (:func:`tolerates`) does not exclude a node either.

    Returns:
        The :class:`Inventory`, nodes and exclusions each ordered by node name, with every node's
        labels.  Never raises on malformed labels (the node is excluded with ``MalformedLabels``).
    """
    used = used_resources(pods)
    usable: list[NodeInventory] = []
    excluded: list[ExcludedNode] = []
    warnings: list[InventoryWarning] = []
    labels: dict[str, Mapping[str, str]] = {}
    for node in sorted(nodes, key=_node_name):
        name = _node_name(node)
        labels[name] = node_labels(node)
        result = read_node(node, used.get(name, {}), tolerated_taint_keys=tolerated_taint_keys,
                           tolerations=tolerations)
        if isinstance(result, ExcludedNode):
            excluded.append(result)
        else:
            usable.append(result[0])
            warnings.extend(result[1])
    return Inventory(nodes=tuple(usable), excluded=tuple(excluded), warnings=tuple(warnings),
                     labels=labels)


def read_node(node: Mapping[str, Any], used: Mapping[str, int], *,
              tolerated_taint_keys: tuple[str, ...] = DEFAULT_TOLERATED_TAINT_KEYS,
              tolerations: Sequence[Mapping[str, Any]] = (),
              ) -> ExcludedNode | tuple[NodeInventory, list[InventoryWarning]]:
    """One node: its inventory and warnings, or why it is excluded (arguments as
    :func:`build_inventory`'s)."""
    name = _node_name(node)
    labels = node_labels(node)
    gpu_type = _gpu_type_guess(labels)
    try:
        _check_health(node, labels, tolerated_taint_keys, tolerations)
        return _read_devices(name, node, labels, used)
    except NodeExcluded as exc:
        return ExcludedNode(node=name, reason=exc.reason, message=exc.message, gpu_type=gpu_type)
    except gfd.LabelError as exc:
        return ExcludedNode(node=name, reason=model.MALFORMED_LABELS,
                            message=f"label {exc}; fix the label or restart GPU Feature Discovery",
                            gpu_type=gpu_type)


def used_resources(pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """``{node: {resource: devices requested}}`` for ``nvidia.com/*`` over the active pods.

    A pod's request is ``max(sum over containers, max over init containers)`` (the scheduler's rule);
    limits are read first (extended resources must have equal requests and limits).
    """
    out: dict[str, dict[str, int]] = {}
    for pod in pods or ():
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in _DONE_PHASES:
            continue
        main = _container_requests(spec.get("containers") or [], combine=sum)
        init = _container_requests(spec.get("initContainers") or [], combine=max)
        per_node = out.setdefault(node, {})
        for resource in main.keys() | init.keys():
            per_node[resource] = per_node.get(resource, 0) + max(main.get(resource, 0),
                                                                   init.get(resource, 0))
    return out


def _container_requests(containers: list[Mapping[str, Any]], *, combine: Any) -> dict[str, int]:
    values: dict[str, list[int]] = {}
    for c in containers:
        res = c.get("resources") or {}
        merged = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        for key, raw in merged.items():
            if key.startswith("nvidia.com/"):
                values.setdefault(key, []).append(_quantity(raw))
    return {k: combine(v) for k, v in values.items()}


def _quantity(raw: Any) -> int:
    try:
        return int(str(raw).strip())
    except ValueError:
        return 0


# --- health ----------------------------------------------------------------------------------

def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' rule: one toleration matches the taint's key, value (Equal) and effect; one
    with operator Exists and no key tolerates every taint, an empty effect every effect
    (https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/)."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if op == "Exists" or str(t.get("value") or "") == str(taint.get("value") or ""):
            return True
    return False


def blocking_taints(node: Mapping[str, Any], tolerated: tuple[str, ...] = DEFAULT_TOLERATED_TAINT_KEYS,
                    tolerations: Sequence[Mapping[str, Any]] = ()) -> list[Mapping[str, Any]]:
    """The node's ``NoSchedule``/``NoExecute`` taints that keep the job's pods off it: key not in
    ``tolerated`` and not tolerated by ``tolerations``."""
    return [t for t in (node.get("spec") or {}).get("taints") or ()
            if t.get("effect") in _BLOCKING_EFFECTS and t.get("key") not in tolerated
            and not tolerates(tolerations, t)]


def _check_health(node: Mapping[str, Any], labels: Mapping[str, str], tolerated: tuple[str, ...],
                  tolerations: Sequence[Mapping[str, Any]]) -> None:
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        raise NodeExcluded(model.UNSCHEDULABLE, "node is cordoned (spec.unschedulable); "
                        "uncordon it with kubectl uncordon")
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready" and str(cond.get("status")) != "True":
            why = cond.get("reason") or cond.get("message") or f"Ready={cond.get('status')}"
            raise NodeExcluded(model.NOT_READY, f"node is not Ready ({why})")
    upgrading = upgrade_in_progress(labels)
    if upgrading:
        raise NodeExcluded(DRIVER_UPGRADE, upgrading)
    for taint in blocking_taints(node, tolerated, tolerations)[:1]:
        value = f"={taint['value']}" if taint.get("value") else ""
        raise NodeExcluded(model.TAINTED, f"taint {taint.get('key')}{value}:{taint.get('effect')} "
                        "is not tolerated by the worker pods (add a toleration to "
                        "spec.worker.template.spec.tolerations to use the node)")
    state = str(labels.get(gfd.MIG_STATE, "")).lower()
    target = labels.get(gfd.MIG_CONFIG, "")
    if state in _MIG_PENDING_STATES:
        raise NodeExcluded(model.MIG_PENDING, f"MIG reconfiguration to {target or 'a new layout'} is "
                        f"{state} (nvidia.com/mig.config.state); wait for success")
    if state == "failed":
        raise NodeExcluded(model.MIG_FAILED, f"MIG reconfiguration to {target or 'a new layout'} failed "
                        "(nvidia.com/mig.config.state=failed); check the MIG manager logs")
    paused = gfd.paused_for_mig_change(labels)
    if paused:
        raise NodeExcluded(model.MIG_PENDING, f"MIG reconfiguration to {target or 'a new layout'} is in "
                        f"progress: the MIG manager paused {', '.join(paused)} "
                        f"({gfd.PAUSED_FOR_MIG_CHANGE}); wait until it restores them")


# --- devices ---------------------------------------------------------------------------------

def _read_devices(name: str, node: Mapping[str, Any], labels: Mapping[str, str],
                  used: Mapping[str, int]) -> tuple[NodeInventory, list[InventoryWarning]]:
    warnings: list[InventoryWarning] = []
    alloc = _allocatable(node)
    product_raw = str(labels.get(gfd.PRODUCT, "") or "").strip()
    if not product_raw and not _has_gpu_signals(labels, alloc):
        raise NodeExcluded(model.NO_GPUS, "no NVIDIA GPU labels or nvidia.com/* resources")
    product = gfd.split_product(product_raw) if product_raw else None
    if product is not None and product.mig_invalid:
        raise NodeExcluded(model.MIG_FAILED, f"product {product_raw}: GFD reports an invalid MIG layout; "
                        "apply a valid nvidia.com/mig.config")
    cc, arch = _cc_and_arch(name, labels, product.base if product else "", warnings)
    inferred: GpuModel | None = None
    if product is None:
        product, inferred = _unlabelled_product(name, labels, cc, arch, warnings)
    speed, known = (inferred.relative_speed, True) if inferred else base_speed(product.base, arch)
    if not known:
        warnings.append(InventoryWarning(
            node=name, reason=model.UNKNOWN_GPU_SPEED,
            message=f"{product.base} is not in the speed table; using the {arch} default {speed:.2f} "
                    "(set spec.gpus.speedOverrides to correct it)"))
    common = {"node": name, "product": product.base, "compute_capability": cc, "architecture": arch}
    mixed = mixed_mig(name, labels, alloc, used, speed, common, warnings)
    mig_gpus = gpus_taken_by_mig(mixed, product.base)
    count_label = gfd.read_int(labels, gfd.COUNT)
    if count_label is not None and mig_gpus > count_label:
        warnings.append(InventoryWarning(
            node=name, reason=model.GPU_COUNT_MISMATCH,
            message=f"{name}: the MIG slices need at least {mig_gpus} GPUs but {gfd.COUNT}="
                    f"{count_label}; the slices are offered as allocatable lists them (restart GPU "
                    "Feature Discovery and the device plugin on the node)"))
    devices = whole_or_single(name, labels, alloc, used, product, speed, common, mig_gpus, warnings)
    devices += mixed
    lost = _unhealthy(node, alloc)
    if not devices:
        if lost:
            raise NodeExcluded(model.GPUS_UNHEALTHY, _unhealthy_text(lost) + " and nothing else "
                               "allocatable: check the GPUs (nvidia-smi -q, XID errors in the kernel "
                               "log) and the device plugin")
        raise NodeExcluded(model.NO_GPUS, f"{product_raw or product.base}: no allocatable nvidia.com/gpu "
                        "or nvidia.com/mig-* devices")
    devices = [replace(d, unhealthy=-(-lost[d.resource_name] // d.time_sliced_replicas))
               if lost.get(d.resource_name) else d for d in devices]
    driver_text, max_cuda, driver_cuda = _cuda(name, labels, warnings)
    return NodeInventory(name=name, driver_version=driver_text, max_cuda=max_cuda,
                         devices=tuple(devices), driver_cuda=driver_cuda), warnings


def _cc_and_arch(name: str, labels: Mapping[str, str], base: str,
                 warnings: list[InventoryWarning]) -> tuple[str, str]:
    family = gfd.family_label(labels)
    cc = gfd.compute_capability(labels)
    if cc is None:
        table = lookup_model(base) if base else None
        cc = table.compute_capability if table else gfd.FAMILY_CC.get(family)
    if cc is None:
        what = f"{base} is not in the product table" if base else f"{gfd.PRODUCT} is missing too"
        raise NodeExcluded(model.MALFORMED_LABELS, f"no compute capability: {gfd.CC_MAJOR} is missing, "
                        f"{what} and {gfd.FAMILY} is {family or 'missing'}; check that GPU Feature "
                        "Discovery runs on the node")
    arch = gfd.architecture(cc)
    if family and family != arch:
        warnings.append(InventoryWarning(
            node=name, reason=model.GPU_FAMILY_LABEL_MISMATCH,
            message=f"{name} says {family}, cc {cc} => {arch}; using {arch} (the family label "
                    "comes from an old GPU Feature Discovery mapping)"))
    return cc, arch


INFER_MEMORY_TOLERANCE = 0.06
"""Relative memory difference within which a table GPU matches an unlabelled one: drivers report a
little less than the nominal size (an A100-40GB reports 40536 of 40960 MiB, 1 %; an H100 SXM 81559
of 81920, 0.4 %)."""


def _unlabelled_product(name: str, labels: Mapping[str, str], cc: str, arch: str,
                        warnings: list[InventoryWarning]) -> tuple[gfd.ProductName, GpuModel | None]:
    """A node without ``gpu.product`` but with compute capability (or family) and memory labels.

    Everything the planner needs is known: compute capability picks the image and precision,
    ``gpu.memory`` the memory cap, allocatable the count.  The product is named
    ``unlabelled-cc<cc>-<memory>MiB``; its speed is the table GPU's when exactly one table GPU has
    that compute capability and a memory within :data:`INFER_MEMORY_TOLERANCE`, else the
    architecture default (with ``UnknownGpuSpeed``).
    """
    memory = gfd.read_int(labels, gfd.MEMORY)
    base = f"unlabelled-cc{cc}" + (f"-{memory}MiB" if memory else "")
    matches = [m for m in GPU_MODELS if m.compute_capability == cc and memory
               and abs(m.memory_mib - memory) <= INFER_MEMORY_TOLERANCE * m.memory_mib]
    inferred = matches[0] if len({m.tflops for m in matches}) == 1 else None
    speed_text = (f"; speed of the {inferred.name} (the only table GPU with cc {cc} and about "
                  f"{memory} MiB)" if inferred else "")
    warnings.append(InventoryWarning(
        node=name, reason=model.GPU_PRODUCT_LABEL_MISSING,
        message=f"{gfd.PRODUCT} is missing; classified from compute capability {cc} ({arch})"
                + (f" and {gfd.MEMORY}={memory} MiB" if memory else "")
                + f" as {base}{speed_text}; restart GPU Feature Discovery on {name} to restore the label"))
    return gfd.ProductName(base=base), inferred


def _cuda(name: str, labels: Mapping[str, str], warnings: list[InventoryWarning],
          ) -> tuple[str, tuple[int, int] | None, tuple[int, int] | None]:
    """Driver text, max CUDA = min(runtime label, driver table), and the driver table's CUDA."""
    driver_text, major, minor = gfd.driver_version(labels)
    runtime = gfd.runtime_version(labels)
    driver_cuda = None
    if major is not None:
        driver_cuda = cuda_for_driver(major, minor) or (0, 0)
    if runtime is not None and driver_cuda is not None and runtime > driver_cuda:
        warnings.append(InventoryWarning(
            node=name, reason=model.CUDA_LABEL_EXCEEDS_DRIVER,
            message=f"cuda.runtime label says {format_cuda(runtime)} but driver {driver_text} "
                    f"supports CUDA {format_cuda(driver_cuda)} (NVIDIA CUDA release notes, table 3); "
                    f"using {format_cuda(driver_cuda)}"))
    candidates = [v for v in (runtime, driver_cuda) if v is not None]
    if not candidates:
        warnings.append(InventoryWarning(
            node=name, reason=model.CUDA_VERSION_UNKNOWN,
            message="no cuda.driver-version/cuda.runtime-version labels; the image is chosen by "
                    "compute capability only"))
        return driver_text, None, None
    return driver_text, min(candidates), driver_cuda


# --- small readers ---------------------------------------------------------------------------

def _node_name(node: Mapping[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("name") or "<unnamed>")


def node_labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    """The node's labels as strings (the Node's own map when it is one already: an index value
    shares it instead of holding a copy; treat it as read-only)."""
    raw = (node.get("metadata") or {}).get("labels") or {}
    if not isinstance(raw, Mapping):
        return {}
    if isinstance(raw, dict) and all(type(k) is str and type(v) is str for k, v in raw.items()):
        return raw
    return {str(k): "" if v is None else str(v) for k, v in raw.items()}


def _allocatable(node: Mapping[str, Any]) -> dict[str, int] | None:
    """``nvidia.com/*`` allocatable (capacity when allocatable is absent); None when neither exists.

    Raises:
        NodeExcluded: a malformed quantity.
    """
    status = node.get("status") or {}
    raw = status.get("allocatable")
    if raw is None:
        raw = status.get("capacity")
    if raw is None:
        return None
    out = {}
    for key, value in raw.items():
        if str(key).startswith("nvidia.com/"):
            text = str(value).strip()
            if not text.isdigit():
                raise NodeExcluded(model.MALFORMED_LABELS, f"status.allocatable[{key}] must be an "
                                f"integer, got {value!r}")
            out[str(key)] = int(text)
    return out


def _unhealthy(node: Mapping[str, Any], alloc: Mapping[str, int] | None) -> dict[str, int]:
    """``{resource: capacity - allocatable}`` of ``nvidia.com/*`` where capacity counts more: the
    devices the device plugin reports unhealthy (kubelet's device manager keeps them in capacity
    only).  Empty without both maps."""
    capacity = (node.get("status") or {}).get("capacity")
    if alloc is None or not isinstance(capacity, Mapping) or "allocatable" not in (node.get("status") or {}):
        return {}
    out = {}
    for key, value in capacity.items():
        text = str(value).strip()
        if str(key).startswith("nvidia.com/") and text.isdigit() and int(text) > alloc.get(str(key), 0):
            out[str(key)] = int(text) - alloc.get(str(key), 0)
    return out


def _unhealthy_text(lost: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {resource} in capacity but not allocatable (unhealthy)"
                     for resource, n in sorted(lost.items()))


def _has_gpu_signals(labels: Mapping[str, str], alloc: Mapping[str, int] | None) -> bool:
    return (labels.get(gfd.GPU_PRESENT) == "true" or any(v > 0 for v in (alloc or {}).values())
            or any(k.startswith("nvidia.com/gpu.") or k.startswith("nvidia.com/mig-") for k in labels))


def _gpu_type_guess(labels: Mapping[str, str]) -> str:
    """Best-effort GFD type of an excluded node's GPUs (no exceptions)."""
    product = str(labels.get(gfd.PRODUCT, "") or "")
    if not product:
        return ""
    parts = gfd.split_product(product)
    return model.gpu_type_name(parts.base, parts.mig_profile) if not parts.mig_invalid else parts.base
