"""A small asyncio client of the Kubernetes REST API for the local kubelet (aiohttp, token + CA).

Only what a node agent needs: JSON requests, merge patches, and a watch that re-lists on
``410 Gone``.  Reads a kubeconfig with a bearer token (the admin kubeconfig that
:mod:`.controlplane` writes).

Errors: :class:`ApiError` (``status``, ``reason``, the server's message) for any non-2xx answer.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import yaml

MERGE = "application/merge-patch+json"


class ApiError(RuntimeError):
    """A non-2xx answer: ``status`` (HTTP code), ``reason`` (the Status's reason) and message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status, self.reason, self.message = status, reason, message


def read_kubeconfig(path: Path) -> tuple[str, str, Path | None]:
    """``(server, token, ca_path)`` of the current context of a token kubeconfig.

    Raises:
        ValueError: no token in the current user (client certificates are not supported here).
    """
    cfg = yaml.safe_load(path.read_text())
    ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == cfg["current-context"])
    cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
    user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
    if "token" not in user:
        raise ValueError(f"{path}: the local kubelet needs a token user")
    ca = cluster.get("certificate-authority")
    return cluster["server"], user["token"], Path(ca) if ca else None


class Api:
    """An aiohttp session against one API server; use ``async with``."""

    def __init__(self, server: str, token: str, ca: Path | None, *, connections: int = 32) -> None:
        self.server, self.token, self.ca = server.rstrip("/"), token, ca
        self._connections = connections
        self.session: aiohttp.ClientSession | None = None

    @classmethod
    def from_kubeconfig(cls, path: Path, **kw: Any) -> Api:
        return cls(*read_kubeconfig(path), **kw)

    async def __aenter__(self) -> Api:
        ctx = ssl.create_default_context(cafile=str(self.ca) if self.ca else None)
        self.session = aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {self.token}"},
            connector=aiohttp.TCPConnector(ssl=ctx, limit=self._connections),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()

    async def request(self, method: str, path: str, body: Any = None, *, params: Mapping[str, str] | None = None,
                      content_type: str = "application/json", timeout_s: float = 30) -> dict[str, Any]:
        """One request; returns the decoded JSON answer.

        Raises:
            ApiError: a non-2xx status.
        """
        assert self.session is not None, "use async with"
        data = None if body is None else json.dumps(body)
        async with self.session.request(method, self.server + path, data=data, params=params,
                                        headers={"Content-Type": content_type},
                                        timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            text = await resp.text()
            answer = json.loads(text) if text else {}
            if resp.status >= 300:
                raise ApiError(resp.status, answer.get("reason", ""), answer.get("message", text[:300]))
            return answer

    async def get(self, path: str, **kw: Any) -> dict[str, Any]:
        return await self.request("GET", path, **kw)

    async def create(self, path: str, body: Any) -> dict[str, Any]:
        return await self.request("POST", path, body)

    async def patch(self, path: str, body: Any) -> dict[str, Any]:
        return await self.request("PATCH", path, body, content_type=MERGE)

    async def delete(self, path: str, body: Any = None) -> dict[str, Any]:
        return await self.request("DELETE", path, body)

    async def watch(self, path: str, params: Mapping[str, str] | None = None) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """List, then watch ``path`` forever: yields ``("ADDED"|"MODIFIED"|"DELETED", obj)``,
        first ``ADDED`` for every listed object; re-lists (``"SYNC"``, ``{}`` first) after
        ``410 Gone`` or a broken stream."""
        assert self.session is not None
        while True:
            try:
                listed = await self.get(path, params=dict(params or {}))
            except (ApiError, aiohttp.ClientError, asyncio.TimeoutError):
                await asyncio.sleep(1)
                continue
            yield "SYNC", {}
            for item in listed.get("items", []):
                yield "ADDED", item
            rv = listed["metadata"].get("resourceVersion", "")
            while rv:
                query = {**(params or {}), "watch": "1", "resourceVersion": rv,
                         "allowWatchBookmarks": "1", "timeoutSeconds": "300"}
                try:
                    async with self.session.get(self.server + path, params=query,
                                                timeout=aiohttp.ClientTimeout(total=None, sock_read=330)) as resp:
                        if resp.status == 410:
                            rv = ""
                            break
                        if resp.status >= 300:
                            await asyncio.sleep(1)
                            break
                        async for line in resp.content:
                            if not line.strip():
                                continue
                            event = json.loads(line)
                            obj = event.get("object") or {}
                            if event.get("type") == "ERROR":
                                rv = "" if obj.get("code") == 410 else rv
                                break
                            rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                            if event.get("type") != "BOOKMARK":
                                yield event["type"], obj
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                    await asyncio.sleep(0.5)
                    break
