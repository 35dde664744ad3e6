"""``heterotrain cluster up|down``: a real local Kubernetes control plane for users and tests.

``up`` builds the binaries if needed (``scripts/build-controlplane.sh``, cached), starts etcd,
kube-apiserver, kube-controller-manager, kube-scheduler, optionally Kueue (``--kueue``) and the
local kubelet for the nodes of ``--nodes``, waits until every node is Ready, then returns (the
processes stay) and prints how to use it.  ``--kueue`` also creates the queues of :mod:`.queues`
(one ResourceFlavor per GPU type, a ClusterQueue, the LocalQueue ``default/gpu-queue``, the
PriorityClass ``training``); ``--monitoring`` starts Prometheus with Kubernetes service discovery
(:mod:`.monitoring`).  ``down`` stops them all; nothing keeps running or
listening.  Exit codes: 0 done, 1 a component failed (its log's tail is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import sys
import time
import urllib.request
from pathlib import Path

from . import controlplane
from .controlplane import ControlPlaneError, Options

REPO = Path(__file__).resolve().parents[3]
DEFAULT_NODES = REPO / "examples" / "clusters" / "mixed.yaml"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Add ``cluster`` to the CLI's subparsers; returns its parser."""
    p = subparsers.add_parser("cluster", help="a real local Kubernetes control plane (up/down)",
                              description=__doc__.splitlines()[0])
    configure(p)
    return p


def configure(p: argparse.ArgumentParser) -> None:
    """The ``cluster`` subcommand's arguments (the CLI's ``configure`` convention)."""
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = sub.add_parser("up", help="start etcd, the API server, controllers, scheduler, kubelet")
    up.add_argument("--nodes", type=Path, default=DEFAULT_NODES, help="NodeList YAML (default: %(default)s)")
    up.add_argument("--kueue", action="store_true",
                    help="also run Kueue's manager (CRDs, webhooks) and create its queues (docs/kueue.md)")
    up.add_argument("--monitoring", action="store_true",
                    help="also run Prometheus, scraping every rank through Kubernetes service discovery")
    up.add_argument("--dir", type=Path, default=None, help="cluster dir (default ~/.cache/heterotrain/cluster)")
    up.add_argument("--node-grace-s", type=int, default=40,
                    help="node lifecycle grace, seconds (default %(default)s)")
    down = sub.add_parser("down", help="stop every process of the cluster")
    down.add_argument("--dir", type=Path, default=None)
    st = sub.add_parser("status", help="print the state file (pids, ports)")
    st.add_argument("--dir", type=Path, default=None)


def run(args: argparse.Namespace) -> int:
    cluster_dir = (args.dir or controlplane.default_dir()).resolve()
    if args.action == "down":
        return down(cluster_dir)
    if args.action == "status":
        print(json.dumps(controlplane.read_state(cluster_dir), indent=2))
        return 0
    try:
        up(cluster_dir, args.nodes, kueue=args.kueue, monitoring=args.monitoring, grace_s=args.node_grace_s)
    except ControlPlaneError as exc:
        print(f"heterotrain cluster up: {exc}", file=sys.stderr)
        return 1
    return 0


def up(cluster_dir: Path, nodes: Path, *, kueue: bool = False, monitoring: bool = False,
       grace_s: int = 40) -> dict:
    """Start everything (see the module doc); returns the state.

    Raises:
        ControlPlaneError: a component did not start (everything started is stopped again).
    """
    t0 = time.monotonic()
    bins = controlplane.bin_dir()
    state = controlplane.start(cluster_dir, bins, Options(node_monitor_grace_s=grace_s))
    prometheus = ""
    try:
        if kueue:
            from . import kueue as kueue_mod
            from . import queues
            from .kubelet import load_nodes
            kueue_mod.start(cluster_dir, bins)
            queues.install(cluster_dir, load_nodes(nodes))
        start_kubelet(cluster_dir, nodes, renew_s=max(1.0, grace_s / 5), lease_s=grace_s)
        wait_nodes_ready(cluster_dir, nodes)
        if monitoring:
            from . import monitoring as monitoring_mod
            prometheus = monitoring_mod.start(cluster_dir)
    except BaseException:
        controlplane.stop(cluster_dir)
        raise
    state = controlplane.read_state(cluster_dir)
    print(f"cluster up in {time.monotonic() - t0:.1f} s: API server {state['server']}, "
          f"{len(_node_names(nodes))} nodes Ready{', Kueue' if kueue else ''}; logs in {cluster_dir / 'logs'}")
    if kueue:
        from . import queues
        print(f"Kueue: ClusterQueue {queues.CLUSTER_QUEUE}, LocalQueue {queues.LOCAL_QUEUE_NAMESPACE}/"
              f"{queues.LOCAL_QUEUE}, PriorityClass {queues.PRIORITY_CLASS}")
    if prometheus:
        print(f"Prometheus {prometheus} (targets: {prometheus}/targets)")
    print(f"export KUBECONFIG={state['kubeconfig']}")
    print(f"export PATH={state['binDir']}:$PATH   # kubectl {_server_version(cluster_dir)}")
    print("heterotrain cluster down   # stops everything")
    return state


