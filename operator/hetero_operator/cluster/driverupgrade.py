"""The GPU Operator's rolling driver upgrade, as its node label tells it (pure; shared case 52).

NVIDIA's upgrade controller (NVIDIA/k8s-operator-libs ``pkg/upgrade/consts.go``) labels each node
``nvidia.com/gpu-driver-upgrade-state`` and moves it through ``upgrade-required`` (waiting its
turn, possibly for weeks under ``maxParallelUpgrades``), ``cordon-required`` ...
``validation-required`` (the controller is taking or holds the node's GPUs: it cordons the node,
deletes GPU pods or drains it, restarts the driver), then ``uncordon-required``, ``upgrade-done``
or ``upgrade-failed``.  The label moves ahead of the Node: ``cordon-required`` is written before
the node is cordoned.

So a node in an in-progress state is excluded (:data:`DRIVER_UPGRADE`) whether cordoned yet or
not, and a node in ``upgrade-required`` is usable but deferred: the planner takes its GPUs only
when the job does not fit on the others (:func:`upgrade_pending`).
"""

from __future__ import annotations

from collections.abc import Mapping

from hetero_operator.api import types as model

UPGRADE_STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
UPGRADE_REQUIRED = "upgrade-required"
IN_PROGRESS_STATES = frozenset({
    "cordon-required", "wait-for-jobs-required", "pod-deletion-required", "drain-required",
    "node-maintenance-required", "post-maintenance-required", "pod-restart-required",
    "validation-required"})
"""States in which the upgrade controller cordons, empties or restarts the node's GPUs."""
DRIVER_UPGRADE = "DriverUpgradeInProgress"
"""Exclusion reason: the GPU Operator is upgrading the node's driver."""
model.REASON_PHRASES.setdefault(DRIVER_UPGRADE, "driver upgrade in progress")


def upgrade_in_progress(labels: Mapping[str, str]) -> str:
    """The message excluding a node whose driver upgrade is under way, ``""`` when it is not."""
    state = str(labels.get(UPGRADE_STATE_LABEL, "")).strip()
    if state not in IN_PROGRESS_STATES:
        return ""
    return (f"the GPU Operator is upgrading the node's driver ({UPGRADE_STATE_LABEL}={state}): it "
            "cordons the node and evicts its GPU pods; wait for upgrade-done")


def upgrade_pending(labels: Mapping[str, str]) -> bool:
    """True when the node waits for its driver upgrade (``upgrade-required``): usable, but it will
    be cordoned and emptied when its turn comes."""
    return str(labels.get(UPGRADE_STATE_LABEL, "")).strip() == UPGRADE_REQUIRED
