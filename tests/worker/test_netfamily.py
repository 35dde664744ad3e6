"""Gloo and NCCL bind in the master address's family (dual-stack and IPv6-only clusters; issue
20): the route to MASTER_ADDR decides, a value the pod sets wins; ranks rendezvous and train over
IPv6 loopback."""

from __future__ import annotations

import socket
import sys

import pytest
from rankproc import assert_ok, mixed_cluster_envs, run_ranks

from hetero_worker.runtime import netfamily


def _resolver(*families: int):  # type: ignore[no-untyped-def]
    """getaddrinfo of a name that resolves to loopback in ``families``, in that order."""
    addr = {socket.AF_INET6: ("::1", 0, 0, 0), socket.AF_INET: ("127.0.0.1", 0)}

    def resolve(host: str, port: int, **_: object) -> list[tuple]:
        return [(f, socket.SOCK_STREAM, 6, "", (addr[f][0], port, *addr[f][2:])) for f in families]
    return resolve


def test_a_name_resolving_to_both_families_binds_in_the_family_it_resolves_to_first() -> None:
    v6 = netfamily.route_to("dual.example", 29500, resolve=_resolver(socket.AF_INET6, socket.AF_INET))
    assert (v6.family, v6.local_address, v6.interface) == (socket.AF_INET6, "::1", "lo")
    v4 = netfamily.route_to("dual.example", 29500, resolve=_resolver(socket.AF_INET, socket.AF_INET6))
    assert (v4.family, v4.local_address, v4.interface) == (socket.AF_INET, "127.0.0.1", "lo")


def test_pinning_sets_only_what_the_pod_left_unset() -> None:
    route = netfamily.Route(family=socket.AF_INET6, local_address="fd00::2", interface="eth0")
    env: dict[str, str] = {}
    assert netfamily.pin_transports("m", 1, env, route=lambda h, p: route) == {
        "NCCL_SOCKET_FAMILY": "AF_INET6", "GLOO_SOCKET_IFNAME": "eth0"}
    given = {"GLOO_SOCKET_IFNAME": "net1"}  # set through spec.worker.template: it wins
    netfamily.pin_transports("m", 1, given, route=lambda h, p: route)
    assert given == {"GLOO_SOCKET_IFNAME": "net1", "NCCL_SOCKET_FAMILY": "AF_INET6"}
    assert "NCCL_SOCKET_IFNAME" not in given  # NCCL picks its own interface (fast secondary NICs)

    def unreachable(host: str, port: int) -> netfamily.Route:
        raise OSError("Network is unreachable")
    assert netfamily.pin_transports("m", 1, {}, route=unreachable) == {}


def test_the_kernel_route_to_ipv6_and_ipv4_loopback() -> None:
    assert netfamily.route_to("::1", 29500).interface == "lo"
    assert netfamily.route_to("127.0.0.1", 29500).interface == "lo"


RANK = """
import os, torch, torch.distributed as dist
from hetero_worker import trainer as ht
t = ht.init()
x = torch.ones(1) * (t.rank + 1)
dist.all_reduce(x)
print("sum", int(x.item()), os.environ["GLOO_SOCKET_IFNAME"], os.environ["NCCL_SOCKET_FAMILY"], flush=True)
t.close()
"""


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ranks_rendezvous_and_reduce_over_ipv6_loopback() -> None:
    envs = mixed_cluster_envs([8, 6, 4])
    for env in envs:
        env["MASTER_ADDR"] = "::1"
    runs = run_ranks([sys.executable, "-c", RANK], envs, timeout_s=150)
    assert_ok(runs)
    assert [r.stdout.split() for r in runs] == [["sum", "6", "lo", "AF_INET6"]] * 3
