"""GPUs held by plans whose pods the operator's pod index has not seen yet (pure, no kopf).

A start plans against the node index and the GPU pods of the pod index, then awaits API calls
(status, Service, NetworkPolicy, the pods). Until the watch delivers the new pods, the index
still shows their GPUs as free, and jobs started in the same seconds plan onto them too: in
``bench/bench_operator.py`` 500 jobs all planned onto the same two nodes. A start therefore holds
its planned pods here, synchronously right after planning (no ``await`` in between, so two starts
on the one event loop cannot interleave), and every later plan counts them as used until the index
has all of them or the hold expires.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hetero_operator.api.labels import selector
from hetero_operator.api.podtemplate import WORKER_CONTAINER
from hetero_operator.api.types import Plan
from hetero_operator.cluster.nodeindex import IndexedPod
from hetero_operator.render.pods import pod_units

HOLD_S = 120.0
"""How long a plan's pods are held without appearing in the index, seconds (the pod creations
failed or the job went away; a later start re-plans from what the index shows)."""

JobKey = tuple[str, str]
"""``(namespace, job name)``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class _Hold:
    since_s: float
    names: frozenset[str]
    entries: tuple[Mapping[str, Any], ...]


class Reservations:
    """The planned-but-not-yet-indexed GPU pods of each job being started."""

    def __init__(self, hold_s: float = HOLD_S) -> None:
        self.hold_s = hold_s
        self._holds: dict[JobKey, _Hold] = {}

    def hold(self, job: JobKey, entries: Sequence[Mapping[str, Any]], *, now_s: float) -> None:
        """Hold ``entries`` (pod-index entries of the pods just planned: :func:`planned_gpu_pods`)
        for ``job``, replacing what it held before."""
        names = frozenset(str((e.get("metadata") or {}).get("name")) for e in entries)
        self._holds[job] = _Hold(since_s=now_s, names=names, entries=tuple(entries))

    def release(self, job: JobKey) -> None:
        """Forget ``job``'s hold (its start failed before any pod was created)."""
        self._holds.pop(job, None)

    def held_by_others(self, job: JobKey, indexed: Iterable[Mapping[str, Any]], *,
                       now_s: float) -> list[Mapping[str, Any]]:
        """Entries other jobs hold that the index does not show yet; drops holds whose pods are
        all indexed or that are older than ``hold_s``.

        Args:
            job: the job being planned (its own hold is never counted against it).
            indexed: the GPU pods of the pod index.
            now_s: the clock, seconds.

        Returns:
            The held pod entries to count as used.
        """
        seen = {((p.get("metadata") or {}).get("namespace"), (p.get("metadata") or {}).get("name"))
                for p in indexed}
        out: list[Mapping[str, Any]] = []
        for key in list(self._holds):
            h = self._holds[key]
            missing = [e for e in h.entries
                       if (key[0], (e.get("metadata") or {}).get("name")) not in seen]
            if not missing or now_s - h.since_s > self.hold_s:
                del self._holds[key]
            elif key != job:
                out.extend(missing)
        return out


def planned_gpu_pods(namespace: str, job_name: str, plan: Plan, *,
                     dra_nodes: Collection[str] = ()) -> list[IndexedPod]:
    """The pod-index entries of a plan's pods, as
    :func:`hetero_operator.cluster.nodeindex.gpu_pod_entry` reads them once the pods exist: one per
    pod, on its group's node, requesting its ranks' devices of the group's resource.

    Pods on ``dra_nodes`` request their GPUs through ResourceClaims, not extended resources
    (:func:`hetero_operator.render.claims.add_claims`), and are left out as the index leaves them out.
    """
    return [IndexedPod({"metadata": {"name": u.name, "namespace": namespace,
                                     "labels": selector(job_name)},
                        "spec": {"nodeName": u.group.node, "containers": [{
                            "name": WORKER_CONTAINER, "resources": {
                                "requests": {u.group.resource_name: str(len(u.ranks))},
                                "limits": {u.group.resource_name: str(len(u.ranks))}}}]},
                        "status": {"phase": None}})
            for u in pod_units(job_name, plan) if u.group.node not in dra_nodes]
