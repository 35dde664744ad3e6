"""Kueue on the local control plane: its CRDs and webhooks from the pinned module, its manager
as a local process.

The manifests come from ``config/components`` of ``sigs.k8s.io/kueue`` in the Go module cache
(``go env GOMODCACHE``; the version of ``tests/controlplane/kueue/go.mod``).  What differs from
Kueue's kustomize install (docs/cluster.md):

* webhooks (mutating, validating, and the CRDs' conversion webhook) call
  ``https://127.0.0.1:<port><path>`` (``clientConfig.url``) instead of a Service: there is no
  kube-proxy; the serving certificate is signed by the cluster CA (``caBundle``), and Kueue's own
  certificate rotation is off (``internalCertManagement.enable: false``);
* only the webhooks of the ``kueue.x-k8s.io`` API and ``batch/job`` (the one framework enabled)
  are installed: the others would call paths the manager does not serve;
* its metrics certificate must lie in ``/etc/kueue/metrics/certs`` (a path fixed in Kueue's
  main.go): ``start`` writes the cluster's there, so ``--kueue`` needs root;
* the manager runs with the admin kubeconfig (no RBAC of its own), no leader election, the
  visibility API off (``VisibilityOnDemand=false``), ``waitForPodsReady`` on (``timeout_s``).

Errors: :class:`~.controlplane.ControlPlaneError` (module not in the cache, manager not ready).
"""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from . import controlplane, pki
from .private import private_dir, write_secret
from .controlplane import ControlPlaneError

REPO = Path(__file__).resolve().parents[3]
GO_MOD = REPO / "tests" / "controlplane" / "kueue" / "go.mod"
NAMESPACE = "kueue-system"
WEBHOOK_GROUPS = {"kueue.x-k8s.io", "batch"}
METRICS_CERTS = Path("/etc/kueue/metrics/certs")
"""Where Kueue's manager reads its metrics serving certificate (hard-coded in v0.17)."""


def module_dir() -> Path:
    """``sigs.k8s.io/kueue@<version>`` in the Go module cache.

    Raises:
        ControlPlaneError: not there (run scripts/build-controlplane.sh first).
    """
    import re
    found = re.search(r"^\s*(?:require\s+)?sigs\.k8s\.io/kueue\s+(v\S+)", GO_MOD.read_text(), re.M)
    if not found:
        raise ControlPlaneError(f"{GO_MOD} does not require sigs.k8s.io/kueue")
    version = found.group(1)
    cache = os.environ.get("GOMODCACHE") or subprocess.run(
        ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=False).stdout.strip()
    path = Path(cache) / f"sigs.k8s.io/kueue@{version}"
    if not (path / "config" / "components").is_dir():
        raise ControlPlaneError(f"{path} not in the Go module cache: run scripts/build-controlplane.sh")
    return path


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def manifests(kueue_dir: Path, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """The namespace, the CRDs (conversion via URL) and the webhook configurations (URL
    client configs of :data:`WEBHOOK_GROUPS`), ready for ``kubectl apply``."""
    bundle = base64.b64encode(ca_pem).decode()
    base = f"https://127.0.0.1:{port}"
    out: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}]
    comp = kueue_dir / "config" / "components"
    converted = {p.name.removeprefix("webhook_in_").removesuffix(".yaml")
                 for p in (comp / "crd" / "patches").glob("webhook_in_*.yaml")}
    kustom = yaml.safe_load((comp / "crd" / "kustomization.yaml").read_text())
    active = {Path(p["path"]).name.removeprefix("webhook_in_").removesuffix(".yaml")
              for p in kustom.get("patches", [])} & converted
    for crd_file in sorted((comp / "crd" / "bases").glob("*.yaml")):
        for crd in _docs(crd_file):
            if crd["spec"]["names"]["plural"] in active:
                crd["spec"]["conversion"] = {"strategy": "Webhook", "webhook": {
                    "conversionReviewVersions": ["v1"],
                    "clientConfig": {"url": f"{base}/convert", "caBundle": bundle}}}
            out.append(crd)
    for hook_cfg in _docs(comp / "webhook" / "manifests.yaml"):
        cfg = copy.deepcopy(hook_cfg)
        cfg["metadata"]["name"] = f"kueue-{cfg['metadata']['name']}"
        hooks = []
        for hook in cfg["webhooks"]:
            groups = {g for rule in hook.get("rules", []) for g in rule.get("apiGroups", [])}
            if not groups <= WEBHOOK_GROUPS:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": base + path, "caBundle": bundle}
            hook["timeoutSeconds"] = 10
            hooks.append(hook)
        cfg["webhooks"] = hooks
        out.append(cfg)
    return out


