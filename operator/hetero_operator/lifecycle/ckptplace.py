"""Where a job's checkpoints live, and where a restart continues from (pure; issue 32, F8).

``spec.training.checkpoint.path`` on no volume is the container's own file system: every
checkpoint is lost when the pods are deleted (and a restart deletes every pod), so a restart
starts at step 0 whatever the job saved.  :func:`checkpoint_warning` says so at each start (a
Warning Event ``CheckpointNotPersistent`` naming the path and the fix) and :func:`restart_source`
is what the restart Events say.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetero_operator.api import podtemplate
from hetero_operator.api.spec import JobSpec

WARNING_REASON = "CheckpointNotPersistent"
CHECKPOINT_NOT_RESUMED = "CheckpointNotResumed"
"""Reason of the Warning Event when rank 0 started beside other jobs' checkpoints (issue 33)."""
KEEPING_TYPES = ("persistentVolumeClaim", "csi")
"""Volume types whose data outlives the pod (``emptyDir`` and ``ephemeral`` go with it)."""


def _covers(mount_path: str, path: str) -> bool:
    base = mount_path.rstrip("/") or "/"
    return path == base or path.startswith(base if base == "/" else base + "/")


def checkpoint_volume(spec: JobSpec) -> str | None:
    """What keeps the checkpoints: ``"PersistentVolumeClaim ckpt"``; ``""`` when nothing that
    outlives the pods is mounted at ``spec.training.checkpoint.path``; None without checkpoints."""
    path = spec.training.checkpoint_path
    if not path:
        return None
    if spec.training.checkpoint_pvc:
        return f"PersistentVolumeClaim {spec.training.checkpoint_pvc}"
    volumes: dict[str, Mapping[str, Any]] = {
        str(v.get("name")): v for v in (spec.worker.template.get("spec") or {}).get("volumes") or ()
        if isinstance(v, Mapping)}
    mounts = [m for m in podtemplate.worker_container(spec.worker.template).get("volumeMounts") or ()
              if isinstance(m, Mapping) and _covers(str(m.get("mountPath") or ""), path)]
    if not mounts:
        return ""
    mount = max(mounts, key=lambda m: len(str(m.get("mountPath"))))
    volume = volumes.get(str(mount.get("name")), {})
    if "persistentVolumeClaim" in volume:
        return (f"PersistentVolumeClaim {volume['persistentVolumeClaim'].get('claimName')} "
                f"(volume {mount.get('name')} at {mount.get('mountPath')})")
    if "csi" in volume:
        return f"CSI volume {mount.get('name')} ({volume['csi'].get('driver')}) at {mount.get('mountPath')}"
    return ""


def checkpoint_warning(spec: JobSpec) -> str:
    """The Warning for checkpoints on no volume that outlives the pods, ``""`` otherwise."""
    if checkpoint_volume(spec) != "":
        return ""
    path = spec.training.checkpoint_path
    return (f"spec.training.checkpoint.path {path} is on no volume that outlives the pods (no "
            "spec.training.checkpoint.persistentVolumeClaim, and no PersistentVolumeClaim or CSI "
            f"volume of spec.worker.template mounted there): the checkpoints are lost when the pods "
            "are deleted, so a restart starts again from step 0; set "
            f"spec.training.checkpoint.persistentVolumeClaim, or mount one at {path}.")


def restart_source(spec: JobSpec) -> str:
    """Where a restart of the job continues, for its Events: ``"the last checkpoint in /ckpt on
    PersistentVolumeClaim ckpt"``, or step 0 with why."""
    where = checkpoint_volume(spec)
    if where is None:
        return "step 0 (the job does not checkpoint: spec.training.checkpoint.path is not set)"
    path = spec.training.checkpoint_path
    if where == "":
        return (f"step 0 unless a checkpoint in {path} survived: it is on no volume, so the pods' "
                "deletion removes it (mount a PersistentVolumeClaim there)")
    return f"the last checkpoint in {path} on {where}"


def not_resumed_message(spec: JobSpec, count: int) -> str:
    """The ``CheckpointNotResumed`` Event: rank 0 found ``count`` checkpoints of other jobs in the
    job's checkpoint path and started at step 0 (a checkpoint belongs to its job); the field that
    continues from them, and rank 0's log line that names the job."""
    where = spec.training.checkpoint_path + (
        f" on PersistentVolumeClaim {spec.training.checkpoint_pvc}" if spec.training.checkpoint_pvc else "")
    return (f"Started at step 0 beside {count} checkpoint(s) of another job in {where}: a job "
            "re-applied under its name or renamed is a new job and does not resume them. To "
            "continue from them, set spec.training.checkpoint.resumeFrom to that job's name or "
            "UID (rank 0's checkpoint_not_resumed log line names it); to keep jobs apart, give "
            "each its own spec.training.checkpoint.path.")
