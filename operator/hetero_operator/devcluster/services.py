"""Service addresses in a local pod's arguments: ``<service>.<namespace>.svc[.cluster.local]:<port>``
becomes ``127.0.0.1:<the port a ready endpoint really listens on>``.

There is no kube-proxy and no cluster DNS on the local cluster: every pod runs on 127.0.0.1 and
the local kubelet remaps the ports several pods would share (annotation
:data:`~hetero_operator.api.labels.ANNOTATION_LOCAL_PORTS`).  So a Service's address is resolved
the way kube-proxy would route it: the Service's port -> its ``targetPort`` (a number, or a
container port name) on a ``Running`` pod its selector picks -> the host port the kubelet gave
that container port (the container port itself when it was not remapped).  The chart's ``helm
test`` pod (``wget http://<release>-metrics.<ns>.svc:8080/metrics``) reaches the operator so.
An address that does not resolve (no such Service, no running endpoint) is left to the cluster
DNS rewrite (:func:`.podenv.resolve_dns`: ``127.0.0.1``, the port unchanged).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from hetero_operator.api.labels import ANNOTATION_LOCAL_PORTS

from .kubeapi import Api, ApiError

ADDRESS = re.compile(r"(?<![\w.-])([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)\.([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)"
                     r"\.svc(?:\.cluster\.local)?:(\d+)\b")


def endpoint_port(service: Mapping[str, Any], port: int, pods: list[Mapping[str, Any]]) -> int | None:
    """The host port behind ``service``'s ``port`` on the first ``Running`` pod of ``pods``
    (already selected by the Service's selector); None when none serves it."""
    sport = next((p for p in (service.get("spec") or {}).get("ports") or () if int(p.get("port", 0)) == port), None)
    if sport is None:
        return None
    target = sport.get("targetPort", port)
    for pod in pods:
        if (pod.get("status") or {}).get("phase") != "Running" or (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        number: int | None = None
        if isinstance(target, int) or str(target).isdigit():
            number = int(target)
        else:
            number = next((int(p["containerPort"]) for c in pod["spec"]["containers"] for p in c.get("ports") or ()
                           if p.get("name") == target), None)
        if number is None:
            continue
        remapped = json.loads(((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_LOCAL_PORTS, "{}"))
        return int(remapped.get(str(number), number))
    return None


async def resolve(api: Api, text: str) -> str:
    """``text`` with every resolvable Service address replaced (see the module doc)."""
    out, last = [], 0
    for found in ADDRESS.finditer(text):
        name, ns, port = found.group(1), found.group(2), int(found.group(3))
        try:
            service = await api.get(f"/api/v1/namespaces/{ns}/services/{name}")
            selector = (service.get("spec") or {}).get("selector") or {}
            if not selector:
                continue
            query = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
            pods = (await api.get(f"/api/v1/namespaces/{ns}/pods", params={"labelSelector": query})).get("items", [])
        except ApiError:
            continue
        real = endpoint_port(service, port, pods)
        if real is not None:
            out += [text[last:found.start()], f"127.0.0.1:{real}"]
            last = found.end()
    return "".join(out) + text[last:]
