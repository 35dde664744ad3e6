"""Start-up check of the installed HeteroTrainingJob CRD (shared/cases/27).

Helm installs a chart's ``crds/`` once and never upgrades them (helm/helm#8163), and the API server
silently prunes fields its structural schema does not list.  An operator running against an older
CRD would see new spec fields vanish (a setting quietly ignored) and its status writes stripped.
So at start-up the operator reads the installed CRD and refuses to run when a field it relies on
is missing, naming the fields and the fix.

Pure: no kopf, no kubernetes (tests/operator/test_layering.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from hetero_operator.spec import API_GROUP, PLURAL

VERSION = "v1alpha1"
CRD_NAME = f"{PLURAL}.{API_GROUP}"

REQUIRED_FIELDS: tuple[str, ...] = (
    "spec", "spec.worker", "spec.worker.command", "spec.worker.args", "spec.worker.env",
    "spec.worker.resources", "spec.worker.resources.requests", "spec.worker.resources.limits",
    "spec.worker.metricsPort", "spec.images", "spec.images[].image", "spec.images[].cudaVersion",
    "spec.images[].computeCapabilities", "spec.images[].torchVersion",
    "spec.images[].cudaMinorVersionCompatible", "spec.gpus", "spec.gpus.ranks", "spec.gpus.minRanks",
    "spec.gpus.allowedProducts", "spec.gpus.deniedProducts", "spec.gpus.allowedMigProfiles",
    "spec.gpus.deniedMigProfiles", "spec.gpus.allowMig", "spec.gpus.minMemoryMiB",
    "spec.gpus.speedOverrides", "spec.gpus.speedOverrides[].device",
    "spec.gpus.speedOverrides[].relativeSpeedPercent", "spec.gpus.selection",
    "spec.gpus.minGainPercent", "spec.training", "spec.training.globalBatchSize",
    "spec.training.batchSplit", "spec.training.precision", "spec.training.hierarchy",
    "spec.training.memoryPerSampleMiB", "spec.training.memoryReserveMiB", "spec.training.checkpoint",
    "spec.training.checkpoint.path", "spec.training.checkpoint.persistentVolumeClaim",
    "spec.training.checkpoint.intervalSteps", "spec.training.rebalance",
    "spec.training.rebalance.intervalSteps", "spec.training.compression",
    "spec.training.compression.mode", "spec.training.compression.powerSGDRank",
    "spec.training.profileKey", "spec.training.gradientMiB",
    "spec.training.referenceSamplesPerSecond", "spec.runPolicy", "spec.runPolicy.backoffLimit",
    "spec.runPolicy.activeDeadlineSeconds", "spec.runPolicy.ttlSecondsAfterFinished",
    "spec.runPolicy.cleanPodPolicy", "spec.runPolicy.suspend", "spec.runPolicy.nodeLossGraceSeconds",
    "spec.runPolicy.schedulingPolicy", "spec.runPolicy.schedulingPolicy.queue",
    "spec.runPolicy.schedulingPolicy.priorityClass",
    "status", "status.phase", "status.message", "status.observedGeneration", "status.conditions",
    "status.conditions[].type", "status.conditions[].status", "status.conditions[].reason",
    "status.conditions[].message", "status.conditions[].lastTransitionTime",
    "status.conditions[].lastUpdateTime", "status.conditions[].observedGeneration",
    "status.restarts", "status.infrastructureRestarts", "status.lastDisruption",
    "status.lastNodeLoss", "status.lastNodeLoss.node", "status.lastNodeLoss.reason",
    "status.lastNodeLoss.notReadySince", "status.lastNodeLoss.lostTime", "status.lastNodeLoss.pods",
    "status.replans", "status.attempt", "status.ranksWanted", "status.ranksRunning",
    "status.ranksSummary", "status.gpuTypes", "status.startTime", "status.lastStartTime",
    "status.completionTime", "status.restartNotBefore", "status.lastFailure", "status.plan",
    "status.plan.worldSize", "status.plan.masterAddr", "status.plan.masterPort", "status.plan.pods",
    "status.plan.expectedSpeedupOverEqual", "status.plan.groups", "status.plan.groups[].index",
    "status.plan.groups[].pod", "status.plan.groups[].node", "status.plan.groups[].gpuType",
    "status.plan.groups[].architecture", "status.plan.groups[].resourceName",
    "status.plan.groups[].image", "status.plan.groups[].precision", "status.plan.groups[].firstRank",
    "status.plan.groups[].ranks", "status.plan.groups[].localBatches", "status.plan.excluded",
    "status.plan.excluded[].node", "status.plan.excluded[].reason", "status.plan.excluded[].message",
    "status.plan.prediction", "status.plan.prediction.throughput", "status.plan.prediction.unit",
    "status.plan.prediction.computeSeconds", "status.plan.prediction.communicationSeconds",
    "status.plan.prediction.hierarchy", "status.plan.prediction.communication",
    "status.plan.prediction.costPerHour", "status.plan.prediction.costPerMillionSamples",
    "status.plan.gpuTypeValues", "status.plan.gpuTypeValues[].gpuType",
    "status.plan.gpuTypeValues[].devices", "status.plan.gpuTypeValues[].speedSource",
    "status.plan.gpuTypeValues[].relativeSpeed", "status.plan.gpuTypeValues[].observations",
    "status.plan.gpuTypeValues[].shareOfStep", "status.plan.gpuTypeValues[].throughputAdded",
    "status.plan.gpuTypeValues[].gainPercent", "status.plan.gpuTypeValues[].costPerMillionSamples",
    "status.plan.leftOut", "status.plan.leftOut[].gpuType", "status.plan.leftOut[].devices",
    "status.plan.leftOut[].message",
    "status.progress", "status.progress.step", "status.progress.samplesPerSecond",
    "status.progress.loss", "status.progress.efficiency", "status.progress.predictionRatio",
    "status.progress.updateTime",
)
"""Every field of the CRD this operator ships with (``crds/heterotrainingjobs.heterotrain.io.yaml``;
``tests/operator/test_schemacheck.py`` keeps the two equal): the spec fields it reads and the
status fields it writes.  ``a[].b`` is field ``b`` of the items of list ``a``."""


class StaleCrdError(RuntimeError):
    """The installed CRD lacks fields this operator relies on (or is not installed).

    Attributes:
        missing: the missing field paths, in :data:`REQUIRED_FIELDS` order.
    """

    def __init__(self, message: str, missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing


def schema_of(crd: Mapping[str, Any], version: str = VERSION) -> Mapping[str, Any] | None:
    """The ``openAPIV3Schema`` of a served ``version`` of ``crd``; None when not served."""
    for v in (crd.get("spec") or {}).get("versions") or ():
        if v.get("name") == version and v.get("served", True):
            return ((v.get("schema") or {}).get("openAPIV3Schema")) or {}
    return None


def _walk(node: Mapping[str, Any], prefix: str) -> Iterator[tuple[str, bool]]:
    """``(path, open)`` for every property under ``node``; an open one keeps unknown fields, so
    nothing below it is pruned (and it is not descended into)."""
    for key, child in (node.get("properties") or {}).items():
        path = f"{prefix}{key}"
        is_open = bool(child.get("x-kubernetes-preserve-unknown-fields"))
        yield path, is_open
        if is_open:
            continue
        yield from _walk(child, path + ".")
        items = child.get("items")
        if isinstance(items, Mapping):
            if items.get("x-kubernetes-preserve-unknown-fields"):
                yield path + "[]", True
            else:
                yield from _walk(items, path + "[].")


def schema_fields(crd: Mapping[str, Any], version: str = VERSION) -> tuple[set[str], list[str]]:
    """``(fields, open paths)`` of ``spec`` and ``status`` in ``crd``'s schema of ``version``.

    Raises:
        StaleCrdError: ``version`` is not served by ``crd``.
    """
    schema = schema_of(crd, version)
    if schema is None:
        raise StaleCrdError(f"the installed CRD {CRD_NAME} does not serve {version}; apply the "
                            f"chart's CRD ({apply_hint()})")
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return set(), ["spec", "status"]
    root = {"properties": {k: v for k, v in (schema.get("properties") or {}).items()
                           if k in ("spec", "status")}}
    fields, open_paths = set(), []
    for path, is_open in _walk(root, ""):
        if is_open:
            open_paths.append(path)
        if not path.endswith("[]"):
            fields.add(path)
    return fields, open_paths


def missing_fields(crd: Mapping[str, Any], required: tuple[str, ...] = REQUIRED_FIELDS,
                   version: str = VERSION) -> tuple[str, ...]:
    """Fields of ``required`` that the API server would prune under ``crd``'s schema.

    A field below an ``x-kubernetes-preserve-unknown-fields`` object is kept, so it is not missing.

    Raises:
        StaleCrdError: ``version`` is not served by ``crd``.
    """
    present, open_paths = schema_fields(crd, version)
    return tuple(p for p in required if p not in present
                 and not any(p.startswith(o + ".") or p.startswith(o + "[]") for o in open_paths))


def check_installed_crd(crd: Mapping[str, Any] | None) -> None:
    """Refuse to run against a missing or stale CRD.

    Args:
        crd: the installed ``CustomResourceDefinition`` (None when it is not installed).

    Raises:
        StaleCrdError: naming every missing field and how to apply the current CRD.
    """
    if crd is None:
        raise StaleCrdError(f"the CRD {CRD_NAME} is not installed; {apply_hint()}")
    missing = missing_fields(crd)
    if missing:
        raise StaleCrdError(
            f"the installed CRD {CRD_NAME} lacks {len(missing)} field(s) this operator relies on: "
            f"{', '.join(missing)}; the API server would silently drop them from jobs and status. "
            f"Upgrade the CRD: {apply_hint()}", missing)


def apply_hint() -> str:
    """How to install or upgrade the CRD."""
    return ("kubectl apply --server-side --force-conflicts -f charts/heterotrain/crds/ (helm upgrade "
            "does this in its pre-upgrade hook unless crdUpgrade.enabled is false or hooks are skipped)")
