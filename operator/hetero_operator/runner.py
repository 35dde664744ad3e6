"""``heterotrain operator``: settings, kopf startup, liveness endpoint and peering.

Peering (HA): replicas share the ``ClusterKopfPeering`` named ``heterotrain`` (cluster-wide) or a
``KopfPeering`` of that name in each watched namespace; each replica gets a distinct random
priority, so exactly one acts and the others take over when it stops renewing (kopf's rule).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import socket
from collections.abc import Mapping
from typing import Any

import kopf

from hetero_operator import schemacheck
from hetero_operator.config import OperatorConfig
from hetero_operator.k8s import Api, CallLimits, load_configuration
from hetero_operator.nodeindex import IndexedNode, IndexedPod
from hetero_operator.opmetrics import OperatorMetrics
from hetero_operator.reconcile import MetricsUrlFn, Reconciler, default_metrics_url
from hetero_operator.rendering import LABEL_MANAGED_BY, MANAGED_BY

GPU_RESOURCE_PREFIX = "nvidia.com/"


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of ``heterotrain operator`` (each overrides its ``HTJ_*`` variable)."""
    parser.add_argument("-n", "--namespace", action="append", dest="namespaces",
                        help="namespace (pattern) to watch; repeat; default: cluster-wide (HTJ_NAMESPACES)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus port, 0 = off (HTJ_METRICS_PORT, 8080)")
    parser.add_argument("--health-port", type=int, help="liveness port, 0 = off (HTJ_HEALTH_PORT, 8081)")
    parser.add_argument("--peering", help="kopf peering name; '' = standalone (HTJ_PEERING, heterotrain)")
    parser.add_argument("--priority", type=int, dest="peering_priority",
                        help="peering priority of this replica (HTJ_PEERING_PRIORITY, random)")
    parser.add_argument("--pending-timeout-s", type=float, help="re-plan after pods Pending this long (300)")
    parser.add_argument("--verbose", action="store_true", help="debug logging")


