"""The membership keeper pod of an elastic job (``spec.elastic``, issue 31; pure: dicts in, dicts out).

An elastic job's ranks re-form among themselves when one is lost and take a joining rank in at a
step boundary; they agree on who is in through a store that must outlive every rank, rank 0
included. So the operator runs one more pod per attempt, ``<job>-membership``: the worker image of
rank 0's group (it has torch) running ``heterotrain keeper`` (``hetero_worker.membership.keeper``), which hosts
the store on the rendezvous port, notices a lost rank when its heartbeat stops, announces each
membership generation, and serves its view as JSON on the metrics port (``GET /membership``).
The pod asks for no GPU and little CPU and memory; it is hardened like the rank pods (no
privileges, no service-account token: it never talks to the API server). It is pinned to rank 0's
node: losing that node loses the store, and the job falls back to the gang restart
(docs/elastic.md).

Every rank gets ``MASTER_ADDR`` = the keeper's address (``<job>-membership.<job>.<ns>.svc``
through the job's headless Service) and ``HTJ_ELASTIC_STORE`` = ``MASTER_ADDR:MASTER_PORT``
(:func:`with_store`); elastic ranks rendezvous only through that store.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from hetero_operator.api.elasticspec import ElasticSpec
from hetero_operator.api.labels import LABEL_ATTEMPT, LABEL_ROLE, ROLE_KEEPER, selector
from hetero_operator.api.spec import JobSpec
from hetero_operator.api.types import Plan
from hetero_operator.render import pods as rendering
from heterotrain_common import envnames
from heterotrain_common.membership import JOIN_NEXT

KEEPER_SUFFIX = "-membership"
KEEPER_COMMAND = ("heterotrain", "keeper")
"""The keeper's argv prefix: the ``heterotrain`` console script of the worker image."""
KEEPER_RESOURCES: Mapping[str, Mapping[str, str]] = {
    "requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}
"""The keeper's CPU and memory: a TCPStore and a 0.2 s poll (torch's import is most of it)."""
KEEPER_CONTAINER = "keeper"


def keeper_name(job_name: str) -> str:
    """The keeper pod's name (and hostname): ``<job>-membership``."""
    return f"{job_name}{KEEPER_SUFFIX}"


def keeper_addr(job_name: str, namespace: str, domain: str = "svc") -> str:
    """``<job>-membership.<job>.<namespace>.<domain>``: the keeper through the headless Service."""
    return f"{keeper_name(job_name)}.{job_name}.{namespace}.{domain}"


def with_store(rank_envs: Sequence[Mapping[str, str]], *, address: str,
               port: int) -> list[dict[str, str]]:
    """``rank_envs`` with ``HTJ_ELASTIC_STORE=<address>:<port>`` (the keeper's store) added."""
    return [{**env, envnames.ELASTIC_STORE: f"{address}:{port}"} for env in rank_envs]


def joining(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of rank pod ``pod`` (as rendered at the start) whose ranks join the running job
    (``HTJ_ELASTIC_JOIN_GENERATION=next``: the keeper assigns the generation)."""
    out = copy.deepcopy(dict(pod))
    for c in out["spec"]["containers"]:
        if c["name"] == rendering.CONTAINER:
            c["env"] = [e for e in c.get("env") or () if e["name"] != envnames.ELASTIC_JOIN_GENERATION]
            c["env"].append({"name": envnames.ELASTIC_JOIN_GENERATION,
                             "value": JOIN_NEXT})
    return out


def on_node(pod: Mapping[str, Any], node: str) -> dict[str, Any]:
    """A copy of rank pod ``pod`` pinned to ``node`` instead of its planned node (an elastic pod
    coming back on another node of its GPU type): the node pin of each required node term
    (:func:`hetero_operator.render.pods.node_affinity`) names ``node``."""
    out = copy.deepcopy(dict(pod))
    required = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in required["nodeSelectorTerms"]:
        for field in term.get("matchFields") or ():
            if field.get("key") == "metadata.name":
                field["values"] = [node]
    return out


def render_keeper(job: JobSpec, elastic: ElasticSpec, plan: Plan, *, master_port: int,
                  attempt: int, run_as_non_root: bool = True) -> dict[str, Any]:
    """The keeper pod of ``job``'s attempt ``attempt`` (``v1/Pod`` dict, no owner reference).

    Args:
        job: the parsed job (its name, namespace, metrics port, priority class).
        elastic: ``spec.elastic`` (the keeper's ``--min-ranks``/``--max-ranks``).
        plan: its plan (rank 0's group gives the image and the node; ``--members`` is its world).
        master_port: the rendezvous port, which the keeper's store listens on.
        attempt: the :data:`~hetero_operator.api.labels.LABEL_ATTEMPT` of the attempt.
        run_as_non_root: as for the rank pods.
    """
    first = plan.groups[0]
    name = keeper_name(job.name)
    env = [{"name": envnames.MASTER_PORT, "value": str(master_port)},
           {"name": envnames.METRICS_PORT, "value": str(job.worker.metrics_port)}]
    container: dict[str, Any] = {
        "name": KEEPER_CONTAINER, "image": first.image,
        "command": [*KEEPER_COMMAND, "--members", str(plan.world_size),
                    "--min-ranks", str(elastic.min_ranks), "--max-ranks", str(elastic.max_ranks)],
        "env": env, "resources": copy.deepcopy(dict(KEEPER_RESOURCES)),
        "ports": [{"name": "rendezvous", "containerPort": master_port, "protocol": "TCP"}]
        + ([{"name": "metrics", "containerPort": job.worker.metrics_port, "protocol": "TCP"}]
           if job.worker.metrics_port else []),
        "securityContext": copy.deepcopy(rendering.CONTAINER_SECURITY_CONTEXT),
        "terminationMessagePolicy": rendering.TERMINATION_MESSAGE_POLICY,
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never", "automountServiceAccountToken": False,
        "enableServiceLinks": False, "hostname": name, "subdomain": job.name,
        "securityContext": rendering.pod_security_context(job, {}, run_as_non_root=run_as_non_root),
        "affinity": rendering.node_affinity({}, first.node),
        "tolerations": [dict(rendering.GPU_TOLERATION)],
        "containers": [container],
    }
    if job.run_policy.priority_class:
        spec["priorityClassName"] = job.run_policy.priority_class
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": job.namespace,
                         "labels": {**selector(job.name), LABEL_ATTEMPT: str(attempt),
                                    LABEL_ROLE: ROLE_KEEPER}},
            "spec": spec}
