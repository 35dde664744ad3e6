"""Operator settings: :class:`OperatorConfig` from ``HTJ_*`` environment variables and flags.

Every field has a documented default (see docs/operator.md, "Settings").  Pure: no kopf import.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from hetero_operator.api.errors import ConfigError
from hetero_operator.api.prices import parse_prices_setting
from hetero_operator.api.spec import ImageVariant
from heterotrain_common import defaults

DEFAULT_TORCH_VERSION = "2.13.0"
"""The PyTorch release of every default worker image (scripts/build-images.sh builds one release)."""
DEFAULT_IMAGES = (
    ImageVariant(image="ghcr.io/heterotrain/worker:0.1.0-cu126", cuda_version=(12, 6),
                 compute_capabilities=("5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0"),
                 torch_version=DEFAULT_TORCH_VERSION, cuda_minor_version_compatible=True),
    ImageVariant(image="ghcr.io/heterotrain/worker:0.1.0-cu128", cuda_version=(12, 8),
                 compute_capabilities=("7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"),
                 torch_version=DEFAULT_TORCH_VERSION),
)
"""Used when a job's ``spec.images`` is empty; same catalog as examples/digits.yaml."""


@dataclass(frozen=True, kw_only=True, slots=True)
class OperatorConfig:
    """Settings of one operator process.

    Attributes:
        namespaces: namespaces to watch (kopf patterns, e.g. ``team-*``); empty = cluster-wide.
            Env ``HTJ_NAMESPACES`` (comma-separated).
        default_images: image catalog for jobs without ``spec.images``. Env
            ``HTJ_DEFAULT_IMAGES`` = ``image=cuda=cc1/cc2[=torchVersion[=minor-compat]];image2=...``.
        metrics_port: Prometheus port of the operator (``HTJ_METRICS_PORT``, 8080; 0 = off).
        health_port: liveness port, serves ``/healthz`` (``HTJ_HEALTH_PORT``, 8081; 0 = off).
        master_port: rendezvous port of rank 0 (``HTJ_MASTER_PORT``, 29500).
        pending_timeout_s: pods Pending longer than this are deleted and the job re-planned
            (``HTJ_PENDING_TIMEOUT_S``, 300).
        unschedulable_retry_s: re-plan interval of a job that does not fit
            (``HTJ_UNSCHEDULABLE_RETRY_S``, 30).
        backoff_base_s / backoff_max_s: restart delay ``base * 2**(restarts-1)`` capped at max
            (``HTJ_BACKOFF_BASE_S`` 10, ``HTJ_BACKOFF_MAX_S`` 300), as case 21 (10 s, 20 s, ...).
        resync_s: level-based re-check interval of every job (``HTJ_RESYNC_S``, 10).
        progress_interval_s: how often rank 0's metrics (progress) and one rank per GPU type's
            (learned speeds) are read (``HTJ_PROGRESS_INTERVAL_S``, 15).
        peering: kopf peering object name (``HTJ_PEERING``, ``heterotrain``); ``""`` = standalone
            (no peering; only for a single replica).
        peering_priority: this replica's peering priority (``HTJ_PEERING_PRIORITY``; default
            random 1..1000000 so two replicas never tie, which would pause both).
        simulate_devices: set ``simulated`` in the device profile (CPU test clusters;
            ``HTJ_SIMULATE_DEVICES``, false).
        launcher: argv prefix of the pod's container (``HTJ_LAUNCHER``,
            ``heterotrain launch --``).
        service_domain: suffix of ``MASTER_ADDR`` after the namespace (``HTJ_SERVICE_DOMAIN``,
            ``svc``; ``svc.cluster.local`` also works).
        gpu_prices: price of one device per hour by GPU type, MIG profile or product
            (``HTJ_GPU_PRICES`` = ``Tesla-T4=0.35,NVIDIA-A100-SXM4-40GB=2.9``; Helm
            ``gpuPricesPerHour``); plans then carry cost per million samples.
        link_intra_node_gbps / link_inter_node_gbps: link bandwidths of the planner's step-time
            model, Gbit/s (``HTJ_LINK_INTRA_NODE_GBPS`` 100, ``HTJ_LINK_INTER_NODE_GBPS`` 10).
        api_connect_timeout_s / api_read_timeout_s: bounds of every API call of the reconciler
            (``HTJ_API_CONNECT_TIMEOUT_S`` 5, ``HTJ_API_READ_TIMEOUT_S`` 30; shared/cases/25).
        api_retries: retries of a call that timed out or got 429/5xx (``HTJ_API_RETRIES``, 3).
        waiting_event_interval_s: a job that keeps waiting (unschedulable, node not ready)
            re-posts its unchanged Warning after this long (``HTJ_WAITING_EVENT_INTERVAL_S``,
            300; Events aggregate: the count grows, no new objects).
        watch_server_timeout_s: kopf watch requests ask the API server to end the stream after
            this long, so every watch is re-established at least this often
            (``HTJ_WATCH_SERVER_TIMEOUT_S``, 300; shared/cases/25).
        watch_client_timeout_s: the client gives up on a watch request after this long, for a
            connection that went silent without a reset (``HTJ_WATCH_CLIENT_TIMEOUT_S``, 301;
            must exceed the server timeout, so a healthy stream ends server-side first).
        watch_connect_timeout_s: connecting a watch (``HTJ_WATCH_CONNECT_TIMEOUT_S``, 30).
        watch_inactivity_timeout_s: a watch stream with no data for this long is reconnected
            (kopf's ``inactivity_timeout``; ``HTJ_WATCH_INACTIVITY_TIMEOUT_S``, 70, kopf's default).
        network_policy: create a NetworkPolicy per job that admits only the job's pods and the
            metrics namespaces (``HTJ_NETWORK_POLICY``, true).
        metrics_namespaces: namespaces whose pods may scrape the workers' metrics ports: the
            monitoring stack's and the operator's own (it reads rank 0's progress)
            (``HTJ_METRICS_NAMESPACES``, comma-separated; default ``monitoring``).
        worker_run_as_non_root: set ``runAsNonRoot`` on worker pods (``HTJ_WORKER_RUN_AS_NON_ROOT``,
            true; false only for worker images that must run as root).
        network_policy_egress: whether the job's NetworkPolicy also restricts its pods' egress to
            the job's own pods and the cluster DNS (``HTJ_NETWORK_POLICY_EGRESS``): ``auto`` (the
            default) when a policy of the namespace isolates the pods' egress already (e.g.
            "default deny all", shared/cases/46), so the ranks still reach each other and the DNS
            while everything else stays as the namespace decides; ``always``; ``never``.
        dns_namespace / dns_labels: where the cluster DNS pods run and their labels, for that
            egress rule (``HTJ_DNS_NAMESPACE`` kube-system, ``HTJ_DNS_LABELS`` k8s-app=kube-dns).
    """

    namespaces: tuple[str, ...] = ()
    default_images: tuple[ImageVariant, ...] = DEFAULT_IMAGES
    metrics_port: int = 8080
    health_port: int = 8081
    master_port: int = 29500
    pending_timeout_s: float = defaults.PENDING_TIMEOUT_S
    unschedulable_retry_s: float = 30.0
    backoff_base_s: float = defaults.BACKOFF_BASE_S
    backoff_max_s: float = defaults.BACKOFF_MAX_S
    resync_s: float = 10.0
    progress_interval_s: float = 15.0
    peering: str = "heterotrain"
    peering_priority: int = field(default_factory=lambda: random.randint(1, 1_000_000))
    simulate_devices: bool = False
    launcher: tuple[str, ...] = ("heterotrain", "launch", "--")
    service_domain: str = "svc"
    gpu_prices: Mapping[str, float] = field(default_factory=dict)
    link_intra_node_gbps: float = 100.0
    link_inter_node_gbps: float = 10.0
    api_connect_timeout_s: float = 5.0
    api_read_timeout_s: float = 30.0
    api_retries: int = 3
    waiting_event_interval_s: float = 300.0
    watch_server_timeout_s: float = 300.0
    watch_client_timeout_s: float = 301.0
    watch_connect_timeout_s: float = 30.0
    watch_inactivity_timeout_s: float = 70.0
    network_policy: bool = True
    metrics_namespaces: tuple[str, ...] = ("monitoring",)
    worker_run_as_non_root: bool = True
    network_policy_egress: str = "auto"
    dns_namespace: str = "kube-system"
    dns_labels: Mapping[str, str] = field(default_factory=lambda: {"k8s-app": "kube-dns"})

    def __post_init__(self) -> None:
        for name in ("metrics_port", "health_port", "master_port"):
            port = getattr(self, name)
            if not 0 <= port <= 65535 or (name == "master_port" and port == 0):
                raise ConfigError(f"{name} must be a TCP port in 1..65535 (0 turns metrics/health off), got {port}")
        for name in ("pending_timeout_s", "unschedulable_retry_s", "backoff_base_s", "backoff_max_s",
                     "resync_s", "progress_interval_s", "api_connect_timeout_s",
                     "api_read_timeout_s", "waiting_event_interval_s", "watch_server_timeout_s",
                     "watch_client_timeout_s", "watch_connect_timeout_s",
                     "watch_inactivity_timeout_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.backoff_max_s < self.backoff_base_s:
            raise ConfigError(f"backoff_max_s ({self.backoff_max_s}) must be >= backoff_base_s ({self.backoff_base_s})")
        if not 0 <= self.api_retries <= 10:
            raise ConfigError(f"api_retries must be in 0..10, got {self.api_retries}")
        if self.watch_client_timeout_s <= self.watch_server_timeout_s:
            raise ConfigError(f"watch_client_timeout_s ({self.watch_client_timeout_s}) must exceed "
                              f"watch_server_timeout_s ({self.watch_server_timeout_s}): the server "
                              "ends a healthy watch, the client only a silent one")
        if self.watch_inactivity_timeout_s > self.watch_server_timeout_s:
            raise ConfigError(f"watch_inactivity_timeout_s ({self.watch_inactivity_timeout_s}) must "
                              f"not exceed watch_server_timeout_s ({self.watch_server_timeout_s})")
        if not self.launcher:
            raise ConfigError("launcher must not be empty")
        if self.network_policy_egress not in EGRESS_MODES:
            raise ConfigError(f"network_policy_egress must be one of {', '.join(EGRESS_MODES)}, "
                              f"got {self.network_policy_egress!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> OperatorConfig:
        """Read ``HTJ_*`` variables; ``overrides`` (e.g. from flags) win.

        Raises:
            ConfigError: naming the variable that does not parse.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            var = "HTJ_" + f.name.upper()
            if var in env and (env[var] != "" or f.name == "peering"):
                values[f.name] = _parse(f.name, var, env[var])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def with_(self, **changes: Any) -> OperatorConfig:
        """A copy with ``changes`` applied."""
        return replace(self, **changes)


EGRESS_MODES = ("auto", "always", "never")


def _parse(name: str, var: str, raw: str) -> Any:
    try:
        if name in ("namespaces", "launcher", "metrics_namespaces"):
            sep = " " if name == "launcher" else ","
            return tuple(p.strip() for p in raw.split(sep) if p.strip())
        if name == "default_images":
            return parse_images(raw)
        if name in ("simulate_devices", "network_policy", "worker_run_as_non_root"):
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise ValueError("use true or false")
            return raw.lower() in ("1", "true", "yes")
        if name in ("peering", "service_domain", "dns_namespace"):
            return raw
        if name == "network_policy_egress":
            return raw.strip().lower()
        if name == "dns_labels":
            pairs = [p.strip().split("=", 1) for p in raw.split(",") if p.strip()]
            if not pairs or any(len(p) != 2 or not p[0] for p in pairs):
                raise ValueError("use key=value[,key=value]")
            return {k.strip(): v.strip() for k, v in pairs}
        if name == "gpu_prices":
            return parse_prices_setting(raw, var)
        if name.endswith("_gbps"):
            value = float(raw)
            if not value > 0:
                raise ValueError("must be > 0 Gbit/s")
            return value
        if name.endswith("_s"):
            return float(raw)
        return int(raw)
    except ValueError as exc:
        raise ConfigError(f"{var}={raw!r} does not parse: {exc}") from None


def parse_images(raw: str) -> tuple[ImageVariant, ...]:
    """Parse ``image=12.6=8.0/9.0=2.13.0=minor-compat;image2=12.8=9.0=2.13.0`` into image variants.

    Each entry is ``image=cudaMajor.minor=cc1/cc2`` plus optionally ``=torchVersion`` and then
    ``=minor-compat`` (the variant's ``cudaMinorVersionCompatible``).

    Raises:
        ValueError: an entry lacks one of the first three parts, has a bad CUDA version or an
            unknown fifth part.
    """
    out = []
    for entry in filter(None, (e.strip() for e in raw.split(";"))):
        parts = entry.split("=")
        if not 3 <= len(parts) <= 5:
            raise ValueError(f"entry {entry!r} must be image=cudaMajor.minor=cc1/cc2"
                             "[=torchVersion[=minor-compat]]")
        image, cuda, ccs = parts[:3]
        torch_version = parts[3] if len(parts) > 3 else ""
        flag = parts[4] if len(parts) > 4 else ""
        if flag not in ("", "minor-compat"):
            raise ValueError(f"entry {entry!r}: the fifth part may only be minor-compat, got {flag!r}")
        major, minor = cuda.split(".")
        out.append(ImageVariant(image=image, cuda_version=(int(major), int(minor)),
                                compute_capabilities=tuple(ccs.split("/")),
                                torch_version=torch_version,
                                cuda_minor_version_compatible=flag == "minor-compat"))
    return tuple(out)
