"""Pods that will not start whatever the plan (pure): an image that cannot be pulled, an invalid
image name, a missing Secret or ConfigMap, scheduling gates nobody removes, a volume attached to
another node (Multi-Attach).  Re-planning such a pod creates the same pod again, so these are
job errors with a named reason (issue 32, F5), not re-plans: the job waits with the reason in its
condition and a Warning naming the pod and the fix, and fails with that reason when the pod is
still stuck after ``HTJ_PENDING_TIMEOUT_S`` (an invalid image name at once: it never heals).

:func:`stuck_of` reads a pod; :func:`stuck_decision` is asked by
:func:`hetero_operator.lifecycle.decisions.decide` before the pending timeout's re-plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hetero_operator.api import conditions as c
from hetero_operator.lifecycle.values import FAIL, WAIT, Decision, PodState

IMAGE_PULL_FAILED = "ImagePullFailed"
INVALID_IMAGE_NAME = "InvalidImageName"
CONTAINER_CONFIG_ERROR = "ContainerConfigError"
SCHEDULING_GATED = "SchedulingGated"
VOLUME_MULTI_ATTACH = "VolumeMultiAttach"

WAITING_REASONS: Mapping[str, str] = {
    "ErrImagePull": IMAGE_PULL_FAILED, "ImagePullBackOff": IMAGE_PULL_FAILED,
    "ErrImageNeverPull": IMAGE_PULL_FAILED, "InvalidImageName": INVALID_IMAGE_NAME,
    "CreateContainerConfigError": CONTAINER_CONFIG_ERROR,
}
"""A container's ``state.waiting.reason`` (the kubelet's) -> the job's condition reason."""
JOB_REASONS: tuple[str, ...] = (IMAGE_PULL_FAILED, INVALID_IMAGE_NAME, CONTAINER_CONFIG_ERROR,
                                SCHEDULING_GATED, VOLUME_MULTI_ATTACH)
"""The job's condition reasons of a stuck pod (Warnings while it waits, then ``Failed``)."""
PERMANENT: frozenset[str] = frozenset({INVALID_IMAGE_NAME})
"""Reasons that never heal: the job fails at once."""
FIXES: Mapping[str, str] = {
    IMAGE_PULL_FAILED: ("check the image and tag in spec.images and the registry's credentials "
                        "(imagePullSecrets in spec.worker.template.spec)"),
    INVALID_IMAGE_NAME: "fix the image reference in spec.images",
    CONTAINER_CONFIG_ERROR: ("create the Secret or ConfigMap it names, or fix the reference in "
                             "spec.worker.env or the template's env, envFrom and volumes"),
    SCHEDULING_GATED: ("the controller that added the gates never removed them: remove them, or "
                       "fix or uninstall the webhook that adds them"),
    VOLUME_MULTI_ATTACH: ("a ReadWriteOnce volume cannot be attached to two nodes: use a "
                          "ReadWriteMany claim (NFS, CephFS, a CSI file system) or object storage"),
}
"""What the user does about each reason (the messages say it)."""
MULTI_ATTACH_EVENT = ("FailedAttachVolume", "Multi-Attach error")
"""(Event reason, message start) of the attach/detach controller's Multi-Attach refusal."""


def stuck_of(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]] = ()) -> tuple[str, str]:
    """``(job reason, what)`` of a pod that will not start, ``("", "")`` otherwise.

    Args:
        pod: a ``v1/Pod`` dict.
        events: Events about the pod (only Multi-Attach is read from them).
    """
    st = pod.get("status") or {}
    if (st.get("phase") or "Pending") != "Pending":
        return "", ""
    for cs in [*(st.get("initContainerStatuses") or ()), *(st.get("containerStatuses") or ())]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason = str(waiting.get("reason") or "")
        if reason in WAITING_REASONS:
            detail = f": {waiting['message']}" if waiting.get("message") else ""
            return WAITING_REASONS[reason], f"container {cs.get('name', '?')} is {reason}{detail}"
    gates = [str(g.get("name")) for g in (pod.get("spec") or {}).get("schedulingGates") or ()
             if isinstance(g, Mapping)]
    if gates and not (pod.get("spec") or {}).get("nodeName"):
        return SCHEDULING_GATED, f"scheduling gate(s) {', '.join(gates)} still on it"
    for ev in events:
        if ev.get("reason") == MULTI_ATTACH_EVENT[0] and MULTI_ATTACH_EVENT[1] in str(ev.get("message") or ""):
            return VOLUME_MULTI_ATTACH, str(ev.get("message"))
    return "", ""


def stuck_decision(pods: Sequence[PodState], *, now_s: float, pending_timeout_s: float,
                   clean: tuple[str, ...]) -> Decision | None:
    """Wait with the reason, or fail with it: the first stuck pod (lowest rank) decides.

    Args:
        pods: the job's live pods of the current attempt.
        now_s: the clock, epoch seconds.
        pending_timeout_s: ``HTJ_PENDING_TIMEOUT_S``: how long a stuck pod may wait.
        clean: the pods ``cleanPodPolicy`` deletes when the job fails.

    Returns:
        None when no pod is stuck.
    """
    stuck = [p for p in pods if p.phase == "Pending" and p.stuck]
    if not stuck:
        return None
    first = min(stuck, key=lambda p: p.first_rank)
    since = first.created_s if first.created_s is not None else now_s
    fails_at = since + pending_timeout_s
    what = f"Pod {first.name} cannot start: {first.stuck_message}"
    fix = FIXES.get(first.stuck, "")
    if first.stuck in PERMANENT or now_s >= fails_at:
        waited = "" if first.stuck in PERMANENT else f" for {now_s - since:.0f} s"
        return Decision(action=FAIL, phase=c.FAILED, reason=first.stuck,
                        message=(f"{what}{waited}; re-planning would create the same pod, so the "
                                 f"job fails: {fix}, then re-create the job."),
                        delete_pods=clean)
    return Decision(action=WAIT, phase=c.CREATED, reason=first.stuck,
                    message=(f"{what}; {fix}. The job fails at {c.now_iso(fails_at)} if it still "
                             f"cannot start (HTJ_PENDING_TIMEOUT_S={pending_timeout_s:.0f})."),
                    requeue_s=max(fails_at - now_s, 0.0) + 0.5)


ATTACH_WAIT_S = 30.0
"""How long a bound pod may create its containers before its Events are read for Multi-Attach,
seconds (an attach normally takes seconds; the read is one list call per such job)."""


def wants_events(pods: Iterable[Mapping[str, Any]], now_s: float) -> bool:
    """Some pod is bound to a node, Pending and still creating its containers after
    :data:`ATTACH_WAIT_S` (where a Multi-Attach refusal shows only as an Event)."""
    for pod in pods:
        st = pod.get("status") or {}
        created = c.parse_iso((pod.get("metadata") or {}).get("creationTimestamp"))
        if (st.get("phase") or "Pending") != "Pending" or not (pod.get("spec") or {}).get("nodeName"):
            continue
        if created is not None and now_s - created >= ATTACH_WAIT_S:
            return True
    return False


def events_by_pod(events: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Pod Events grouped by the pod's name (``involvedObject.name``)."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for ev in events:
        name = str((ev.get("involvedObject") or {}).get("name") or "")
        if name:
            out.setdefault(name, []).append(ev)
    return out
