"""What the operator writes to and reads from a Kueue Workload beyond admission (pure: dicts in,
dicts out): the ``PodsReady`` condition, admission checks and their ``podSetUpdates``, the
Workload's ``spec.active`` for a user's suspend, and condition patches that merge instead of
replacing (issue 21).

As an external framework the operator *is* the job reconciler of Kueue's ``jobframework``
(kueue.sigs.k8s.io, "Integrate a custom Job with Kueue"), so it does what that reconciler does:

* **PodsReady** (Kueue v0.17 ``jobframework.generatePodsReadyCondition``): ``False``/``WaitForStart``
  until every rank runs, ``True``/``Started`` once they do, ``False``/``WaitForRecovery`` while a
  job that ran restarts its gang, ``True``/``Recovered`` when it runs again.  Without it a cluster
  with ``waitForPodsReady`` evicts every admitted job after the timeout (shared case 41).
* **Admission checks** (KEP-1136/1145): ``Admitted`` comes only once every check is ``Ready``;
  the checks' ``podSetUpdates`` (labels, annotations, nodeSelector, tolerations; e.g. a
  ProvisioningRequest's ``autoscaling.x-k8s.io/consume-provisioning-request``) go onto the pods
  of their pod set, and an update that contradicts the pod set's own selector is refused, not
  dropped (shared case 42).
* **Suspend**: a user's ``spec.runPolicy.suspend`` deactivates the Workload (``spec.active:
  false``): Kueue evicts it (``Deactivated``) and the quota is released once the pods are gone;
  resuming activates it again, and Kueue queues it anew.  Only a Workload the operator
  deactivated (:data:`DEACTIVATED_BY`) is re-activated: one Kueue deactivated itself (e.g.
  ``requeuingStrategy.backoffLimitCount``) stays off.
* **Merged conditions**: every status patch is computed from the Workload as just read and sent
  with its ``resourceVersion`` (optimistic concurrency), one condition type at a time, so a
  condition Kueue wrote in between is never overwritten (a 409 means: read again, merge again).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetero_operator.api import labels

PODS_READY = "PodsReady"
WAIT_FOR_START, WAIT_FOR_RECOVERY, STARTED, RECOVERED = (
    "WaitForStart", "WaitForRecovery", "Started", "Recovered")
NOT_READY_MESSAGE = "Not all pods are ready or succeeded"
RECOVERY_MESSAGE = "At least one pod has failed, waiting for recovery"
READY_MESSAGE = "All pods reached readiness and the workload is running"
"""Kueue v0.17's own messages (``pkg/controller/jobframework/reconciler.go``)."""
DEACTIVATED_BY = labels.ANNOTATION_DEACTIVATED_BY
"""Annotation on a Workload the operator deactivated for the job's ``spec.runPolicy.suspend``."""
USER_SUSPEND = "spec.runPolicy.suspend"


def condition(workload: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any]:
    """The Workload's condition of ``type_`` (``{}`` when absent)."""
    return next((c for c in ((workload or {}).get("status") or {}).get("conditions") or ()
                 if c.get("type") == type_), {})


# --- conditions, merged -------------------------------------------------------------------------

def merged_conditions(workload: Mapping[str, Any], changes: Iterable[Mapping[str, Any]],
                      now_iso: str) -> list[dict[str, Any]] | None:
    """The Workload's conditions with ``changes`` applied per type (others kept as read).

    ``lastTransitionTime`` moves only when a condition's status changes.

    Returns:
        The new list, or None when nothing changes (no patch needed).
    """
    conditions = [dict(c) for c in (workload.get("status") or {}).get("conditions") or ()]
    changed = False
    for new in changes:
        old = next((c for c in conditions if c.get("type") == new["type"]), None)
        if old is None:
            conditions.append({**new, "lastTransitionTime": now_iso})
            changed = True
            continue
        if all(old.get(k) == new[k] for k in ("status", "reason", "message")):
            continue
        if old.get("status") != new["status"]:
            old["lastTransitionTime"] = now_iso
        old.update(status=new["status"], reason=new["reason"], message=new["message"])
        changed = True
    return conditions if changed else None


