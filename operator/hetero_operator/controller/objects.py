"""The operator's side of Kueue and DRA objects: the API calls around :mod:`hetero_operator.render.workload`
and :mod:`hetero_operator.cluster.dra` (thin; every decision is in those pure modules).

Objects of other API groups go through :class:`hetero_operator.controller.customobjects.Objects`
(the client's generic ``CustomObjectsApi``, bounded and retried), so this module needs neither kopf
nor the kubernetes package. A group the cluster does not serve (Kueue or DRA not installed)
answers 404: DRA is then simply absent; a queued job waits with ``KueueNotInstalled``.  Every
object is the job's only with its controller ownerReference
(:mod:`hetero_operator.controller.ownership`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hetero_operator.api import conditions as c
from hetero_operator.api.spec import JobSpec, RunPolicy
from hetero_operator.api.types import Unschedulable
from hetero_operator.controller.customobjects import Objects, _status
from hetero_operator.controller.ownership import NOT_OWNED, NotOwned, check_owned, owned_by
from hetero_operator.lifecycle import decisions as lc
from hetero_operator.render import kueuestatus as kstatus
from hetero_operator.render import workload as kueue

PRIORITY_CLASSES = ("scheduling.k8s.io", "v1", "priorityclasses")
RESOURCE_SLICES = ("resource.k8s.io", "v1", "resourceslices")
RESOURCE_CLAIMS = ("resource.k8s.io", "v1", "resourceclaims")
RESOURCE_CLAIM_TEMPLATES = ("resource.k8s.io", "v1", "resourceclaimtemplates")


@dataclass(frozen=True, kw_only=True, slots=True)
class Gate:
    """Kueue's word on a queued job for one reconcile.

    Attributes:
        admitted: pods may run.
        reason / message: why not (the job's ``Suspended`` condition), or the admission.
        allowed: ``{gpu_type: FlavorPlacement}`` when admitted.
        evicted: Kueue evicted the Workload (its admission is cleared once the pods are gone).
        workload: the Workload object (``None`` before it exists).
        version: the Workload API version it was read in.
        user_suspended: the job's own ``spec.runPolicy.suspend``.
    """

    admitted: bool
    reason: str
    message: str
    allowed: Mapping[str, kueue.FlavorPlacement] = field(default_factory=dict)
    evicted: bool = False
    workload: Mapping[str, Any] | None = None
    version: str = kueue.VERSION
    user_suspended: bool = False
    not_owned: bool = False
    """A Workload of the job's name exists and is not the job's
    (:mod:`hetero_operator.controller.ownership`): the job waits, retried with backoff."""

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
QUEUE_REQUIRED = "QueueRequired"
"""Reason of a job without a queue on an operator that requires one (``HTJ_REQUIRE_QUEUE``)."""
QUEUE_LABEL_REMOVED = "QueueLabelRemoved"
"""Reason of a job whose queue label was removed while its Workload is not admitted."""
WARNED_GATE_REASONS = (NOT_OWNED, QUEUE_REQUIRED, QUEUE_LABEL_REMOVED)
"""Gate reasons that are Warning Events on the job (posted when the message changes)."""
ABSENT_RECHECK_S = 60.0
"""How long a cluster found serving no Kueue is not asked again for an unqueued job's Workload."""
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

    def __init__(self, api: Any, *, clock: Any = time.monotonic) -> None:
        self.objects = Objects(api)
        self.version: str | None = None
        self.clock = clock
        self._absent_until = 0.0
        self._queues: dict[tuple[str, str], tuple[str, str]] = {}
        """``(namespace, name) -> (job uid, queue)`` of every job seen with a queue."""

    async def _version(self) -> str | None:
        if self.version is None:
            for version in kueue.VERSIONS:
                if await self.objects.served(kueue.GROUP, version):
                    self.version = version
                    break
        return self.version

    def _not_installed(self, job: Mapping[str, Any], queue: str) -> Gate:
        self.version = None  # look again next time
        return Gate(admitted=False, reason=KUEUE_NOT_INSTALLED,
                    message=f"The job is queued ({kueue.QUEUE_LABEL}={queue}) but "
                            f"the cluster serves no Kueue Workloads ({kueue.GROUP} "
                            f"{' or '.join(kueue.VERSIONS)}); install Kueue or "
                            "remove the label")

    async def queue_of(self, job: Mapping[str, Any], spec: JobSpec, *, has_pods: bool) -> tuple[str, bool]:
        """The job's LocalQueue and whether its queue label was removed.

        One source: ``spec.run_policy.queue`` (the ``kueue.x-k8s.io/queue-name`` label, or
        ``spec.runPolicy.schedulingPolicy.queue`` when the label is absent; the two may not
        disagree, :func:`hetero_operator.api.spec.parse_job`).  A job that had a queue keeps it
        when the label goes (the chart's ValidatingAdmissionPolicy refuses that; this covers a
        cluster without it): the queue this operator saw, or, for a job without pods (about to
        start), the ``spec.queueName`` of the Workload the job owns.  So a job whose Workload is
        not admitted never starts outside the quota.

        Returns:
            ``(queue, removed)``: ``("", False)`` for a job that never had a queue.
        """
        meta = job["metadata"]
        key, uid = (meta["namespace"], meta["name"]), str(meta.get("uid") or "")
        if spec.run_policy.queue:
            self._queues[key] = (uid, spec.run_policy.queue)
            return spec.run_policy.queue, False
        seen = self._queues.get(key)
        if seen is not None and seen[0] == uid:  # not a re-created job of the same name
            return seen[1], True
        if has_pods:
            return "", False
        wl = await self.remembered(job)
        queue = str(((wl or {}).get("spec") or {}).get("queueName") or "")
        if queue:
            self._queues[key] = (uid, queue)
        return queue, bool(queue)

    async def remembered(self, job: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The Workload this job owns, ``None`` when there is none or Kueue is not served (a
        cluster without Kueue is asked again after :data:`ABSENT_RECHECK_S`)."""
        if self.version is None and self.clock() < self._absent_until:
            return None
        version = await self._version()
        if version is None:
            self._absent_until = self.clock() + ABSENT_RECHECK_S
            return None
        meta = job["metadata"]
        wl = await self.objects.get(kueue.workloads(version), meta["namespace"],
                                    kueue.workload_name(meta["name"], meta.get("uid", "")))
        return wl if wl is not None and owned_by(wl, str(meta.get("uid") or "")) else None

    async def gate(self, job: Mapping[str, Any], spec: JobSpec, capacity_plan: Any, *,
                   has_pods: bool, require_queue: bool) -> Gate | None:
        """Kueue's gate of a job that is not finished, ``None`` for a job that runs unqueued.

        The queue comes from :meth:`queue_of` (one source); a job without one waits under
        ``require_queue`` (:meth:`queue_required`).

        Args:
            job / spec / capacity_plan: as :meth:`check`.
            has_pods: the job has pods (a job without is about to start: its Workload is looked
                up even when the queue label is gone).
            require_queue: the operator's ``kueue.require_queue``.
        """
        queue, removed = await self.queue_of(job, spec, has_pods=has_pods)
        if queue:
            return await self.check(job, spec, capacity_plan, queue=queue, label_removed=removed)
        return self.queue_required() if require_queue else None

    def queue_required(self) -> Gate:
        """The gate of a job without a queue where the operator requires one
        (``HTJ_REQUIRE_QUEUE``): it waits, suspended, until it gets one."""
        return Gate(admitted=False, reason=QUEUE_REQUIRED,
                    message="This operator runs only queued jobs (HTJ_REQUIRE_QUEUE): label the "
                            f"job {kueue.QUEUE_LABEL}=<LocalQueue> (or set "
                            "spec.runPolicy.schedulingPolicy.queue); it starts once Kueue admits it")

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted job's remembered queue."""
        self._queues.pop((namespace, name), None)

    async def check(self, job: Mapping[str, Any], spec: JobSpec, capacity_plan: Any, *,
                    queue: str = "", label_removed: bool = False) -> Gate:
        """Ensure the Workload exists, make its ``spec.active`` follow the job's suspend, and read
        Kueue's decision.

        Args:
            job: the job object.
            spec: its parsed spec.
            capacity_plan: ``() -> Plan | Unschedulable`` on the cluster's capacity (called only
                when the Workload must be created).
            queue: the job's LocalQueue (:meth:`queue_of`); ``""``: ``spec.run_policy.queue``.
            label_removed: the job's queue label was removed (:meth:`queue_of`): a gate that
                keeps the job waiting says so and how to put it back.
        """
        queue = queue or spec.run_policy.queue or kueue.queue_name(job)
        if kueue.queue_name(job) != queue:  # the Workload's spec.queueName is read from the label
            meta = dict(job["metadata"])
            meta["labels"] = {**(meta.get("labels") or {}), kueue.QUEUE_LABEL: queue}
            job = {**job, "metadata": meta}
        gate = await self._check(job, spec, capacity_plan, queue)
        if label_removed and not gate.admitted and not gate.user_suspended:
            gate = replace(gate, reason=QUEUE_LABEL_REMOVED, message=(
                f"The job's {kueue.QUEUE_LABEL} label was removed, but it was queued in LocalQueue "
                f"{queue}, so it runs only when Kueue admits it there ({gate.reason}: "
                f"{gate.message.rstrip('.')}); put the label back ({kueue.QUEUE_LABEL}={queue}), or "
                "re-create the job without a queue"))
        return gate

    async def _check(self, job: Mapping[str, Any], spec: JobSpec, capacity_plan: Any,
                     queue: str) -> Gate:
        meta = job["metadata"]
        version = await self._version()
        if version is None:
            return self._not_installed(job, queue)
        gvr = kueue.workloads(version)
        name = kueue.workload_name(meta["name"], meta.get("uid", ""))
        wl = await self.objects.get(gvr, meta["namespace"], name)
        try:
            if wl is not None:
                check_owned({"kind": "Workload", **wl}, job)
        except NotOwned as exc:
            return Gate(admitted=False, reason=exc.reason, message=str(exc), version=version,
                        not_owned=True)
        if wl is None:
            plan = capacity_plan()
            if isinstance(plan, Unschedulable):
                return Gate(admitted=False, reason=plan.reason, version=version,
                            message=f"Unschedulable even on an empty cluster, so no Workload was "
                                    f"queued: {plan.message}")
            priority = await self._priority(spec.run_policy.priority_class)
            wl = kueue.render_workload(job, spec, plan, priority=priority, version=version)
            try:
                await self.objects.create_owned(gvr, wl, job)
            except NotOwned as exc:  # made between our read and our create
                return Gate(admitted=False, reason=exc.reason, message=str(exc), version=version,
                            not_owned=True)
            except Exception as exc:
                if _status(exc) == 404:
                    return self._not_installed(job, queue)
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
                                  templates: Sequence[Mapping[str, Any]],
                                  owner: Mapping[str, Any] | None = None) -> None:
    """Delete the templates of the attempt before (``stale``; 404s ignored, and one that is not
    ``owner``'s is left alone), then create this attempt's (409 tolerated for ``owner``'s own: a
    retried start), so no pod of the new attempt can claim from an old template
    (:mod:`hetero_operator.render.claims`).

    Raises:
        NotOwned: a template of this attempt's name exists and is not ``owner``'s.
    """
    new = {t["metadata"]["name"] for t in templates}
    uid = str((owner or {}).get("metadata", {}).get("uid") or "")
    for name in stale:
        if name not in new:
            current = await objects.get(RESOURCE_CLAIM_TEMPLATES, namespace, name)
            if current is not None and (owner is None or owned_by(current, uid)):
                await objects.delete(RESOURCE_CLAIM_TEMPLATES, namespace, name)
    for template in templates:
        if owner is None:  # no ownership asked (callers before ownership checks)
            await objects.create(RESOURCE_CLAIM_TEMPLATES, template)
        else:
            await objects.create_owned(RESOURCE_CLAIM_TEMPLATES, template, owner)
