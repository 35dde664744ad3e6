"""Value types of the cluster model and the placement plan (pure, frozen dataclasses).

``inventory.build_inventory`` turns Node objects into an :class:`Inventory`;
``planning.plan_job`` turns a job and an inventory into a :class:`Plan` or an
:class:`Unschedulable`; ``envrender.render_rank_envs`` turns a plan into the env contract.
Names and fields are fixed in ``docs/internal-api.md``; fields after those are additions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from hetero_operator.api.memoryplan import MemoryPlan
from hetero_operator.api.pipelineplan import LayoutChoice, PipelinePlan
from hetero_operator.api.planvalue import PlanValue

# Exclusion reasons (CamelCase, Kubernetes condition style).
UNSCHEDULABLE = "Unschedulable"
NOT_READY = "NotReady"
TAINTED = "Tainted"
MIG_PENDING = "MigReconfigurationPending"
MIG_FAILED = "MigReconfigurationFailed"
MALFORMED_LABELS = "MalformedLabels"
NO_COMPATIBLE_IMAGE = "NoCompatibleImage"
NO_GPUS = "NoGPUs"
GPUS_UNHEALTHY = "GPUsUnhealthy"
"""Every GPU the node has is unusable: counted in ``status.capacity`` but not in allocatable (the
device plugin's health check, e.g. after an XID error), or tainted by a DRA driver."""
# Job-specific reasons added by the planner.
DENIED_BY_SPEC = "DeniedBySpec"
INSUFFICIENT_MEMORY = "InsufficientMemory"
PRECISION_UNSUPPORTED = "PrecisionUnsupported"

REASON_PHRASES: dict[str, str] = {
    UNSCHEDULABLE: "cordoned",
    NOT_READY: "not Ready",
    TAINTED: "tainted",
    MIG_PENDING: "MIG reconfiguration pending",
    MIG_FAILED: "MIG reconfiguration failed",
    MALFORMED_LABELS: "malformed GPU labels",
    NO_COMPATIBLE_IMAGE: "no compatible image",
    NO_GPUS: "no GPUs",
    GPUS_UNHEALTHY: "all GPUs unhealthy",
    DENIED_BY_SPEC: "denied by spec.gpus",
    INSUFFICIENT_MEMORY: "too little memory",
    PRECISION_UNSUPPORTED: "precision unsupported",
}
"""Short human phrase per reason, used in the one-line unschedulable message."""

# Inventory warnings (the operator emits them as Warning events on the Node or job).
GPU_FAMILY_LABEL_MISMATCH = "GpuFamilyLabelMismatch"
CUDA_LABEL_EXCEEDS_DRIVER = "CudaLabelExceedsDriver"
CUDA_VERSION_UNKNOWN = "CudaVersionUnknown"
UNKNOWN_GPU_SPEED = "UnknownGpuSpeed"
GPU_OFFERED_TWICE = "GpuOfferedTwice"
"""Allocatable offers whole ``nvidia.com/gpu`` that are already carved into MIG slices (stale
device-plugin state after a MIG change); the whole GPUs are capped to ``gpu.count`` minus the GPUs
the slices occupy."""
GPU_COUNT_MISMATCH = "GpuCountMismatch"
"""The MIG slices need more GPUs than ``gpu.count`` says the node has."""
MIG_PROFILE_NAME_MISMATCH = "MigProfileNameMismatch"
"""A ``nvidia.com/mig-<profile>`` resource and its GFD label family spell the memory differently
(``3g.20gb`` vs ``3g.21gb``); joined by slices, the resource name is requested as allocatable
spells it and memory/multiprocessors come from the labels."""
MIG_LABELS_UNMATCHED = "MigLabelsUnmatched"
"""A GFD ``nvidia.com/mig-<profile>.*`` family with a count but no allocatable resource."""
MIG_LABELS_MISSING = "MigLabelsMissing"
"""An allocatable MIG resource without GFD labels: memory from the profile name, SMs unknown."""
GPU_PRODUCT_LABEL_MISSING = "GpuProductLabelMissing"
"""``gpu.product`` is missing; the node was classified from compute capability and memory."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Device:
    """One schedulable device class on a node (all its devices are interchangeable).

    Attributes:
        node: node name.
        product: base GFD product, without ``-MIG-…``/``-SHARED``, e.g. ``"NVIDIA-A100-SXM4-40GB"``.
        mig_profile: MIG profile such as ``"3g.40gb"``; ``""`` for a whole GPU.
        compute_capability: ``"major.minor"``, e.g. ``"8.0"``.
        architecture: GFD family name derived from the compute capability, e.g. ``"ampere"``.
        memory_mib: memory of one device (the MIG slice's for MIG), MiB.
        resource_name: extended resource a pod requests, ``nvidia.com/gpu`` or
            ``nvidia.com/mig-3g.40gb``.
        total: devices of this class on the node (physical GPUs when time-sliced).
        free: devices not requested by pods already bound to the node, ``0 <= free <= total``.
        relative_speed: throughput relative to an A100 (= 1.0), from :mod:`hetero_operator.cluster.gputable`.
        time_sliced_replicas: replicas per physical GPU under time-slicing/MPS; 1 when exclusive.
        compute_slices: compute slices out of 7 for MIG; 7 for a whole GPU.
        multiprocessors: SM count when labelled (MIG), else 0.
        unhealthy: devices of this class that exist but cannot be used, not part of ``total``:
            counted in ``status.capacity`` but not in allocatable (the device plugin's unhealthy
            GPUs, e.g. after an XID error), or marked by a DRA driver's device taint.
        claimed: devices of ``total`` allocated to DRA ResourceClaims (not free).
    """

    node: str
    product: str
    mig_profile: str = ""
    compute_capability: str
    architecture: str
    memory_mib: int
    resource_name: str
    total: int
    free: int
    relative_speed: float
    time_sliced_replicas: int = 1
    compute_slices: int = 7
    multiprocessors: int = 0
    unhealthy: int = 0
    claimed: int = 0

    @property
    def gpu_type(self) -> str:
        """GFD-style product of one device: ``"NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"`` for MIG."""
        return gpu_type_name(self.product, self.mig_profile)

    @property
    def is_mig(self) -> bool:
        """True for a MIG device."""
        return bool(self.mig_profile)


def gpu_type_name(product: str, mig_profile: str) -> str:
    """``product`` plus ``-MIG-<profile>`` when ``mig_profile`` is set (GFD single-strategy shape)."""
    return f"{product}-MIG-{mig_profile}" if mig_profile else product


@dataclass(frozen=True, kw_only=True, slots=True)
class InventoryWarning:
    """A label inconsistency that did not exclude the node.

    Attributes:
        node: node name.
        reason: CamelCase, e.g. ``"GpuFamilyLabelMismatch"``, ``"CudaLabelExceedsDriver"``.
        message: one sentence for a Warning event.
    """

    node: str
    reason: str
    message: str


@dataclass(frozen=True, kw_only=True, slots=True)
class NodeInventory:
    """The usable GPUs of one node.

    Attributes:
        name: node name.
        driver_version: driver version as labelled, e.g. ``"550.107.02"``; ``""`` when unlabelled.
        max_cuda: highest CUDA runtime the node can run, ``(12, 4)``; ``None`` when neither the
            runtime nor the driver label is present (image choice then checks only the compute
            capability and a ``CudaVersionUnknown`` warning is recorded).
        devices: device classes, ordered by resource name.
        driver_cuda: what the driver supports by NVIDIA's table, ``None`` when unknown.
    """

    name: str
    driver_version: str
    max_cuda: tuple[int, int] | None
    devices: tuple[Device, ...]
    driver_cuda: tuple[int, int] | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class ExcludedNode:
    """A node (or, for job-specific reasons, its devices) that the plan cannot use.

    Attributes:
        node: node name.
        reason: CamelCase reason (see the module constants).
        message: one sentence naming the cause and the fix.
        gpu_type: GFD-style product of the node's GPUs when known (for unschedulable messages).
    """

    node: str
    reason: str
    message: str
    gpu_type: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Inventory:
    """All nodes: usable ones, excluded ones and label warnings.

    Attributes:
        nodes: usable nodes, ordered by name.
        excluded: excluded nodes, ordered by name.
        warnings: label inconsistencies on usable nodes.
        labels: every node's labels (usable and excluded) by node name, what later filters match
            (a template's nodeSelector, a Kueue flavor's nodeLabels) without reading the Node again.
    """

    nodes: tuple[NodeInventory, ...]
    excluded: tuple[ExcludedNode, ...]
    warnings: tuple[InventoryWarning, ...] = ()
    labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict, repr=False)

    def devices(self) -> list[Device]:
        """All device classes of all usable nodes."""
        return [d for n in self.nodes for d in n.devices]


@dataclass(frozen=True, kw_only=True, slots=True)
class RankPlacement:
    """Where one rank runs.

    Attributes:
        rank: global rank.
        group: index of its :class:`GroupPlan`.
        node / product / mig_profile / compute_capability / resource_name: the device.
        image: worker image chosen for the node (``""`` when the job has no catalog).
        precision: ``"bf16"``, ``"fp16"`` or ``"fp32"``.
        local_batch: samples per optimizer step (>= 1).
        relative_speed: speed used for the split (A100 = 1.0, after overrides).
        memory_mib: device memory, MiB.
        architecture: GFD family name.
        group_rank: position inside the group (LOCAL_RANK in the group's pod).
        stage / stage_replica: its pipeline stage and replica (``Plan.pipeline``); None / 0
            without a pipeline.
    """

    rank: int
    group: int
    node: str
    product: str
    mig_profile: str
    compute_capability: str
    resource_name: str
    image: str
    precision: str
    local_batch: int
    relative_speed: float
    memory_mib: int
    architecture: str = ""
    group_rank: int = 0
    stage: int | None = None
    stage_replica: int = 0

    @property
    def gpu_type(self) -> str:
        """GFD-style product including the MIG suffix."""
        return gpu_type_name(self.product, self.mig_profile)


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupPlan:
    """One group: ranks on the same node and GPU type; the operator makes one pod per group.

    Attributes:
        index: group index (0-based, ranks of lower groups come first).
        node / product / mig_profile / resource_name / image / precision: shared by its ranks.
        ranks: global ranks, contiguous and ascending.
        local_batches: local batch per rank, same order.
        architecture / compute_capability / memory_mib / relative_speed: the device.
        extra_env: extra environment for every rank of the group, e.g.
            ``{"NCCL_P2P_DISABLE": "1"}`` for MIG devices and multi-GPU GeForce groups.
    """

    index: int
    node: str
    product: str
    mig_profile: str
    resource_name: str
    image: str
    precision: str
    ranks: tuple[int, ...]
    local_batches: tuple[int, ...]
    architecture: str = ""
    compute_capability: str = ""
    memory_mib: int = 0
    relative_speed: float = 1.0
    extra_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def gpu_count(self) -> int:
        """Devices the group's pod requests (one per rank)."""
        return len(self.ranks)

    @property
    def gpu_type(self) -> str:
        """GFD-style product including the MIG suffix."""
        return gpu_type_name(self.product, self.mig_profile)


@dataclass(frozen=True, kw_only=True, slots=True)
class Plan:
    """A placement for every rank.

    Attributes:
        ranks: one entry per rank, ordered by rank.
        groups: ordered by index.
        excluded: nodes not usable for this job (inventory exclusions plus job-specific ones).
        expected_speedup_over_equal: step time with an equal split divided by step time with this
            plan's split, using the relative speeds (1.0 for ``batchSplit: Equal``).
        warnings: inventory warnings, passed through for events and the CLI.
        value: the step-time model's prediction, what each GPU type adds and what was left out
            (:mod:`hetero_operator.planning.marginal`); None for plans built without it.
        memory: the memory model's decision (sharding mode, per-rank state share and
            micro-batches, why per GPU type; :class:`hetero_operator.api.memoryplan.MemoryPlan`); None
            when the job gives no ``spec.training.model.parameters``.
        pipeline: the pipeline stages per GPU type (``spec.training.pipeline``), else None.
        layout: ``Auto``'s choice between the pipeline and no pipeline, with why (a job with
            ``spec.training.pipeline`` and ``spec.training.sharding Auto``), else None.
    """

    ranks: tuple[RankPlacement, ...]
    groups: tuple[GroupPlan, ...]
    excluded: tuple[ExcludedNode, ...]
    expected_speedup_over_equal: float
    warnings: tuple[InventoryWarning, ...] = ()
    value: PlanValue | None = None
    memory: MemoryPlan | None = None
    pipeline: PipelinePlan | None = None
    layout: LayoutChoice | None = None

    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self.ranks)

    @property
    def nodes(self) -> tuple[str, ...]:
        """Nodes used, in group order, without repeats."""
        return tuple(dict.fromkeys(g.node for g in self.groups))


@dataclass(frozen=True, kw_only=True, slots=True)
class Shortfall:
    """Per GPU type: how many devices the job needed and how many were free.

    Attributes:
        gpu_type: GFD-style product (with ``-MIG-<profile>`` for MIG).
        need: devices of this type the job would need if every other eligible type were used fully.
        free: free eligible devices of this type.
        reasons: ``"node-c: MIG reconfiguration pending"`` style notes on why devices are missing.
    """

    gpu_type: str
    need: int
    free: int
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class Unschedulable:
    """No plan: the minimum cannot be met.

    Attributes:
        shortfalls: per GPU type.
        excluded: every excluded node with its reason.
        message: one line, e.g. ``"Tesla-T4: need 2, free 1 (node-c: MIG reconfiguration pending)"``.
        reason: ``"InsufficientGPUs"``, ``"InsufficientMemory"`` or ``"GlobalBatchTooSmall"``.
        warnings: inventory warnings, passed through.
    """

    shortfalls: tuple[Shortfall, ...]
    excluded: tuple[ExcludedNode, ...]
    message: str
    reason: str = "InsufficientGPUs"
    warnings: tuple[InventoryWarning, ...] = ()


def to_dict(value: Plan | Unschedulable | Inventory) -> dict[str, Any]:
    """JSON-ready dict of a plan, unschedulable result or inventory (tuples become lists)."""
    data = asdict(value)
    if isinstance(value, Plan):
        data["result"] = "planned"
        data["world_size"] = value.world_size
        data["nodes"] = list(value.nodes)
    elif isinstance(value, Unschedulable):
        data["result"] = "unschedulable"
    return _jsonable(data)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _jsonable(v) for k, v in value.items()}
    return value
