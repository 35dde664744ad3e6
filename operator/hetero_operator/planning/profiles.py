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

One entry per ``<GPU type>/<precision>/<batch band>`` (GPU type = GFD product with
``-MIG-<profile>``; batch band = the power-of-two range ``[2^k, 2^(k+1))`` of the local batch the
figure was measured at): ``samples_per_s`` of one device's compute (samples / compute seconds:
communication waits left out, so the figure transfers between topologies), ``observations``,
``first_unix_s``, ``updated_unix_s``, the mean ``local_batch`` measured and the ``job`` and
``namespace`` that last moved it.  Per-sample throughput depends on the batch (a step has costs
that do not grow with it), so a run with a tiny batch lands in its own band and does not change
the figure planned for a large one; the planner uses the entry of the band nearest to the batch it
plans, at most one band away (:func:`for_batch`).

One bad run cannot poison a figure (issue 21, shared case 43):

* an observation within :data:`OUTLIER_RATIO` of the figure is averaged in with weight
  ``1/min(n+1, MAX_WEIGHT)`` (the figure follows a model that changes slowly);
* one further off is held as a **candidate** beside the figure and takes effect only when
  confirmed: :data:`CONFIRMATIONS` observations in a row that agree with each other (fewer for a
  young figure: one more than it has), and then it replaces the figure (the model or the hardware
  really changed); an observation that agrees with the figure again drops the candidate;
* a rank that ran fewer than :data:`MIN_STEPS` steps, :data:`MIN_COMPUTE_S` seconds of compute or
  :data:`MIN_SAMPLES` samples is not measured (:func:`observations_from_stats`), and the figure of a
  type is the median over its ranks of one band (one throttled device among several does not
  decide it).

Entries older than the store's ``max_age_s`` (default 30 days) are dropped when read and when
written.  Entries written before batch bands (no ``local_batch``) are used only where no banded
entry fits.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from heterotrain_common.pipelineschedules import FORWARD_SHARE
from hetero_operator.planning.steadystate import steady

STORE_VERSION = 1
DEFAULT_MAX_AGE_S = 30 * 24 * 3600.0
"""Observations older than this are aged out (seconds)."""
OUTLIER_RATIO = 1.5
"""An observation off by more than this factor (either way) is a candidate, not averaged in."""
CONFIRMATIONS = 3
"""Agreeing observations in a row that turn a candidate into the figure."""
MIN_STEPS = 10
MIN_COMPUTE_S = 1.0
MIN_SAMPLES = 100
"""A rank below any of these (steps, compute seconds, samples) is too short or small to measure."""
TABLE_DIFFERENCE = 2.0
"""A learned figure this far (either way) from the table's relative speed is pointed out by
``heterotrain plan`` (``TypeValue.table_speed``)."""
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
        local_batch: mean local batch (samples per step) of the observations; 0 for an entry
            written before batch bands.
        job / namespace: the job that last changed the figure.
        candidate_samples_per_s / candidate_observations: a far-off figure held until confirmed
            (0 when none), :data:`OUTLIER_RATIO`.
        candidate_job / candidate_namespace: the job that observed it last.
    """

    gpu_type: str
    precision: str
    samples_per_s: float
    observations: int
    first_unix_s: float
    updated_unix_s: float
    local_batch: float = 0.0
    job: str = ""
    namespace: str = ""
    candidate_samples_per_s: float = 0.0
    candidate_observations: int = 0
    candidate_job: str = ""
    candidate_namespace: str = ""

    @property
    def band(self) -> int | None:
        """``k`` of the batch band ``[2^k, 2^(k+1))``; None before batch bands."""
        return batch_band(self.local_batch) if self.local_batch >= 1 else None

    @property
    def key(self) -> str:
        """``"<gpu type>/<precision>"`` plus ``/<band>`` (``8-15``)."""
        return entry_key(self.gpu_type, self.precision, self.band)

    @property
    def observed_by(self) -> str:
        """``"<namespace>/<job>"`` of the last observation that changed the figure."""
        return f"{self.namespace}/{self.job}" if self.job else ""

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
        local_batch: the local batch it was measured at (samples per step); 0 when unknown.
        job / namespace: the job that measured it.
    """

    gpu_type: str
    precision: str
    samples_per_s: float
    unix_s: float
    local_batch: float = 0.0
    job: str = ""
    namespace: str = ""


def batch_band(local_batch: float) -> int:
    """``k`` with ``2^k <= local_batch < 2^(k+1)`` (0 for a batch of 1)."""
    return max(0, int(math.floor(math.log2(max(local_batch, 1.0)) + 1e-9)))


