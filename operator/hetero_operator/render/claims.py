"""DRA requests: a ResourceClaimTemplate per planned group whose CEL selector pins the planned
product (and MIG profile), and the pods' inputs that make them claim it instead of the extended
resource (pure; the inventory side is :mod:`hetero_operator.cluster.dra`, the pods are built by
:func:`hetero_operator.render.pods.render_pods`).

Templates are named per attempt (``<job>-a<attempt>-g<group>``): a re-plan (node loss, a pending
timeout, a Kueue re-admission) makes a new attempt whose groups may hold another GPU type or
count, and a template named by group alone would be reused with the old request (an existing
template is not replaced by a create), so the new pods would ask for devices that are not there
and stay Pending.  The templates of the attempt before are deleted when the next one starts
(:func:`stale_template_names`); the last attempt's go with the job (owner reference)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hetero_operator.api.labels import LABEL_ATTEMPT
from hetero_operator.api.types import GroupPlan, Plan
from hetero_operator.cluster.dra import API_VERSION, DRIVER, DraInventory
from hetero_operator.render.pods import CLAIM_NAME, GroupInputs, PodInputs, ranks_per_pod

GPU_DEVICE_CLASS = "gpu.nvidia.com"
MIG_DEVICE_CLASS = "mig.nvidia.com"
__all__ = ["CLAIM_NAME", "add_claims", "render_claim_template", "selector_expression",
           "stale_template_names", "template_name"]


def template_name(job_name: str, group: GroupPlan | int, attempt: int = 1) -> str:
    """``<job>-a<attempt>-g<group>``: one ResourceClaimTemplate per group and attempt (each pod
    gets its own claim from it)."""
    index = group if isinstance(group, int) else group.index
    return f"{job_name}-a{attempt}-g{index}"


def stale_template_names(job_name: str, previous_plan: Mapping[str, Any] | None,
                         previous_attempt: int) -> list[str]:
    """The templates a new attempt replaces: those of ``previous_attempt`` for the groups of
    ``previous_plan`` (``status.plan``), and the per-group names of operators before per-attempt
    names (``<job>-g<group>``)."""
    groups = range(len((previous_plan or {}).get("groups") or ()))
    return ([template_name(job_name, i, previous_attempt) for i in groups] if previous_attempt else []) + \
        [f"{job_name}-g{i}" for i in groups]


def selector_expression(product_name: str, mig_profile: str, gpu_uuids: tuple[str, ...] = ()) -> str:
    """CEL that matches exactly the planned GPU type among the driver's devices.

    Args:
        product_name: ``productName`` as the driver publishes it (``"NVIDIA A100-SXM4-40GB"``).
        mig_profile: MIG profile, ``""`` for a whole GPU.
        gpu_uuids: the physical GPUs the planned devices come from (partitionable devices,
            :attr:`hetero_operator.cluster.dra.DraInventory.gpu_uuids`): a whole GPU's ``uuid``
            or a partition's ``parentUUID`` must be one of them; ``()`` pins none.
    """
    attrs = f'device.attributes["{DRIVER}"]'
    expr = f"{attrs}.productName == {json.dumps(product_name)}"
    if mig_profile:
        expr += f" && {attrs}.profile == {json.dumps(mig_profile)}"
    if gpu_uuids:
        expr += f" && {attrs}.{'parentUUID' if mig_profile else 'uuid'} in {json.dumps(list(gpu_uuids))}"
    return expr


def render_claim_template(job_name: str, namespace: str, group: GroupPlan, *, product_name: str,
                          devices_per_pod: int, labels: Mapping[str, str],
                          attempt: int = 1, gpu_uuids: tuple[str, ...] = ()) -> dict[str, Any]:
    """The ``resource.k8s.io/v1`` ResourceClaimTemplate of one group of one attempt.

    Args:
        job_name / namespace: the job.
        group: the planned group.
        product_name: the driver's ``productName`` of the group's GPU type.
        devices_per_pod: devices each pod of the group needs (its ranks; 1 for MIG pods).
        labels: labels of the template (the job's selector labels).
        attempt: the attempt the template belongs to (``status.attempt``).
        gpu_uuids: the GPUs a partitionable group's devices come from (:func:`selector_expression`).
    """
    device_class = MIG_DEVICE_CLASS if group.mig_profile else GPU_DEVICE_CLASS
    return {
        "apiVersion": API_VERSION, "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(job_name, group, attempt), "namespace": namespace,
                     "labels": {**labels, LABEL_ATTEMPT: str(attempt)}},
        "spec": {"spec": {"devices": {"requests": [{
            "name": CLAIM_NAME,
            "exactly": {
                "deviceClassName": device_class, "allocationMode": "ExactCount",
                "count": devices_per_pod,
                "selectors": [{"cel": {"expression": selector_expression(
                    product_name, group.mig_profile, gpu_uuids)}}]}}]}}},
    }


def add_claims(inputs: PodInputs, job_name: str, namespace: str, plan: Plan, dra: DraInventory, *,
               labels: Mapping[str, str], attempt: int = 1) -> tuple[PodInputs, list[dict[str, Any]]]:
    """Claims instead of extended resources for the plan's groups on DRA nodes.

    For each group on a DRA node: one ResourceClaimTemplate, and the group's pod inputs name it
    (:attr:`~hetero_operator.render.pods.GroupInputs.claim_template`), so its pods are built with
    ``spec.resourceClaims`` and the container's ``resources.claims`` and without the
    ``nvidia.com/*`` request.  Groups on GFD nodes are left as they are.

    Args:
        inputs: the pods' inputs so far.
        job_name / namespace: the job.
        plan: its plan.
        dra: the inventory the plan was made on.
        labels: labels for the templates.
        attempt: the attempt the pods belong to (templates are named per attempt).

    Returns:
        ``(inputs with the claims added, claim templates ordered by group)``.

    Raises:
        KeyError: a DRA group whose GPU type has no product name in ``dra`` (the plan was not made
            on this inventory).
    """
    templates = []
    for g in sorted((g for g in plan.groups if g.node in dra.dra_nodes), key=lambda g: g.index):
        templates.append(render_claim_template(
            job_name, namespace, g, product_name=dra.product_names[(g.node, g.gpu_type)],
            devices_per_pod=ranks_per_pod(g), labels=labels, attempt=attempt,
            gpu_uuids=dra.gpu_uuids.get((g.node, g.gpu_type), ())))
        inputs = inputs.add(g.index, GroupInputs(claim_template=template_name(job_name, g, attempt)))
    return inputs, templates
