"""Thin async wrappers over the Kubernetes API (the official client, run in worker threads).

Every call returns plain JSON dicts (``_preload_content=False``), tolerates the harmless cases
(409 on create: the deterministic name exists already; 404 on delete: already gone) and lets
everything else raise for the reconciler's retry to handle.

Every call is bounded (shared/cases/25): a connect and a read timeout on the request itself
(urllib3 closes a connection that stays silent), an asyncio deadline on the worker thread as a
second guard (counted from when the thread starts, not while the call waits for a free thread), and a few retries with exponential backoff for what is worth retrying
(timeouts, dropped connections, 429 and 5xx).  A reconcile therefore never holds its job's
lock on a dead pooled connection: at worst it gives up after ``(retries + 1)`` timeouts and the
job is looked at again after the resync period.  Retrying a create is safe (names are
deterministic: a create that reached the server answers 409 the second time); patches are merge
patches and deletes tolerate 404.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes
import urllib3

from hetero_operator.api.spec import API_GROUP, PLURAL, VERSION

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
log = logging.getLogger("heterotrain.operator.api")


def load_configuration() -> kubernetes.client.Configuration:
    """In-cluster service account, else ``$KUBECONFIG``/``~/.kube/config``.

    Raises:
        kubernetes.config.ConfigException: neither is available.
    """
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None,
                                           client_configuration=config)
    return config


def selector_text(labels: Mapping[str, str]) -> str:
    """``a=b,c=d`` label selector."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


@dataclass(frozen=True, kw_only=True, slots=True)
class CallLimits:
    """Bounds of every API call.

    Attributes:
        connect_timeout_s: TCP/TLS connect timeout, seconds.
        read_timeout_s: longest silence while waiting for the response, seconds.
        retries: further attempts after a retryable failure (0 = one attempt).
        backoff_s: delay before the first retry, doubled for each next one, seconds.
    """

    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0
    retries: int = 3
    backoff_s: float = 0.2

    @property
    def worst_case_s(self) -> float:
        """Upper bound of one call with all its retries, seconds."""
        per_try = self.connect_timeout_s + self.read_timeout_s + 1.0
        return (self.retries + 1) * per_try + sum(self.backoff_s * 2 ** i for i in range(self.retries))


def retryable(exc: BaseException) -> bool:
    """True for timeouts, dropped connections, 429 and 5xx answers."""
    if isinstance(exc, kubernetes.client.ApiException):
        return exc.status in RETRY_STATUSES or exc.status == 0
    return isinstance(exc, (urllib3.exceptions.HTTPError, asyncio.TimeoutError, TimeoutError,
                            ConnectionError))


