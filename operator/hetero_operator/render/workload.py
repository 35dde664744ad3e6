"""Kueue admission of a job, one pod set per GPU type (pure: dicts in, dicts out; no kopf).

A job labelled ``kueue.x-k8s.io/queue-name`` runs only inside what Kueue admitted. The operator
plays the part of Kueue's ``jobframework`` for an external framework (kueue.sigs.k8s.io, "Integrate
a custom Job with Kueue": the job kind is listed in Kueue's ``integrations.externalFrameworks``):

1. it creates a ``Workload`` (``kueue.x-k8s.io/v1beta2``), controlled by the job, with **one pod
   set per GPU type** of a plan made on the cluster's capacity (:func:`render_workload`); each pod
   set selects its GPU type (``nvidia.com/gpu.product``) and requests one GPU per pod, so Kueue
   can only pick a flavor whose node labels fit that type, and a mixed-GPU job is naturally the
   "one flavor per pod set" that Kueue assigns;
2. no pod exists until the Workload is admitted (condition ``Admitted`` and ``status.admission``);
3. on admission the plan is made again, within what was admitted (:func:`restrict_inventory`:
   only admitted GPU types, only nodes carrying the admitted flavor's node labels, at most the
   admitted count per type), and every pod gets the flavor's ``nodeLabels`` as ``nodeSelector``
   and its ``tolerations`` (:func:`add_placements`, an input of the pod renderer);
4. on eviction (condition ``Evicted``) the pods are deleted and the admission cleared, as
   ``jobframework`` does (:func:`cleared_admission_status`); on re-admission the job starts again
   and resumes from its checkpoint;
5. when the job finishes the Workload gets ``Finished`` so Kueue releases the quota.

Why a Workload and not Kueue's pod-group integration: a pod group (``kueue.x-k8s.io/pod-group-name``
on plain pods) is admitted as one pod set per distinct pod template *after* the pods exist
(gated by a scheduling gate), so the pods would have to be created before admission from a plan
Kueue may then contradict, and their node affinity (we pin nodes) is fixed at creation. A
Workload of our own is admitted before any pod exists, its pod sets are exactly our GPU types, and
the plan is made once the flavors are known.

What a pod-set "pod" is: one rank (one GPU of the type). Our pods host all ranks of a node's group
(one process per GPU), so a pod with ``n`` ranks appears as ``n`` pod-set pods; GPU quota is
exact, and the worker's CPU/memory requests are counted once per rank, an upper bound when a pod
hosts several ranks.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from hetero_operator.api.labels import ANNOTATION_GPU_TYPE, LABEL_JOB
from hetero_operator.api.spec import API_GROUP, JobSpec
from hetero_operator.api.spec import VERSION as API_VERSION_NAME
from hetero_operator.api.types import Device, GroupPlan, Inventory, NodeInventory, Plan
from hetero_operator.api.workerspec import pod_resources
from hetero_operator.cluster import gfd
from hetero_operator.render import kueuestatus as kstatus
from hetero_operator.render.pods import GroupInputs, PodInputs

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"
WORKLOADS = (GROUP, VERSION, "workloads")
RESOURCE_FLAVORS = (GROUP, VERSION, "resourceflavors")
VERSIONS = ("v1beta2", "v1beta1")
"""Workload versions the operator speaks, preferred first: v1beta2 (Kueue >= 0.15, its storage
version from 0.16) and v1beta1 (Kueue <= 0.14 serves only it; 0.15-0.17 serve both).  The pod
sets, admission and checks read and written are the same in both; only the priority differs
(v1beta2 ``priorityClassRef``, v1beta1 ``priorityClassName`` + ``priorityClassSource``)."""


def workloads(version: str = VERSION) -> tuple[str, str, str]:
    """The Workload resource in ``version``."""
    return (GROUP, version, "workloads")


def resource_flavors(version: str = VERSION) -> tuple[str, str, str]:
    """The ResourceFlavor resource in ``version``."""
    return (GROUP, version, "resourceflavors")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
GPU_TYPE_ANNOTATION = ANNOTATION_GPU_TYPE
PRODUCT_LABEL = gfd.PRODUCT
MAX_POD_SETS = 18
"""Kueue's limit on ``spec.podSets`` (``maxItems`` in the v1beta2 Workload CRD, v0.19.2)."""

