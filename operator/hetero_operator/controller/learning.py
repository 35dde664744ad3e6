"""Learned speeds from the operator's jobs: read one rank per GPU type while a job runs, record
the figures in the namespace's ``heterotrain-profiles`` ConfigMap when it succeeds.

Every rank exports cumulative ``htj_steps_total``, ``htj_samples_total`` and
``htj_compute_seconds_total`` (docs/internal-api.md).  While a job is Running the reconciler
calls :meth:`SpeedLearner.observe`: per (GPU type, precision) of ``status.plan`` it reads the
first pod of that type (the pod's local rank 0 serves on ``spec.worker.metricsPort``), at most
every ``interval_s`` per job, each read bounded by :data:`hetero_operator.controller.progress.READ_TIMEOUT_S`,
and keeps the newest reading in memory.  The ranks' endpoints end with their processes, so what is
recorded is the last reading before the end: that device's samples over its compute seconds up to
then (communication waits left out, like ``heterotrain run`` records from ``rank-<r>.json``).

When the job turns Succeeded, :func:`record` merges the readings (long enough to measure:
``profiles.observations_from_stats``) into the ConfigMap with
:func:`hetero_operator.planning.profiles.configmap_update`: get, then create or a merge patch carrying the
``resourceVersion`` read (optimistic concurrency: two jobs finishing at once both land, the loser
re-reads and merges again).  The ConfigMap has no owner: it outlives the jobs that filled it.

A pipelined job (``status.plan.pipeline``) is not read: its ranks' figures are their stages'.
A type whose ranks recompute their blocks in backward (``status.plan.memory``: mode ``Full``, or
the type's ``activationCheckpointing``) is recorded as ``recomputes``, so its figure is kept
without the recomputation as ``heterotrain run`` keeps it (``profiles.observations_from_stats``).

Limits: a job that ends before one reading long enough to measure
(``profiles.MIN_STEPS`` steps, ``MIN_COMPUTE_S`` compute seconds, ``MIN_SAMPLES`` samples)
records nothing; readings live in the
operator's memory (a restarted operator starts over from the next reading); the job's step
efficiency (``profiles.JOB_EFFICIENCY``) is not recorded (it needs every rank's figures).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from hetero_operator.api.labels import LABEL_MANAGED_BY
from hetero_operator.controller.progress import (MetricsUrlFn, ReadWarnings, parse_problem,
                                                 read_metrics)
from hetero_operator.planning import profiles
from heterotrain_common import metricnames as mn

log = logging.getLogger("heterotrain.operator.learning")
Key = tuple[str, str]
RECORD_ATTEMPTS = 3
"""Read-merge-write rounds before giving up on a contended ConfigMap."""
_COUNTERS = {mn.STEPS_TOTAL: "steps", mn.SAMPLES_TOTAL: "samples",
             mn.COMPUTE_SECONDS_TOTAL: "compute_seconds"}


class ConfigMapApi(Protocol):
    """The calls :func:`record` makes (:class:`hetero_operator.controller.k8s.Api` has them)."""

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def create_configmap(self, namespace: str, body: Mapping[str, Any]) -> bool: ...

    async def patch_configmap(self, namespace: str, name: str, patch: Mapping[str, Any]) -> bool: ...


def rank_stats(metrics_text: str) -> dict[str, Any] | None:
    """A rank's cumulative ``steps``, ``samples``, ``compute_seconds`` from its ``/metrics`` text.

    Returns:
        The three figures (the keys :func:`hetero_operator.planning.profiles.observations_from_stats`
        reads), or ``None`` when one is missing (no step yet, not a HeteroTrain worker).
    """
    out: dict[str, Any] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name in _COUNTERS:
                out[_COUNTERS[sample.name]] = sample.value
    if len(out) != len(_COUNTERS):
        return None
    out["steps"] = int(out["steps"])
    return out


def reading_pods(plan: Mapping[str, Any] | None) -> dict[tuple[str, str], str]:
    """``(gpuType, precision) -> pod`` to read: the first group of each type in ``status.plan``;
    none for a pipelined plan (``status.plan.pipeline``): a stage's samples per compute second
    are its blocks', not its device's, and would mislead every later plan of the profile."""
    out: dict[tuple[str, str], str] = {}
    if (plan or {}).get("pipeline"):
        return out
    for g in (plan or {}).get("groups") or ():
        if g.get("gpuType") and g.get("precision") and g.get("pod"):
            out.setdefault((str(g["gpuType"]), str(g["precision"])), str(g["pod"]))
    return out


def recomputing_types(plan: Mapping[str, Any] | None) -> set[str]:
    """GPU types of ``status.plan`` whose ranks recompute their blocks' forward in backward:
    every type under ``memory.mode`` ``Full``, else those with ``activationCheckpointing``."""
    memory = (plan or {}).get("memory") or {}
    types = [t for t in memory.get("gpuTypes") or () if t.get("gpuType")]
    if memory.get("mode") == "Full":
        return {str(t["gpuType"]) for t in types}
    return {str(t["gpuType"]) for t in types if t.get("activationCheckpointing")}


class SpeedLearner(ReadWarnings):
    """Newest per-type readings of each running job (see the module docstring).

    Args:
        metrics_url: where a pod's local rank 0 serves metrics (a test kubelet maps ports).
        interval_s: least time between two reads of one job, seconds.
    """

    def __init__(self, metrics_url: MetricsUrlFn, interval_s: float) -> None:
        super().__init__()
        self.metrics_url, self.interval_s = metrics_url, interval_s
        self._read_at: dict[Key, float] = {}
        self._stats: dict[Key, dict[tuple[str, str], dict[str, Any]]] = {}

    def forget(self, namespace: str, name: str) -> None:
        """Drop a job's readings and timer."""
        self._read_at.pop((namespace, name), None)
        self._stats.pop((namespace, name), None)
        self.take_warnings(namespace, name)

    async def observe(self, namespace: str, name: str, pods: Sequence[Mapping[str, Any]],
                      plan: Mapping[str, Any] | None, *, metrics_port: int, now_s: float) -> int:
        """Read one pod per GPU type when due; returns how many readings were taken."""
        key = (namespace, name)
        if not metrics_port or now_s - self._read_at.get(key, -1e18) < self.interval_s:
            return 0
        by_name = {p["metadata"]["name"]: p for p in pods
                   if (p.get("status") or {}).get("phase") == "Running"
                   and not p["metadata"].get("deletionTimestamp")}
        urls = {t: self.metrics_url(by_name[pod], metrics_port)
                for t, pod in reading_pods(plan).items() if pod in by_name}
        urls = {t: u for t, u in urls.items() if u}
        if not urls:
            return 0
        self._read_at[key] = now_s
        reads = await asyncio.gather(*(read_metrics(u) for u in urls.values()))
        recomputing = recomputing_types(plan)
        taken = 0
        for ((gpu_type, precision), url), read in zip(urls.items(), reads):
            self.warn(namespace, name, read.problem)
            try:
                stats = rank_stats(read.text) if read.text is not None else None
            except Exception as exc:  # noqa: BLE001 - not a worker's metrics: a warning
                self.warn(namespace, name, parse_problem(url, exc))
                continue
            if stats is not None:
                self._stats.setdefault(key, {})[(gpu_type, precision)] = {
                    **stats, "gpu_product": gpu_type, "precision": precision,
                    "recomputes": gpu_type in recomputing}
                taken += 1
        return taken

    def observations(self, namespace: str, name: str, *, unix_s: float) -> list[profiles.Observation]:
        """The job's readings as observations (and forgets them: each job is recorded once)."""
        stats = list(self._stats.pop((namespace, name), {}).values())
        return profiles.observations_from_stats(stats, unix_s=unix_s, job=name, namespace=namespace)


