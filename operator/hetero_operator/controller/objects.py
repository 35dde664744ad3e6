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
from hetero_operator.render import kueuestatus as kstatus
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
                           status: Mapping[str, Any], *, resource_version: str | None = None,
                           ) -> bool:
        """Merge-patch the ``status`` subresource (404 ignored: the object is gone).

        With ``resource_version`` the patch applies only to that version of the object.

        Returns:
            False when the object changed since ``resource_version`` (409), else True.
        """
        group, version, plural = gvr
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        try:
            await self._call("patch_namespaced_custom_object_status", group, version, namespace,
                             plural, name, body)
        except Exception as exc:
            if _status(exc) == 409:
                return False
            if _status(exc) != 404:
                raise
        return True

    async def patch(self, gvr: tuple[str, str, str], namespace: str, name: str,
                    patch: Mapping[str, Any]) -> None:
        """Merge-patch a namespaced object (404 ignored: the object is gone)."""
        group, version, plural = gvr
        try:
            await self._call("patch_namespaced_custom_object", group, version, namespace, plural,
                             name, dict(patch))
        except Exception as exc:
            if _status(exc) != 404:
                raise

    async def delete(self, gvr: tuple[str, str, str], namespace: str, name: str) -> bool:
        """Delete a namespaced object; False when it was not there (404)."""
        group, version, plural = gvr
        try:
            await self._call("delete_namespaced_custom_object", group, version, namespace, plural, name)
        except Exception as exc:
            if _status(exc) == 404:
                return False
            raise
        return True

    async def served(self, group: str, version: str) -> bool:
        """Whether the cluster serves ``group/version`` (API discovery; any error but a 404 raises)."""
        try:
            await self._call("get_api_resources", group, version)
        except Exception as exc:
            if _status(exc) == 404:
                return False
            raise
        return True


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
    version: str = kueue.VERSION
    user_suspended: bool = False

    def policy(self, spec: JobSpec) -> RunPolicy:
        """The run policy the lifecycle sees: suspended unless admitted."""
        return spec.run_policy if self.admitted else replace(spec.run_policy, suspend=True)

    def explain(self, decision: lc.Decision) -> lc.Decision:
        """A ``Suspend`` decision caused by the gate carries Kueue's reason and message (the
        user's own suspend keeps the lifecycle's)."""
        if self.admitted or self.user_suspended or decision.action != lc.SUSPEND:
            return decision
        return replace(decision, reason=self.reason, message=self.message)


KUEUE_NOT_INSTALLED = "KueueNotInstalled"
STATUS_ATTEMPTS = 3
"""Read-merge-patch rounds of a Workload status change before the next reconcile tries again."""