# Workload condition types (kueue.x-k8s.io/v1beta2 WorkloadConditionType).
QUOTA_RESERVED = "QuotaReserved"
ADMITTED = "Admitted"
EVICTED = "Evicted"
FINISHED = "Finished"
REQUEUED = "Requeued"

# What the gate says.
PENDING = "Pending"
"""Not admitted (yet): no pods may exist."""
RUN = "Run"
"""Admitted: pods may run, within the admission."""
EVICT = "Evict"
"""Evicted or preempted: stop the pods, clear the admission, wait to be admitted again."""


def queue_name(job: Mapping[str, Any]) -> str:
    """The job's LocalQueue from its ``kueue.x-k8s.io/queue-name`` label, ``""`` when unqueued."""
    return str(((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL) or "")


def workload_name(job_name: str, job_uid: str) -> str:
    """``heterotrainingjob-<job>-<hash>``: deterministic per job object (a re-created job with the
    same name gets a new Workload), shaped like Kueue's own ``GetWorkloadNameForOwnerWithGVK``."""
    digest = hashlib.sha256(f"{job_name}/{job_uid}".encode()).hexdigest()[:5]
    return f"heterotrainingjob-{job_name}-{digest}"


def pod_set_name(gpu_type: str) -> str:
    """A DNS label (Kueue's pod-set name rule) for a GPU type: ``Tesla-T4`` -> ``tesla-t4``,
    ``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`` -> ``nvidia-a100-sxm4-40gb-mig-1g-5gb``; longer than 63
    characters: cut, plus a hash of the whole type."""
    name = re.sub(r"[^a-z0-9]+", "-", gpu_type.lower()).strip("-") or "gpu"
    if len(name) > 63:
        digest = hashlib.sha256(gpu_type.encode()).hexdigest()[:6]
        name = f"{name[:56].rstrip('-')}-{digest}"
    return name


@dataclass(frozen=True, kw_only=True, slots=True)
class PodSetShape:
    """One GPU type of a plan as a Kueue pod set.

    Attributes:
        name: pod-set name (:func:`pod_set_name`).
        gpu_type: GFD-style type, ``"NVIDIA-A100-SXM4-80GB-MIG-3g.40gb"``.
        product_label: the ``nvidia.com/gpu.product`` value of nodes with this type (the base
            product; with ``-MIG-<profile>`` under GFD's single MIG strategy).
        resource_name: extended resource of one device, ``nvidia.com/gpu`` or ``nvidia.com/mig-…``.
        count: ranks (= GPUs) of this type.
    """

    name: str
    gpu_type: str
    product_label: str
    resource_name: str
    count: int


def pod_set_shapes(plan: Plan) -> list[PodSetShape]:
    """One :class:`PodSetShape` per GPU type of ``plan``, in the order of first rank.

    Raises:
        ValueError: more GPU types than Kueue allows pod sets (:data:`MAX_POD_SETS`).
    """
    shapes: dict[str, PodSetShape] = {}
    for g in plan.groups:
        shape = shapes.get(g.gpu_type)
        if shape is None:
            single = g.mig_profile and g.resource_name == gfd.GPU_RESOURCE
            shapes[g.gpu_type] = PodSetShape(
                name=pod_set_name(g.gpu_type), gpu_type=g.gpu_type,
                product_label=g.gpu_type if single else g.product, resource_name=g.resource_name,
                count=len(g.ranks))
        else:
            shapes[g.gpu_type] = replace(shape, count=shape.count + len(g.ranks))
    if len(shapes) > MAX_POD_SETS:
        raise ValueError(f"{len(shapes)} GPU types but a Kueue Workload holds at most "
                         f"{MAX_POD_SETS} pod sets; restrict spec.gpus.allowedProducts")
    return list(shapes.values())


def capacity_inventory(inventory: Inventory) -> Inventory:
    """``inventory`` with every device free: the shape a job asks Kueue for does not depend on
    what other jobs hold right now (Kueue's quota decides when it may run)."""
    nodes = tuple(replace(n, devices=tuple(replace(d, free=d.total) for d in n.devices))
                  for n in inventory.nodes)
    return replace(inventory, nodes=nodes)


def render_workload(job: Mapping[str, Any], spec: JobSpec, plan: Plan, *,
                    priority: int | None = None, version: str = VERSION) -> dict[str, Any]:
    """The Workload of a queued job.

    Args:
        job: the job object (name, namespace, uid).
        spec: the parsed job.
        plan: a plan of the job (on :func:`capacity_inventory`): its GPU types and counts.
        priority: value of ``spec.runPolicy.schedulingPolicy.priorityClass``'s PriorityClass;
            None when the job names none (Kueue then uses 0 or its default).
        version: one of :data:`VERSIONS` (what the cluster's Kueue serves).

    Returns:
        A ``kueue.x-k8s.io/<version>`` Workload with a controller owner reference to the job.
    """
    meta = job["metadata"]
    requests = dict(pod_resources(spec.worker, 1).get("requests") or {})  # a pod set is 1 GPU
    pod_sets = []
    for shape in pod_set_shapes(plan):
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "nodeSelector": {PRODUCT_LABEL: shape.product_label},
            "tolerations": [{"key": gfd.GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "worker",
                            "resources": {"requests": {**requests, shape.resource_name: "1"},
                                          "limits": {shape.resource_name: "1"}}}],
        }
        image = _image(plan, shape.gpu_type)
        if image:  # informational for Kueue; the pods are rendered from the plan at admission
            pod_spec["containers"][0]["image"] = image
        if spec.run_policy.priority_class:
            pod_spec["priorityClassName"] = spec.run_policy.priority_class
        pod_sets.append({"name": shape.name, "count": shape.count, "template": {
            "metadata": {"annotations": {GPU_TYPE_ANNOTATION: shape.gpu_type}},
            "spec": pod_spec}})
    body: dict[str, Any] = {"queueName": queue_name(job), "podSets": pod_sets}
    if spec.run_policy.priority_class and priority is not None:
        if version == "v1beta1":
            body["priorityClassName"] = spec.run_policy.priority_class
            body["priorityClassSource"] = "scheduling.k8s.io/priorityclass"
        else:
            body["priorityClassRef"] = {"group": "scheduling.k8s.io", "kind": "PriorityClass",
                                        "name": spec.run_policy.priority_class}
        body["priority"] = int(priority)
    body["active"] = not spec.run_policy.suspend  # a user's suspend holds no quota
    meta_annotations = ({kstatus.DEACTIVATED_BY: kstatus.USER_SUSPEND}
                        if spec.run_policy.suspend else {})
    return {
        "apiVersion": f"{GROUP}/{version}", "kind": "Workload",
        "metadata": {
            "name": workload_name(meta["name"], meta.get("uid", "")), "namespace": meta["namespace"],
            "labels": {JOB_UID_LABEL: str(meta.get("uid", "")),
                       LABEL_JOB: meta["name"]},
            **({"annotations": meta_annotations} if meta_annotations else {}),
            "ownerReferences": [{"apiVersion": job.get("apiVersion", f"{API_GROUP}/{API_VERSION_NAME}"),
                                 "kind": job.get("kind", "HeteroTrainingJob"),
                                 "name": meta["name"], "uid": meta.get("uid", ""),
                                 "controller": True, "blockOwnerDeletion": True}]},
        "spec": body,
    }


