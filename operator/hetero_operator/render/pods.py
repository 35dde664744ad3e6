"""Pods and the headless Service of a planned job (pure: dicts in, dicts out; no kopf).

One pod per (node, GPU type) group runs ``heterotrain launch -- <command> <args>``, which starts
one process per GPU (``LOCAL_WORLD_SIZE``), like ``torchrun --nproc-per-node``.  A MIG group gets
one pod per MIG device (one CUDA process can use one MIG device; shared/docs/gpu-facts.md, "MIG").
Names are deterministic (``<job>-g<group>``; ``<job>-g<group>-m<k>`` for the k-th MIG pod) so a
retry after an operator crash hits a 409, never a duplicate.  Every pod has ``hostname`` and
``subdomain: <job>``, so ``MASTER_ADDR = <rank-0 pod>.<job>.<namespace>.svc`` resolves the same
on every rank through the headless Service (shared/cases/18).

Pods are hardened (issue 10): no privilege escalation, every capability dropped, seccomp
``RuntimeDefault``, ``runAsNonRoot`` (our worker images run as UID 10001; the operator setting
``HTJ_WORKER_RUN_AS_NON_ROOT=false`` is for images that need root), and no service-account token
unless the template asks for one.
A NetworkPolicy per job (:func:`render_network_policy`) admits only the job's own pods (the
rendezvous store, Gloo and NCCL listen on their ports) and the metrics namespaces (to the metrics
ports): the ``*_object`` collectives unpickle what they receive, so nothing else may connect.  It
also allows the job's own egress (to its pods and to the cluster DNS), so a namespace with a
"default deny all" policy does not cut the ranks off from each other (shared/cases/46).

The pod template (``spec.worker.template``, :mod:`hetero_operator.api.podtemplate`) is merged in:
its labels and annotations under ours; its pod fields as given, except that ours win for what we
own (restartPolicy, hostname, subdomain, the security context's seccompProfile and runAsNonRoot,
the priority class) and that lists add up: tolerations, volumes (ours first: the checkpoint
claim and ``/dev/shm``), node affinity (each of the template's required terms gets our node pin,
so the terms still OR and the node is ours).  Its container ``worker`` is merged into the rank
container: env and envFrom, volume mounts, ports, probes, CPU and memory as given, around our
image, command, env contract, GPUs and hardened security context.  Its init containers (and
native sidecars) get the hardened security context too.  Every pod mounts a Memory emptyDir at
``/dev/shm`` (shared/cases/38; :func:`hetero_operator.api.workerspec.shared_memory_bytes`).

A pod is built once.  What the integrations decide about a group's pods is gathered first in one
:class:`PodInputs` (Kubeflow Trainer's runtime info, which its plugins add to before the pod is
built): Kueue's admitted flavor adds a nodeSelector, tolerations, labels and annotations
(:func:`hetero_operator.render.workload.add_placements`); DRA adds the ResourceClaimTemplate the
pods claim their GPUs from instead of the extended resource
(:func:`hetero_operator.render.claims.add_claims`).  :func:`render_pods` reads them; nothing
patches a rendered pod afterwards.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hetero_operator.api.labels import (ANNOTATION_GPU_TYPE, ANNOTATION_RANKS, LABEL_ARCH,
                                        LABEL_ATTEMPT, LABEL_GROUP, LABEL_JOB, LABEL_MANAGED_BY,
                                        LABEL_RANK, MANAGED_BY, selector)
from hetero_operator.api import podtemplate
from hetero_operator.api.spec import JobSpec
from hetero_operator.api.workerspec import merged_resources, shared_memory_bytes
from hetero_operator.api.types import GroupPlan, Plan
from heterotrain_common import contract, envnames
from heterotrain_common.tracking import SECRET_KEYS

CONTAINER = podtemplate.WORKER_CONTAINER
CHECKPOINT_VOLUME = podtemplate.CHECKPOINT_VOLUME
SHM_VOLUME = podtemplate.SHM_VOLUME
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
WORKER_FS_GROUP = 10001
"""Group of the worker images' user (Dockerfile.worker); a checkpoint volume is made writable to it."""
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]}}
"""Container-level hardening of every worker (the Pod Security Standards' "restricted" level)."""
METRICS_NAMESPACE_LABEL = "kubernetes.io/metadata.name"
"""Namespace label set by the API server on every namespace (Kubernetes >= 1.22)."""
CLAIM_NAME = "gpus"
"""Name of a DRA pod's resource claim (and of the request inside its ResourceClaimTemplate)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupInputs:
    """What the integrations add to the pods of one group, before they are built.

    Attributes:
        node_selector: merged over the template's ``nodeSelector`` (Kueue: the product label and
            the admitted flavor's node labels).
        tolerations: added after the pod's own, without duplicates (Kueue: the flavor's).
        labels / annotations: added to the pod's metadata (Kueue's admission checks).
        claim_template: the ResourceClaimTemplate each pod of the group claims its GPUs from
            (DRA), in place of the ``nvidia.com/*`` request; ``""`` for the extended resource.
    """

    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    claim_template: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class PodInputs:
    """The inputs of a job's pods beyond the job and its plan, per group index; each integration
    adds its part (:meth:`add`) before :func:`render_pods` builds the pods."""

    groups: Mapping[int, GroupInputs] = field(default_factory=dict)

    def group(self, index: int) -> GroupInputs:
        """What was added for group ``index`` (nothing: an empty :class:`GroupInputs`)."""
        return self.groups.get(index) or GroupInputs()

    def add(self, index: int, extra: GroupInputs) -> PodInputs:
        """These inputs with ``extra`` added to group ``index``'s: selectors, labels and
        annotations merged (``extra`` wins a key), tolerations appended without duplicates, a
        claim template set."""
        old = self.group(index)
        merged = GroupInputs(
            node_selector={**old.node_selector, **extra.node_selector},
            tolerations=tuple(_add([dict(t) for t in old.tolerations], extra.tolerations)),
            labels={**old.labels, **extra.labels},
            annotations={**old.annotations, **extra.annotations},
            claim_template=extra.claim_template or old.claim_template)
        return replace(self, groups={**self.groups, index: merged})


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


def ranks_per_pod(group: GroupPlan) -> int:
    """Ranks (= devices) each pod of ``group`` hosts: 1 for a MIG group's pods, else all of them."""
    return 1 if group.mig_profile else len(group.ranks)


def pod_units(job_name: str, plan: Plan) -> list[PodUnit]:
    """The pods of a plan, in rank order."""
    units: list[PodUnit] = []
    for g in plan.groups:
        if ranks_per_pod(g) < len(g.ranks):
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
                launcher: Sequence[str], attempt: int = 0, run_as_non_root: bool = True,
                inputs: PodInputs | None = None) -> list[dict[str, Any]]:
    """One pod per :class:`PodUnit`, built once with everything the integrations added.

    Args:
        job: the parsed job.
        plan: its plan.
        rank_envs: rank form of the contract, one per rank (``envrender.render_rank_envs``),
            ``len == plan.world_size``.
        launcher: argv prefix of the container, e.g. ``["heterotrain", "launch", "--"]``.
        attempt: restart generation, stored in the :data:`~hetero_operator.api.labels.LABEL_ATTEMPT` label.
        run_as_non_root: set ``runAsNonRoot`` (the kubelet then refuses an image whose user is
            root); False only for images that need root.
        inputs: what Kueue and DRA add per group (:class:`PodInputs`); None for nothing.

    Returns:
        Pod manifests (``v1/Pod`` dicts) without owner references.

    Raises:
        ValueError: ``rank_envs`` does not have one entry per rank.
    """
    if len(rank_envs) != plan.world_size:
        raise ValueError(f"rank_envs has {len(rank_envs)} entries, plan has {plan.world_size} ranks")
    inputs = inputs or PodInputs()
    return [_pod(job, unit, rank_envs, launcher=launcher, attempt=attempt,
                 run_as_non_root=run_as_non_root, extra=inputs.group(unit.group.index))
            for unit in pod_units(job.name, plan)]


_MERGED_POD_FIELDS = ("containers", "initContainers", "volumes", "tolerations", "affinity",
                      "securityContext")
"""Template pod fields merged field by field; every other allowed one is copied as given."""
TERMINATION_MESSAGE_POLICY = "FallbackToLogsOnError"
"""The worker container's ``terminationMessagePolicy`` (unless the template's container sets one)."""

_MERGED_CONTAINER_FIELDS = ("name", "env", "resources", "securityContext", "ports", "volumeMounts")


def _pod(job: JobSpec, unit: PodUnit, rank_envs: Sequence[Mapping[str, str]], *,
         launcher: Sequence[str], attempt: int, run_as_non_root: bool,
         extra: GroupInputs) -> dict[str, Any]:
    g = unit.group
    env = contract.pod_env(rank_envs[unit.ranks[0]])
    env[envnames.LOCAL_WORLD_SIZE] = str(len(unit.ranks))
    env.update(g.extra_env)
    tmeta = job.worker.template.get("metadata") or {}
    tspec = job.worker.template.get("spec") or {}
    labels = {**(tmeta.get("labels") or {}), **selector(job.name), LABEL_GROUP: str(g.index),
              LABEL_RANK: str(unit.ranks[0]), LABEL_ARCH: (g.architecture or "unknown").lower(),
              LABEL_ATTEMPT: str(attempt), **extra.labels}
    annotations = {**(tmeta.get("annotations") or {}), ANNOTATION_GPU_TYPE: g.gpu_type,
                   ANNOTATION_RANKS: _ranks_text(unit.ranks), **extra.annotations}
    spec: dict[str, Any] = {k: copy.deepcopy(v) for k, v in tspec.items()
                            if k not in _MERGED_POD_FIELDS}
    volumes, mounts = _own_volumes(job, len(unit.ranks))
    spec.update({
        "restartPolicy": "Never",
        # workers never talk to the API server, unless the template asks (object-store identity)
        "automountServiceAccountToken": bool(tspec.get("automountServiceAccountToken", False)),
        "securityContext": pod_security_context(job, tspec.get("securityContext") or {},
                                                 run_as_non_root=run_as_non_root),
        "hostname": unit.name,
        "subdomain": job.name,
        "enableServiceLinks": bool(tspec.get("enableServiceLinks", False)),
        "affinity": node_affinity(tspec.get("affinity") or {}, g.node),
        "tolerations": _add(_add([dict(GPU_TOLERATION)], tspec.get("tolerations") or ()),
                            extra.tolerations),
        "terminationGracePeriodSeconds": job.worker.termination_grace_s,
        "containers": [_container(job, unit, env, launcher, mounts, extra.claim_template)],
    })
    if extra.node_selector:
        spec["nodeSelector"] = {**(spec.get("nodeSelector") or {}), **extra.node_selector}
    if extra.claim_template:
        spec["resourceClaims"] = [{"name": CLAIM_NAME, "resourceClaimTemplateName": extra.claim_template}]
    if tspec.get("initContainers"):
        spec["initContainers"] = [_hardened(c) for c in tspec["initContainers"]]
    if job.run_policy.priority_class:
        spec["priorityClassName"] = job.run_policy.priority_class
    volumes += [copy.deepcopy(dict(v)) for v in tspec.get("volumes") or ()]
    if volumes:
        spec["volumes"] = volumes
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": unit.name, "namespace": job.namespace, "labels": labels,
                     "annotations": annotations},
        "spec": spec,
    }


def _own_volumes(job: JobSpec, local_ranks: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Our volumes and the worker's mounts of them: the checkpoint claim, ``/dev/shm``."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if job.training.checkpoint_pvc:
        volumes.append({"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {
            "claimName": job.training.checkpoint_pvc}})
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": job.training.checkpoint_path})
    shm = shared_memory_bytes(job.worker, local_ranks)
    if shm:
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory",
                                                         "sizeLimit": quantity_text(shm)}})
        mounts.append({"name": SHM_VOLUME, "mountPath": podtemplate.SHM_PATH})
    return volumes, mounts


def quantity_text(n_bytes: int) -> str:
    """Bytes as the shortest exact binary quantity: ``4Gi``, ``1536Mi``, ``1000``."""
    for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n_bytes >= size and n_bytes % size == 0:
            return f"{n_bytes // size}{suffix}"
    return str(n_bytes)


def node_affinity(user: Mapping[str, Any], node: str) -> dict[str, Any]:
    """The template's affinity with our node pin ANDed into each of its required node terms
    (node selector terms OR; the expressions of one term AND), so every term still holds and the
    pod lands on its planned node."""
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    out = copy.deepcopy(dict(user))
    node_aff = dict(out.get("nodeAffinity") or {})
    required = dict(node_aff.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or [{}]
    required["nodeSelectorTerms"] = [{**t, "matchFields": [*(t.get("matchFields") or ()), pin]}
                                     for t in terms]
    node_aff["requiredDuringSchedulingIgnoredDuringExecution"] = required
    out["nodeAffinity"] = node_aff
    return out


def _add(ours: list[dict[str, Any]], theirs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``ours`` then each of ``theirs`` not already there."""
    out = list(ours)
    out += [copy.deepcopy(dict(t)) for t in theirs if dict(t) not in out]
    return out


def _hardened(container: Mapping[str, Any]) -> dict[str, Any]:
    """A template init container or native sidecar with our container hardening."""
    out = copy.deepcopy(dict(container))
    out["securityContext"] = {**(out.get("securityContext") or {}),
                              **copy.deepcopy(CONTAINER_SECURITY_CONTEXT)}
    return out


def _container(job: JobSpec, unit: PodUnit, env: Mapping[str, str], launcher: Sequence[str],
               mounts: Sequence[Mapping[str, Any]], claim_template: str = "") -> dict[str, Any]:
    g = unit.group
    user = podtemplate.worker_container(job.worker.template)
    secrets = tracking_secret_env(job)
    ours = set(env) | {e["name"] for e in secrets}
    given = {e.get("name"): e for e in job.worker.env}  # the template's win over spec.worker.env
    given.update({e.get("name"): e for e in user.get("env") or ()})
    user_env = [copy.deepcopy(dict(e)) for name, e in given.items() if name not in ours]
    resources = _resources(merged_resources(job.worker, len(unit.ranks)), g.resource_name, len(unit.ranks),
                           claimed=bool(claim_template))
    container: dict[str, Any] = {k: copy.deepcopy(v) for k, v in user.items()
                                 if k not in _MERGED_CONTAINER_FIELDS}
    container.update({
        "name": CONTAINER, "image": g.image,
        "command": list(launcher), "args": [*job.worker.command, *job.worker.args],
        "env": user_env + [{"name": k, "value": v} for k, v in sorted(env.items())] + secrets,
        "resources": resources,
        "securityContext": {**(user.get("securityContext") or {}),
                            **copy.deepcopy(CONTAINER_SECURITY_CONTEXT)},
    })
    # a failed rank's log tail lands in its status (the job's condition and Event quote it),
    # and rank 0's result file when it succeeded (hetero_operator.lifecycle.startup)
    container.setdefault("terminationMessagePolicy", TERMINATION_MESSAGE_POLICY)
    ports = []
    if unit.ranks[0] == 0:
        ports.append({"name": "rendezvous", "containerPort": int(env[envnames.MASTER_PORT]),
                      "protocol": "TCP"})
    if job.worker.metrics_port:  # local rank i serves on metricsPort + i (heterotrain launch)
        for i in range(len(unit.ranks)):
            ports.append({"name": "metrics" if i == 0 else f"metrics-{i}",
                          "containerPort": job.worker.metrics_port + i, "protocol": "TCP"})
    taken = {p["name"] for p in ports} | {p["containerPort"] for p in ports}
    ports += [copy.deepcopy(dict(p)) for p in user.get("ports") or ()
              if p.get("name") not in taken and p.get("containerPort") not in taken]
    if ports:
        container["ports"] = ports
    volume_mounts = [dict(m) for m in mounts] + [copy.deepcopy(dict(m)) for m in user.get("volumeMounts") or ()]
    if volume_mounts:
        container["volumeMounts"] = volume_mounts
    return container


def tracking_secret_env(job: JobSpec) -> list[dict[str, Any]]:
    """The worker's env entries that bring the online tracking backends' tokens from the Secrets
    ``spec.training.tracking.{wandb,mlflow}.secretRef`` name: ``WANDB_API_KEY`` and
    ``MLFLOW_TRACKING_TOKEN`` (the names the libraries read), each a ``valueFrom.secretKeyRef``
    (never the value: the operator does not read the Secret, and the kubelet refuses to start the
    pod while it is missing). These win over a ``spec.worker.env`` entry of the same name."""
    tracking = json.loads(job.training.tracking_json) if job.training.tracking_json else {}
    out = []
    for backend, env_name in SECRET_KEYS.items():
        ref = (tracking.get(backend) or {}).get("secretRef")
        if ref:
            out.append({"name": env_name, "valueFrom": {"secretKeyRef": {"name": ref["name"],
                                                                         "key": ref["key"]}}})
    return out


def pod_security_context(job: JobSpec, user: Mapping[str, Any], *,
                          run_as_non_root: bool) -> dict[str, Any]:
    ctx: dict[str, Any] = copy.deepcopy(dict(user))  # seccompProfile, runAsNonRoot: refused there
    ctx["seccompProfile"] = {"type": "RuntimeDefault"}
    if run_as_non_root:
        ctx["runAsNonRoot"] = True
    if job.training.checkpoint_pvc:  # the image's group may write the volume; chown only once
        ctx.setdefault("fsGroup", WORKER_FS_GROUP)
        ctx.setdefault("fsGroupChangePolicy", "OnRootMismatch")
    return ctx


DNS_NAMESPACE = "kube-system"
DNS_LABELS: Mapping[str, str] = {"k8s-app": "kube-dns"}
"""Where the cluster DNS runs: CoreDNS keeps kube-dns's label in ``kube-system`` (kubeadm, EKS,
GKE, AKS); the operator settings ``HTJ_DNS_NAMESPACE``/``HTJ_DNS_LABELS`` change it."""


def render_network_policy(job: JobSpec, plan: Plan, *, metrics_namespaces: Sequence[str],
                          egress: bool = False, dns_namespace: str = DNS_NAMESPACE,
                          dns_labels: Mapping[str, str] = DNS_LABELS) -> dict[str, Any]:
    """The NetworkPolicy ``<job>``: who may connect to the job's pods, and where they may connect.

    Ingress:

    * the job's own pods (same namespace, :func:`selector`), on every port: the rendezvous store
      listens on ``MASTER_PORT``, but Gloo and NCCL's socket transport connect to ephemeral ports
      that cannot be listed;
    * pods of ``metrics_namespaces`` (Prometheus, and the operator, which reads rank 0's metrics),
      on the metrics ports ``metricsPort .. metricsPort + local ranks - 1`` only.

    Nothing else reaches the pods (the ``*_object`` collectives unpickle what they receive).

    Egress (``egress``: the namespace isolates the pods' egress, e.g. a "default deny all"
    policy, shared/cases/46): the job's own pods on every port, and the cluster DNS on UDP and
    TCP 53 (``MASTER_ADDR`` is a name).  Anything else (datasets, object stores) stays as the
    namespace's own policies decide.  Without ``egress`` the policy restricts ingress only and
    egress is as open as the namespace leaves it.

    Args:
        job: the parsed job.
        plan: its plan (the largest pod's local ranks bound the metrics port range).
        metrics_namespaces: namespaces allowed to scrape, e.g. ``["monitoring", "heterotrain"]``.
        egress: add ``Egress`` to ``policyTypes`` with the job's own egress rules.
        dns_namespace / dns_labels: the namespace and pod labels of the cluster DNS.

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
    spec: dict[str, Any] = {"podSelector": own_pods, "policyTypes": ["Ingress"], "ingress": ingress}
    if egress:
        spec["policyTypes"] = ["Ingress", "Egress"]
        spec["egress"] = [
            {"to": [{"podSelector": copy.deepcopy(own_pods)}]},
            {"to": [{"namespaceSelector": {"matchLabels": {METRICS_NAMESPACE_LABEL: dns_namespace}},
                     "podSelector": {"matchLabels": dict(dns_labels)}}],
             "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        ]
    return {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": job.name, "namespace": job.namespace,
                     "labels": {LABEL_JOB: job.name, LABEL_MANAGED_BY: MANAGED_BY}},
        "spec": spec,
    }


def _resources(base: Mapping[str, Any], resource_name: str, count: int, *,
               claimed: bool = False) -> dict[str, Any]:
    """CPU and memory as given, plus ``count`` devices: the extended resource, or (``claimed``)
    the pod's DRA claim :data:`CLAIM_NAME` (its template holds the count)."""
    out = {k: dict(v) for k, v in base.items() if k in ("requests", "limits") and v}
    if claimed:
        for key in ("requests", "limits"):
            out.get(key, {}).pop(resource_name, None)
            if key in out and not out[key]:
                del out[key]
        out["claims"] = [{"name": CLAIM_NAME}]
        return out
    for key in ("requests", "limits"):
        out.setdefault(key, {})[resource_name] = str(count)
    return out


def _ranks_text(ranks: Sequence[int]) -> str:
    return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"
