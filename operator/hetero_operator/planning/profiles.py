"""Learned speeds: measured throughput per (profileKey, GPU type, precision), with count and age.

Pure data handling plus two stores (no kopf, no kubernetes):

* :class:`FileStore`: the local file of ``heterotrain run`` (default
  ``$XDG_CACHE_HOME/heterotrain/profiles.json``, i.e. ``~/.cache/heterotrain/profiles.json``;
  ``--learned-speeds FILE`` chooses another, ``--learned-speeds ''`` turns learning off).  JSON only (nothing
  is unpickled), written atomically under an ``fcntl`` lock so concurrent runs do not lose
  observations.
* The operator keeps the same JSON in one ConfigMap per namespace, ``heterotrain-profiles``, one
  data key per ``profileKey`` (:func:`configmap_entries`, :func:`configmap_data`).  A ConfigMap and
  not a ``HeteroTrainingProfile`` CRD: the data is small (a few hundred bytes per key, far below
  the 1 MiB object limit), needs no schema evolution, no CRD upgrade path (helm/helm#8163) and only
  ConfigMap RBAC; users can read or reset it with ``kubectl``.

One entry per ``<GPU type>/<precision>`` (GPU type = GFD product with ``-MIG-<profile>``):
``samples_per_s`` of one device's compute (samples / compute seconds: communication waits left
out, so the figure transfers between topologies), ``observations``, ``first_unix_s`` and
``updated_unix_s``.  A new observation is averaged in with weight ``1/min(n+1, MAX_WEIGHT)`` (so the
figure follows a model that changes); one that differs from the stored figure by more than
:data:`INCONSISTENT_RATIO` replaces it (the old figure is taken as stale: a new model under the same
key, other hardware); entries older than the store's ``max_age_s`` (default 30 days) are dropped
when read and when written.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STORE_VERSION = 1
DEFAULT_MAX_AGE_S = 30 * 24 * 3600.0
"""Observations older than this are aged out (seconds)."""
INCONSISTENT_RATIO = 2.0
"""A new observation off by more than this factor (either way) replaces the stored figure."""
MAX_WEIGHT = 10
"""The running mean weighs a new observation at least ``1/MAX_WEIGHT``."""
JOB_EFFICIENCY = ("job", "efficiency")
"""``(gpu_type, precision)`` of the entry that holds the job's step efficiency instead of a device
speed: its ``samples_per_s`` field is a ratio, the job's steady-state throughput over what the
compute model predicts for the run's own split and measured speeds (see
:func:`step_efficiency`): what waiting, synchronisation and data loading cost on top of the
slowest rank's compute."""
CONFIGMAP_NAME = "heterotrain-profiles"
"""The operator's store: one ConfigMap per namespace, data key = profileKey."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LearnedSpeed:
    """A learned figure for one GPU type at one precision.

    Attributes:
        gpu_type: GFD-style product, e.g. ``"Tesla-T4"`` or ``"NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"``.
        precision: ``bf16|fp16|fp32``.
        samples_per_s: one device's compute throughput, samples/s (> 0).
        observations: how many observations the figure averages (>= 1).
        first_unix_s / updated_unix_s: first and newest observation, Unix seconds.
    """

    gpu_type: str
    precision: str
    samples_per_s: float
    observations: int
    first_unix_s: float
    updated_unix_s: float

    @property
    def key(self) -> str:
        """``"<gpu type>/<precision>"``."""
        return entry_key(self.gpu_type, self.precision)

    def age_s(self, now_s: float) -> float:
        """Seconds since the newest observation."""
        return max(0.0, now_s - self.updated_unix_s)


@dataclass(frozen=True, kw_only=True, slots=True)
class Observation:
    """One measurement from a finished (or running) job.

    Attributes:
        gpu_type / precision: as :class:`LearnedSpeed`.
        samples_per_s: one device's compute throughput, samples/s.
        unix_s: when measured.
    """

    gpu_type: str
    precision: str
    samples_per_s: float
    unix_s: float


def entry_key(gpu_type: str, precision: str) -> str:
    """``"Tesla-T4/fp16"``."""
    return f"{gpu_type}/{precision}"


def merge(entries: Mapping[str, LearnedSpeed], observations: Iterable[Observation], *,
          now_s: float, max_age_s: float = DEFAULT_MAX_AGE_S) -> dict[str, LearnedSpeed]:
    """Fold observations into entries (stale entries dropped, inconsistent ones replaced).

    Returns:
        A new mapping ``key -> LearnedSpeed``.
    """
    out = {k: e for k, e in entries.items() if e.age_s(now_s) <= max_age_s}
    for obs in observations:
        if not (obs.samples_per_s > 0 and math.isfinite(obs.samples_per_s)):
            continue
        key = entry_key(obs.gpu_type, obs.precision)
        old = out.get(key)
        ratio = obs.samples_per_s / old.samples_per_s if old else 1.0
        if old is None or not 1 / INCONSISTENT_RATIO <= ratio <= INCONSISTENT_RATIO:
            out[key] = LearnedSpeed(gpu_type=obs.gpu_type, precision=obs.precision,
                                    samples_per_s=obs.samples_per_s, observations=1,
                                    first_unix_s=obs.unix_s, updated_unix_s=obs.unix_s)
            continue
        weight = 1.0 / min(old.observations + 1, MAX_WEIGHT)
        out[key] = LearnedSpeed(
            gpu_type=obs.gpu_type, precision=obs.precision,
            samples_per_s=old.samples_per_s + weight * (obs.samples_per_s - old.samples_per_s),
            observations=old.observations + 1, first_unix_s=old.first_unix_s,
            updated_unix_s=max(old.updated_unix_s, obs.unix_s))
    return out


def fresh(entries: Mapping[str, LearnedSpeed], *, now_s: float,
          max_age_s: float = DEFAULT_MAX_AGE_S) -> dict[tuple[str, str], LearnedSpeed]:
    """``(gpu type, precision) -> LearnedSpeed`` of the entries not older than ``max_age_s``."""
    return {(e.gpu_type, e.precision): e for e in entries.values() if e.age_s(now_s) <= max_age_s}


def observations_from_stats(stats: Sequence[Mapping[str, Any]], *, unix_s: float,
                            min_steps: int = 3) -> list[Observation]:
    """Observations from the ranks' statistics (``rank-<R>.json`` of ``heterotrain run``).

    Per (GPU type, precision): the mean over its ranks of ``samples / compute_seconds``.  Ranks
    with fewer than ``min_steps`` steps (too little to measure) are skipped.  Plus the run's
    :func:`step_efficiency` under :data:`JOB_EFFICIENCY` when rank 0 exported its efficiency.

    Args:
        stats: one mapping per rank with ``gpu_product``, ``precision``, ``samples``,
            ``compute_seconds`` and ``steps`` (what :class:`hetero_worker.metrics.WorkerMetrics`
            writes).
    """
    per_type: dict[tuple[str, str], list[float]] = {}
    for s in stats:
        samples, compute_s = float(s.get("samples") or 0), float(s.get("compute_seconds") or 0.0)
        if int(s.get("steps") or 0) < min_steps or samples <= 0 or compute_s <= 0:
            continue
        per_type.setdefault((str(s.get("gpu_product")), str(s.get("precision"))), []).append(
            samples / compute_s)
    out = [Observation(gpu_type=t, precision=p, samples_per_s=sum(v) / len(v), unix_s=unix_s)
           for (t, p), v in sorted(per_type.items())]
    efficiency = step_efficiency(stats)
    if out and efficiency is not None:
        out.append(Observation(gpu_type=JOB_EFFICIENCY[0], precision=JOB_EFFICIENCY[1],
                               samples_per_s=efficiency, unix_s=unix_s))
    return out


def step_efficiency(stats: Sequence[Mapping[str, Any]]) -> float | None:
    """Steady-state job throughput over the compute model's, for the run's own final split.

    Rank 0's last ``job_efficiency_ratio`` is the job's samples/s over ``sum_r 1/t_r`` (``t_r``
    = rank r's compute seconds per sample), so the job's samples/s is ``eff * sum_r 1/t_r``; the
    compute model predicts ``G / max_r(b_r * t_r)`` for local batches ``b_r`` summing to ``G``.
    Their ratio leaves the split's imbalance out (the model has it) and keeps what the model
    lacks: waiting beyond the imbalance, synchronisation, data loading.

    Returns:
        The ratio, or None without rank 0's efficiency or with a rank lacking measurements.
    """
    rank0 = next((s for s in stats if int(s.get("rank", -1)) == 0), None)
    eff = (rank0 or {}).get("job_efficiency_ratio")
    if not isinstance(eff, (int, float)) or not 0 < eff <= 1.5 or not stats:
        return None
    t, b = [], []
    for s in stats:
        samples, compute_s = float(s.get("samples") or 0), float(s.get("compute_seconds") or 0.0)
        batch = int(s.get("local_batch") or 0)
        if samples <= 0 or compute_s <= 0 or batch < 1:
            return None
        t.append(compute_s / samples)
        b.append(batch)
    model = sum(b) / max(bi * ti for bi, ti in zip(b, t))
    return float(eff) * sum(1 / ti for ti in t) / model


# --- serialisation ----------------------------------------------------------------------------

def entries_to_json(entries: Mapping[str, LearnedSpeed]) -> dict[str, Any]:
    """``{key: {gpu_type, precision, samples_per_s, observations, first_unix_s, updated_unix_s}}``."""
    return {k: asdict(e) for k, e in sorted(entries.items())}


def entries_from_json(data: Any) -> dict[str, LearnedSpeed]:
    """Parse :func:`entries_to_json`'s output; malformed entries are skipped (a store is advice)."""
    out: dict[str, LearnedSpeed] = {}
    if not isinstance(data, Mapping):
        return out
    for value in data.values():
        try:
            e = LearnedSpeed(gpu_type=str(value["gpu_type"]), precision=str(value["precision"]),
                             samples_per_s=float(value["samples_per_s"]),
                             observations=int(value["observations"]),
                             first_unix_s=float(value["first_unix_s"]),
                             updated_unix_s=float(value["updated_unix_s"]))
        except (KeyError, TypeError, ValueError):
            continue
        if e.samples_per_s > 0 and math.isfinite(e.samples_per_s) and e.observations >= 1:
            out[e.key] = e
    return out


def configmap_entries(configmap: Mapping[str, Any] | None, profile_key: str) -> dict[str, LearnedSpeed]:
    """The entries of ``profile_key`` in the operator's ConfigMap (empty when absent/malformed)."""
    raw = ((configmap or {}).get("data") or {}).get(profile_key)
    if not raw:
        return {}
    try:
        return entries_from_json(json.loads(raw))
    except ValueError:
        return {}


def configmap_data(profile_key: str, entries: Mapping[str, LearnedSpeed]) -> dict[str, str]:
    """The ``data`` patch that stores ``entries`` under ``profile_key`` (merge-patch semantics)."""
    return {profile_key: json.dumps(entries_to_json(entries), sort_keys=True, separators=(",", ":"))}


def configmap_update(configmap: Mapping[str, Any] | None, profile_key: str,
                     observations: Sequence[Observation], *, now_s: float,
                     max_age_s: float = DEFAULT_MAX_AGE_S
                     ) -> tuple[dict[str, str | None], dict[str, LearnedSpeed]]:
    """The ``data`` merge patch that records ``observations`` under ``profile_key``.

    The key's entries are merged with the observations (:func:`merge`); every other key whose entries
    are all older than ``max_age_s`` is removed (``None`` in a JSON merge patch, RFC 7386), so
    the ConfigMap does not grow with keys nobody trains any more.  Keys that do not parse are
    left alone (someone edited them by hand).

    Args:
        configmap: the ConfigMap as read (``None`` when it does not exist yet).
        profile_key: the job's profileKey.
        observations: from :func:`observations_from_stats`.
        now_s: Unix seconds.
        max_age_s: ageing limit, seconds.

    Returns:
        ``(data patch, the key's new entries)``.
    """
    data = (configmap or {}).get("data") or {}
    merged = merge(configmap_entries(configmap, profile_key), observations, now_s=now_s,
                   max_age_s=max_age_s)
    patch: dict[str, str | None] = dict(configmap_data(profile_key, merged))
    for key in data:
        if key == profile_key:
            continue
        try:
            entries = entries_from_json(json.loads(data[key] or "null"))
        except ValueError:
            continue
        if entries and not fresh(entries, now_s=now_s, max_age_s=max_age_s):
            patch[key] = None
    return patch, merged


# --- the local file store ---------------------------------------------------------------------

def default_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/heterotrain/profiles.json`` (``~/.cache`` when unset)."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "heterotrain" / "profiles.json"


class FileStore:
    """Learned speeds in one local JSON file: ``{"version": 1, "profiles": {key: entries}}``.

    Args:
        path: the file; created (with its directory) on first write.
        max_age_s: observations older than this are ignored and dropped.
    """

    def __init__(self, path: Path, *, max_age_s: float = DEFAULT_MAX_AGE_S) -> None:
        self.path = Path(path)
        self.max_age_s = max_age_s

    def load(self, profile_key: str, *, now_s: float | None = None) -> dict[tuple[str, str], LearnedSpeed]:
        """Fresh figures of ``profile_key`` (empty when the file or key is missing or unreadable)."""
        now = time.time() if now_s is None else now_s
        entries = entries_from_json(self._read().get(profile_key))
        return fresh(entries, now_s=now, max_age_s=self.max_age_s)

    def record(self, profile_key: str, observations: Sequence[Observation], *,
               now_s: float | None = None) -> dict[str, LearnedSpeed]:
        """Merge observations into ``profile_key``; returns its new entries.

        Raises:
            OSError: the file cannot be written.
        """
        now = time.time() if now_s is None else now_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._locked():
            profiles = self._read()
            merged = merge(entries_from_json(profiles.get(profile_key)), observations, now_s=now,
                           max_age_s=self.max_age_s)
            profiles[profile_key] = entries_to_json(merged)
            for key in list(profiles):  # age out the other keys too
                kept = fresh(entries_from_json(profiles[key]), now_s=now, max_age_s=self.max_age_s)
                if kept:
                    profiles[key] = entries_to_json({e.key: e for e in kept.values()})
                else:
                    del profiles[key]
            self._write({"version": STORE_VERSION, "profiles": profiles})
        return merged

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        profiles = data.get("profiles") if isinstance(data, Mapping) else None
        return dict(profiles) if isinstance(profiles, Mapping) else {}

    def _write(self, data: Mapping[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".profiles-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.path.with_name(self.path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
