"""Which replica acts: kopf's peering rule, read from the peering object.

kopf pauses a replica's watch handlers while a live peer with a priority >= its own exists; the
reconciler's own delayed re-checks must follow the same rule, so they ask :class:`Leadership`
before acting.  kopf does not expose its pause to application code (the toggle lives inside
``kopf.spawn_tasks``), and kopf timers/daemons, which it does pause, need a finalizer on the job
(shared/cases/23); hence this check of the same peering object.  A standalone operator (no
peering) always acts.

Two rules beyond kopf's make a replica that just started safe during an upgrade or next to a
peer (shared/cases/26):

* it acts only once its own keep-alive is in the peering object, so every peer can see it;
* and only ``settle_s`` after it first saw itself there, so a lower-priority peer that was acting
  has re-read the object (its cache is ``cache_s`` old at most) and stopped.

In namespaced mode kopf keeps one ``KopfPeering`` per watched namespace; the check reads the one
of the job's namespace, so two replicas never act on one job in any namespace.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from hetero_operator.api import conditions as c

log = logging.getLogger("heterotrain.operator")

PeeringGetter = Callable[[str, "str | None"], Awaitable["dict[str, Any] | None"]]


def peering_leader(body: Mapping[str, Any] | None, identity: str, priority: int, now_s: float) -> bool:
    """kopf's peering rule: act unless another live peer has a priority >= ``priority``.

    A peer is live while ``lastseen + lifetime`` is in the future (kopf's ``Peer.is_dead``).
    A missing peering object means kopf runs standalone: act.
    """
    if body is None:
        return True
    for peer_id, info in (body.get("status") or {}).items():
        if peer_id == identity or not isinstance(info, Mapping):
            continue
        seen = c.parse_iso(str(info.get("lastseen", "")).replace(" ", "T")) if info.get("lastseen") else None
        alive = seen is not None and seen + float(info.get("lifetime", 60)) > now_s
        if alive and int(info.get("priority", 0)) >= priority:
            return False
    return True


class Leadership:
    """Answers "may this replica act now?", caching each peering read for ``cache_s``.

    Args:
        get_peering: ``(name, namespace) -> body | None`` (``Api.get_peering``).
        identity: this replica's peering identity; ``None`` = standalone (always acts).
        peering: the peering object's name.
        namespace: its namespace; ``None`` for the cluster-wide ``ClusterKopfPeering``.
        priority: this replica's priority.
        clock: epoch seconds.
        cache_s: how long one read is trusted.
        per_job_namespace: namespaced mode: read the ``KopfPeering`` of the namespace passed to
            :meth:`is_leader` (``namespace`` is then only the fallback).
        settle_s: how long after first seeing its own keep-alive a replica waits before acting
            (default ``cache_s``: every peer has re-read the object by then).
    """

    def __init__(self, *, get_peering: PeeringGetter, identity: str | None, peering: str,
                 namespace: str | None, priority: int, clock: Callable[[], float],
                 cache_s: float = 2.0, per_job_namespace: bool = False,
                 settle_s: float | None = None) -> None:
        self.get_peering, self.identity, self.peering = get_peering, identity, peering
        self.namespace, self.priority, self.clock, self.cache_s = namespace, priority, clock, cache_s
        self.per_job_namespace = per_job_namespace
        self.settle_s = cache_s if settle_s is None else settle_s
        self._cache: dict[str | None, tuple[float, bool]] = {}
        self._seen_self: dict[str | None, float] = {}
        self._warned: set[str | None] = set()

    async def is_leader(self, job_namespace: str | None = None) -> bool:
        """True when standalone, or when this replica's keep-alive has been in the peering object
        for ``settle_s`` and no live peer there has a priority >= ours (kopf's rule).

        Args:
            job_namespace: the namespace of the job about to be reconciled (namespaced mode).
        """
        if self.identity is None:
            return True
        ns = job_namespace if self.per_job_namespace and job_namespace else self.namespace
        now = self.clock()
        cached = self._cache.get(ns)
        if cached is not None and now - cached[0] < self.cache_s:
            return cached[1]
        body = await self.get_peering(self.peering, ns)
        if body is None and ns not in self._warned:
            self._warned.add(ns)
            where = f"KopfPeering {ns}/{self.peering}" if ns else f"ClusterKopfPeering {self.peering}"
            log.warning("%s not found: this replica does not act until it exists (the chart creates "
                        "it; run standalone with --peering='' for a single replica)", where)
        present = body is not None and self.identity in (body.get("status") or {})
        if present:
            self._seen_self.setdefault(ns, now)
        else:
            self._seen_self.pop(ns, None)  # our keep-alive is gone (or not yet there): start over
        settled = present and now - self._seen_self[ns] >= self.settle_s
        leader = settled and peering_leader(body, self.identity, self.priority, now)
        self._cache[ns] = (now, leader)
        return leader
