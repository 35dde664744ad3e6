"""The node side of the local kubelet: register each Node, keep its Lease renewed, revive it.

A real kubelet registers its Node (labels, taints, capacity, ``Ready=True``), creates its Lease in
``kube-node-lease`` and renews it; the node lifecycle controller turns a node whose lease lapses
``Ready=Unknown``. :class:`NodeLeases` does that for every node of a NodeList from one process
(2,000 nodes for the benchmark); a node in :attr:`NodeLeases.dead` is no longer renewed.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
from collections.abc import Callable, Mapping
from typing import Any

from . import podenv
from .kubeapi import Api, ApiError

LEASE_NS = "kube-node-lease"


def micro_now() -> str:
    """MicroTime: RFC 3339 with microseconds (a Lease's renewTime)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class NodeLeases:
    """Registers ``nodes`` and renews their Leases.

    Args:
        api: an open :class:`~.kubeapi.Api`.
        nodes: Node objects by name.
        lease_s: the Lease's ``leaseDurationSeconds``.
        renew_s: seconds between renewals of every lease (spread over the interval).
        log_port: the kubelet log endpoint's port, posted in each Node's ``daemonEndpoints``
            (0: none).

    Attributes:
        dead: nodes whose kubelet died (not renewed, nothing reported).
        renewals: lease renewals so far.
    """

    def __init__(self, api: Api, nodes: Mapping[str, Mapping[str, Any]], *, lease_s: int,
                 renew_s: float, log_port: Callable[[], int]) -> None:
        self.api, self.nodes, self.lease_s, self.renew_s = api, nodes, lease_s, renew_s
        self.log_port = log_port
        self.dead: set[str] = set()
        self.renewals = 0

    async def register(self, name: str) -> None:
        """Create (or update) the Node, post its status, create its Lease."""
        src = self.nodes[name]
        meta = {"name": name, "labels": {**(src["metadata"].get("labels") or {}),
                                         "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                         "kubernetes.io/arch": "amd64"},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"}}
        body = {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": dict(src.get("spec") or {})}
        try:
            node = await self.api.create("/api/v1/nodes", body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            node = await self.api.patch(f"/api/v1/nodes/{name}", {"metadata": {"labels": meta["labels"]}})
        await self.post_status(name)
        lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                 "metadata": {"name": name, "namespace": LEASE_NS, "ownerReferences": [
                     {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}]},
                 "spec": {"holderIdentity": name, "leaseDurationSeconds": self.lease_s,
                          "renewTime": micro_now()}}
        try:
            await self.api.create(f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases", lease)
        except ApiError as exc:
            if exc.status != 409:
                raise
            await self.renew(name)

    async def register_all(self, parallel: int = 16) -> None:
        """:meth:`register` every node, ``parallel`` at a time."""
        sem = asyncio.Semaphore(parallel)

        async def one(name: str) -> None:
            async with sem:
                await self.register(name)
        await asyncio.gather(*(one(n) for n in self.nodes))

    async def post_status(self, name: str) -> None:
        """Post the Node's status, with the log endpoint's port where the API server looks for it."""
        status = {**podenv.node_status(self.nodes[name]),
                  "daemonEndpoints": {"kubeletEndpoint": {"Port": self.log_port()}}}
        await self.api.patch(f"/api/v1/nodes/{name}/status", {"status": status})

    async def renew(self, name: str) -> None:
        """Renew the node's Lease now."""
        await self.api.patch(f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{name}",
                             {"spec": {"holderIdentity": name, "leaseDurationSeconds": self.lease_s,
                                       "renewTime": micro_now()}})
        self.renewals += 1

    async def heartbeat(self) -> None:
        """Renew every live node's lease each ``renew_s``, spread evenly over the interval; runs
        until cancelled (a failed renewal waits for the next round)."""
        sem = asyncio.Semaphore(16)

        async def one(name: str) -> None:
            async with sem:
                with contextlib.suppress(ApiError, OSError, asyncio.TimeoutError):
                    await self.renew(name)
        while True:
            t0 = time.monotonic()
            names = [n for n in self.nodes if n not in self.dead]
            gap = self.renew_s / max(1, len(names)) * 0.8
            pending = []
            for name in names:
                pending.append(asyncio.ensure_future(one(name)))
                if gap > 0.002:
                    await asyncio.sleep(gap)
            await asyncio.gather(*pending)
            await asyncio.sleep(max(0.05, self.renew_s - (time.monotonic() - t0)))

    async def revive(self, name: str) -> None:
        """A new kubelet on the node: it posts Ready again and renews the lease."""
        self.dead.discard(name)
        await self.post_status(name)
        await self.renew(name)

    async def revive_registered(self, name: str) -> None:
        """A new kubelet on a node whose Node object was deleted: it registers the Node again."""
        self.dead.discard(name)
        await self.register(name)
