"""The operator's side of Kueue and DRA objects: the API calls around :mod:`hetero_operator.render.workload`
and :mod:`hetero_operator.cluster.dra` (thin; every decision is in those pure modules).

Objects of other API groups (Kueue's Workloads and ResourceFlavors, PriorityClasses, DRA's
ResourceSlices/Claims/ClaimTemplates) go through the client's generic ``CustomObjectsApi`` with
the bounded, retried calls of :class:`hetero_operator.controller.k8s.Api`, so this module needs neither kopf
nor the kubernetes package. A group the cluster does not serve (Kueue or DRA not installed)
answers 404: DRA is then simply absent; a queued job waits with ``KueueNotInstalled``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hetero_operator.api import conditions as c
from hetero_operator.api.spec import JobSpec, RunPolicy
from hetero_operator.api.types import Unschedulable
from hetero_operator.lifecycle import decisions as lc
from hetero_operator.render import workload as kueue

PRIORITY_CLASSES = ("scheduling.k8s.io", "v1", "priorityclasses")
RESOURCE_SLICES = ("resource.k8s.io", "v1", "resourceslices")
RESOURCE_CLAIMS = ("resource.k8s.io", "v1", "resourceclaims")
RESOURCE_CLAIM_TEMPLATES = ("resource.k8s.io", "v1", "resourceclaimtemplates")


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


class _NotServed(Exception):
    status = 404


class Objects:
    """Generic object calls over an :class:`hetero_operator.controller.k8s.Api` (its bounded ``_call``).

    An API object without the generic client (``custom``), such as a test double of the core
    calls only, serves none of these groups: every call answers as a 404 would.

    Args:
        api: the operator's API wrapper.
    """

    def __init__(self, api: Any) -> None:
        self.api = api

    async def _call(self, method: str, *args: Any) -> Any:
        custom = getattr(self.api, "custom", None)
        if custom is None:
            raise _NotServed(method)
        return await self.api._call(getattr(custom, method), *args)

    async def get(self, gvr: tuple[str, str, str], namespace: str | None, name: str
                  ) -> dict[str, Any] | None:
        """The object, ``None`` on 404 (absent, or the API group is not served)."""
        group, version, plural = gvr
        try:
            if namespace is None:
                return await self._call("get_cluster_custom_object", group, version, plural, name)
            return await self._call("get_namespaced_custom_object", group, version, namespace,
                                    plural, name)
        except Exception as exc:
            if _status(exc) == 404:
                return None
            raise

    async def list(self, gvr: tuple[str, str, str]) -> list[dict[str, Any]] | None:
        """Every object of a resource in all namespaces; ``None`` when the group is not served."""
        group, version, plural = gvr
        try:
            data = await self._call("list_cluster_custom_object", group, version, plural)
        except Exception as exc:
            if _status(exc) == 404:
                return None
            raise
        return list(data.get("items") or [])

    async def create(self, gvr: tuple[str, str, str], obj: Mapping[str, Any]) -> bool:
        """Create a namespaced object; ``False`` when it exists already (409).

        Raises:
            Exception: 404 when the API group is not served, and other API errors.
        """
        group, version, plural = gvr
        try:
            await self._call("create_namespaced_custom_object", group, version,
                             obj["metadata"]["namespace"], plural, dict(obj))
            return True
        except Exception as exc:
            if _status(exc) == 409:
                return False
            raise

    async def patch_status(self, gvr: tuple[str, str, str], namespace: str, name: str,
                           status: Mapping[str, Any]) -> None:
        """Merge-patch the ``status`` subresource (404 ignored: the object is gone)."""
        group, version, plural = gvr
        try:
            await self._call("patch_namespaced_custom_object_status", group, version, namespace,
                             plural, name, {"status": dict(status)})
        except Exception as exc:
            if _status(exc) != 404:
                raise


@dataclass(frozen=True, kw_only=True, slots=True)
class Gate:
    """Kueue's word on a queued job for one reconcile.

    Attributes:
        admitted: pods may run.
        reason / message: why not (the job's ``Suspended`` condition), or the admission.
        allowed: ``{gpu_type: FlavorPlacement}`` when admitted.
        evicted: Kueue evicted the Workload (its admission is cleared once the pods are gone).
        workload: the Workload object (``None`` before it exists).
    """

    admitted: bool
    reason: str
    message: str
    allowed: Mapping[str, kueue.FlavorPlacement] = field(default_factory=dict)
    evicted: bool = False
    workload: Mapping[str, Any] | None = None

    def policy(self, spec: JobSpec) -> RunPolicy:
        """The run policy the lifecycle sees: suspended unless admitted."""
        return spec.run_policy if self.admitted else replace(spec.run_policy, suspend=True)

    def explain(self, decision: lc.Decision) -> lc.Decision:
        """A ``Suspend`` decision caused by the gate carries Kueue's reason and message."""
        if self.admitted or decision.action != lc.SUSPEND:
            return decision
        return replace(decision, reason=self.reason, message=self.message)


class KueueGate:
    """Creates, reads and updates a queued job's Workload.

    Args:
        api: the operator's :class:`hetero_operator.controller.k8s.Api`.
    """

    def __init__(self, api: Any) -> None:
        self.objects = Objects(api)

    async def check(self, job: Mapping[str, Any], spec: JobSpec, capacity_plan: Any) -> Gate:
        """Ensure the Workload exists and read Kueue's decision.

        Args:
            job: the job object.
            spec: its parsed spec.
            capacity_plan: ``() -> Plan | Unschedulable`` on the cluster's capacity (called only
                when the Workload must be created).
        """
        meta = job["metadata"]
        name = kueue.workload_name(meta["name"], meta.get("uid", ""))
        wl = await self.objects.get(kueue.WORKLOADS, meta["namespace"], name)
        if wl is None:
            plan = capacity_plan()
            if isinstance(plan, Unschedulable):
                return Gate(admitted=False, reason=plan.reason,
                            message=f"Unschedulable even on an empty cluster, so no Workload was "
                                    f"queued: {plan.message}")
            priority = await self._priority(spec.run_policy.priority_class)
            wl = kueue.render_workload(job, spec, plan, priority=priority)
            try:
                await self.objects.create(kueue.WORKLOADS, wl)
            except Exception as exc:
                if _status(exc) == 404:
                    return Gate(admitted=False, reason="KueueNotInstalled",
                                message=f"The job is queued ({kueue.QUEUE_LABEL}="
                                        f"{kueue.queue_name(job)}) but the cluster serves no "
                                        f"{kueue.API_VERSION} Workloads; install Kueue or remove "
                                        "the label")
                raise
        adm = kueue.read_admission(wl)
        if adm.state == kueue.EVICT:
            return Gate(admitted=False, reason=adm.reason, message=adm.message, evicted=True,
                        workload=wl)
        if adm.state == kueue.PENDING:
            return Gate(admitted=False, reason=adm.reason, message=adm.message, workload=wl)
        flavors = {f["metadata"]["name"]: f for f in await self.objects.list(kueue.RESOURCE_FLAVORS) or ()}
        try:
            allowed = kueue.placements(adm, wl, flavors)
        except kueue.FlavorMismatch as exc:
            return Gate(admitted=False, reason="FlavorMismatch", message=str(exc), workload=wl)
        return Gate(admitted=True, reason=adm.reason, message=adm.message, allowed=allowed,
                    workload=wl)

    async def after(self, gate: Gate, job: Mapping[str, Any], decision: lc.Decision,
                    live_pods: Sequence[Any], now_iso: str) -> None:
        """Write back what the job did: admission cleared once an evicted job has no pods left;
        ``Finished`` when the job finished (Kueue frees the quota)."""
        wl = gate.workload
        if wl is None:
            return
        meta = wl["metadata"]
        if gate.evicted and not live_pods and (wl.get("status") or {}).get("admission"):
            await self.objects.patch_status(kueue.WORKLOADS, meta["namespace"], meta["name"],
                                            kueue.cleared_admission_status(wl, now_iso))
        if decision.phase in c.FINISHED_PHASES:
            patch = kueue.finished_status(wl, succeeded=decision.phase == c.SUCCEEDED,
                                          message=decision.message or decision.phase,
                                          now_iso=now_iso)
            if patch is not None:
                await self.objects.patch_status(kueue.WORKLOADS, meta["namespace"], meta["name"], patch)

    async def _priority(self, priority_class: str) -> int | None:
        if not priority_class:
            return None
        pc = await self.objects.get(PRIORITY_CLASSES, None, priority_class)
        return None if pc is None else int(pc.get("value", 0))


async def dra_objects(objects: Objects) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(ResourceSlices, ResourceClaims)`` of the cluster; empty lists where DRA is not served."""
    slices = await objects.list(RESOURCE_SLICES) or []
    if not slices:
        return [], []
    return slices, await objects.list(RESOURCE_CLAIMS) or []
