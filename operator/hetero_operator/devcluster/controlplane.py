"""Start and stop a real Kubernetes control plane on this machine, as local processes.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler, built from the Go modules pinned
in ``tests/controlplane`` (``scripts/build-controlplane.sh``), all on 127.0.0.1 with free ports.
Everything lives in one *cluster dir* (default ``~/.cache/heterotrain/cluster``)::

    pki/          CA, kube-apiserver serving cert, service-account signing key (openssl)
    pki/etcd/     etcd's own CA, its certificate, kube-apiserver's client certificate for it
    etcd/         etcd's data
    logs/         one log per process
    tokens.csv    the static admin token (group system:masters), 0600
    kubeconfig    admin kubeconfig (token + CA), 0600: export KUBECONFIG=<dir>/kubeconfig
    state.json    pids, ports, bin dir (read by ``stop`` and by ``heterotrain cluster down``)

Processes are started in sessions of their own (they outlive ``heterotrain cluster up``);
readiness is polled (etcd ``/health``, the API server's ``/readyz``, the others' ``/healthz``),
never slept for.  The dir is its user's alone (0700, :mod:`.private`): every secret in it is created
0600, and etcd takes only clients with a certificate of its own CA.  The pure helpers (flags, kubeconfig) are in :mod:`.cpflags`.

Errors: :class:`ControlPlaneError` (a binary missing, a process that exited or did not get ready
in time: the message ends with its log's last lines); :class:`~.pki.PkiError`.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heterotrain_common.procs import pid_alive

from . import cpflags, kubeletlogs, pki
from .private import private_dir, write_secret

REPO = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO / "scripts" / "build-controlplane.sh"
STOP_ORDER = ("kubelet", "kueue", "kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")
"""``stop`` ends the processes in this order (the node agent first, etcd last); others before."""


class ControlPlaneError(RuntimeError):
    """A control-plane process is missing, died, or did not get ready in time."""


def default_dir() -> Path:
    """``$HETEROTRAIN_CACHE_DIR/cluster`` (default ``~/.cache/heterotrain/cluster``)."""
    cache = os.environ.get("HETEROTRAIN_CACHE_DIR") or str(Path.home() / ".cache" / "heterotrain")
    return Path(cache) / "cluster"


def bin_dir(build: bool = True) -> Path:
    """The directory holding the control-plane binaries.

    ``$HETEROTRAIN_CONTROLPLANE_BIN`` when set; else the cache dir printed by
    ``scripts/build-controlplane.sh``, which builds what is missing (minutes the first time,
    well under a second when cached) unless ``build`` is false.

    Raises:
        ControlPlaneError: the script failed, or a binary is not there.
    """
    env = os.environ.get("HETEROTRAIN_CONTROLPLANE_BIN")
    if env:
        path = Path(env)
    else:
        if not BUILD_SCRIPT.exists():
            raise ControlPlaneError(f"{BUILD_SCRIPT} not found: set HETEROTRAIN_CONTROLPLANE_BIN")
        if not build:
            raise ControlPlaneError("no HETEROTRAIN_CONTROLPLANE_BIN and building is not allowed")
        proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise ControlPlaneError(f"build-controlplane.sh failed:\n{proc.stderr[-3000:]}")
        path = Path(proc.stdout.strip().splitlines()[-1])
    for name in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"):
        if not os.access(path / name, os.X_OK):
            raise ControlPlaneError(f"{path / name} missing or not executable")
    return path


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now (bound to port 0, then released)."""
    socks, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def free_port_range(count: int = 1) -> int:
    """A port ``p`` with ``p .. p+count-1`` free on 127.0.0.1 right now (a free port from the
    system, then each of the range probed by binding it; 50 tries).

    Raises:
        RuntimeError: no such range found in 50 tries.
    """
    for _ in range(50):
        base = free_ports(1)[0]
        if base + count > 65535:
            continue
        try:
            for p in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port range")


@dataclass(frozen=True, kw_only=True)
class Options:
    """What ``start`` runs.

    Attributes:
        node_monitor_grace_s: the node lifecycle controller's grace, seconds: a node whose lease
            was not renewed for this long turns ``Ready=Unknown`` (Kubernetes' default: 50).
        node_monitor_period_s: how often that controller looks, seconds (default there: 5).
        ready_timeout_s: the most to wait for each process's readiness, seconds.
        verbosity: klog ``-v`` of the Kubernetes components.
    """

    node_monitor_grace_s: int = 16
    node_monitor_period_s: int = 1
    ready_timeout_s: float = 120.0
    verbosity: int = 0


