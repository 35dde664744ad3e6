"""DRA requests: a ResourceClaimTemplate per planned group whose CEL selector pins the planned
product (and MIG profile), and the pods rewritten to claim it (pure; the inventory side is
:mod:`hetero_operator.cluster.dra`).

Templates are named per attempt (``<job>-a<attempt>-g<group>``): a re-plan (node loss, a pending
timeout, a Kueue re-admission) makes a new attempt whose groups may hold another GPU type or
count, and a template named by group alone would be reused with the old request (an existing
template is not replaced by a create), so the new pods would ask for devices that are not there
and stay Pending.  The templates of the attempt before are deleted when the next one starts
(:func:`stale_template_names`); the last attempt's go with the job (owner reference)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from hetero_operator.api.labels import LABEL_ATTEMPT
from hetero_operator.api.types import GroupPlan, Plan
from hetero_operator.cluster.dra import API_VERSION, DRIVER, DraInventory

GPU_DEVICE_CLASS = "gpu.nvidia.com"
MIG_DEVICE_CLASS = "mig.nvidia.com"
CLAIM_NAME = "gpus"
"""Name of the pod's resource claim and of the request inside the template."""


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
                          devices_per_pod: int, labels: Mapping[str, str],
                          attempt: int = 1) -> dict[str, Any]:
    """The ``resource.k8s.io/v1`` ResourceClaimTemplate of one group of one attempt.

    Args:
        job_name / namespace: the job.
        group: the planned group.
        product_name: the driver's ``productName`` of the group's GPU type.
        devices_per_pod: devices each pod of the group needs (its ranks; 1 for MIG pods).
        labels: labels of the template (the job's selector labels).
        attempt: the attempt the template belongs to (``status.attempt``).
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
                    product_name, group.mig_profile)}}]}}]}}},
    }


def use_claims(job_name: str, namespace: str, plan: Plan, pods: Sequence[Mapping[str, Any]],
               dra: DraInventory, *, labels: Mapping[str, str], attempt: int = 1,
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
        attempt: the attempt the pods belong to (templates are named per attempt).

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
        pod, count = _claiming_pod(pod, template_name(job_name, group, attempt), group.resource_name)
        per_pod[str(group.index)] = count
        out.append(pod)
    templates = [render_claim_template(job_name, namespace, g,
                                       product_name=dra.product_names[(g.node, g.gpu_type)],
                                       devices_per_pod=per_pod.get(i, len(g.ranks)), labels=labels,
                                       attempt=attempt)
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