def run(args: argparse.Namespace) -> int:
    """Run the operator until interrupted; returns the exit code."""
    overrides = {k: getattr(args, k, None) for k in
                 ("metrics_port", "health_port", "peering", "peering_priority", "pending_timeout_s")}
    if getattr(args, "namespaces", None):
        overrides["namespaces"] = tuple(args.namespaces)
    config = OperatorConfig.from_env(**overrides)
    logging.basicConfig(level=logging.DEBUG if getattr(args, "verbose", False) else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not getattr(args, "verbose", False):
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # one line per watch event
    import hetero_operator.main  # noqa: F401 - registers the handlers

    memo = make_memo(config)
    kopf.run(**operator_kwargs(config, memo))
    return 0


def make_identity() -> str:
    """A peering identity unique per replica: ``host/pid/random``."""
    return f"{socket.gethostname()}/{os.getpid()}/{random.getrandbits(32):08x}"


def make_memo(config: OperatorConfig, *, metrics_url: MetricsUrlFn = default_metrics_url,
              identity: str | None = None) -> kopf.Memo:
    """The operator-wide memo: config, metrics and (after startup) the reconciler."""
    return kopf.Memo(config=config, metrics=OperatorMetrics(), metrics_url=metrics_url,
                     identity=identity or make_identity(), state={})


def operator_kwargs(config: OperatorConfig, memo: kopf.Memo) -> dict[str, Any]:
    """Keyword arguments for ``kopf.run``/``kopf.operator`` from the settings."""
    kwargs: dict[str, Any] = dict(memo=memo, identity=memo.identity,
                                  standalone=not config.peering,
                                  peering_name=config.peering or None,
                                  priority=config.peering_priority)
    if config.namespaces:
        kwargs["namespaces"] = list(config.namespaces)
    else:
        kwargs["clusterwide"] = True
    if config.health_port:
        kwargs["liveness_endpoint"] = f"http://0.0.0.0:{config.health_port}/healthz"
    return kwargs


def apply_settings(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """kopf settings: progress in annotations (status holds only our fields, case 24), bounded
    watches (case 25) and mandatory peering (case 26).

    Watches: kopf's ``server_timeout``/``client_timeout`` default to ``None`` (wait for ever), so a
    watch connection that a proxy dropped without a reset would never be noticed; the server ends
    every watch after ``watch_server_timeout_s``, the client gives up a second later, and a stream
    without data for ``watch_inactivity_timeout_s`` is reconnected.

    Peering is mandatory when named: a starting replica stays paused until it has read the
    peering object (kopf pre-activates the pause), so during an upgrade it never acts before it
    knows whether a live peer outranks it; a missing peering CRD pauses it rather than letting it
    act alone.
    """
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="heterotrain.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="heterotrain.io", key="last-handled-configuration")
    settings.posting.level = logging.WARNING
    settings.peering.priority = config.peering_priority
    settings.peering.clusterwide = not config.namespaces
    if config.peering:
        settings.peering.name = config.peering
        settings.peering.mandatory = True
    settings.watching.server_timeout = config.watch_server_timeout_s
    settings.watching.client_timeout = config.watch_client_timeout_s
    settings.watching.connect_timeout = config.watch_connect_timeout_s
    settings.watching.inactivity_timeout = config.watch_inactivity_timeout_s


async def on_startup(settings: kopf.OperatorSettings, memo: kopf.Memo) -> None:
    """Apply settings, connect to the API, start the metrics endpoint and the reconciler."""
    config: OperatorConfig = memo.config
    apply_settings(settings, config)
    api = Api(await asyncio.to_thread(load_configuration), CallLimits(
        connect_timeout_s=config.api_connect_timeout_s, read_timeout_s=config.api_read_timeout_s,
        retries=config.api_retries))
    await check_crd(api)
    memo.metrics.serve(config.metrics_port)
    memo.state["reconciler"] = Reconciler(
        config=config, api=api, metrics=memo.metrics, nodes=list, gpu_pods=list,
        identity=memo.identity if config.peering else None,
        peering_namespace=None if not config.namespaces else config.namespaces[0],
        namespaced_peering=bool(config.namespaces),
        metrics_url=memo.metrics_url)


async def check_crd(api: Api) -> None:
    """Refuse to start against a missing or stale HeteroTrainingJob CRD (shared/cases/27).

    Raises:
        kopf.PermanentError: naming the missing fields; kopf then stops the operator (a failed
            startup handler ends ``kopf.run``), so it never runs with silently pruned settings.
    """
    required = schemacheck.required_fields()
    if not required:
        logging.getLogger("heterotrain.operator").warning(
            "no copy of the HeteroTrainingJob CRD shipped with this operator was found; the "
            "installed CRD is not checked (the operator image carries one)")
        return
    try:
        schemacheck.check_installed_crd(await api.get_crd(schemacheck.CRD_NAME), required)
    except schemacheck.StaleCrdError as exc:
        logging.getLogger("heterotrain.operator").error("refusing to start: %s", exc)
        api.close()
        raise kopf.PermanentError(str(exc)) from exc


async def on_cleanup(memo: kopf.Memo) -> None:
    """Stop the reconciler and close the API client."""
    reconciler: Reconciler | None = memo.state.get("reconciler")
    if reconciler is not None:
        await reconciler.stop()
        reconciler.api.close()


def login() -> kopf.ConnectionInfo:
    """kopf's credentials from the same source as our API client (service account or
    ``$KUBECONFIG``, read at call time), like kopf's own ``login_via_client``."""
    config = load_configuration()
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix("authorization")
    parts = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else (parts[0], parts[1])
    return kopf.ConnectionInfo(server=config.host, ca_path=config.ssl_ca_cert,
                               insecure=not config.verify_ssl, username=config.username or None,
                               password=config.password or None, scheme=scheme, token=token,
                               certificate_path=config.cert_file, private_key_path=config.key_file)


def reconciler(memo: kopf.Memo, nodes_idx: kopf.Index[str, Any],
               gpu_pods_idx: kopf.Index[str, Any]) -> Reconciler:
    """The reconciler, bound to the live node and GPU-pod indices."""
    rec: Reconciler = memo.state["reconciler"]
    if not memo.state.get("bound"):
        rec.nodes = lambda: [v for store in nodes_idx.values() for v in store]
        rec.gpu_pods = lambda: [v for store in gpu_pods_idx.values() for v in store]
        memo.state["bound"] = True
    return rec


def trim_node(body: Mapping[str, Any]) -> IndexedNode:
    """What the planner reads of a Node: name, labels, taints, unschedulable, capacity, conditions.

    An :class:`~hetero_operator.nodeindex.IndexedNode`: the index value also keeps the node's
    parse, so a start re-reads only nodes that changed (issue 11).  Conditions lose
    ``lastHeartbeatTime`` (nothing reads it): a kubelet's heartbeat then leaves the value equal,
    kopf keeps the old one, and its parse survives.
    """
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status", {})
    trimmed = {k: status[k] for k in ("capacity", "allocatable") if k in status}
    if "conditions" in status:
        trimmed["conditions"] = [{k: v for k, v in c.items() if k != "lastHeartbeatTime"}
                                 for c in status["conditions"] or ()]
    return IndexedNode({
        "metadata": {"name": meta.get("name"), "labels": dict(meta.get("labels") or {}),
                     "annotations": dict(meta.get("annotations") or {})},
        "spec": {k: spec[k] for k in ("unschedulable", "taints") if k in spec},
        "status": trimmed,
    })


def gpu_pod_entry(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """``{node: trimmed pod}`` for a bound, unfinished pod requesting NVIDIA resources; else None.

    Our own pods count from their creation: before the scheduler binds one, its node is the one
    its required node affinity pins it to.  Otherwise jobs started in the same seconds all plan
    onto the same free GPUs (seen in bench/bench_operator.py: 500 jobs, all on two nodes).
    """
    spec, status = body.get("spec", {}), body.get("status", {})
    node = spec.get("nodeName") or _pinned_node(body)
    if not node or status.get("phase") in ("Succeeded", "Failed"):
        return None
    if (body.get("metadata") or {}).get("deletionTimestamp") and status.get("phase") != "Running":
        return None
    containers = [{"name": ct.get("name"), "resources": ct.get("resources") or {}}
                  for ct in spec.get("containers") or ()]
    wants_gpu = any(k.startswith(GPU_RESOURCE_PREFIX)  # requests/limits; DRA's `claims` is a list
                    for ct in containers for part in ct["resources"].values()
                    if isinstance(part, Mapping) for k in part)
    if not wants_gpu:
        return None
    meta = body.get("metadata") or {}
    return {node: IndexedPod({"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                                           "labels": dict(meta.get("labels") or {})},
                              "spec": {"nodeName": node, "containers": containers},
                              "status": {"phase": status.get("phase")}})}


def _pinned_node(body: Mapping[str, Any]) -> str | None:
    """The one node a not-yet-bound pod of ours is pinned to (``rendering``'s required node
    affinity ``metadata.name In [node]``); None for anything else."""
    labels = (body.get("metadata") or {}).get("labels") or {}
    if labels.get(LABEL_MANAGED_BY) != MANAGED_BY:
        return None
    try:
        terms = body["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    except (KeyError, TypeError):
        return None
    names = [v for t in terms or () for f in t.get("matchFields") or ()
             if f.get("key") == "metadata.name" and f.get("operator") == "In" for v in f.get("values") or ()]
    return names[0] if len(terms or ()) == 1 and len(names) == 1 else None