def entry_key(gpu_type: str, precision: str, band: int | None = None) -> str:
    """``"Tesla-T4/fp16"``, with a batch band ``"Tesla-T4/fp16/8-15"``."""
    base = f"{gpu_type}/{precision}"
    return base if band is None else f"{base}/{2 ** band}-{2 ** (band + 1) - 1}"


def merge(entries: Mapping[str, LearnedSpeed], observations: Iterable[Observation], *,
          now_s: float, max_age_s: float = DEFAULT_MAX_AGE_S) -> dict[str, LearnedSpeed]:
    """Fold observations into entries (stale entries dropped; see the module docstring for
    outliers and candidates).

    Returns:
        A new mapping ``key -> LearnedSpeed``.
    """
    out = {k: e for k, e in entries.items() if e.age_s(now_s) <= max_age_s}
    for obs in observations:
        if not (obs.samples_per_s > 0 and math.isfinite(obs.samples_per_s)):
            continue
        band = batch_band(obs.local_batch) if obs.local_batch >= 1 else None
        key = entry_key(obs.gpu_type, obs.precision, band)
        out[key] = fold(out.get(key), obs)
    return out


def fold(old: LearnedSpeed | None, obs: Observation) -> LearnedSpeed:
    """One observation into one entry: averaged in, held as a candidate, or confirming one."""
    by = {"job": obs.job, "namespace": obs.namespace}
    if old is None:
        return LearnedSpeed(gpu_type=obs.gpu_type, precision=obs.precision,
                            samples_per_s=obs.samples_per_s, observations=1,
                            first_unix_s=obs.unix_s, updated_unix_s=obs.unix_s,
                            local_batch=obs.local_batch, **by)
    if _agrees(obs.samples_per_s, old.samples_per_s):  # averaged in; a candidate's streak ends
        weight = 1.0 / min(old.observations + 1, MAX_WEIGHT)
        return replace(
            old, samples_per_s=old.samples_per_s + weight * (obs.samples_per_s - old.samples_per_s),
            observations=old.observations + 1, updated_unix_s=max(old.updated_unix_s, obs.unix_s),
            local_batch=old.local_batch + weight * (obs.local_batch - old.local_batch),
            candidate_samples_per_s=0.0, candidate_observations=0, candidate_job="",
            candidate_namespace="", **by)
    if old.candidate_observations and _agrees(obs.samples_per_s, old.candidate_samples_per_s):
        n = old.candidate_observations + 1
        figure = old.candidate_samples_per_s + (obs.samples_per_s - old.candidate_samples_per_s) / n
    else:
        n, figure = 1, obs.samples_per_s
    if n >= min(CONFIRMATIONS, old.observations + 1):  # confirmed: the model or hardware changed
        return LearnedSpeed(gpu_type=obs.gpu_type, precision=obs.precision, samples_per_s=figure,
                            observations=n, first_unix_s=obs.unix_s, updated_unix_s=obs.unix_s,
                            local_batch=obs.local_batch, **by)
    return replace(old, candidate_samples_per_s=figure, candidate_observations=n,
                   candidate_job=obs.job, candidate_namespace=obs.namespace)


def _agrees(a: float, b: float) -> bool:
    return 1 / OUTLIER_RATIO <= a / b <= OUTLIER_RATIO


LearnedTable = Mapping[tuple[str, str], "LearnedSpeed | tuple[LearnedSpeed, ...]"]
"""What the planner gets (``PlanInputs.learned``): per ``(gpu type, precision)`` the entries of
every batch band (:func:`fresh`), or one figure (tests and callers without bands)."""


def fresh(entries: Mapping[str, LearnedSpeed], *, now_s: float,
          max_age_s: float = DEFAULT_MAX_AGE_S) -> dict[tuple[str, str], tuple[LearnedSpeed, ...]]:
    """``(gpu type, precision) -> entries of every batch band`` not older than ``max_age_s``."""
    out: dict[tuple[str, str], list[LearnedSpeed]] = {}
    for e in sorted(entries.values(), key=lambda e: (e.gpu_type, e.precision, e.local_batch)):
        if e.age_s(now_s) <= max_age_s:
            out.setdefault((e.gpu_type, e.precision), []).append(e)
    return {k: tuple(v) for k, v in out.items()}


