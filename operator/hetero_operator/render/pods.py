"""Pods and the headless Service of a planned job (pure: dicts in, dicts out; no kopf).

One pod per (node, GPU type) group runs ``heterotrain launch -- <command> <args>``, which starts
one process per GPU (``LOCAL_WORLD_SIZE``), like ``torchrun --nproc-per-node``.  A MIG group gets
one pod per MIG device (one CUDA process can use one MIG device; docs/gpu-facts.md, "MIG").
Names are deterministic (``<job>-g<group>``; ``<job>-g<group>-m<k>`` for the k-th MIG pod) so a
retry after an operator crash hits a 409, never a duplicate.  Every pod has ``hostname`` and
``subdomain: <job>``, so ``MASTER_ADDR = <rank-0 pod>.<job>.<namespace>.svc`` resolves the same
on every rank through the headless Service (shared/cases/18).

Pods are hardened (issue 10): no privilege escalation, every capability dropped, seccomp
``RuntimeDefault``, ``runAsNonRoot`` (our worker images run as UID 10001; the operator setting
``HTJ_WORKER_RUN_AS_NON_ROOT=false`` is for images that need root), and no service-account token.
A NetworkPolicy per job (:func:`render_network_policy`) admits only the job's own pods (the
rendezvous store, Gloo and NCCL listen on their ports) and the metrics namespaces (to the metrics
ports): the ``*_object`` collectives unpickle what they receive, so nothing else may connect.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hetero_operator.api.labels import (ANNOTATION_GPU_TYPE, ANNOTATION_RANKS, LABEL_ARCH,
                                        LABEL_ATTEMPT, LABEL_GROUP, LABEL_JOB, LABEL_MANAGED_BY,
                                        LABEL_RANK, MANAGED_BY, selector)
from hetero_operator.api.spec import JobSpec
from hetero_operator.api.types import GroupPlan, Plan
from heterotrain_common import contract, envnames

CONTAINER = "worker"
CHECKPOINT_VOLUME = "checkpoint"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
WORKER_FS_GROUP = 10001
"""Group of the worker images' user (Dockerfile.worker); a checkpoint volume is made writable to it."""
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]}}
"""Container-level hardening of every worker (the Pod Security Standards' "restricted" level)."""
METRICS_NAMESPACE_LABEL = "kubernetes.io/metadata.name"
"""Namespace label set by the API server on every namespace (Kubernetes >= 1.22)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PodUnit:
    """One pod of the plan: a whole group, or one MIG device of a MIG group.

    Attributes:
        name: pod name.
        group: the group it belongs to.
        ranks: global ranks it hosts (contiguous).
    """

    name: str
    group: GroupPlan
    ranks: tuple[int, ...]


def pod_units(job_name: str, plan: Plan) -> list[PodUnit]:
    """The pods of a plan, in rank order."""
    units: list[PodUnit] = []
    for g in plan.groups:
        if g.mig_profile and len(g.ranks) > 1:
            units += [PodUnit(name=f"{job_name}-g{g.index}-m{k}", group=g, ranks=(r,))
                      for k, r in enumerate(g.ranks)]
        else:
            units.append(PodUnit(name=f"{job_name}-g{g.index}", group=g, ranks=tuple(g.ranks)))
    return units


def master_addr(job_name: str, namespace: str, plan: Plan, domain: str = "svc") -> str:
    """``<rank-0 pod>.<job>.<namespace>.<domain>``: the same string on every rank (case 18)."""
    first = pod_units(job_name, plan)[0].name
    return f"{first}.{job_name}.{namespace}.{domain}"


def render_service(job: JobSpec, *, master_port: int) -> dict[str, Any]:
    """The headless Service ``<job>`` that gives every pod ``<pod>.<job>.<ns>.svc``.

    ``publishNotReadyAddresses`` makes rank 0's name resolve before it is Ready (case 17).
    """
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": job.name, "namespace": job.namespace,
                     "labels": {LABEL_JOB: job.name, LABEL_MANAGED_BY: MANAGED_BY}},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": selector(job.name),
                 "ports": [{"name": "rendezvous", "port": master_port, "targetPort": master_port,
                            "protocol": "TCP"}]},
    }


def render_pods(job: JobSpec, plan: Plan, rank_envs: Sequence[Mapping[str, str]], *,
                launcher: Sequence[str], attempt: int = 0,
                run_as_non_root: bool = True) -> list[dict[str, Any]]:
    """One pod per :class:`PodUnit`.

    Args:
        job: the parsed job.
        plan: its plan.
        rank_envs: rank form of the contract, one per rank (``envrender.render_rank_envs``),
            ``len == plan.world_size``.
        launcher: argv prefix of the container, e.g. ``["heterotrain", "launch", "--"]``.
        attempt: restart generation, stored in the ``heterotrain.io/attempt`` label.
        run_as_non_root: set ``runAsNonRoot`` (the kubelet then refuses an image whose user is
            root); False only for images that need root.

    Returns:
        Pod manifests (``v1/Pod`` dicts) without owner references.

    Raises:
        ValueError: ``rank_envs`` does not have one entry per rank.
    """
    if len(rank_envs) != plan.world_size:
        raise ValueError(f"rank_envs has {len(rank_envs)} entries, plan has {plan.world_size} ranks")
    return [_pod(job, unit, rank_envs, launcher=launcher, attempt=attempt,
                 run_as_non_root=run_as_non_root) for unit in pod_units(job.name, plan)]


def _pod(job: JobSpec, unit: PodUnit, rank_envs: Sequence[Mapping[str, str]], *,
         launcher: Sequence[str], attempt: int, run_as_non_root: bool) -> dict[str, Any]:
    g = unit.group
    env = contract.pod_env(rank_envs[unit.ranks[0]])
    env[envnames.LOCAL_WORLD_SIZE] = str(len(unit.ranks))
    env.update(g.extra_env)
    labels = {**selector(job.name), LABEL_GROUP: str(g.index), LABEL_RANK: str(unit.ranks[0]),
              LABEL_ARCH: (g.architecture or "unknown").lower(), LABEL_ATTEMPT: str(attempt)}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # workers never talk to the API server
        "securityContext": _pod_security_context(job, run_as_non_root=run_as_non_root),
        "hostname": unit.name,
        "subdomain": job.name,
        "enableServiceLinks": False,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [g.node]}]}]}}},
        "tolerations": [dict(GPU_TOLERATION)],
        "containers": [_container(job, unit, env, launcher)],
    }
    if job.run_policy.priority_class:
        spec["priorityClassName"] = job.run_policy.priority_class
    if job.training.checkpoint_pvc:
        spec["volumes"] = [{"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {
            "claimName": job.training.checkpoint_pvc}}]
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": unit.name, "namespace": job.namespace, "labels": labels,
                     "annotations": {ANNOTATION_GPU_TYPE: g.gpu_type,
                                     ANNOTATION_RANKS: _ranks_text(unit.ranks)}},
        "spec": spec,
    }


def _container(job: JobSpec, unit: PodUnit, env: Mapping[str, str],
               launcher: Sequence[str]) -> dict[str, Any]:
    g = unit.group
    ours = set(env)
    user_env = [copy.deepcopy(dict(e)) for e in job.worker.env if e.get("name") not in ours]
    resources = _resources(job.worker.resources, g.resource_name, len(unit.ranks))
    container: dict[str, Any] = {
        "name": CONTAINER, "image": g.image,
        "command": list(launcher), "args": [*job.worker.command, *job.worker.args],
        "env": user_env + [{"name": k, "value": v} for k, v in sorted(env.items())],
        "resources": resources,
        "securityContext": copy.deepcopy(CONTAINER_SECURITY_CONTEXT),
    }
    ports = []
    if unit.ranks[0] == 0:
        ports.append({"name": "rendezvous", "containerPort": int(env[envnames.MASTER_PORT]),
                      "protocol": "TCP"})
    if job.worker.metrics_port:  # local rank i serves on metricsPort + i (heterotrain launch)
        for i in range(len(unit.ranks)):
            ports.append({"name": "metrics" if i == 0 else f"metrics-{i}",
                          "containerPort": job.worker.metrics_port + i, "protocol": "TCP"})
    if ports:
        container["ports"] = ports
    if job.training.checkpoint_pvc:
        container["volumeMounts"] = [{"name": CHECKPOINT_VOLUME,
                                      "mountPath": job.training.checkpoint_path}]
    return container


def _pod_security_context(job: JobSpec, *, run_as_non_root: bool) -> dict[str, Any]:
    ctx: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if run_as_non_root:
        ctx["runAsNonRoot"] = True
    if job.training.checkpoint_pvc:  # the image's group may write the volume; chown only once
        ctx.update(fsGroup=WORKER_FS_GROUP, fsGroupChangePolicy="OnRootMismatch")
    return ctx


def render_network_policy(job: JobSpec, plan: Plan, *,
                          metrics_namespaces: Sequence[str]) -> dict[str, Any]:
    """The NetworkPolicy ``<job>``: who may connect to the job's pods.

    * the job's own pods (same namespace, :func:`selector`), on every port: the rendezvous store
      listens on ``MASTER_PORT``, but Gloo and NCCL's socket transport connect to ephemeral ports
      that cannot be listed;
    * pods of ``metrics_namespaces`` (Prometheus, and the operator, which reads rank 0's metrics),
      on the metrics ports ``metricsPort .. metricsPort + local ranks - 1`` only.

    Nothing else reaches the pods (the ``*_object`` collectives unpickle what they receive).
    Egress is not restricted (DNS, datasets, checkpoint stores).

    Args:
        job: the parsed job.
        plan: its plan (the largest pod's local ranks bound the metrics port range).
        metrics_namespaces: namespaces allowed to scrape, e.g. ``["monitoring", "heterotrain"]``.

    Returns:
        A ``networking.k8s.io/v1`` NetworkPolicy dict without owner references.
    """
    own_pods = {"matchLabels": selector(job.name)}
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": copy.deepcopy(own_pods)}]}]
    if job.worker.metrics_port and metrics_namespaces:
        local = max(len(u.ranks) for u in pod_units(job.name, plan))
        port: dict[str, Any] = {"protocol": "TCP", "port": job.worker.metrics_port}
        if local > 1:
            port["endPort"] = job.worker.metrics_port + local - 1
        ingress.append({
            "from": [{"namespaceSelector": {"matchExpressions": [{
                "key": METRICS_NAMESPACE_LABEL, "operator": "In",
                "values": sorted(set(metrics_namespaces))}]}}],
            "ports": [port]})
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": job.name, "namespace": job.namespace,
                     "labels": {LABEL_JOB: job.name, LABEL_MANAGED_BY: MANAGED_BY}},
        "spec": {"podSelector": own_pods, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def _resources(base: Mapping[str, Any], resource_name: str, count: int) -> dict[str, Any]:
    out = {k: dict(v) for k, v in base.items() if k in ("requests", "limits") and v}
    for key in ("requests", "limits"):
        out.setdefault(key, {})[resource_name] = str(count)
    return out


def _ranks_text(ranks: Sequence[int]) -> str:
    return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"