def status_patch(workload: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """A status merge patch guarded by the Workload's ``resourceVersion`` (409 on a conflict)."""
    rv = (workload.get("metadata") or {}).get("resourceVersion")
    patch: dict[str, Any] = {"status": dict(status)}
    if rv:
        patch["metadata"] = {"resourceVersion": rv}
    return patch


# --- PodsReady ------------------------------------------------------------------------------------

def pods_ready(workload: Mapping[str, Any], *, admitted: bool, all_running: bool) -> dict[str, str]:
    """The ``PodsReady`` condition Kueue's own job reconciler would write now.

    Args:
        workload: the Workload as read (its current ``PodsReady`` decides recovery).
        admitted: Kueue admitted it (pods may run).
        all_running: every rank's pod runs.
    """
    current = condition(workload, PODS_READY)
    if not admitted:
        return _cond("False", WAIT_FOR_START, NOT_READY_MESSAGE)
    if all_running:
        recovering = current.get("reason") in (WAIT_FOR_RECOVERY, RECOVERED)
        return _cond("True", RECOVERED if recovering else STARTED, READY_MESSAGE)
    if current.get("status") == "True" or current.get("reason") == WAIT_FOR_RECOVERY:
        return _cond("False", WAIT_FOR_RECOVERY, RECOVERY_MESSAGE)
    return _cond("False", WAIT_FOR_START, NOT_READY_MESSAGE)


def _cond(status: str, reason: str, message: str) -> dict[str, str]:
    return {"type": PODS_READY, "status": status, "reason": reason, "message": message}


# --- admission checks -----------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True, slots=True)
class PodSetUpdate:
    """What the admission checks ask of one pod set's pods (all checks merged)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


class PodSetUpdateConflict(ValueError):
    """An admission check's update contradicts the pod set's own selector or another check."""


def pending_checks(workload: Mapping[str, Any]) -> list[str]:
    """``"<check> (<state>: <message>)"`` of every admission check that is not ``Ready``."""
    out = []
    for check in (workload.get("status") or {}).get("admissionChecks") or ():
        if check.get("state") != "Ready":
            why = f": {check['message']}" if check.get("message") else ""
            out.append(f"{check.get('name', '?')} ({check.get('state', 'Pending')}{why})")
    return out


def pod_set_updates(workload: Mapping[str, Any]) -> dict[str, PodSetUpdate]:
    """``{pod set: PodSetUpdate}`` from every admission check's ``podSetUpdates``.

    Raises:
        PodSetUpdateConflict: two checks set one key to different values.
    """
    merged: dict[str, dict[str, Any]] = {}
    for check in (workload.get("status") or {}).get("admissionChecks") or ():
        for update in check.get("podSetUpdates") or ():
            name = str(update.get("name", "main"))
            into = merged.setdefault(name, {"labels": {}, "annotations": {}, "nodeSelector": {},
                                            "tolerations": []})
            for key in ("labels", "annotations", "nodeSelector"):
                for k, v in (update.get(key) or {}).items():
                    if into[key].get(k, v) != v:
                        raise PodSetUpdateConflict(
                            f"admission check {check.get('name')} sets {key} {k}={v} for pod set "
                            f"{name}, another check set {into[key][k]}")
                    into[key][k] = v
            into["tolerations"] += [dict(t) for t in update.get("tolerations") or ()
                                    if dict(t) not in into["tolerations"]]
    return {name: PodSetUpdate(labels=u["labels"], annotations=u["annotations"],
                               node_selector=u["nodeSelector"], tolerations=tuple(u["tolerations"]))
            for name, u in merged.items()}


def merged_selector(pod_set: str, own: Mapping[str, str], update: PodSetUpdate) -> dict[str, str]:
    """``own`` (product label and flavor node labels) plus the update's nodeSelector.

    Raises:
        PodSetUpdateConflict: the update names another value for a key of ``own`` (e.g. another
            ``nvidia.com/gpu.product``), as Kueue's jobframework refuses such an update.
    """
    for k, v in update.node_selector.items():
        if k in own and own[k] != v:
            raise PodSetUpdateConflict(
                f"an admission check's podSetUpdate for pod set {pod_set} asks nodeSelector "
                f"{k}={v}, but its pods must select {k}={own[k]} (their GPU type and flavor); "
                "fix the admission check's configuration (e.g. its ProvisioningRequest class)")
    return {**own, **update.node_selector}


OWN_LABEL_PREFIXES = (labels.OWN_PREFIX, labels.LABEL_MANAGED_BY)
"""Pod labels the operator sets itself (job, group, rank, ...): an update may not change them."""


def check_metadata(pod_set: str, update: PodSetUpdate) -> None:
    """Refuse an update that would set one of the operator's own pod labels.

    Raises:
        PodSetUpdateConflict: it would.
    """
    for k, v in update.labels.items():
        if k.startswith(OWN_LABEL_PREFIXES):
            raise PodSetUpdateConflict(
                f"an admission check's podSetUpdate for pod set {pod_set} sets label {k}={v}, "
                "a label the operator sets on its pods itself")


# --- suspend: spec.active ---------------------------------------------------------------------

def active_patch(workload: Mapping[str, Any], *, suspended: bool) -> dict[str, Any] | None:
    """The Workload patch that makes ``spec.active`` follow the job's own suspend, or None.

    Suspended: ``active: false`` plus :data:`DEACTIVATED_BY`; resumed: ``active: true`` and the
    annotation removed, only on a Workload this operator deactivated.
    """
    active = (workload.get("spec") or {}).get("active", True) is not False
    ours = DEACTIVATED_BY in ((workload.get("metadata") or {}).get("annotations") or {})
    if suspended and active:
        return {"metadata": {"annotations": {DEACTIVATED_BY: USER_SUSPEND}},
                "spec": {"active": False}}
    if not suspended and not active and ours:
        return {"metadata": {"annotations": {DEACTIVATED_BY: None}}, "spec": {"active": True}}
    return None


def all_ranks_running(states: Sequence[Any], world_size: int) -> bool:
    """Every one of the plan's ``world_size`` ranks is in a pod that is not terminating and runs or
    has succeeded: Kueue's own ``PodsReady`` counts ready *or succeeded* pods (v0.17
    ``jobframework``, message "Not all pods are ready or succeeded"), so the ranks that finish
    first at the end of a job do not turn it into ``WaitForRecovery``."""
    if world_size <= 0:
        return False
    return sum(p.ranks for p in states
               if p.phase in ("Running", "Succeeded") and not p.deleting) >= world_size