def _tls_flags(cluster_dir: Path) -> list[str]:
    """The kubelet's log endpoint flags (``kubectl logs``), none for a cluster without its files."""
    from .kubeletlogs import tls_of
    tls = tls_of(cluster_dir)
    return [] if tls is None else ["--tls-cert-file", str(tls.cert), "--tls-private-key-file", str(tls.key),
                                   "--client-ca-file", str(tls.client_ca)]


def start_kubelet(cluster_dir: Path, nodes: Path, *, renew_s: float, lease_s: int) -> int:
    """Start ``python -m hetero_operator.devcluster.kubelet`` detached; returns its pid."""
    state = controlplane.read_state(cluster_dir)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), str(REPO / "worker"), env.get("PYTHONPATH", "")])
    proc = controlplane.spawn("kubelet", [sys.executable, "-m", "hetero_operator.devcluster.kubelet",
                                          "--kubeconfig", state["kubeconfig"], "--nodes", str(nodes.resolve()),
                                          "--dir", str(cluster_dir / "pods"), "--renew-s", str(renew_s),
                                          "--lease-s", str(lease_s), *_tls_flags(cluster_dir)],
                                cluster_dir, env=env, cwd=REPO)
    controlplane.record_process(cluster_dir, "kubelet", proc.pid)
    return proc.pid


def _node_names(nodes: Path) -> list[str]:
    from .kubelet import load_nodes
    return [n["metadata"]["name"] for n in load_nodes(nodes)]


def _get(cluster_dir: Path, path: str) -> dict:
    state = controlplane.read_state(cluster_dir)
    token = (cluster_dir / "tokens.csv").read_text().split(",", 1)[0]
    ctx = ssl.create_default_context(cafile=str(cluster_dir / "pki" / "ca.crt"))
    req = urllib.request.Request(state["server"] + path, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
        return json.loads(resp.read())


def wait_nodes_ready(cluster_dir: Path, nodes: Path, timeout_s: float = 120) -> None:
    """Poll the API until every node of ``nodes`` is ``Ready=True``.

    Raises:
        ControlPlaneError: not all Ready after ``timeout_s`` seconds, or the kubelet exited.
    """
    want = set(_node_names(nodes))
    pid = controlplane.read_state(cluster_dir)["processes"]["kubelet"]["pid"]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not controlplane.pid_alive(pid):
            raise ControlPlaneError(f"kubelet exited:\n{controlplane.log_tail(cluster_dir, 'kubelet')}")
        items = _get(cluster_dir, "/api/v1/nodes").get("items", [])
        ready = {n["metadata"]["name"] for n in items
                 if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))}
        if want <= ready:
            return
        time.sleep(0.2)
    raise ControlPlaneError(f"nodes not Ready after {timeout_s:.0f} s:\n{controlplane.log_tail(cluster_dir, 'kubelet')}")


def _server_version(cluster_dir: Path) -> str:
    try:
        return "server " + _get(cluster_dir, "/version")["gitVersion"]
    except (OSError, KeyError, ValueError):
        return ""


def listening(ports: list[int]) -> list[int]:
    """Those of ``ports`` that something on 127.0.0.1 accepts connections on."""
    out = []
    for port in ports:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                out.append(port)
    return out


def down(cluster_dir: Path) -> int:
    """Stop every process; 1 when a port of the cluster still listens afterwards."""
    state = controlplane.read_state(cluster_dir)
    if not state:
        print(f"no cluster in {cluster_dir}")
        return 0
    stopped = controlplane.stop(cluster_dir)
    left = listening([int(p) for p in state.get("ports", {}).values()])
    print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
    if left:
        print(f"still listening on 127.0.0.1: {left}", file=sys.stderr)
        return 1
    return 0
