"""``heterotrain cluster up --monitoring``: the real Prometheus, finding every rank of every
HeteroTrainingJob through Kubernetes service discovery against the local API server.

The scrape job (:data:`SCRAPE_JOB`) uses ``kubernetes_sd_configs`` with ``role: pod`` (the
cluster's admin token, its CA) where the binary has it; Debian's package is built without it, and
then :mod:`.podsd` (a process listing the pods from the API server and answering what ``role:
pod`` would, as ``http_sd_configs``, refreshed every scrape interval) stands in.  The job keeps the container ports the operator names ``metrics``,
``metrics-1`` .. (local rank i serves on ``metricsPort + i``) of ``Running`` pods: one target per
rank, as the chart's PodMonitor selects them.  The local kubelet runs every pod on 127.0.0.1 and
remaps those ports; it records the real one per port name in the pod annotation
:data:`~hetero_operator.api.labels.ANNOTATION_LOCAL_NAMED_PORTS`, and one relabel rule per local
rank (up to :data:`MAX_LOCAL_RANKS`; Prometheus's RE2 has no back-references) sets
``__address__`` from it.  Targets carry ``namespace``, ``pod``, ``node`` and ``port_name``; the
series keep their own ``job`` label (the HeteroTrainingJob: ``honor_labels``).

The binary is the system's ``prometheus`` (PATH, then /usr/bin: the Debian package, as the tests
under tests/prom use it).  It runs as the cluster's process ``prometheus`` (``cluster down``
stops it, and ``prometheus-sd``, the stand-in discovery) with its config and TSDB in ``<cluster dir>/prometheus``.

Errors: :class:`~.controlplane.ControlPlaneError` (no binary, not ready).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from hetero_operator.api.labels import ANNOTATION_LOCAL_NAMED_PORTS

from . import controlplane
from .controlplane import ControlPlaneError
from .private import private_dir, write_secret

PROCESS = "prometheus"
SD_PROCESS = "prometheus-sd"
"""The stand-in pod discovery's process (:mod:`.podsd`), where the binary lacks the Kubernetes one."""
"""The name of the process in the cluster's state file (and its log, ``logs/prometheus.log``)."""
SCRAPE_JOB = "heterotrain-ranks"
MAX_LOCAL_RANKS = 16
"""Ranks of one pod that get a relabel rule (a node's GPUs)."""
SCRAPE_INTERVAL_S = 5
METRICS_PORT_NAME = "metrics"
"""The operator's container port name of local rank 0; rank i's is ``metrics-i``."""


def find_binary() -> str | None:
    """Path of the ``prometheus`` binary (PATH, then /usr/bin), None when not installed."""
    found = shutil.which("prometheus")
    if found:
        return found
    return "/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None


def _meta(name: str) -> str:
    """Prometheus's meta label of a pod annotation (non-alphanumerics become ``_``)."""
    import re
    return "__meta_kubernetes_pod_annotation_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)


def port_names(max_local_ranks: int = MAX_LOCAL_RANKS) -> list[str]:
    """The metrics port names of a pod's local ranks: ``metrics``, ``metrics-1``, ..."""
    return [METRICS_PORT_NAME if i == 0 else f"{METRICS_PORT_NAME}-{i}" for i in range(max_local_ranks)]


def has_kubernetes_sd(binary: str) -> bool:
    """Whether ``binary`` knows ``kubernetes_sd_configs`` (``promtool`` beside it checks a config
    that has it; without a ``promtool`` it is assumed to, as upstream builds do)."""
    promtool = Path(binary).with_name("promtool")
    if not promtool.exists():
        return True
    probe = ("scrape_configs:\n- job_name: probe\n  kubernetes_sd_configs:\n  - role: pod\n"
             "    api_server: https://127.0.0.1:1\n")
    proc = subprocess.run([str(promtool), "check", "config", "/dev/stdin"], input=probe, capture_output=True,
                          text=True, timeout=30, check=False)
    return "kubernetes_sd_configs not found" not in proc.stdout + proc.stderr


