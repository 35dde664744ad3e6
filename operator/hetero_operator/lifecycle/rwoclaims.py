"""A ReadWriteOnce claim mounted by every rank pod: the plan stays on one node (pure).

A claim with ``accessModes: [ReadWriteOnce]`` attaches to one node at a time; a plan that spreads
the ranks over several nodes gets one running pod and the rest stuck ``ContainerCreating`` with
a Multi-Attach error (shared/cases/51).  So before a start, every claim the pods mount (the
checkpoint claim ``spec.training.checkpoint.persistentVolumeClaim`` and the template's
``persistentVolumeClaim`` volumes) is looked up; when one is ReadWriteOnce and the plan spans
several nodes, the job is planned again onto each of those nodes alone and runs on the best one
that holds ``spec.gpus.minRanks`` (with a Warning naming the claim and what it costs), or waits
``Pending`` with reason ``ReadWriteOnceClaim`` naming the claim, its access mode and the fix.
A ReadWriteOncePod claim allows one pod: a plan of more pods waits the same way.
ReadWriteMany and ReadOnlyMany claims change nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hetero_operator.api.spec import JobSpec
from hetero_operator.api.types import Plan, Unschedulable
from hetero_operator.render.pods import pod_units

REASON = "ReadWriteOnceClaim"
ONE_NODE = "ReadWriteOnce"
ONE_POD = "ReadWriteOncePod"
SHARED = frozenset({"ReadWriteMany", "ReadOnlyMany"})
FIX = ("use a ReadWriteMany claim (NFS, CephFS, a CSI file system) or object storage for what "
       "every rank shares")


@dataclass(frozen=True, kw_only=True, slots=True)
class ClaimUse:
    """A PersistentVolumeClaim the rank pods mount: its name and the field that names it."""

    name: str
    path: str


@dataclass(frozen=True, kw_only=True, slots=True)
class OneNodeClaim:
    """A claim the pods mount that one node (``ReadWriteOnce``) or one pod (``ReadWriteOncePod``)
    may use at a time."""

    name: str
    path: str
    mode: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Confined:
    """:func:`confine`'s answer: the plan to start (or an :class:`Unschedulable` naming the claim)
    and a Warning to post when the plan was narrowed to one node (``""`` otherwise)."""

    plan: Plan | Unschedulable
    warning: str = ""


def claim_uses(spec: JobSpec) -> tuple[ClaimUse, ...]:
    """Every claim the rank pods mount, in field order, each once."""
    found: dict[str, ClaimUse] = {}
    if spec.training.checkpoint_pvc:
        found[spec.training.checkpoint_pvc] = ClaimUse(
            name=spec.training.checkpoint_pvc, path="spec.training.checkpoint.persistentVolumeClaim")
    volumes = (spec.worker.template.get("spec") or {}).get("volumes") or ()
    for i, volume in enumerate(volumes):
        name = str(((volume or {}).get("persistentVolumeClaim") or {}).get("claimName") or "")
        if name and name not in found:
            found[name] = ClaimUse(name=name, path=f"spec.worker.template.spec.volumes[{i}]")
    return tuple(found.values())


def access_modes(pvc: Mapping[str, Any]) -> frozenset[str]:
    """A claim's access modes: its bound volume's (``status.accessModes``), else the requested."""
    modes = (pvc.get("status") or {}).get("accessModes") or (pvc.get("spec") or {}).get("accessModes") or ()
    return frozenset(str(m) for m in modes)


def one_node_claims(uses: tuple[ClaimUse, ...],
                    pvcs: Mapping[str, Mapping[str, Any] | None]) -> tuple[OneNodeClaim, ...]:
    """The claims of ``uses`` that one node or one pod may use at a time (a claim not found is
    left to the kubelet, which reports it on the pod).

    Args:
        uses: :func:`claim_uses` of the job.
        pvcs: the claims by name (None: not found).
    """
    out = []
    for use in uses:
        pvc = pvcs.get(use.name)
        if pvc is None:
            continue
        modes = access_modes(pvc)
        if modes & SHARED or not modes:
            continue
        mode = ONE_POD if ONE_POD in modes else ONE_NODE
        out.append(OneNodeClaim(name=use.name, path=use.path, mode=mode))
    return tuple(out)


def _throughput(plan: Plan) -> float:
    return plan.value.predicted_throughput if plan.value is not None else float(plan.world_size)


def confine(job: str, plan: Plan, claims: tuple[OneNodeClaim, ...], *, min_ranks: int,
            plan_on: Callable[[str], Plan | Unschedulable]) -> Confined:
    """The plan the claims allow.

    Args:
        job: the job's name (the pods' names).
        plan: the plan over the whole cluster.
        claims: :func:`one_node_claims` of the job.
        min_ranks: ``spec.gpus.minRanks``.
        plan_on: plans the job onto one node alone (``node name -> plan``).

    Returns:
        ``plan`` unchanged without such a claim or on one node; else the best plan on one of its
        nodes (most ranks, then the highest predicted throughput) with a Warning, or an
        :class:`Unschedulable` with reason :data:`REASON` naming the claim and the fix.
    """
    if not claims:
        return Confined(plan=plan)
    one_pod = next((cl for cl in claims if cl.mode == ONE_POD), None)
    pods = len(pod_units(job, plan))
    if one_pod is not None and pods > 1:
        return Confined(plan=_refusal(plan, (
            f"PersistentVolumeClaim {one_pod.name} ({one_pod.path}) is {ONE_POD}: one pod at a "
            f"time, and the plan needs {pods} pods; {FIX}")))
    if len(plan.nodes) <= 1:
        return Confined(plan=plan)
    claim = claims[0]
    single = [p for p in (plan_on(node) for node in plan.nodes) if isinstance(p, Plan)
              and p.world_size >= min_ranks and len(p.nodes) == 1]
    spread = f"the plan spans {len(plan.nodes)} nodes ({', '.join(plan.nodes)})"
    if not single:
        return Confined(plan=_refusal(plan, (
            f"PersistentVolumeClaim {claim.name} ({claim.path}) is {ONE_NODE}: it attaches to one "
            f"node at a time, {spread} and no one of them holds spec.gpus.minRanks={min_ranks}; "
            f"{FIX}, or lower spec.gpus.minRanks to what one node holds")))
    best = max(single, key=lambda p: (p.world_size, _throughput(p)))
    return Confined(plan=best, warning=(
        f"PersistentVolumeClaim {claim.name} ({claim.path}) is {ONE_NODE}: it attaches to one node "
        f"at a time, so the job runs on node {best.nodes[0]} only ({best.world_size} ranks; "
        f"{spread} with {plan.world_size}); {FIX} to use them all."))


def _refusal(plan: Plan, message: str) -> Unschedulable:
    return Unschedulable(shortfalls=(), excluded=plan.excluded, message=message, reason=REASON,
                         warnings=plan.warnings)
