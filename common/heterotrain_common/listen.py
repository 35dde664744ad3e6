"""Where a rank's own servers listen: its Prometheus endpoint and, on rank 0, the rendezvous
``TCPStore`` (issue 32, F11).

A job whose ``MASTER_ADDR`` is a loopback address runs on one host (``heterotrain run``, the dev
cluster's kubelet, a hand-run ``torchrun`` on one machine): no peer and no scraper comes from
elsewhere, so its servers listen on that loopback address and nothing else, where any host on the
network could otherwise read the metrics or write into the store.  Any other ``MASTER_ADDR`` (a
pod's headless Service name) keeps every interface, as before.  ``torch.distributed.TCPStore``
listens on every interface whatever host it is given, so rank 0 hands it a socket bound here
(``master_listen_fd``).  Gloo follows ``MASTER_ADDR``'s interface already
(``hetero_worker.runtime.netfamily``).
"""

from __future__ import annotations

import ipaddress
import socket

EVERY_INTERFACE = "0.0.0.0"
"""The bind address of a job that spans hosts (the default of ``prometheus_client``)."""
LISTEN_BACKLOG = 2048
"""Pending connections the store's socket queues (a large world connects at once)."""


def loopback_address(host: str) -> str | None:
    """The loopback address ``host`` names: itself for a loopback IP literal (``127.0.0.1``,
    ``::1``), the first address of ``localhost`` (from the hosts file, no DNS); None for any other
    host (no lookup is made, so a Service name that does not resolve yet costs nothing)."""
    try:
        return host if ipaddress.ip_address(host.split("%")[0]).is_loopback else None
    except ValueError:
        pass
    if host.lower() != "localhost":
        return None
    try:
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except OSError:
        return "127.0.0.1"


def server_address(master_addr: str) -> str:
    """The address a rank's own servers bind for a job whose master is ``master_addr``: its
    loopback address for a one-host job, :data:`EVERY_INTERFACE` otherwise."""
    return loopback_address(master_addr) or EVERY_INTERFACE


def loopback_listener(master_addr: str, port: int) -> int | None:
    """A listening TCP socket on ``master_addr``'s loopback address and ``port``, as a file
    descriptor the caller owns (``TCPStore(master_listen_fd=...)`` takes it over); None when
    ``master_addr`` is no loopback address (the store then listens on every interface itself).

    Raises:
        OSError: the port cannot be bound (taken).
    """
    address = loopback_address(master_addr)
    if address is None:
        return None
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock.detach()