def configmap_body(namespace: str, data: Mapping[str, str | None]) -> dict[str, Any]:
    """A new ``heterotrain-profiles`` ConfigMap holding ``data`` (no owner: it outlives jobs)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": profiles.CONFIGMAP_NAME, "namespace": namespace,
                         "labels": {LABEL_MANAGED_BY: "heterotrain"}},
            "data": {k: v for k, v in data.items() if v is not None}}


async def record(api: ConfigMapApi, namespace: str, profile_key: str,
                 observations: Sequence[profiles.Observation], *,
                 now_s: float) -> dict[str, profiles.LearnedSpeed] | None:
    """Merge ``observations`` into ``profile_key`` of the namespace's ConfigMap.

    Returns:
        The key's new entries, or ``None`` when nothing was written (no observations, or
        :data:`RECORD_ATTEMPTS` conflicts in a row).

    Raises:
        kubernetes.client.ApiException: the API refused otherwise (e.g. 403 without the RBAC);
            the caller logs it (learned speeds are advice).
    """
    if not observations:
        return None
    for _ in range(RECORD_ATTEMPTS):
        cm = await api.get_configmap(namespace, profiles.CONFIGMAP_NAME)
        data, merged = profiles.configmap_update(cm, profile_key, observations, now_s=now_s)
        if cm is None:
            if await api.create_configmap(namespace, configmap_body(namespace, data)):
                return merged
            continue  # created by someone else meanwhile: merge into theirs
        version = (cm.get("metadata") or {}).get("resourceVersion")
        if await api.patch_configmap(namespace, profiles.CONFIGMAP_NAME,
                                     {"metadata": {"resourceVersion": version}, "data": data}):
            return merged
    log.warning("%s: ConfigMap %s changed under every one of %d attempts; %s not recorded",
                namespace, profiles.CONFIGMAP_NAME, RECORD_ATTEMPTS, profile_key)
    return None
