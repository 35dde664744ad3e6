"""The local kubelet's log endpoint: ``GET /containerLogs/{namespace}/{pod}/{container}`` over TLS,
the kubelet API the API server calls for ``pods/log`` (``kubectl logs``).

The API server reaches a kubelet at the Node's address of the first type in its
``--kubelet-preferred-address-types`` (the default tries ``Hostname`` first, and a node name such as
``node-a100`` resolves nowhere: "lookup node-a100 ... no such host"), on the port in
``status.daemonEndpoints.kubeletEndpoint.Port``.  So the local cluster's API server runs with
``--kubelet-preferred-address-types=InternalIP`` (every local node's InternalIP is 127.0.0.1), and
the kubelet posts the port of this server in each Node's status.

Secure by default, as a kubelet: the server's certificate is signed by the cluster CA (the API
server verifies it: ``--kubelet-certificate-authority``) and it takes only a client certificate of
that CA whose subject is :data:`APISERVER_CLIENT` (the API server's ``--kubelet-client-certificate``);
anything else is refused in the TLS handshake or with 403.

Query parameters as the kubelet takes them: ``follow``, ``tailLines``, ``limitBytes``; ``previous``
is refused (the local kubelet keeps every restart's output in one log), ``timestamps`` ignored.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from . import pki

APISERVER_CLIENT = "kube-apiserver-kubelet-client"
"""Subject CN of the API server's client certificate for kubelets (kubeadm's name)."""
SERVING = "kubelet"
"""Name of the kubelet's serving certificate in the cluster's ``pki/`` (``kubelet.crt``)."""
POLL_S = 0.2
"""Seconds between looks at a followed log."""
CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True, kw_only=True, slots=True)
class KubeletTls:
    """The files the log endpoint serves with.

    Attributes:
        cert / key: the kubelet's serving certificate (SAN 127.0.0.1) and its key.
        client_ca: the CA a client certificate must be signed by (the cluster CA).
    """

    cert: Path
    key: Path
    client_ca: Path


def kubelet_pki(pki_dir: Path) -> tuple[KubeletTls, tuple[Path, Path]]:
    """Make (if absent) the kubelet's serving certificate and the API server's client certificate
    for kubelets in ``pki_dir`` (signed by its CA); returns the kubelet's :class:`KubeletTls` and
    the API server's (client certificate, key)."""
    ca, _ = pki.ensure_ca(pki_dir)
    cert, key = pki.ensure_serving_cert(pki_dir, SERVING, ips=("127.0.0.1",), dns=("localhost",))
    return KubeletTls(cert=cert, key=key, client_ca=ca), pki.ensure_client_cert(pki_dir, APISERVER_CLIENT)


def tls_of(cluster_dir: Path) -> KubeletTls | None:
    """The :class:`KubeletTls` made for the cluster in ``cluster_dir`` (``pki/``), None when the
    cluster has none (started by an older version)."""
    p = cluster_dir / "pki"
    tls = KubeletTls(cert=p / f"{SERVING}.crt", key=p / f"{SERVING}.key", client_ca=p / "ca.crt")
    return tls if all(f.is_file() for f in (tls.cert, tls.key, tls.client_ca)) else None


@dataclass(frozen=True, kw_only=True, slots=True)
class LogSource:
    """What the endpoint asks the kubelet.

    Attributes:
        log_path: ``(namespace, pod)`` -> its log file, None for a pod not on this kubelet.
        has_container: ``(namespace, pod, container)`` -> whether the pod has that container.
        running: ``(namespace, pod, container)`` -> whether the container's process still runs
            (a followed log ends once it does not and the file has nothing more).
    """

    log_path: Callable[[str, str], Path | None]
    has_container: Callable[[str, str, str], bool]
    running: Callable[[str, str, str], bool]


class LogServer:
    """The endpoint on ``127.0.0.1`` (a free port unless given)."""

    def __init__(self, tls: KubeletTls, source: LogSource) -> None:
        self.tls, self.source = tls, source
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self, port: int = 0) -> int:
        """Listen; returns the port."""
        app = web.Application()
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._logs)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, ssl_context=self._ssl())
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self.port

    async def stop(self) -> None:
        """Stop listening (open streams end)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.tls.cert, self.tls.key)
        ctx.load_verify_locations(self.tls.client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        if _client_cn(request) != APISERVER_CLIENT:
            return _status(403, f"Forbidden (user={_client_cn(request)!r}): only the API server "
                                f"({APISERVER_CLIENT}) reads logs here")
        ns, pod, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
        q = request.query
        path = self.source.log_path(ns, pod)
        if path is None:
            return _status(404, f"pod {ns}/{pod} is not on this kubelet")
        if not self.source.has_container(ns, pod, container):
            return _status(400, f"container {container} is not valid for pod {pod}")
        if _true(q.get("previous")):
            return _status(400, "previous terminated container not found: the local kubelet keeps "
                                "every restart's output in one log; read it without --previous")
        try:
            tail = int(q["tailLines"]) if "tailLines" in q else None
            limit = int(q["limitBytes"]) if "limitBytes" in q else None
        except ValueError:
            return _status(400, "tailLines and limitBytes must be whole numbers")
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        sent = 0
        with path.open("rb") if path.exists() else _empty() as f:
            data = f.read()
            if tail is not None:
                data = b"".join(data.splitlines(keepends=True)[-tail:] if tail > 0 else [])
            while True:
                if data:
                    if limit is not None:
                        data = data[:max(0, limit - sent)]
                    await response.write(data)
                    sent += len(data)
                    if limit is not None and sent >= limit:
                        break
                if not _true(q.get("follow")) or not self.source.running(ns, pod, container):
                    rest = f.read() if _true(q.get("follow")) else b""
                    if rest and (limit is None or sent < limit):
                        await response.write(rest[:None if limit is None else limit - sent])
                    break
                await asyncio.sleep(POLL_S)
                data = f.read(CHUNK_BYTES)
        await response.write_eof()
        return response


class _empty:
    """A file with nothing in it (a pod whose log was not written yet)."""

    def __enter__(self) -> _empty:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def read(self, _n: int = -1) -> bytes:
        return b""


def _client_cn(request: web.Request) -> str:
    transport: Any = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


def _true(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


def _status(code: int, message: str) -> web.Response:
    return web.Response(status=code, text=message)