def scrape_config(server: str, ca_file: Path, token_file: Path, *, sd_url: str = "",
                  scrape_interval_s: int = SCRAPE_INTERVAL_S) -> dict[str, Any]:
    """The scrape job (see the module doc); ``sd_url``: the stand-in discovery's (:mod:`.podsd`)
    instead of ``kubernetes_sd_configs``."""
    named = _meta(ANNOTATION_LOCAL_NAMED_PORTS)
    relabel: list[dict[str, Any]] = [
        {"source_labels": ["__meta_kubernetes_pod_container_port_name"],
         "regex": f"{METRICS_PORT_NAME}(-[0-9]+)?", "action": "keep"},
        {"source_labels": ["__meta_kubernetes_pod_phase"], "regex": "Running", "action": "keep"},
        {"target_label": "__address__", "replacement": "unmapped"},
    ]
    for name in port_names():
        relabel.append({"source_labels": ["__meta_kubernetes_pod_container_port_name", named],
                        "regex": f'{name};.*"{name}": ([0-9]+).*', "target_label": "__address__",
                        "replacement": "127.0.0.1:$1"})
    relabel += [
        {"source_labels": ["__address__"], "regex": r"127\.0\.0\.1:[0-9]+", "action": "keep"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
        {"source_labels": ["__meta_kubernetes_pod_container_port_name"], "target_label": "port_name"},
    ]
    sd: dict[str, Any] = (
        {"http_sd_configs": [{"url": sd_url, "refresh_interval": f"{scrape_interval_s}s"}]} if sd_url else
        {"kubernetes_sd_configs": [{"role": "pod", "api_server": server, "tls_config": {"ca_file": str(ca_file)},
                                    "authorization": {"credentials_file": str(token_file)}}]})
    return {"job_name": SCRAPE_JOB, "honor_labels": True,
            "scrape_interval": f"{scrape_interval_s}s", "scrape_timeout": f"{scrape_interval_s}s",
            **sd, "relabel_configs": relabel}


def start(cluster_dir: Path, *, scrape_interval_s: int = SCRAPE_INTERVAL_S) -> str:
    """Start Prometheus for the cluster of ``cluster_dir`` and wait until it is ready; returns
    its URL (also in the state file: port ``prometheus``).

    Raises:
        ControlPlaneError: no ``prometheus`` binary, or it did not get ready.
    """
    binary = find_binary()
    if binary is None:
        raise ControlPlaneError("--monitoring needs the prometheus binary (apt-get install prometheus)")
    cluster_dir = cluster_dir.resolve()
    state = controlplane.read_state(cluster_dir)
    pdir = private_dir(cluster_dir / "prometheus")
    token = write_secret(pdir / "token", (cluster_dir / "tokens.csv").read_text().split(",", 1)[0])
    port, sd_port = controlplane.free_ports(2)
    sd_url = "" if has_kubernetes_sd(binary) else _start_sd(cluster_dir, sd_port)
    config = {"global": {"scrape_interval": f"{scrape_interval_s}s"},
              "scrape_configs": [scrape_config(state["server"], cluster_dir / "pki" / "ca.crt", token,
                                               sd_url=sd_url, scrape_interval_s=scrape_interval_s)]}
    (pdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    proc = controlplane.spawn(PROCESS, [binary, f"--config.file={pdir / 'prometheus.yml'}",
                                        f"--storage.tsdb.path={pdir / 'data'}",
                                        f"--web.listen-address=127.0.0.1:{port}",
                                        "--storage.tsdb.retention.time=2d"], cluster_dir)
    controlplane.record_process(cluster_dir, PROCESS, proc.pid, {PROCESS: port})
    url = f"http://127.0.0.1:{port}"
    controlplane.wait_ready(PROCESS, f"{url}/-/ready", proc, cluster_dir, timeout_s=60)
    return url


def _start_sd(cluster_dir: Path, port: int) -> str:
    """Start :mod:`.podsd` on ``port`` (process :data:`SD_PROCESS`), wait until it answers;
    returns its targets URL."""
    import os
    repo = Path(__file__).resolve().parents[3]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(repo / "operator"), str(repo / "common"), env.get("PYTHONPATH", "")])
    proc = controlplane.spawn(SD_PROCESS, [sys.executable, "-m", "hetero_operator.devcluster.podsd",
                                           "--dir", str(cluster_dir), "--port", str(port)], cluster_dir, env=env)
    controlplane.record_process(cluster_dir, SD_PROCESS, proc.pid, {SD_PROCESS: port})
    url = f"http://127.0.0.1:{port}/targets"
    controlplane.wait_ready(SD_PROCESS, url, proc, cluster_dir, timeout_s=60)
    return url
