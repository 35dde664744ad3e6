"""Kubernetes pod discovery for a Prometheus built without ``kubernetes_sd_configs``.

Debian's ``prometheus`` package (the one this project's tests and ``cluster up --monitoring`` use)
is built from source without the Kubernetes service discovery (``field kubernetes_sd_configs not
found``).  This process stands in for it: on every request of Prometheus's ``http_sd_configs`` it
lists the pods from the API server (the cluster's admin token and CA) and answers the target
groups that ``kubernetes_sd_configs`` with ``role: pod`` would make: one target per declared
container port (``<pod IP>:<port>``) with the same ``__meta_kubernetes_*`` labels, so the scrape
job's relabelling (:func:`.monitoring.scrape_config`) is the same for both.

Run it: ``python -m hetero_operator.devcluster.podsd --dir CLUSTER_DIR --port PORT``.
"""

from __future__ import annotations

import argparse
import json
import re
import ssl
import sys
import urllib.request
from collections.abc import Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

META = "__meta_kubernetes_"


def _name(text: str) -> str:
    """A label name as Prometheus's Kubernetes discovery sanitizes it."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", text)


def pod_targets(pods: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The target groups of ``role: pod`` for ``pods`` (those with a pod IP), one per container
    port (https://prometheus.io/docs/prometheus/latest/configuration/configuration/#pod)."""
    groups = []
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        ip = status.get("podIP")
        if not ip:
            continue
        common = {f"{META}namespace": meta.get("namespace", ""), f"{META}pod_name": meta.get("name", ""),
                  f"{META}pod_ip": ip, f"{META}pod_node_name": spec.get("nodeName", ""),
                  f"{META}pod_host_ip": status.get("hostIP", ""), f"{META}pod_uid": meta.get("uid", ""),
                  f"{META}pod_phase": status.get("phase", ""),
                  f"{META}pod_ready": str(any(c.get("type") == "Ready" and c.get("status") == "True"
                                              for c in status.get("conditions") or ())).lower()}
        for key, value in (meta.get("labels") or {}).items():
            common[f"{META}pod_label_{_name(key)}"] = str(value)
            common[f"{META}pod_labelpresent_{_name(key)}"] = "true"
        for key, value in (meta.get("annotations") or {}).items():
            common[f"{META}pod_annotation_{_name(key)}"] = str(value)
            common[f"{META}pod_annotationpresent_{_name(key)}"] = "true"
        for c in spec.get("containers") or ():
            for port in c.get("ports") or ():
                groups.append({"targets": [f"{ip}:{port['containerPort']}"], "labels": {
                    **common, f"{META}pod_container_name": c["name"],
                    f"{META}pod_container_image": c.get("image", ""),
                    f"{META}pod_container_init": "false",
                    f"{META}pod_container_port_name": port.get("name", ""),
                    f"{META}pod_container_port_number": str(port["containerPort"]),
                    f"{META}pod_container_port_protocol": port.get("protocol", "TCP")}})
    return groups


class _Pods:
    """Lists the cluster's pods through its API server (admin token, cluster CA)."""

    def __init__(self, cluster_dir: Path) -> None:
        from .controlplane import read_state
        state = read_state(cluster_dir)
        self.url = state["server"] + "/api/v1/pods"
        self.token = (cluster_dir / "tokens.csv").read_text().split(",", 1)[0]
        self.ctx = ssl.create_default_context(cafile=str(cluster_dir / "pki" / "ca.crt"))

    def list(self) -> list[dict[str, Any]]:
        req = urllib.request.Request(self.url, headers={"Authorization": f"Bearer {self.token}"})
        with urllib.request.urlopen(req, timeout=10, context=self.ctx) as resp:
            return list(json.loads(resp.read()).get("items") or [])


def serve(cluster_dir: Path, port: int) -> None:
    """Answer ``GET /targets`` on 127.0.0.1:``port`` until killed."""
    pods = _Pods(cluster_dir)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            try:
                body = json.dumps(pod_targets(pods.list())).encode()
                code = 200
            except OSError as exc:  # the API server away: Prometheus keeps its last targets
                body, code = str(exc).encode(), 503
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return None

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def main(argv: list[str] | None = None) -> int:
    """``python -m hetero_operator.devcluster.podsd``: serve until SIGTERM."""
    p = argparse.ArgumentParser(prog="hetero_operator.devcluster.podsd", description=__doc__.splitlines()[0])
    p.add_argument("--dir", required=True, type=Path, help="the cluster dir")
    p.add_argument("--port", required=True, type=int)
    args = p.parse_args(argv)
    serve(args.dir.resolve(), args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