def configuration(ports: dict[str, int], cert_dir: Path, wait_for_pods_ready_s: int) -> dict[str, Any]:
    """Kueue's ``Configuration`` (config.kueue.x-k8s.io/v1beta2) for the local manager."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration", "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['kueue_health']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['kueue_metrics']}"},
        "webhook": {"port": ports["kueue_webhook"], "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "waitForPodsReady": {"timeout": f"{wait_for_pods_ready_s}s", "blockAdmission": False,
                             "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 1,
                                                   "backoffMaxSeconds": 5}},
        "integrations": {"frameworks": ["batch/job"]},
        "clientConnection": {"qps": 50, "burst": 100},
    }


def start(cluster_dir: Path, bins: Path, *, wait_for_pods_ready_s: int = 60) -> int:
    """Install Kueue's manifests, start its manager, wait for its readiness and webhooks; returns
    the manager's pid (also in the state file as ``kueue``).

    Raises:
        ControlPlaneError: as above, or the manifests were refused.
    """
    cluster_dir = cluster_dir.resolve()
    kdir = cluster_dir / "kueue"
    private_dir(kdir)
    pdir = cluster_dir / "pki"
    crt, key = pki.ensure_serving_cert(pdir, "kueue-webhook", ips=("127.0.0.1",), dns=("localhost",))
    certs = kdir / "certs"
    private_dir(certs)
    (certs / "tls.crt").write_bytes(crt.read_bytes())
    write_secret(certs / "tls.key", key.read_text())
    _metrics_certs(crt, key)
    names = ("kueue_webhook", "kueue_metrics", "kueue_health")
    ports = dict(zip(names, controlplane.free_ports(len(names)), strict=True))
    (kdir / "config.yaml").write_text(yaml.safe_dump(configuration(ports, certs, wait_for_pods_ready_s)))
    docs = manifests(module_dir(), ports["kueue_webhook"], (pdir / "ca.crt").read_bytes())
    (kdir / "manifests.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    controlplane.kubectl(cluster_dir, "apply", "--server-side", "--force-conflicts", "-f", str(kdir / "manifests.json"))
    controlplane.wait_crds_established(cluster_dir, [d["metadata"]["name"] for d in docs
                                                     if d["kind"] == "CustomResourceDefinition"])
    state = controlplane.read_state(cluster_dir)
    env = {**os.environ, "KUBECONFIG": state["kubeconfig"]}
    proc = controlplane.spawn("kueue", [str(bins / "kueue"), f"--config={kdir / 'config.yaml'}",
                                        "--feature-gates=VisibilityOnDemand=false", "--zap-log-level=info"],
                              cluster_dir, env=env)
    controlplane.record_process(cluster_dir, "kueue", proc.pid, ports)
    controlplane.wait_ready("kueue", f"http://127.0.0.1:{ports['kueue_health']}/readyz", proc, cluster_dir,
                            timeout_s=120)
    # the webhook server answers (TLS with our CA) before anything is created through it
    _wait_webhook(cluster_dir, ports["kueue_webhook"], pdir / "ca.crt", proc)
    return proc.pid


def _metrics_certs(crt: Path, key: Path) -> None:
    """Kueue v0.17's manager reads its metrics certificate from the fixed path
    :data:`METRICS_CERTS` when its own certificate management is off (cmd/kueue/main.go); put
    ours there (needs root, or that directory writable).

    Raises:
        ControlPlaneError: the directory cannot be written.
    """
    try:
        METRICS_CERTS.mkdir(parents=True, exist_ok=True)
        (METRICS_CERTS / "tls.crt").write_bytes(crt.read_bytes())
        write_secret(METRICS_CERTS / "tls.key", key.read_text())
    except OSError as exc:
        raise ControlPlaneError(f"Kueue needs its metrics certificate in {METRICS_CERTS}: {exc} "
                                "(run as root or make that directory writable)") from exc


def _wait_webhook(cluster_dir: Path, port: int, ca: Path, proc: subprocess.Popen[bytes]) -> None:
    """Poll until the webhook port completes a TLS handshake with a certificate of our CA."""
    import socket
    import ssl
    import time
    ctx = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ControlPlaneError(f"kueue exited:\n{controlplane.log_tail(cluster_dir, 'kueue')}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as raw, \
                    ctx.wrap_socket(raw, server_hostname="127.0.0.1"):
                return
        except OSError:
            time.sleep(0.2)
    raise ControlPlaneError(f"kueue's webhook server not up on {port}:\n{controlplane.log_tail(cluster_dir, 'kueue')}")


def names(docs: Iterable[dict[str, Any]]) -> list[str]:
    """``Kind/name`` of each manifest (for messages and tests)."""
    return [f"{d['kind']}/{d['metadata']['name']}" for d in docs]
