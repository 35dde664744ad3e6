"""Operator settings: :class:`OperatorConfig` from ``HTJ_*`` environment variables and flags.

Grouped as kopf groups its own settings, in small frozen dataclasses instead of one flat record:
``ports``, ``peering``, ``watch``, ``api``, ``restart``, ``intervals``, ``network``, ``pods``,
``planning``, ``links``, ``kueue``.  Each field declares its variable, parser, check and default once
(:func:`~hetero_operator.api.settingfields.setting`); :func:`OperatorConfig.from_env` and
:func:`env_table` walk those declarations, and docs/operator.md ("Settings") lists them.
Pure: no kopf import.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, ClassVar

from hetero_operator.api import settingfields as sf
from hetero_operator.api.errors import ConfigError
from hetero_operator.api.prices import parse_prices_setting
from hetero_operator.api.settingfields import setting
from hetero_operator.api.spec import ImageVariant
from heterotrain_common import defaults, envfields

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


EGRESS_MODES = ("auto", "always", "never")
"""``HTJ_NETWORK_POLICY_EGRESS``: whether a job's NetworkPolicy restricts its pods' egress too."""

_GROUP = dict(frozen=True, kw_only=True, slots=True)


@dataclass(**_GROUP)
class Ports(sf.Group):
    """TCP ports.

    Attributes:
        metrics: the operator's Prometheus endpoint (0 = off).
        health: the liveness endpoint, ``GET /healthz`` (0 = off).
        master: rank 0's rendezvous port in every job.
    """

    metrics: int = setting(8080, env="HTJ_METRICS_PORT", parse=int, check=sf.port)
    health: int = setting(8081, env="HTJ_HEALTH_PORT", parse=int, check=sf.port)
    master: int = setting(29500, env="HTJ_MASTER_PORT", parse=int, check=sf.required_port)

    PATH: ClassVar[str] = "ports"


@dataclass(**_GROUP)
class Peering(sf.Group):
    """kopf peering (HA: one replica acts, the others wait).

    Attributes:
        name: the peering object's name; ``""`` = standalone (no peering; one replica only).
        priority: this replica's priority; random 1..1000000 by default, so two replicas never
            tie (a tie pauses both).
    """

    name: str = setting("heterotrain", env="HTJ_PEERING", parse=sf.text, empty_is_value=True)
    priority: int = setting(env="HTJ_PEERING_PRIORITY", parse=int,
                            factory=lambda: random.randint(1, 1_000_000))

    PATH: ClassVar[str] = "peering"


@dataclass(**_GROUP)
class WatchSettings(sf.Group):
    """What kopf watches and how long a watch may run (shared/cases/25).

    Attributes:
        namespaces: namespaces to watch (kopf patterns, e.g. ``team-*``); empty = cluster-wide.
        server_timeout_s: watch requests ask the API server to end the stream after this long,
            so every watch is re-established at least this often.
        client_timeout_s: the client gives up on a watch request after this long, for a
            connection that went silent without a reset; must exceed the server timeout, so a
            healthy stream ends server-side first.
        connect_timeout_s: connecting a watch.
        inactivity_timeout_s: a stream with no data for this long is reconnected (kopf's
            ``inactivity_timeout``, its default); at most the server timeout.
    """

    namespaces: tuple[str, ...] = setting((), env="HTJ_NAMESPACES", parse=sf.comma_list)
    server_timeout_s: float = sf.seconds(300.0, env="HTJ_WATCH_SERVER_TIMEOUT_S")
    client_timeout_s: float = sf.seconds(301.0, env="HTJ_WATCH_CLIENT_TIMEOUT_S")
    connect_timeout_s: float = sf.seconds(30.0, env="HTJ_WATCH_CONNECT_TIMEOUT_S")
    inactivity_timeout_s: float = sf.seconds(70.0, env="HTJ_WATCH_INACTIVITY_TIMEOUT_S")

    PATH: ClassVar[str] = "watch"

    def __post_init__(self) -> None:
        sf.Group.__post_init__(self)
        if self.client_timeout_s <= self.server_timeout_s:
            raise ConfigError(f"watch.client_timeout_s ({self.client_timeout_s}) must exceed "
                              f"watch.server_timeout_s ({self.server_timeout_s}): the server ends a "
                              "healthy watch, the client only a silent one")
        if self.inactivity_timeout_s > self.server_timeout_s:
            raise ConfigError(f"watch.inactivity_timeout_s ({self.inactivity_timeout_s}) must not "
                              f"exceed watch.server_timeout_s ({self.server_timeout_s})")


@dataclass(**_GROUP)
class ApiSettings(sf.Group):
    """Bounds of every API call of the reconciler (shared/cases/25).

    Attributes:
        connect_timeout_s / read_timeout_s: connecting, and waiting for the answer.
        retries: retries (backoff 0.2 s, doubling) of a call that timed out, lost its connection
            or got 429/5xx; 0..10.
    """

    connect_timeout_s: float = sf.seconds(5.0, env="HTJ_API_CONNECT_TIMEOUT_S")
    read_timeout_s: float = sf.seconds(30.0, env="HTJ_API_READ_TIMEOUT_S")
    retries: int = setting(3, env="HTJ_API_RETRIES", parse=int, check=sf.in_range(0, 10))

    PATH: ClassVar[str] = "api"


@dataclass(**_GROUP)
class RestartSettings(sf.Group):
    """When a job is restarted or re-planned (the lifecycle's timing,
    :func:`hetero_operator.lifecycle.decisions.decide`).

    Attributes:
        pending_timeout_s: pods Pending longer than this are deleted and the job re-planned.
        backoff_base_s / backoff_max_s: restart delay ``base * 2**(restarts-1)`` capped at max
            (as case 21: 10 s, 20 s, ...); also the retries after an admission refusal.
        unschedulable_retry_s: re-plan interval of a job that does not fit.
        max_replans: re-plans (``status.replans``: pods Pending past ``pending_timeout_s``, a pod
            of the gang missing) after which the job fails (``ReplanLimitExceeded``) instead of
            re-planning again; each re-plan waits ``base * 2**(replans-1)`` capped at max first.
    """

    pending_timeout_s: float = sf.seconds(defaults.PENDING_TIMEOUT_S, env="HTJ_PENDING_TIMEOUT_S")
    backoff_base_s: float = sf.seconds(defaults.BACKOFF_BASE_S, env="HTJ_BACKOFF_BASE_S")
    backoff_max_s: float = sf.seconds(defaults.BACKOFF_MAX_S, env="HTJ_BACKOFF_MAX_S")
    unschedulable_retry_s: float = sf.seconds(30.0, env="HTJ_UNSCHEDULABLE_RETRY_S")
    max_replans: int = setting(10, env="HTJ_MAX_REPLANS", parse=int, check=sf.in_range(0, 10000))

    PATH: ClassVar[str] = "restart"

    def __post_init__(self) -> None:
        sf.Group.__post_init__(self)
        if self.backoff_max_s < self.backoff_base_s:
            raise ConfigError(f"restart.backoff_max_s ({self.backoff_max_s}) must be >= "
                              f"restart.backoff_base_s ({self.backoff_base_s})")


@dataclass(**_GROUP)
class Intervals(sf.Group):
    """How often the reconciler looks again.

    Attributes:
        resync_s: level-based re-check of every job.
        progress_s: how often rank 0's metrics (progress) and one rank per GPU type's (learned
            speeds) are read.
        waiting_event_s: a job that keeps waiting (unschedulable, node not ready) re-posts its
            unchanged Warning after this long (Events aggregate: the count grows).
    """

    resync_s: float = sf.seconds(10.0, env="HTJ_RESYNC_S")
    progress_s: float = sf.seconds(15.0, env="HTJ_PROGRESS_INTERVAL_S")
    waiting_event_s: float = sf.seconds(300.0, env="HTJ_WAITING_EVENT_INTERVAL_S")

    PATH: ClassVar[str] = "intervals"


@dataclass(**_GROUP)
class NetworkSettings(sf.Group):
    """The per-job NetworkPolicy.

    Attributes:
        policy: create a NetworkPolicy per job that admits only the job's pods and the metrics
            namespaces.
        egress: whether it also restricts the pods' egress to the job's own pods and the cluster
            DNS: ``auto`` when a policy of the namespace isolates the pods' egress already (e.g.
            "default deny all", shared/cases/46), ``always``, ``never``.
        metrics_namespaces: namespaces whose pods may scrape the workers' metrics ports (the
            monitoring stack's; the chart adds the operator's own, which reads rank 0's progress).
        dns_namespace / dns_labels: where the cluster DNS pods run and their labels, for the
            egress rule.
    """

    policy: bool = setting(True, env="HTJ_NETWORK_POLICY", parse=sf.boolean)
    egress: str = setting("auto", env="HTJ_NETWORK_POLICY_EGRESS", parse=sf.lowered,
                          check=sf.one_of(EGRESS_MODES))
    metrics_namespaces: tuple[str, ...] = setting(("monitoring",), env="HTJ_METRICS_NAMESPACES",
                                                  parse=sf.comma_list)
    dns_namespace: str = setting("kube-system", env="HTJ_DNS_NAMESPACE", parse=sf.text)
    dns_labels: Mapping[str, str] = setting(env="HTJ_DNS_LABELS", parse=sf.labels,
                                            factory=lambda: {"k8s-app": "kube-dns"})

    PATH: ClassVar[str] = "network"


@dataclass(**_GROUP)
class PodSettings(sf.Group):
    """What every worker pod gets.

    Attributes:
        launcher: argv prefix of the pod's container.
        service_domain: suffix of ``MASTER_ADDR`` after the namespace (``svc.cluster.local``
            also works).
        simulate_devices: set ``simulated`` in the device profile (CPU test clusters).
        run_as_non_root: ``runAsNonRoot`` on worker pods (false only for worker images that must
            run as root).
    """

    launcher: tuple[str, ...] = setting(("heterotrain", "launch", "--"), env="HTJ_LAUNCHER",
                                        parse=sf.word_list, check=sf.not_empty)
    service_domain: str = setting("svc", env="HTJ_SERVICE_DOMAIN", parse=sf.text)
    simulate_devices: bool = setting(False, env="HTJ_SIMULATE_DEVICES", parse=sf.boolean)
    run_as_non_root: bool = setting(True, env="HTJ_WORKER_RUN_AS_NON_ROOT", parse=sf.boolean)

    PATH: ClassVar[str] = "pods"


@dataclass(**_GROUP)
class PlanningSettings(sf.Group):
    """What the planner is given besides the job and the cluster.

    Attributes:
        default_images: image catalog for jobs without ``spec.images``
            (``image=cuda=cc1/cc2[=torchVersion[=minor-compat]];image2=...``, :func:`parse_images`).
        gpu_prices: price of one device per hour by GPU type, MIG profile or product
            (``Tesla-T4=0.35,NVIDIA-A100-SXM4-40GB=2.9``; Helm ``gpuPricesPerHour``); plans then
            carry cost per million samples.
    """

    default_images: tuple[ImageVariant, ...] = setting(DEFAULT_IMAGES, env="HTJ_DEFAULT_IMAGES",
                                                       parse=lambda raw: parse_images(raw))
    gpu_prices: Mapping[str, float] = setting(env="HTJ_GPU_PRICES", parse=parse_prices_setting,
                                              factory=dict)

    PATH: ClassVar[str] = "planning"


@dataclass(**_GROUP)
class Links(sf.Group):
    """Link bandwidths of the planner's step-time model
    (:class:`hetero_operator.planning.marginal.LinkSettings`; Helm ``operator.planningLinks``).

    Attributes:
        intra_node_gbps: between devices of one node, Gbit/s.
        inter_node_gbps: one node's egress to the others, Gbit/s.
    """

    intra_node_gbps: float = sf.gbps(100.0, env="HTJ_LINK_INTRA_NODE_GBPS")
    inter_node_gbps: float = sf.gbps(10.0, env="HTJ_LINK_INTER_NODE_GBPS")

    PATH: ClassVar[str] = "links"


@dataclass(**_GROUP)
class KueueSettings(sf.Group):
    """Queued jobs (Kueue).

    Attributes:
        require_queue: run only jobs with a queue (the ``kueue.x-k8s.io/queue-name`` label or
            ``spec.runPolicy.schedulingPolicy.queue``); a job without one waits ``Suspended``
            (``QueueRequired``) until it gets one, so no job runs outside Kueue's quota.
    """

    require_queue: bool = setting(False, env="HTJ_REQUIRE_QUEUE", parse=sf.boolean)

    PATH: ClassVar[str] = "kueue"


@dataclass(**_GROUP)
class OperatorConfig:
    """Settings of one operator process, in groups (each group's fields and variables are listed
    in its class; docs/operator.md, "Settings", has the table).

    Build one from the environment with :meth:`from_env`; in code, give the groups that differ
    (``OperatorConfig(peering=Peering(name=""), ports=Ports(metrics=0, health=0))``) or change
    fields by path with :meth:`with_` (``config.with_({"network.policy": False})``).
    """

    ports: Ports = envfields.group(Ports)
    peering: Peering = envfields.group(Peering)
    watch: WatchSettings = envfields.group(WatchSettings)
    api: ApiSettings = envfields.group(ApiSettings)
    restart: RestartSettings = envfields.group(RestartSettings)
    intervals: Intervals = envfields.group(Intervals)
    network: NetworkSettings = envfields.group(NetworkSettings)
    pods: PodSettings = envfields.group(PodSettings)
    planning: PlanningSettings = envfields.group(PlanningSettings)
    links: Links = envfields.group(Links)
    kueue: KueueSettings = envfields.group(KueueSettings)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None,
                 overrides: Mapping[str, Any] | None = None) -> OperatorConfig:
        """Read the ``HTJ_*`` variables (an empty one counts as unset, except ``HTJ_PEERING``);
        ``overrides`` (e.g. from flags), by field path (``"ports.metrics"``), win; a None
        override is no override.

        Raises:
            ConfigError: naming the variable that does not parse, the check that failed, or an
                override path that names no setting.
        """
        env = os.environ if environ is None else environ
        by_group = _by_group(overrides or {})
        return cls(**{f.name: sf.read_group(f.default_factory, env, by_group.get(f.name, {}),  # type: ignore[arg-type]
                                            path=f.name) for f in fields(cls)})

    def with_(self, changes: Mapping[str, Any]) -> OperatorConfig:
        """A copy with ``changes`` applied, by field path (``{"network.policy": False}``).

        Raises:
            ConfigError: a path that names no setting, or a changed value fails its check.
        """
        updated = {}
        for group, values in _by_group(changes).items():
            try:
                updated[group] = replace(getattr(self, group), **values)
            except TypeError:
                raise ConfigError(f"{group} has no setting {', '.join(sorted(values))}") from None
        return replace(self, **updated)


def _by_group(changes: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"ports.metrics": 0}`` -> ``{"ports": {"metrics": 0}}``.

    Raises:
        ConfigError: a path that is not ``group.field`` of a known group.
    """
    groups = {f.name for f in fields(OperatorConfig)}
    out: dict[str, dict[str, Any]] = {}
    for path, value in changes.items():
        group, _, name = path.partition(".")
        if group not in groups or not name:
            raise ConfigError(f"{path!r} is no setting path: use group.field, groups "
                              f"{', '.join(sorted(groups))}")
        out.setdefault(group, {})[name] = value
    return out


def env_table() -> list[tuple[str, str, Any]]:
    """``(variable, field path, default)`` of every setting (:func:`hetero_operator.api.settingfields.env_table`)."""
    return sf.env_table(OperatorConfig)


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
