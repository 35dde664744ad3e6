"""Two network namespaces joined by a veth pair: an emulated, rate-limited "inter-node" link.

Needs root and iproute2 (``ip``, ``tc``).  Node A is namespace ``htjA`` with ``10.99.0.1/24`` on
``htjA0``; node B is ``htjB`` with ``10.99.0.2/24`` on ``htjB0``.  Ranks inside one namespace talk over
that namespace's loopback (traffic to the namespace's own address is routed through ``lo``), so
only traffic between the two namespaces crosses the veth and its ``tc tbf`` rate limit (both
directions are shaped: each end shapes its egress).  netem is not available in this kernel, so the
link adds no latency; latency belongs in the cost model.

Usage::

    with VethLink(rate_mbit=100) as link:
        link.exec_argv("A", ["python", ...])   # argv prefix to run in node A
        link.set_rate(None)                    # remove the limit
        link.tx_bytes("A")                     # bytes sent A -> B so far

Only addresses created here (10.99.0.0/24) are used as targets.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field

SUBNET = "10.99.0"
NODES = {"A": ("htjA", "htjA0", f"{SUBNET}.1"), "B": ("htjB", "htjB0", f"{SUBNET}.2")}


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True)


def available() -> str | None:
    """None when namespaces can be made here, else the reason (not root, no ``ip``/``tc``)."""
    if os.geteuid() != 0:
        return "needs root (ip netns)"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "needs iproute2 (ip, tc)"
    return None


@dataclass
class VethLink:
    """The two namespaces and the veth between them; a context manager that always cleans up.

    Attributes:
        rate_mbit: tbf rate in Mbit/s per direction; None for an unshaped veth.
        burst_kib: tbf bucket size in KiB (>= rate / HZ; 64 KiB covers 100 Mbit/s at HZ 250).
    """

    rate_mbit: float | None = 100.0
    burst_kib: int = 64
    created: list[str] = field(default_factory=list)

    def __enter__(self) -> VethLink:
        self.teardown()  # leftovers of an interrupted run
        try:
            self._setup()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def _setup(self) -> None:
        for ns, _, _ in NODES.values():
            _run("ip", "netns", "add", ns)
            self.created.append(ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            # per-namespace sysctl: keep the congestion window of connections that sit idle
            # between collectives (as tuned clusters do); otherwise every step restarts slow start
            _run("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_slow_start_after_idle=0")
        (ns_a, dev_a, ip_a), (ns_b, dev_b, ip_b) = NODES["A"], NODES["B"]
        _run("ip", "link", "add", dev_a, "netns", ns_a, "type", "veth", "peer", "name", dev_b,
             "netns", ns_b)
        for ns, dev, ip in ((ns_a, dev_a, ip_a), (ns_b, dev_b, ip_b)):
            _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", dev)
            _run("ip", "-n", ns, "link", "set", dev, "up")
        self.set_rate(self.rate_mbit)

    def set_rate(self, rate_mbit: float | None) -> None:
        """Shape both directions to ``rate_mbit`` Mbit/s (tbf), or remove shaping (None)."""
        self.rate_mbit = rate_mbit
        for ns, dev, _ in NODES.values():
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
            if rate_mbit is not None:
                _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf",
                     "rate", f"{rate_mbit}mbit", "burst", f"{self.burst_kib}kb", "latency", "400ms")

    def exec_argv(self, node: str, argv: list[str]) -> list[str]:
        """``argv`` prefixed to run inside ``node``'s namespace (``A`` or ``B``)."""
        return ["ip", "netns", "exec", NODES[node][0], *argv]

    @staticmethod
    def address(node: str) -> str:
        """The node's address on the veth."""
        return NODES[node][2]

    @staticmethod
    def device(node: str) -> str:
        """The node's veth device name (for ``GLOO_SOCKET_IFNAME``)."""
        return NODES[node][1]

    def tx_bytes(self, node: str) -> int:
        """Bytes the node's veth end has sent so far (``/sys/class/net/DEV/statistics``)."""
        ns, dev, _ = NODES[node]
        out = _run("ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/tx_bytes")
        return int(out.stdout.strip())

    def teardown(self) -> None:
        """Delete both namespaces (the veth goes with them); ignores what does not exist."""
        for ns, _, _ in NODES.values():
            _run("ip", "netns", "del", ns, check=False)
        self.created.clear()
