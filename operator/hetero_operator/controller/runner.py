"""``heterotrain operator``: settings, kopf startup, liveness endpoint and peering.

Peering (HA): replicas share the ``ClusterKopfPeering`` named ``heterotrain`` (cluster-wide) or a
``KopfPeering`` of that name in each watched namespace; each replica gets a distinct random
priority, so exactly one acts and the others take over when it stops renewing (kopf's rule).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
from typing import Any

import kopf

from hetero_operator.api.settings import OperatorConfig
from hetero_operator.controller import schemacheck
from hetero_operator.controller.clustercache import ClusterCache
from hetero_operator.controller.k8s import Api, CallLimits, load_configuration
from hetero_operator.controller.metrics import OperatorMetrics
from hetero_operator.controller.progress import MetricsUrlFn, default_metrics_url
from hetero_operator.controller.reconcile import Reconciler


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
                                  standalone=not config.peering.name,
                                  peering_name=config.peering.name or None,
                                  priority=config.peering.priority)
    if config.watch.namespaces:
        kwargs["namespaces"] = list(config.watch.namespaces)
    else:
        kwargs["clusterwide"] = True
    if config.ports.health:
        kwargs["liveness_endpoint"] = f"http://0.0.0.0:{config.ports.health}/healthz"
    return kwargs


def apply_settings(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """kopf settings: progress in annotations (status holds only our fields, case 24), bounded
    watches (case 25) and mandatory peering (case 26).

    Watches: kopf's ``server_timeout``/``client_timeout`` default to ``None`` (wait for ever), so a
    watch connection that a proxy dropped without a reset would never be noticed; the server ends
    every watch after ``watch.server_timeout_s``, the client gives up a second later, and a stream
    without data for ``watch.inactivity_timeout_s`` is reconnected.

    Peering is mandatory when named: a starting replica stays paused until it has read the
    peering object (kopf pre-activates the pause), so during an upgrade it never acts before it
    knows whether a live peer outranks it; a missing peering CRD pauses it rather than letting it
    act alone.
    """
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="heterotrain.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="heterotrain.io", key="last-handled-configuration")
    settings.posting.level = logging.WARNING
    settings.peering.priority = config.peering.priority
    settings.peering.clusterwide = not config.watch.namespaces
    if config.peering.name:
        settings.peering.name = config.peering.name
        settings.peering.mandatory = True
    # whole seconds: a real API server refuses timeoutSeconds=300.0 (400 BadRequest, strconv.ParseInt)
    settings.watching.server_timeout = max(1, round(config.watch.server_timeout_s))
    settings.watching.client_timeout = config.watch.client_timeout_s
    settings.watching.connect_timeout = config.watch.connect_timeout_s
    settings.watching.inactivity_timeout = config.watch.inactivity_timeout_s


async def on_startup(settings: kopf.OperatorSettings, memo: kopf.Memo) -> None:
    """Apply settings, connect to the API, start the metrics endpoint and the reconciler."""
    config: OperatorConfig = memo.config
    apply_settings(settings, config)
    api = Api(await asyncio.to_thread(load_configuration), CallLimits(
        connect_timeout_s=config.api.connect_timeout_s, read_timeout_s=config.api.read_timeout_s,
        retries=config.api.retries))
    await check_crd(api)
    memo.metrics.serve(config.ports.metrics)
    # Every Node and GPU pod first, then jobs: kopf starts watching jobs only after this handler
    # returns, so no job is planned on a partial inventory (the synced gate, issue 32 item 9).
    cache = ClusterCache(api.core, config, reconciler=lambda: memo.state.get("reconciler"))
    memo.state["cache"] = cache
    cache.start()
    await cache.wait_synced()
    memo.state["reconciler"] = Reconciler(
        config=config, api=api, metrics=memo.metrics, nodes=cache.node_values,
        gpu_pods=cache.gpu_pod_values,
        identity=memo.identity if config.peering.name else None,
        peering_namespace=None if not config.watch.namespaces else config.watch.namespaces[0],
        namespaced_peering=bool(config.watch.namespaces),
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
    """Stop the informers and the reconciler and close the API client."""
    cache: ClusterCache | None = memo.state.get("cache")
    if cache is not None:
        await asyncio.to_thread(cache.stop)
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


def reconciler(memo: kopf.Memo) -> Reconciler:
    """The reconciler (created by :func:`on_startup` once the Node and Pod informers are synced)."""
    rec: Reconciler = memo.state["reconciler"]
    return rec