async def _in_thread(fn: Callable[[], Any], deadline_s: float) -> Any:
    """Run ``fn`` in the default executor; give up ``deadline_s`` after it *started* (time spent
    queued behind other calls, e.g. 500 jobs starting at once, does not count)."""
    loop = asyncio.get_running_loop()
    began = asyncio.Event()

    def run() -> Any:
        loop.call_soon_threadsafe(began.set)
        return fn()

    future = loop.run_in_executor(None, run)
    waiter = loop.create_task(began.wait())
    try:
        await asyncio.wait({future, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    return await asyncio.wait_for(future, deadline_s)


class Api:
    """The calls the reconciler makes; one instance per operator.

    Args:
        configuration: the client configuration (:func:`load_configuration`).
        limits: timeouts and retries of every call.
    """

    def __init__(self, configuration: kubernetes.client.Configuration,
                 limits: CallLimits = CallLimits()) -> None:
        if configuration.retries is None:
            configuration.retries = False  # our loop retries (urllib3's would multiply the waits)
        self.limits = limits
        self.client = kubernetes.client.ApiClient(configuration)
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.custom = kubernetes.client.CustomObjectsApi(self.client)
        self.networking = kubernetes.client.NetworkingV1Api(self.client)
        self.apiextensions = kubernetes.client.ApiextensionsV1Api(self.client)
        self.retried = 0
        """Retries so far (all calls), for tests and logs."""

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        lim = self.limits
        timeout = (lim.connect_timeout_s, lim.read_timeout_s)

        def blocking() -> bytes:
            resp = fn(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
            return resp.data  # the body is read here, in the worker thread, under the read timeout

        for attempt in range(lim.retries + 1):
            try:
                data = await _in_thread(blocking, lim.connect_timeout_s + lim.read_timeout_s + 1.0)
                return json.loads(data) if data else {}
            except Exception as exc:  # noqa: BLE001 - classified right below
                if attempt >= lim.retries or not retryable(exc):
                    raise
                delay = lim.backoff_s * 2 ** attempt
                log.warning("%s failed (%s: %s); retry %d of %d in %.1f s", getattr(fn, "__name__", fn),
                            type(exc).__name__, str(exc)[:200], attempt + 1, lim.retries, delay)
                self.retried += 1
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _read(self, fn: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
        """``fn(*args)``'s object, ``None`` when it does not exist (404)."""
        try:
            return await self._call(fn, *args)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def _create(self, fn: Callable[..., Any], namespace: str, body: Mapping[str, Any]) -> bool:
        """Create ``body`` in ``namespace``; ``False`` when one of its name exists (409)."""
        try:
            await self._call(fn, namespace, dict(body))
            return True
        except kubernetes.client.ApiException as exc:
            if exc.status == 409:
                return False
            raise

    async def _unless_gone(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """``fn(*args, **kwargs)`` (a patch or delete); a 404 (the object is gone) is ignored."""
        try:
            await self._call(fn, *args, **kwargs)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job, or ``None`` when it is gone."""
        return await self._read(self.custom.get_namespaced_custom_object, API_GROUP, VERSION,
                                namespace, PLURAL, name)

    async def patch_job_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch the ``status`` subresource (404 ignored: the job was deleted)."""
        await self._unless_gone(self.custom.patch_namespaced_custom_object_status, API_GROUP, VERSION,
                                namespace, PLURAL, name, {"status": dict(status)})

    async def delete_job(self, namespace: str, name: str) -> None:
        """Delete the job; its pods and Service go by owner references (404 ignored)."""
        await self._unless_gone(self.custom.delete_namespaced_custom_object, API_GROUP, VERSION,
                                namespace, PLURAL, name, propagation_policy="Background")

    async def create(self, obj: Mapping[str, Any]) -> bool:
        """Create a Pod, Service or NetworkPolicy; ``False`` when it already exists (409)."""
        fn = {"Pod": self.core.create_namespaced_pod,
              "Service": self.core.create_namespaced_service,
              "NetworkPolicy": self.networking.create_namespaced_network_policy}[obj["kind"]]
        return await self._create(fn, obj["metadata"]["namespace"], obj)

    async def read(self, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        """The Pod, Service or NetworkPolicy of ``obj``'s kind, namespace and name, ``None`` when
        absent (404): what a create answered 409 found (:mod:`hetero_operator.controller.ownership`)."""
        fn = {"Pod": self.core.read_namespaced_pod,
              "Service": self.core.read_namespaced_service,
              "NetworkPolicy": self.networking.read_namespaced_network_policy}[obj["kind"]]
        meta = obj["metadata"]
        return await self._read(fn, meta["name"], meta["namespace"])

    async def patch_network_policy(self, obj: Mapping[str, Any]) -> None:
        """Bring the job's existing NetworkPolicy's ``spec`` to ``obj``'s (a restart may need
        egress rules the first start did not: the namespace changed).  Only for a policy the
        job owns (:func:`hetero_operator.controller.ownership.create_owned` checked it)."""
        meta = obj["metadata"]
        await self._call(self.networking.patch_namespaced_network_policy, meta["name"],
                         meta["namespace"], {"spec": dict(obj["spec"])},
                         _content_type="application/merge-patch+json")

    async def list_network_policies(self, namespace: str) -> list[dict[str, Any]]:
        """The NetworkPolicies of ``namespace``."""
        data = await self._call(self.networking.list_namespaced_network_policy, namespace)
        return list(data.get("items") or [])

    async def list_pods(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """Pods matching ``labels`` in ``namespace``."""
        data = await self._call(self.core.list_namespaced_pod, namespace,
                                label_selector=selector_text(labels))
        return list(data.get("items") or [])

    async def get_pvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The PersistentVolumeClaim ``namespace/name`` (its access modes), None when absent."""
        return await self._read(self.core.read_namespaced_persistent_volume_claim, name, namespace)

    async def list_pod_events(self, namespace: str, *, reason: str) -> list[dict[str, Any]]:
        """Events about pods of ``namespace`` with ``reason`` (a field selector: the server filters)."""
        data = await self._call(self.core.list_namespaced_event, namespace,
                                field_selector=f"involvedObject.kind=Pod,reason={reason}")
        return list(data.get("items") or [])

    async def delete_pod(self, namespace: str, name: str, *, grace_s: int | None = None) -> None:
        """Delete a pod (404 ignored).

        Args:
            namespace: its namespace.
            name: its name.
            grace_s: ``gracePeriodSeconds``; ``0`` force-deletes (the object goes at once, no
                kubelet confirmation: only for pods on a lost node); ``None`` = the pod's own.
        """
        kwargs = {} if grace_s is None else {"grace_period_seconds": grace_s}
        await self._unless_gone(self.core.delete_namespaced_pod, name, namespace, **kwargs)

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap ``namespace/name``, or ``None`` when it does not exist."""
        return await self._read(self.core.read_namespaced_config_map, name, namespace)

    async def create_configmap(self, namespace: str, body: Mapping[str, Any]) -> bool:
        """Create a ConfigMap; ``False`` when one of that name exists (409)."""
        return await self._create(self.core.create_namespaced_config_map, namespace, body)

    async def patch_configmap(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool:
        """JSON merge patch (RFC 7386) of a ConfigMap; ``False`` on 409 (the patch's
        ``metadata.resourceVersion`` is no longer current) or 404 (deleted meanwhile)."""
        try:
            await self._call(self.core.patch_namespaced_config_map, name, namespace, dict(patch),
                             _content_type="application/merge-patch+json")
            return True
        except kubernetes.client.ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise

    async def get_crd(self, name: str) -> dict[str, Any] | None:
        """The CustomResourceDefinition ``name``, or ``None`` when it is not installed."""
        return await self._read(self.apiextensions.read_custom_resource_definition, name)

    async def get_peering(self, name: str, namespace: str | None) -> dict[str, Any] | None:
        """The kopf peering object (``ClusterKopfPeering`` when ``namespace`` is None)."""
        if namespace is None:
            return await self._read(self.custom.get_cluster_custom_object, "kopf.dev", "v1",
                                    "clusterkopfpeerings", name)
        return await self._read(self.custom.get_namespaced_custom_object, "kopf.dev", "v1",
                                namespace, "kopfpeerings", name)

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> bool:
        """Create a ``v1/Event``; ``False`` when one of that name exists (409)."""
        return await self._create(self.core.create_namespaced_event, namespace, event)

    async def get_event(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A ``v1/Event``, ``None`` when gone (events expire, by default after one hour)."""
        return await self._read(self.core.read_namespaced_event, name, namespace)

    async def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Patch a ``v1/Event`` (its count and lastTimestamp when it repeats)."""
        await self._call(self.core.patch_namespaced_event, name, namespace, dict(patch))

    def close(self) -> None:
        """Release the connection pool."""
        self.client.close()
