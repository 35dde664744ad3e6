"""DRA requests: a ResourceClaimTemplate per planned group whose CEL selector pins the planned
product (and MIG profile), and the pods rewritten to claim it (pure; the inventory side is
:mod:`hetero_operator.cluster.dra`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hetero_operator.api.types import GroupPlan, Plan
from hetero_operator.cluster.dra import API_VERSION, DRIVER, DraInventory

GPU_DEVICE_CLASS = "gpu.nvidia.com"
MIG_DEVICE_CLASS = "mig.nvidia.com"
CLAIM_NAME = "gpus"
"""Name of the pod's resource claim and of the request inside the template."""


def template_name(job_name: str, group: GroupPlan) -> str:
    """``<job>-g<group>``: one ResourceClaimTemplate per group (each pod gets its own claim)."""
    return f"{job_name}-g{group.index}"


def selector_expression(product_name: str, mig_profile: str) -> str:
    """CEL that matches exactly the planned GPU type among the driver's devices.

    Args:
        product_name: ``productName`` as the driver publishes it (``"NVIDIA A100-SXM4-40GB"``).
        mig_profile: MIG profile, ``""`` for a whole GPU.
    """
    attrs = f'device.attributes["{DRIVER}"]'
    expr = f"{attrs}.productName == {json.dumps(product_name)}"
    if mig_profile:
        expr += f" && {attrs}.profile == {json.dumps(mig_profile)}"
    return expr


def render_claim_template(job_name: str, namespace: str, group: GroupPlan, *, product_name: str,
                          devices_per_pod: int, labels: Mapping[str, str]) -> dict[str, Any]:
    """The ``resource.k8s.io/v1`` ResourceClaimTemplate of one group.

    Args:
        job_name / namespace: the job.
        group: the planned group.
        product_name: the driver's ``productName`` of the group's GPU type.
        devices_per_pod: devices each pod of the group needs (its ranks; 1 for MIG pods).
        labels: labels of the template (the job's selector labels).
    """
    device_class = MIG_DEVICE_CLASS if group.mig_profile else GPU_DEVICE_CLASS
    return {
        "apiVersion": API_VERSION, "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(job_name, group), "namespace": namespace,
                     "labels": dict(labels)},
        "spec": {"spec": {"devices": {"requests": [{
            "name": CLAIM_NAME,
            "exactly": {
                "deviceClassName": device_class, "allocationMode": "ExactCount",
                "count": devices_per_pod,
                "selectors": [{"cel": {"expression": selector_expression(
                    product_name, group.mig_profile)}}]}}]}}},
    }


def use_claims(job_name: str, namespace: str, plan: Plan, pods: Sequence[Mapping[str, Any]],
               dra: DraInventory, *, labels: Mapping[str, str],
               ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Swap extended-resource GPU requests for resource claims on the plan's DRA nodes.

    For each group on a DRA node: one ResourceClaimTemplate; every pod of the group loses the
    ``nvidia.com/*`` request and limit of its container and gets ``spec.resourceClaims`` (the
    template) plus ``resources.claims`` in the container. Pods on GFD nodes are unchanged.

    Args:
        job_name / namespace: the job.
        plan: its plan.
        pods: pods from :func:`hetero_operator.render.pods.render_pods` (not modified).
        dra: the inventory the plan was made on.
        labels: labels for the templates.

    Returns:
        ``(pods, claim templates)``; the templates are ordered by group.

    Raises:
        KeyError: a DRA group whose GPU type has no product name in ``dra`` (the plan was not made
            on this inventory).
    """
    groups = {str(g.index): g for g in plan.groups if g.node in dra.dra_nodes}
    if not groups:
        return [dict(p) for p in pods], []
    out = []
    per_pod: dict[str, int] = {}
    for pod in pods:
        group = groups.get(str(pod["metadata"]["labels"].get("heterotrain.io/group-index")))
        if group is None:
            out.append(dict(pod))
            continue
        pod, count = _claiming_pod(pod, template_name(job_name, group), group.resource_name)
        per_pod[str(group.index)] = count
        out.append(pod)
    templates = [render_claim_template(job_name, namespace, g,
                                       product_name=dra.product_names[(g.node, g.gpu_type)],
                                       devices_per_pod=per_pod.get(i, len(g.ranks)), labels=labels)
                 for i, g in sorted(groups.items(), key=lambda kv: kv[1].index)]
    return out, templates


def _claiming_pod(pod: Mapping[str, Any], template: str, resource_name: str,
                  ) -> tuple[dict[str, Any], int]:
    spec = dict(pod["spec"])
    containers = []
    count = 0
    for c in spec["containers"]:
        c = dict(c)
        resources = {k: dict(v) for k, v in (c.get("resources") or {}).items()}
        for key in ("requests", "limits"):
            value = resources.get(key, {}).pop(resource_name, None)
            if value is not None:
                count = max(count, int(value))
            if key in resources and not resources[key]:
                del resources[key]
        if count:
            resources["claims"] = [{"name": CLAIM_NAME}]
        c["resources"] = resources
        containers.append(c)
    spec["containers"] = containers
    spec["resourceClaims"] = [{"name": CLAIM_NAME, "resourceClaimTemplateName": template}]
    return {**pod, "spec": spec}, count