def for_batch(found: LearnedSpeed | Sequence[LearnedSpeed] | None,
              local_batch: float) -> LearnedSpeed | None:
    """The entry to plan a local batch of ``local_batch`` with: the banded entry nearest to it
    (log scale), at most one band away; else one written before batch bands; else None."""
    if found is None:
        return None
    if isinstance(found, LearnedSpeed):
        return found
    want = batch_band(local_batch)
    banded = [e for e in found if e.band is not None and abs(e.band - want) <= 1]
    if banded:
        return min(banded, key=lambda e: (abs(math.log2(e.local_batch) - math.log2(max(local_batch, 1.0))),
                                          e.local_batch))
    return next((e for e in found if e.band is None), None)


def efficiency(learned: LearnedTable) -> LearnedSpeed | None:
    """The job-efficiency entry (:data:`JOB_EFFICIENCY`) of a learned table."""
    found = learned.get(JOB_EFFICIENCY)
    if isinstance(found, LearnedSpeed) or found is None:
        return found
    return found[-1] if found else None


def observations_from_stats(stats: Sequence[Mapping[str, Any]], *, unix_s: float,
                            min_steps: int = MIN_STEPS, min_compute_s: float = MIN_COMPUTE_S,
                            min_samples: int = MIN_SAMPLES, job: str = "",
                            namespace: str = "") -> list[Observation]:
    """Observations from the ranks' statistics (``rank-<R>.json`` of ``heterotrain run``).

    Per (GPU type, precision, batch band): the median over its ranks of ``samples /
    compute_seconds``, at their mean local batch (``samples / steps``), over the steps after the
    first where the rank kept it apart (:mod:`.steadystate`). A rank that recomputed its blocks'
    forward (``recomputes``: ``Full`` or activation checkpointing) counts without it, ``x (1 +
    FORWARD_SHARE)``, which the step-time model adds back where a plan recomputes. Ranks with
    fewer than ``min_steps`` steps, ``min_compute_s`` compute seconds or ``min_samples`` samples
    (too short or too small to measure) are skipped. Plus the run's :func:`step_efficiency`
    under :data:`JOB_EFFICIENCY` when rank 0 exported its efficiency.

    Args:
        stats: one mapping per rank (``rank-<R>.json`` of :class:`hetero_worker.metrics.
            WorkerMetrics`: ``gpu_product``, ``precision``, ``samples``, ``compute_seconds``...).
        job / namespace: the job that measured them (kept in the entries).
    """
    per_type: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for s in stats:
        samples, compute_s, steps = steady(s, "compute_seconds")  # the thresholds: whole run's
        if (int(s.get("steps") or 0) < min_steps or float(s.get("compute_seconds") or 0) <
                min_compute_s or float(s.get("samples") or 0) < min_samples or compute_s <= 0):
            continue
        batch = samples / steps
        without_recompute = 1 + FORWARD_SHARE if s.get("recomputes") else 1.0
        per_type.setdefault((str(s.get("gpu_product")), str(s.get("precision")), batch_band(batch)),
                            []).append((samples / compute_s * without_recompute, batch))
    out = [Observation(gpu_type=t, precision=p, samples_per_s=statistics.median(v for v, _ in vals),
                       unix_s=unix_s, local_batch=sum(b for _, b in vals) / len(vals), job=job,
                       namespace=namespace)
           for (t, p, _), vals in sorted(per_type.items())]
    efficiency = step_efficiency(stats)
    if out and efficiency is not None:
        out.append(Observation(gpu_type=JOB_EFFICIENCY[0], precision=JOB_EFFICIENCY[1],
                               samples_per_s=efficiency, unix_s=unix_s, job=job, namespace=namespace))
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
    """``{key: {gpu_type, precision, samples_per_s, observations, first_unix_s, updated_unix_s,
    local_batch, job, namespace[, candidate_*]}}`` (candidate fields only while one is held)."""
    out = {}
    for k, e in sorted(entries.items()):
        d = asdict(e)
        if not e.candidate_observations:
            d = {f: v for f, v in d.items() if not f.startswith("candidate_")}
        out[k] = d
    return out


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
                             updated_unix_s=float(value["updated_unix_s"]),
                             local_batch=float(value.get("local_batch") or 0.0),
                             job=str(value.get("job") or ""), namespace=str(value.get("namespace") or ""),
                             candidate_samples_per_s=float(value.get("candidate_samples_per_s") or 0.0),
                             candidate_observations=int(value.get("candidate_observations") or 0),
                             candidate_job=str(value.get("candidate_job") or ""),
                             candidate_namespace=str(value.get("candidate_namespace") or ""))
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

    def load(self, profile_key: str, *, now_s: float | None = None,
             ) -> dict[tuple[str, str], tuple[LearnedSpeed, ...]]:
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
                    profiles[key] = entries_to_json({e.key: e for es in kept.values() for e in es})
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