# --- state file ------------------------------------------------------------------------------

def state_path(cluster_dir: Path) -> Path:
    return cluster_dir / "state.json"


def read_state(cluster_dir: Path) -> dict[str, Any]:
    """The state file's content; ``{}`` when there is none."""
    path = state_path(cluster_dir)
    return json.loads(path.read_text()) if path.exists() else {}


def write_state(cluster_dir: Path, state: Mapping[str, Any]) -> None:
    path = state_path(cluster_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    tmp.replace(path)


def record_process(cluster_dir: Path, name: str, pid: int, ports: Mapping[str, int] | None = None) -> None:
    """Add a process (and its ports) to the state file, so ``stop`` ends it too."""
    state = read_state(cluster_dir)
    state.setdefault("processes", {})[name] = {"pid": pid}
    state.setdefault("ports", {}).update(ports or {})
    write_state(cluster_dir, state)


# --- processes -------------------------------------------------------------------------------

def spawn(name: str, argv: Sequence[str], cluster_dir: Path, *, env: Mapping[str, str] | None = None,
          cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` detached (a session of its own) with output in ``logs/<name>.log``."""
    logs = cluster_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as log:
        log.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        return subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=dict(env) if env is not None else None,
                                cwd=str(cwd) if cwd else None)


def log_tail(cluster_dir: Path, name: str, lines: int = 25) -> str:
    path = cluster_dir / "logs" / f"{name}.log"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""


def wait_ready(name: str, url: str, proc: subprocess.Popen[bytes] | None, cluster_dir: Path, *,
               timeout_s: float, ca: Path | None = None, token: str | None = None,
               insecure: bool = False, cert: tuple[Path, Path] | None = None) -> None:
    """Poll ``url`` every 0.1-0.5 s until it answers 200 ``ok`` (``cert``: the client
    certificate and key to present, for etcd).

    Raises:
        ControlPlaneError: ``proc`` exited, or ``timeout_s`` seconds passed (with the log's tail).
    """
    ctx: ssl.SSLContext | None = None
    if url.startswith("https"):
        ctx = ssl.create_default_context(cafile=str(ca) if ca else None)
        if insecure:
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        if cert is not None:
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    deadline, pause, last = time.monotonic() + timeout_s, 0.1, ""
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ControlPlaneError(f"{name} exited with {proc.returncode}:\n{log_tail(cluster_dir, name)}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5,
                                        context=ctx) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError, ssl.SSLError) as exc:
            last = str(exc)
        time.sleep(pause)
        pause = min(0.5, pause * 1.5)
    raise ControlPlaneError(f"{name} not ready at {url} after {timeout_s:.0f} s ({last}):\n"
                            f"{log_tail(cluster_dir, name)}")


def _ours(pid: int, cluster_dir: Path) -> bool:
    """Is ``pid`` still a process of this cluster (its command line or environment names the dir
    or a cluster binary)? Guards against a recycled pid."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return str(cluster_dir) in cmd or "/controlplane/" in cmd or "hetero_operator.devcluster" in cmd


def stop_pids(pids: Mapping[str, int], cluster_dir: Path, *, timeout_s: float = 20.0) -> list[str]:
    """SIGTERM each process group (in :data:`STOP_ORDER`), SIGKILL what is left after ``timeout_s``
    seconds; returns the names that were running."""
    order = sorted(pids, key=lambda n: STOP_ORDER.index(n) if n in STOP_ORDER else -1)
    stopped = []
    for name in order:
        pid = pids[name]
        if not (pid_alive(pid) and _ours(pid, cluster_dir)):
            continue
        stopped.append(name)
        with _suppress():
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while pid_alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
        if pid_alive(pid):
            with _suppress():
                os.killpg(pid, signal.SIGKILL)
        while pid_alive(pid):
            _reap(pid)
            time.sleep(0.02)
    return stopped


def _reap(pid: int) -> None:
    with _suppress():
        os.waitpid(pid, os.WNOHANG)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, typ: object, exc: object, tb: object) -> bool:
        return isinstance(exc, (ProcessLookupError, PermissionError, ChildProcessError))


# --- start / stop ----------------------------------------------------------------------------

def start(cluster_dir: Path, bins: Path, options: Options = Options()) -> dict[str, Any]:
    """Start etcd, kube-apiserver, kube-controller-manager and kube-scheduler; wait for each.

    Returns the state (also in ``state.json``): ``server``, ``kubeconfig``, ``ports``,
    ``processes`` (name -> pid), ``binDir``.

    Raises:
        ControlPlaneError: a cluster of this dir is still running, or a process failed to start.
    """
    cluster_dir = cluster_dir.resolve()
    if any(pid_alive(p["pid"]) and _ours(p["pid"], cluster_dir)
           for p in read_state(cluster_dir).get("processes", {}).values()):
        raise ControlPlaneError(f"a cluster is already running in {cluster_dir} "
                                "(heterotrain cluster down first)")
    private_dir(cluster_dir)
    pdir = cluster_dir / "pki"
    ca, _ = pki.ensure_ca(pdir)
    crt, key = pki.ensure_serving_cert(pdir, "kube-apiserver", ips=("127.0.0.1", cpflags.SERVICE_IP),
                                       dns=cpflags.APISERVER_DNS)
    sa_key, sa_pub = pki.ensure_service_account_key(pdir)
    _, (kubelet_client_crt, kubelet_client_key) = kubeletlogs.kubelet_pki(pdir)
    etcd = etcd_pki(pdir / "etcd")
    tokens = cluster_dir / "tokens.csv"
    if not tokens.exists():
        write_secret(tokens, f"{secrets.token_hex(24)},admin,admin,system:masters\n")
    token = tokens.read_text().split(",", 1)[0]
    names = ("etcd_client", "etcd_peer", "apiserver", "controller_manager", "scheduler")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    server = f"https://127.0.0.1:{ports['apiserver']}"
    kubeconfig = cluster_dir / "kubeconfig"
    write_secret(kubeconfig, cpflags.kubeconfig_text(server, ca, token))
    state: dict[str, Any] = {"version": 1, "dir": str(cluster_dir), "binDir": str(bins), "server": server,
                             "kubeconfig": str(kubeconfig), "ports": ports, "processes": {}}
    write_state(cluster_dir, state)
    paths = cpflags.Paths(dir=cluster_dir, ca=ca, ca_key=pdir / "ca.key", tls_crt=crt, tls_key=key,
                          sa_key=sa_key, sa_pub=sa_pub, tokens=tokens, kubeconfig=kubeconfig, **etcd,
                          kubelet_client_crt=kubelet_client_crt, kubelet_client_key=kubelet_client_key)
    timeout = options.ready_timeout_s
    try:
        proc = spawn("etcd", [str(bins / "etcd"), *cpflags.etcd_args(paths, ports)], cluster_dir)
        record_process(cluster_dir, "etcd", proc.pid)
        wait_ready("etcd", f"{cpflags.etcd_client_url(ports)}/health", proc, cluster_dir,
                   timeout_s=timeout, ca=paths.etcd_ca, cert=(paths.etcd_client_crt, paths.etcd_client_key))
        proc = spawn("kube-apiserver", [str(bins / "kube-apiserver"),
                                        *cpflags.apiserver_args(paths, ports, options.verbosity)], cluster_dir)
        record_process(cluster_dir, "kube-apiserver", proc.pid)
        wait_ready("kube-apiserver", f"{server}/readyz", proc, cluster_dir, timeout_s=timeout, ca=ca, token=token)
        procs = {
            "kube-controller-manager": spawn("kube-controller-manager", [
                str(bins / "kube-controller-manager"),
                *cpflags.controller_manager_args(paths, ports, grace_s=options.node_monitor_grace_s,
                                                 period_s=options.node_monitor_period_s,
                                                 verbosity=options.verbosity)], cluster_dir),
            "kube-scheduler": spawn("kube-scheduler", [
                str(bins / "kube-scheduler"), *cpflags.scheduler_args(paths, ports, options.verbosity)],
                cluster_dir),
        }
        for name, proc in procs.items():
            record_process(cluster_dir, name, proc.pid)
        port_of = {"kube-controller-manager": "controller_manager", "kube-scheduler": "scheduler"}
        for name, proc in procs.items():
            wait_ready(name, f"https://127.0.0.1:{ports[port_of[name]]}/healthz", proc, cluster_dir,
                       timeout_s=timeout, insecure=True)
    except BaseException:
        stop(cluster_dir)
        raise
    return read_state(cluster_dir)


def etcd_pki(pdir: Path) -> dict[str, Path]:
    """etcd's CA, its serving (and peer) certificate and kube-apiserver's client certificate in
    ``pdir``, made if absent; returns them as :class:`~.cpflags.Paths` fields (``etcd_*``)."""
    ca, _ = pki.ensure_ca(pdir, cn="heterotrain-local-etcd-ca")
    crt, key = pki.ensure_serving_cert(pdir, "etcd", ips=("127.0.0.1",), dns=("localhost",))
    client_crt, client_key = pki.ensure_client_cert(pdir, "kube-apiserver-etcd-client")
    return {"etcd_ca": ca, "etcd_crt": crt, "etcd_key": key, "etcd_client_crt": client_crt,
            "etcd_client_key": client_key}


def stop(cluster_dir: Path, *, timeout_s: float = 20.0) -> list[str]:
    """Stop every process of the state file (and pods the local kubelet left, ``pods/*.pid``).

    Returns the names that were running.  The cluster dir (certs, etcd data, logs) stays; the
    state file loses its processes.
    """
    cluster_dir = cluster_dir.resolve()
    state = read_state(cluster_dir)
    pids = {name: int(p["pid"]) for name, p in state.get("processes", {}).items()}
    stopped = stop_pids(pids, cluster_dir, timeout_s=timeout_s)
    for pidfile in sorted((cluster_dir / "pods").glob("*.pid")) if (cluster_dir / "pods").exists() else ():
        try:
            pid = int(pidfile.read_text().strip() or 0)
        except (OSError, ValueError):
            pid = 0
        if pid and pid_alive(pid):
            with _suppress():
                os.killpg(pid, signal.SIGKILL)
            stopped.append(f"pod {pidfile.stem}")
        pidfile.unlink(missing_ok=True)
    if state:
        state["processes"] = {}
        write_state(cluster_dir, state)
    return stopped


def kubectl(cluster_dir: Path, *args: str, check: bool = True, input_text: str | None = None,
            timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """Run this cluster's ``kubectl`` with its kubeconfig; returns the finished process.

    Raises:
        ControlPlaneError: ``check`` and a non-zero exit (stderr in the message).
    """
    state = read_state(cluster_dir)
    exe = Path(state["binDir"]) / "kubectl"
    proc = subprocess.run([str(exe), "--kubeconfig", state["kubeconfig"], *args], capture_output=True,
                          text=True, input=input_text, timeout=timeout_s, check=False)
    if check and proc.returncode != 0:
        raise ControlPlaneError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def wait_crds_established(cluster_dir: Path, names: Sequence[str], timeout_s: float = 60) -> None:
    """Poll until every CRD of ``names`` has ``Established=True`` (``kubectl wait`` fails at once
    on a CRD whose status has no conditions yet).

    Raises:
        ControlPlaneError: not all established within ``timeout_s`` seconds.
    """
    deadline, pending = time.monotonic() + timeout_s, list(names)
    while pending:
        proc = kubectl(cluster_dir, "get", *(f"crd/{n}" for n in pending), "-o", "json", check=False)
        if proc.returncode == 0:
            doc = json.loads(proc.stdout)
            items = doc.get("items", [doc]) if doc.get("kind") == "List" else [doc]
            done = {i["metadata"]["name"] for i in items
                    if any(c["type"] == "Established" and c["status"] == "True"
                           for c in (i.get("status") or {}).get("conditions") or ())}
            pending = [n for n in pending if n not in done]
        if pending and time.monotonic() > deadline:
            raise ControlPlaneError(f"CRDs not Established after {timeout_s:.0f} s: {pending}")
        if pending:
            time.sleep(0.1)


if __name__ == "__main__":  # python -m hetero_operator.devcluster.controlplane DIR: start, print state
    print(json.dumps(start(Path(sys.argv[1]), bin_dir()), indent=2))
