"""Thin async wrappers over the Kubernetes API (the official client, run in worker threads).

Every call returns plain JSON dicts (``_preload_content=False``), tolerates the harmless cases
(409 on create: the deterministic name exists already; 404 on delete: already gone) and lets
everything else raise :class:`kubernetes.client.ApiException` for kopf's retry to handle.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Mapping
from typing import Any

import kubernetes

from hetero_operator.spec import API_GROUP, PLURAL

VERSION = "v1alpha1"


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


class Api:
    """The calls the reconciler makes; one instance per operator."""

    def __init__(self, configuration: kubernetes.client.Configuration) -> None:
        self.client = kubernetes.client.ApiClient(configuration)
        self.core = kubernetes.client.CoreV1Api(self.client)
        self.custom = kubernetes.client.CustomObjectsApi(self.client)

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        resp = await asyncio.to_thread(fn, *args, _preload_content=False, **kwargs)
        data = resp.data
        return json.loads(data) if data else {}

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The job, or ``None`` when it is gone."""
        try:
            return await self._call(self.custom.get_namespaced_custom_object, API_GROUP, VERSION,
                                    namespace, PLURAL, name)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def patch_job_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        """Merge-patch the ``status`` subresource (404 ignored: the job was deleted)."""
        try:
            await self._call(self.custom.patch_namespaced_custom_object_status, API_GROUP, VERSION,
                             namespace, PLURAL, name, {"status": dict(status)})
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise

    async def delete_job(self, namespace: str, name: str) -> None:
        """Delete the job; its pods and Service go by owner references (404 ignored)."""
        try:
            await self._call(self.custom.delete_namespaced_custom_object, API_GROUP, VERSION,
                             namespace, PLURAL, name, propagation_policy="Background")
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise

    async def create(self, obj: Mapping[str, Any]) -> bool:
        """Create a Pod or Service; ``False`` when it already exists (409)."""
        fn = {"Pod": self.core.create_namespaced_pod,
              "Service": self.core.create_namespaced_service}[obj["kind"]]
        try:
            await self._call(fn, obj["metadata"]["namespace"], dict(obj))
            return True
        except kubernetes.client.ApiException as exc:
            if exc.status == 409:
                return False
            raise

    async def list_pods(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """Pods matching ``labels`` in ``namespace``."""
        data = await self._call(self.core.list_namespaced_pod, namespace,
                                label_selector=selector_text(labels))
        return list(data.get("items") or [])

    async def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod (404 ignored)."""
        try:
            await self._call(self.core.delete_namespaced_pod, name, namespace)
        except kubernetes.client.ApiException as exc:
            if exc.status != 404:
                raise

    async def get_peering(self, name: str, namespace: str | None) -> dict[str, Any] | None:
        """The kopf peering object (``ClusterKopfPeering`` when ``namespace`` is None)."""
        try:
            if namespace is None:
                return await self._call(self.custom.get_cluster_custom_object, "kopf.dev", "v1",
                                        "clusterkopfpeerings", name)
            return await self._call(self.custom.get_namespaced_custom_object, "kopf.dev", "v1",
                                    namespace, "kopfpeerings", name)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def post_event(self, job: Mapping[str, Any], *, type_: str, reason: str, message: str,
                         now_iso: str) -> None:
        """Record a ``v1/Event`` on the job (failures are logged by the caller, never fatal)."""
        meta = job["metadata"]
        event = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
                         "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": job.get("apiVersion", f"{API_GROUP}/{VERSION}"),
                               "kind": job.get("kind", "HeteroTrainingJob"), "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta.get("uid", "")},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": "heterotrain-operator"}, "reportingComponent": "heterotrain-operator",
            "firstTimestamp": now_iso, "lastTimestamp": now_iso, "count": 1,
        }
        await self._call(self.core.create_namespaced_event, meta["namespace"], event)

    def close(self) -> None:
        """Release the connection pool."""
        self.client.close()