class KueueGate:
    """Creates, reads and updates a queued job's Workload (contract: :mod:`hetero_operator.render.kueuestatus`).

    The Workload version is the first of :data:`~hetero_operator.render.workload.VERSIONS` the
    cluster serves (API discovery, remembered until a call answers 404): a Kueue serving only
    ``v1beta1`` (<= 0.14) is served through ``v1beta1`` (shared case 49).

    Args:
        api: the operator's :class:`hetero_operator.controller.k8s.Api`.
    """

    def __init__(self, api: Any) -> None:
        self.objects = Objects(api)
        self.version: str | None = None

    async def _version(self) -> str | None:
        if self.version is None:
            for version in kueue.VERSIONS:
                if await self.objects.served(kueue.GROUP, version):
                    self.version = version
                    break
        return self.version

    def _not_installed(self, job: Mapping[str, Any]) -> Gate:
        self.version = None  # look again next time
        return Gate(admitted=False, reason=KUEUE_NOT_INSTALLED,
                    message=f"The job is queued ({kueue.QUEUE_LABEL}={kueue.queue_name(job)}) but "
                            f"the cluster serves no Kueue Workloads ({kueue.GROUP} "
                            f"{' or '.join(kueue.VERSIONS)}); install Kueue or "
                            "remove the label")

    async def check(self, job: Mapping[str, Any], spec: JobSpec, capacity_plan: Any) -> Gate:
        """Ensure the Workload exists, make its ``spec.active`` follow the job's suspend, and read
        Kueue's decision.

        Args:
            job: the job object.
            spec: its parsed spec.
            capacity_plan: ``() -> Plan | Unschedulable`` on the cluster's capacity (called only
                when the Workload must be created).
        """
        meta = job["metadata"]
        version = await self._version()
        if version is None:
            return self._not_installed(job)
        gvr = kueue.workloads(version)
        name = kueue.workload_name(meta["name"], meta.get("uid", ""))
        wl = await self.objects.get(gvr, meta["namespace"], name)
        if wl is None:
            plan = capacity_plan()
            if isinstance(plan, Unschedulable):
                return Gate(admitted=False, reason=plan.reason, version=version,
                            message=f"Unschedulable even on an empty cluster, so no Workload was "
                                    f"queued: {plan.message}")
            priority = await self._priority(spec.run_policy.priority_class)
            wl = kueue.render_workload(job, spec, plan, priority=priority, version=version)
            try:
                await self.objects.create(gvr, wl)
            except Exception as exc:
                if _status(exc) == 404:
                    return self._not_installed(job)
                raise
        suspended = spec.run_policy.suspend
        active = kstatus.active_patch(wl, suspended=suspended)
        if active is not None:  # a user's suspend releases the quota, a resume queues it again
            await self.objects.patch(gvr, meta["namespace"], name, active)
        gate = await self._gate(wl, version)
        return replace(gate, user_suspended=suspended) if suspended else gate

    async def _gate(self, wl: Mapping[str, Any], version: str) -> Gate:
        adm = kueue.read_admission(wl)
        if adm.state == kueue.EVICT:
            return Gate(admitted=False, reason=adm.reason, message=adm.message, evicted=True,
                        workload=wl, version=version)
        if adm.state == kueue.PENDING:
            return Gate(admitted=False, reason=adm.reason, message=adm.message, workload=wl,
                        version=version)
        flavors = {f["metadata"]["name"]: f
                   for f in await self.objects.list(kueue.resource_flavors(version)) or ()}
        try:
            allowed = kueue.placements(adm, wl, flavors)
        except kueue.FlavorMismatch as exc:
            return Gate(admitted=False, reason="FlavorMismatch", message=str(exc), workload=wl,
                        version=version)
        except kstatus.PodSetUpdateConflict as exc:
            return Gate(admitted=False, reason="AdmissionCheckConflict", message=str(exc),
                        workload=wl, version=version)
        return Gate(admitted=True, reason=adm.reason, message=adm.message, allowed=allowed,
                    workload=wl, version=version)

    async def after(self, gate: Gate, job: Mapping[str, Any], decision: lc.Decision,
                    live_pods: Sequence[Any], now_iso: str) -> None:
        """Write back what the job did, each change merged into the Workload as just read:
        ``PodsReady`` (every rank running or not), the admission cleared once an evicted job has
        no pods left, ``Finished`` when the job finished (Kueue frees the quota)."""
        if gate.workload is None:
            return
        world = int(((job.get("status") or {}).get("plan") or {}).get("worldSize") or 0)
        running = kstatus.all_ranks_running(live_pods, world)
        finished = decision.phase in c.FINISHED_PHASES

        def change(wl: Mapping[str, Any]) -> dict[str, Any] | None:
            status: dict[str, Any] = {}
            updates = []
            if not finished:
                updates.append(kstatus.pods_ready(wl, admitted=gate.admitted, all_running=running))
            if gate.evicted and not live_pods and (wl.get("status") or {}).get("admission"):
                cleared = kueue.cleared_admission_status(wl, now_iso)
                status["admission"] = None
                updates += [x for x in cleared["conditions"] if x.get("type") in (
                    kueue.QUOTA_RESERVED, kueue.ADMITTED, kueue.REQUEUED)]
            done = kueue.finished_status(wl, succeeded=decision.phase == c.SUCCEEDED,
                                         message=decision.message or decision.phase,
                                         now_iso=now_iso) if finished else None
            if done is not None:
                updates += [x for x in done["conditions"] if x.get("type") == kueue.FINISHED]
            conditions = kstatus.merged_conditions(wl, updates, now_iso)
            if conditions is not None:
                status["conditions"] = conditions
            return status or None

        await self._patch_status(gate, change)

    async def _patch_status(self, gate: Gate, change: Any) -> None:
        """Apply ``change(workload) -> status patch | None`` with optimistic concurrency: the
        patch carries the ``resourceVersion`` it was computed from; on a conflict the Workload is
        read again and the change computed again (Kueue's own writes are kept)."""
        assert gate.workload is not None
        wl: Mapping[str, Any] | None = gate.workload
        meta = gate.workload["metadata"]
        gvr = kueue.workloads(gate.version)
        for _ in range(STATUS_ATTEMPTS):
            if wl is not None and not (wl.get("metadata") or {}).get("resourceVersion"):
                wl = await self.objects.get(gvr, meta["namespace"], meta["name"])  # just created
            if wl is None:
                return
            status = change(wl)
            if status is None:
                return
            rv = wl["metadata"]["resourceVersion"]
            if await self.objects.patch_status(gvr, meta["namespace"], meta["name"], status,
                                               resource_version=rv):
                return
            wl = await self.objects.get(gvr, meta["namespace"], meta["name"])

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


async def replace_claim_templates(objects: Objects, namespace: str, stale: Sequence[str],
                                  templates: Sequence[Mapping[str, Any]]) -> None:
    """Delete the templates of the attempt before (``stale``, 404s ignored), then create this
    attempt's (409 tolerated: a retried start), so no pod of the new attempt can claim from an
    old template (:mod:`hetero_operator.render.claims`)."""
    new = {t["metadata"]["name"] for t in templates}
    for name in stale:
        if name not in new:
            await objects.delete(RESOURCE_CLAIM_TEMPLATES, namespace, name)
    for template in templates:
        await objects.create(RESOURCE_CLAIM_TEMPLATES, template)
