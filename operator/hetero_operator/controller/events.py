"""The one path for the job's Kubernetes Events.

Events are aggregated like client-go's recorder does: one Event object per (job, type, reason,
message), named deterministically, and a repeat bumps its ``count`` and ``lastTimestamp``
instead of adding an object.  So a job that waits can re-post its Warning periodically
(``kubectl describe`` keeps showing why it waits after the first Event expired, one hour by
default) without flooding the namespace.
Source: k8s.io/client-go/tools/record (EventCorrelator / EventAggregator);
https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/event-v1/.

Best effort: a failed post is logged and never fails a reconcile.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from hetero_operator.api import conditions as c
from hetero_operator.api.spec import API_GROUP

COMPONENT = "heterotrain-operator"
MAX_MESSAGE = 1024
log = logging.getLogger("heterotrain.operator.events")


class EventApi(Protocol):
    """What :class:`EventRecorder` needs of :class:`hetero_operator.controller.k8s.Api`."""

    async def create_event(self, namespace: str, event: Mapping[str, Any]) -> bool: ...
    async def get_event(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    async def patch_event(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None: ...


def event_name(job: Mapping[str, Any], type_: str, reason: str, message: str) -> str:
    """``<job>.<16 hex>``: the same name for the same job uid, type, reason and message."""
    meta = job["metadata"]
    key = "\x00".join((meta.get("uid", ""), type_, reason, message[:MAX_MESSAGE]))
    return f"{meta['name']}.{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def event_body(job: Mapping[str, Any], *, type_: str, reason: str, message: str,
               now_s: float) -> dict[str, Any]:
    """A ``v1/Event`` on the job, count 1."""
    meta = job["metadata"]
    stamp = c.now_iso(now_s)
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": event_name(job, type_, reason, message), "namespace": meta["namespace"]},
        "involvedObject": {"apiVersion": job.get("apiVersion", f"{API_GROUP}/v1alpha1"),
                           "kind": job.get("kind", "HeteroTrainingJob"), "name": meta["name"],
                           "namespace": meta["namespace"], "uid": meta.get("uid", "")},
        "type": type_, "reason": reason, "message": message[:MAX_MESSAGE],
        "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
        "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
    }


class EventRecorder:
    """Posts the job's Events and remembers when each was last posted.

    Args:
        api: the API wrapper.
        repeat_s: a waiting job's unchanged Warning is posted again after this many seconds.
    """

    def __init__(self, api: EventApi, *, repeat_s: float) -> None:
        self.api, self.repeat_s = api, repeat_s
        self._posted: dict[tuple[str, str], tuple[str, float, int]] = {}

    async def post(self, job: Mapping[str, Any], type_: str, reason: str, message: str,
                   now_s: float) -> None:
        """Create the Event, or count one more occurrence of it."""
        meta = job["metadata"]
        key = (meta["namespace"], meta["name"])
        name = event_name(job, type_, reason, message)
        try:
            count = await self._post(job, name, type_, reason, message, now_s)
        except Exception:  # noqa: BLE001 - events are best effort
            log.warning("could not post event %s for %s/%s", reason, *key)
            return
        self._posted[key] = (name, now_s, count)

    def due(self, job: Mapping[str, Any], type_: str, reason: str, message: str, now_s: float) -> bool:
        """True when this Event was not posted for the job within ``repeat_s``."""
        meta = job["metadata"]
        last = self._posted.get((meta["namespace"], meta["name"]))
        return (last is None or last[0] != event_name(job, type_, reason, message)
                or now_s - last[1] >= self.repeat_s)

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted job's memory."""
        self._posted.pop((namespace, name), None)

    async def _post(self, job: Mapping[str, Any], name: str, type_: str, reason: str, message: str,
                    now_s: float) -> int:
        body = event_body(job, type_=type_, reason=reason, message=message, now_s=now_s)
        namespace = body["metadata"]["namespace"]
        if await self.api.create_event(namespace, body):
            return 1
        current = await self.api.get_event(namespace, name)
        if current is None:  # expired between the two calls
            await self.api.create_event(namespace, body)
            return 1
        count = int(current.get("count") or 1) + 1
        await self.api.patch_event(namespace, name, {"count": count, "lastTimestamp": c.now_iso(now_s)})
        return count
