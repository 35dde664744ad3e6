"""Bind Gloo and NCCL where the master is: the address family and interface that reach
``MASTER_ADDR`` (dual-stack and IPv6-only clusters; issue 20).

Without a hint Gloo binds to whatever the pod's host name resolves to first and NCCL to the first
interface it likes; on a dual-stack cluster one rank may listen on IPv6 while its peer dials IPv4
(or an IPv6-only pod gets no IPv4 at all), and the ranks hang in their first collective.  Before
the process group is created, :func:`pin_transports` asks the kernel which local address a
connection to ``MASTER_ADDR`` would leave from (a UDP ``connect``: no packet is sent), in the family
``MASTER_ADDR`` resolves to first, and sets

* ``GLOO_SOCKET_IFNAME`` to that address's interface (Gloo carries every cross-type collective),
* ``NCCL_SOCKET_FAMILY`` to ``AF_INET6`` or ``AF_INET`` (NCCL's bootstrap and socket transport;
  its interface is left to NCCL, which prefers fast secondary interfaces such as a Multus
  ``net1`` that the route to the master would not name),

each only when the pod does not set it already (``spec.worker.template``'s container ``worker``
may set these and ``NCCL_SOCKET_IFNAME``: a value given wins).  Every rank reaches the same
master, so every rank picks the same family.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import sys
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

GLOO_IFNAME = "GLOO_SOCKET_IFNAME"
NCCL_IFNAME = "NCCL_SOCKET_IFNAME"
NCCL_FAMILY = "NCCL_SOCKET_FAMILY"
_SIOCGIFADDR = 0x8915


@dataclass(frozen=True, kw_only=True, slots=True)
class Route:
    """How this host reaches the master.

    Attributes:
        family: ``socket.AF_INET`` or ``socket.AF_INET6``.
        local_address: the local address a connection to the master leaves from.
        interface: that address's interface (``"eth0"``, ``"lo"``); ``""`` when not found.
    """

    family: int
    local_address: str
    interface: str


def _ipv6_interfaces(path: str = "/proc/net/if_inet6") -> dict[str, str]:
    """IPv6 address -> interface, from the kernel's table."""
    out: dict[str, str] = {}
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6:
                    packed = bytes.fromhex(parts[0])
                    out[socket.inet_ntop(socket.AF_INET6, packed)] = parts[5]
    except OSError:
        pass
    return out


def _ipv4_interfaces() -> dict[str, str]:
    """IPv4 address -> interface (``SIOCGIFADDR`` of each interface)."""
    out: dict[str, str] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            out[socket.inet_ntoa(raw[20:24])] = name
    return out


def interface_of(address: str, family: int) -> str:
    """The interface that holds ``address`` (``""`` when none is found)."""
    table = _ipv6_interfaces() if family == socket.AF_INET6 else _ipv4_interfaces()
    return table.get(address.split("%")[0], "")


def route_to(host: str, port: int, *, resolve: Callable[..., Any] = socket.getaddrinfo,
             interfaces: Callable[[str, int], str] = interface_of) -> Route:
    """The family, local address and interface this host uses to reach ``host:port``.

    Raises:
        OSError: ``host`` does not resolve or is unreachable.
    """
    family, _, _, _, sockaddr = resolve(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(sockaddr)  # UDP: picks the route, sends nothing
        local = s.getsockname()[0]
    return Route(family=family, local_address=local, interface=interfaces(local, family))


def pin_transports(host: str, port: int, environ: MutableMapping[str, str] | None = None, *,
                   route: Callable[[str, int], Route] = route_to) -> dict[str, str]:
    """Set the Gloo/NCCL socket variables the pod left unset to the route to the master.

    Returns:
        The variables it set (``{}`` when every one was given, or the route is unknown).
    """
    env: MutableMapping[str, str] = os.environ if environ is None else environ
    if all(env.get(k) for k in (GLOO_IFNAME, NCCL_FAMILY)):
        return {}
    try:
        found = route(host, port)
    except OSError as exc:
        print(f"heterotrain: cannot tell which interface reaches {host}:{port} ({exc}); Gloo and "
              "NCCL pick their own", file=sys.stderr, flush=True)
        return {}
    wanted: Mapping[str, str] = {
        NCCL_FAMILY: "AF_INET6" if found.family == socket.AF_INET6 else "AF_INET",
        **({GLOO_IFNAME: found.interface} if found.interface else {})}
    set_now = {k: v for k, v in wanted.items() if not env.get(k)}
    env.update(set_now)
    return set_now
