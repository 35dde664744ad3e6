"""Plan a job over the operator's indexes: the Nodes and GPU pods its informers keep, the GPUs that starts
in flight hold (:mod:`~hetero_operator.controller.reservations`), DRA's slices and claims, the
pod template's placement, Kueue's admission, and the planning inputs (prices and links from the
settings, learned speeds from the namespace's ``heterotrain-profiles`` ConfigMap).

The reconciler's ``_start`` and the Kueue gate (a Workload's shape) plan through here; the
planner itself is :func:`hetero_operator.planning.plan.plan_job`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from hetero_operator.api import labels
from hetero_operator.api.settings import OperatorConfig
from hetero_operator.api.spec import JobSpec, profile_key
from hetero_operator.api.types import Inventory, Plan, Unschedulable
from hetero_operator.cluster import dra
from hetero_operator.cluster.nodeindex import build_indexed_inventory
from hetero_operator.planning import profiles
from hetero_operator.planning.marginal import LinkSettings, PlanInputs
from hetero_operator.planning.placement import pod_tolerations, restrict_to_template
from hetero_operator.planning.plan import plan_job
from hetero_operator.render import workload as kueue

log = logging.getLogger("heterotrain.operator")


def with_default_images(job: JobSpec, config: OperatorConfig) -> JobSpec:
    """Fill an empty ``spec.images`` with the operator's default catalog."""
    return job if job.images else replace(job, images=config.planning.default_images)


def plan_on_indexes(spec: JobSpec, nodes: Sequence[Mapping[str, Any]],
                    indexed: Sequence[Mapping[str, Any]], held: Sequence[Mapping[str, Any]], *,
                    allowed: Mapping[str, Any] | None = None, capacity: bool = False,
                    dra_source: tuple[list[Any], list[Any]] = ([], []),
                    inputs: PlanInputs | None = None) -> tuple[Plan | Unschedulable, dra.DraInventory]:
    """Plan ``spec`` over the indexed nodes and the GPU pods not its own.

    Args:
        spec: the job.
        nodes: the node index's Nodes.
        indexed: the pod index's GPU pods (the job's own are left out here).
        held: GPU pods other starts hold that the index does not show yet.
        allowed: what Kueue admitted (:func:`hetero_operator.render.workload.restrict_inventory`);
            None for no Kueue.
        capacity: plan as if every GPU were free (the shape of a Workload).
        dra_source: (ResourceSlices, ResourceClaims): adds the nodes whose GPUs DRA publishes
            (:mod:`hetero_operator.cluster.dra`).
        inputs: learned speeds, prices and links (:func:`plan_inputs`); None for the defaults.

    Returns:
        The plan (or why not) and the DRA view it was made on, its inventory emptied.

    The inventory (about 0.4 KiB per node: ~0.8 MiB at 2,000 nodes) lives only inside this call:
    ``_start`` awaits API calls after planning, and an inventory kept in its frame would be held
    once per job being started at the same time (the operator's peak RSS grew by ~1 MiB per job
    that way).  Index values remember their parse: only nodes changed since the last start are
    re-read.
    """
    others = [p for p in indexed if not owned_by(p, spec.name, spec.namespace)] + list(held)
    # The nodes are read once, as the job's pods see them (their tolerations: a tainted pool);
    # every filter after this reads the inventory, never a Node.
    inventory = build_indexed_inventory(nodes, others, tolerations=pod_tolerations(spec.worker.template))
    slices, claims = dra_source
    drainv = dra.merge_dra(inventory, slices,
                           [x for x in claims if not dra.claim_owned_by_job(x, spec.name, spec.namespace)])
    inventory = drainv.inventory
    if spec.worker.template:  # its nodeSelector and node affinity
        inventory = restrict_to_template(inventory, spec.worker.template)
    if capacity:
        inventory = kueue.capacity_inventory(inventory)
    if allowed is not None:
        inventory = kueue.restrict_inventory(inventory, allowed)
    result = plan_job(spec, inventory, inputs=inputs)
    log.info("%s/%s: planned over %d usable node(s), %d GPU pod(s) bound: %s", spec.namespace,
             spec.name, len(inventory.nodes), len(indexed),
             getattr(result, "message", None) or [(g.node, g.gpu_type, len(g.ranks)) for g in result.groups])
    return result, replace(drainv, inventory=Inventory(nodes=(), excluded=()))


def free_whole_gpus(spec: JobSpec, nodes: Sequence[Mapping[str, Any]],
                    pods: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Free whole GPUs (``nvidia.com/gpu``, neither MIG nor shared) per GFD product and node, on
    the nodes ``spec``'s pods may use now (healthy, not cordoned, not tainted against them, the
    template's node selector): where an elastic job's lost pod may come back
    (:mod:`hetero_operator.lifecycle.elastic`).

    Args:
        spec: the job (its template's tolerations and node selector).
        nodes: the node index's Nodes.
        pods: every GPU pod the nodes hold or will hold, the job's own included.
    """
    inventory = restrict_to_template(build_indexed_inventory(
        nodes, list(pods), tolerations=pod_tolerations(spec.worker.template)), spec.worker.template)
    free: dict[str, dict[str, int]] = {}
    for d in inventory.devices():
        if not d.mig_profile and d.time_sliced_replicas == 1 and d.resource_name == "nvidia.com/gpu":
            free.setdefault(d.product, {})[d.node] = d.free
    return free


async def plan_inputs(api: Any, spec: JobSpec, config: OperatorConfig, *, now_s: float) -> PlanInputs:
    """Prices and links from the settings; learned speeds of the job's profileKey from the
    namespace's ``heterotrain-profiles`` ConfigMap (:mod:`hetero_operator.planning.profiles`); an
    unreadable ConfigMap (or an ``api`` without ``get_configmap``) only means table speeds."""

    learned: dict[Any, Any] = {}
    get = getattr(api, "get_configmap", None)
    if get is not None:
        try:
            cm = await get(spec.namespace, profiles.CONFIGMAP_NAME)
        except Exception as exc:  # noqa: BLE001 - advice only: plan from the table
            log.warning("%s: cannot read ConfigMap %s: %s", spec.namespace,
                        profiles.CONFIGMAP_NAME, exc)
            cm = None
        learned = profiles.fresh(profiles.configmap_entries(cm, profile_key(spec)), now_s=now_s)
    return PlanInputs(learned=learned, prices=config.planning.gpu_prices, now_s=now_s,
                      link=LinkSettings(intra_node_gbps=config.links.intra_node_gbps,
                                        inter_node_gbps=config.links.inter_node_gbps))


def owned_by(pod: Mapping[str, Any], job: str, namespace: str) -> bool:
    """The pod belongs to job ``namespace/job`` (its :data:`~hetero_operator.api.labels.LABEL_JOB` label)."""
    meta = pod.get("metadata") or {}
    return meta.get("namespace") == namespace and (meta.get("labels") or {}).get(labels.LABEL_JOB) == job
