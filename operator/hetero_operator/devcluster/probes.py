"""Readiness probes of the local kubelet: ``httpGet`` only, on the port the kubelet really gave the
container (it remaps ports several pods would share, :mod:`.podenv`).

A pod whose container has a ``readinessProbe.httpGet`` is reported ``Running`` but not ``Ready``
(``Ready``/``ContainersReady`` False, the container ``ready: false``) until the probe answers
2xx/3xx, polled every ``periodSeconds`` (at most 1 s here: the local cluster favours a quick
start); then ready, once (no failure threshold afterwards).  So ``helm install --wait`` and a
Deployment's rollout wait for the operator to serve, as on a real cluster, and the chart's ``helm
test`` finds it serving.  Other probe kinds (``exec``, ``tcpSocket``, ``grpc``) and liveness and
startup probes are not run (docs/cluster.md).
"""

from __future__ import annotations

import asyncio
import copy
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any


def readiness_url(container: Mapping[str, Any], ports: Mapping[str, int]) -> str | None:
    """The URL of the container's ``readinessProbe.httpGet`` on 127.0.0.1 at its real port
    (``ports``: container port -> host port, the kubelet's remapping); None without one."""
    get = (container.get("readinessProbe") or {}).get("httpGet")
    if not get:
        return None
    port = get.get("port")
    if isinstance(port, str) and not port.isdigit():
        port = next((p["containerPort"] for p in container.get("ports") or () if p.get("name") == port), None)
        if port is None:
            return None
    real = ports.get(str(int(port)), int(port))
    path = get.get("path") or "/"
    return f"{str(get.get('scheme') or 'HTTP').lower()}://127.0.0.1:{real}{path if path.startswith('/') else '/' + path}"


def not_ready(status: Mapping[str, Any], containers: set[str]) -> dict[str, Any]:
    """``status`` (a Running pod's) with ``containers`` not ready and the pod's ``Ready`` and
    ``ContainersReady`` conditions False."""
    out = copy.deepcopy(dict(status))
    for cond in out.get("conditions") or ():
        if cond["type"] in ("Ready", "ContainersReady"):
            cond["status"], cond["reason"] = "False", "ContainersNotReady"
    for cs in out.get("containerStatuses") or ():
        if cs["name"] in containers:
            cs["ready"] = False
    return out


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as resp:
            return 200 <= resp.status < 400
    except (urllib.error.URLError, OSError, ValueError):
        return False


async def wait_ready(url: str, period_s: float, stop: Callable[[], bool]) -> bool:
    """Poll ``url`` until it answers 2xx/3xx (True) or ``stop()`` says the pod ended (False)."""
    while not stop():
        if await asyncio.to_thread(_answers, url):
            return True
        await asyncio.sleep(min(1.0, max(0.1, period_s)))
    return False