def _image(plan: Plan, gpu_type: str) -> str:
    return next((g.image for g in plan.groups if g.gpu_type == gpu_type and g.image), "")


# --- reading what Kueue decided -------------------------------------------------------------

@dataclass(frozen=True, kw_only=True, slots=True)
class Admission:
    """What Kueue decided about a Workload.

    Attributes:
        state: :data:`PENDING`, :data:`RUN` or :data:`EVICT`.
        reason: CamelCase reason for the job's condition (Kueue's own where it gave one).
        message: one sentence.
        flavors: ``{pod set: {resource: flavor}}`` of the admission (empty unless admitted).
        counts: ``{pod set: admitted count}``.
        gpu_types: ``{pod set: GPU type}`` from the Workload's pod-set templates.
    """

    state: str
    reason: str
    message: str
    flavors: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    counts: Mapping[str, int] = field(default_factory=dict)
    gpu_types: Mapping[str, str] = field(default_factory=dict)


def _condition(workload: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    return next((c for c in (workload.get("status") or {}).get("conditions") or ()
                 if c.get("type") == type_), {})


def read_admission(workload: Mapping[str, Any]) -> Admission:
    """The gate's view of a Workload: evicted, admitted (with flavors) or pending."""
    name = (workload.get("metadata") or {}).get("name", "")
    spec = workload.get("spec") or {}
    gpu_types = {ps.get("name", "main"): ((ps.get("template") or {}).get("metadata") or {})
                 .get("annotations", {}).get(GPU_TYPE_ANNOTATION, "")
                 for ps in spec.get("podSets") or ()}
    evicted = _condition(workload, EVICTED)
    if evicted.get("status") == "True":
        return Admission(state=EVICT, reason=f"Evicted{evicted.get('reason', '')}",
                         message=f"Kueue evicted Workload {name}: "
                                 f"{evicted.get('message') or evicted.get('reason', 'no reason given')}",
                         gpu_types=gpu_types)
    admission = (workload.get("status") or {}).get("admission")
    if _condition(workload, ADMITTED).get("status") == "True" and admission:
        flavors = {a.get("name", "main"): dict(a.get("flavors") or {})
                   for a in admission.get("podSetAssignments") or ()}
        counts = {ps.get("name", "main"): int(ps.get("count", 1)) for ps in spec.get("podSets") or ()}
        counts.update({a.get("name", "main"): int(a["count"])
                       for a in admission.get("podSetAssignments") or () if "count" in a})
        return Admission(state=RUN, reason="Admitted",
                         message=f"Kueue admitted Workload {name} in ClusterQueue "
                                 f"{admission.get('clusterQueue', '?')}",
                         flavors=flavors, counts=counts, gpu_types=gpu_types)
    quota = _condition(workload, QUOTA_RESERVED)
    why = quota.get("message") or "waiting for quota in its ClusterQueue"
    checks = kstatus.pending_checks(workload)
    if quota.get("status") == "True" and checks:  # quota held; Admitted waits for the checks
        why = f"quota reserved, waiting for admission check {', '.join(checks)}"
    return Admission(state=PENDING, reason="WaitingForAdmission",
                     message=f"Queued in LocalQueue {spec.get('queueName', '?')}: Workload {name} "
                             f"is not admitted ({why})", gpu_types=gpu_types)


@dataclass(frozen=True, kw_only=True, slots=True)
class FlavorPlacement:
    """Where one GPU type may run after admission.

    Attributes:
        gpu_type: the type.
        flavor: ResourceFlavor name.
        node_labels: the flavor's ``spec.nodeLabels`` and the admission checks' nodeSelector
            (become the pods' ``nodeSelector``).
        tolerations: the flavor's ``spec.tolerations`` and the checks' (added to the pods).
        count: admitted ranks of this type.
        labels / annotations: the admission checks' ``podSetUpdates`` for the pods' metadata.
    """

    gpu_type: str
    flavor: str
    node_labels: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    count: int
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


class FlavorMismatch(ValueError):
    """An admitted flavor's node labels contradict its pod set's GPU type (case 35)."""


def placements(admission: Admission, workload: Mapping[str, Any],
               flavors: Mapping[str, Mapping[str, Any]]) -> dict[str, FlavorPlacement]:
    """``{gpu_type: FlavorPlacement}`` of an admitted Workload.

    The flavor of a pod set is the one assigned to its GPU resource (any assigned flavor when
    Kueue covers only other resources).

    Args:
        admission: :func:`read_admission` of ``workload`` (state :data:`RUN`).
        workload: the Workload (pod-set templates: product selector, GPU resource).
        flavors: ResourceFlavor objects by name.

    Admission checks' ``podSetUpdates`` (:func:`~hetero_operator.render.kueuestatus.pod_set_updates`)
    add their nodeSelector and tolerations to the placement and their labels and annotations to
    the pods (shared case 42).

    Raises:
        FlavorMismatch: a flavor pins ``nvidia.com/gpu.product`` to another product than its pod
            set's, or a flavor is missing.
        kueuestatus.PodSetUpdateConflict: an admission check's update contradicts the pod set's
            selector (its product or flavor labels) or another check.
    """
    updates = kstatus.pod_set_updates(workload)
    out = {}
    for ps in (workload.get("spec") or {}).get("podSets") or ():
        name = ps.get("name", "main")
        gpu_type = admission.gpu_types.get(name, "")
        assigned = admission.flavors.get(name) or {}
        pod_spec = (ps.get("template") or {}).get("spec") or {}
        gpu_resources = [r for c in pod_spec.get("containers") or ()
                         for r in ((c.get("resources") or {}).get("requests") or {})
                         if r.startswith("nvidia.com/")]
        flavor_name = next((assigned[r] for r in gpu_resources if r in assigned),
                           next(iter(assigned.values()), ""))
        flavor = flavors.get(flavor_name)
        if flavor is None:
            raise FlavorMismatch(f"pod set {name} ({gpu_type}) was admitted to ResourceFlavor "
                                 f"{flavor_name or '(none)'}, which does not exist")
        fspec = flavor.get("spec") or {}
        node_labels = dict(fspec.get("nodeLabels") or {})
        wanted = (pod_spec.get("nodeSelector") or {}).get(PRODUCT_LABEL)
        if PRODUCT_LABEL in node_labels and wanted and node_labels[PRODUCT_LABEL] != wanted:
            raise FlavorMismatch(
                f"pod set {name} needs {PRODUCT_LABEL}={wanted} but Kueue admitted it to "
                f"ResourceFlavor {flavor_name} whose nodeLabels say {PRODUCT_LABEL}="
                f"{node_labels[PRODUCT_LABEL]}; give each GPU type its own ResourceFlavor whose "
                f"nodeLabels name that {PRODUCT_LABEL}")
        update = updates.get(name, kstatus.PodSetUpdate())
        kstatus.check_metadata(name, update)
        own = {**({PRODUCT_LABEL: wanted} if wanted else {}), **node_labels}
        node_labels = {k: v for k, v in kstatus.merged_selector(name, own, update).items()
                       if k != PRODUCT_LABEL or PRODUCT_LABEL in node_labels}
        tolerations = [dict(t) for t in fspec.get("tolerations") or ()]
        tolerations += [dict(t) for t in update.tolerations if dict(t) not in tolerations]
        out[gpu_type] = FlavorPlacement(
            gpu_type=gpu_type, flavor=flavor_name, node_labels=node_labels,
            tolerations=tuple(tolerations), count=int(admission.counts.get(name, ps.get("count", 1))),
            labels=dict(update.labels), annotations=dict(update.annotations))
    return out


def restrict_inventory(inventory: Inventory, allowed: Mapping[str, FlavorPlacement]) -> Inventory:
    """The part of ``inventory`` the admission allows.

    Keeps devices whose GPU type was admitted, on nodes whose labels (:attr:`Inventory.labels`)
    include the admitted flavor's ``nodeLabels``, and caps each type's free devices (in node
    order) at the admitted count, so :func:`hetero_operator.planning.plan.plan_job` on the result
    plans within the admission.
    """
    labels = inventory.labels
    left = {t: p.count for t, p in allowed.items()}
    kept: list[NodeInventory] = []
    for node in inventory.nodes:
        node_labels = labels.get(node.name, {})
        devices: list[Device] = []
        for d in node.devices:
            place = allowed.get(d.gpu_type)
            if place is None or any(node_labels.get(k) != v for k, v in place.node_labels.items()):
                continue
            free = min(d.free, left[d.gpu_type])
            left[d.gpu_type] -= free
            devices.append(replace(d, free=free))
        if devices:
            kept.append(replace(node, devices=tuple(devices)))
    return replace(inventory, nodes=tuple(kept))


def add_placements(inputs: PodInputs, plan: Plan, allowed: Mapping[str, FlavorPlacement]) -> PodInputs:
    """The pods' inputs with each group's admitted flavor added (before the pods are built).

    A group's ``nodeSelector`` gets its GPU type's ``nvidia.com/gpu.product`` and the flavor's
    node labels (and the admission checks' nodeSelector); the flavor's and the checks'
    tolerations are added to the pod's own; the checks' labels and annotations go onto the pod's
    metadata (:func:`placements` refused any clash with ours).  Groups of a type that was not
    admitted get nothing.
    """
    for group in plan.groups:
        place = allowed.get(group.gpu_type)
        if place is not None:
            inputs = inputs.add(group.index, GroupInputs(
                node_selector={PRODUCT_LABEL: _product_label(group), **place.node_labels},
                tolerations=tuple(place.tolerations), labels=place.labels,
                annotations=place.annotations))
    return inputs


def _product_label(group: GroupPlan) -> str:
    single = group.mig_profile and group.resource_name == gfd.GPU_RESOURCE
    return group.gpu_type if single else group.product


# --- what the operator writes back ------------------------------------------------------------

def _set(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str,
         now_iso: str) -> None:
    for c in conditions:
        if c.get("type") == type_:
            if c.get("status") != status:
                c["lastTransitionTime"] = now_iso
            c.update(status=status, reason=reason, message=message)
            return
    conditions.append({"type": type_, "status": status, "reason": reason, "message": message,
                       "lastTransitionTime": now_iso})


def cleared_admission_status(workload: Mapping[str, Any], now_iso: str) -> dict[str, Any]:
    """The status patch after the job stopped on eviction (Kueue's ``jobframework``, step "handle
    eviction"): no admission, ``QuotaReserved=False`` (``Pending``), ``Admitted=False``, and
    ``Requeued`` (True after a preemption or node failure, so Kueue queues it again)."""
    evicted = _condition(workload, EVICTED)
    reason = str(evicted.get("reason") or "Evicted")
    message = str(evicted.get("message") or "evicted")
    conditions = [dict(c) for c in (workload.get("status") or {}).get("conditions") or ()]
    _set(conditions, QUOTA_RESERVED, "False", "Pending", message, now_iso)
    _set(conditions, ADMITTED, "False", "NoReservation", "The workload has no reservation", now_iso)
    _set(conditions, REQUEUED, "True" if reason in ("Preempted", "NodeFailures") else "False",
         reason, message, now_iso)
    return {"admission": None, "conditions": conditions}


def finished_status(workload: Mapping[str, Any], *, succeeded: bool, message: str,
                    now_iso: str) -> dict[str, Any] | None:
    """The status patch that marks the Workload ``Finished`` (Kueue frees its quota); None when
    it already is."""
    if _condition(workload, FINISHED).get("status") == "True":
        return None
    conditions = [dict(c) for c in (workload.get("status") or {}).get("conditions") or ()]
    _set(conditions, FINISHED, "True", "Succeeded" if succeeded else "Failed", message, now_iso)
    return {"conditions": conditions}
