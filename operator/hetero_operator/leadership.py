"""Which replica acts: kopf's peering rule, read from the peering object.

kopf pauses a replica's watch handlers while a live peer with a priority >= its own exists; the
reconciler's own delayed re-checks must follow the same rule, so they ask :class:`Leadership`
before acting.  A standalone operator (no peering) always acts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from hetero_operator import conditions as c

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
    """Answers "may this replica act now?", caching the peering read for ``cache_s``.

    Args:
        get_peering: ``(name, namespace) -> body | None`` (``Api.get_peering``).
        identity: this replica's peering identity; ``None`` = standalone (always acts).
        peering: the peering object's name.
        namespace: its namespace; ``None`` for the cluster-wide ``ClusterKopfPeering``.
        priority: this replica's priority.
        clock: epoch seconds.
        cache_s: how long one read is trusted.
    """

    def __init__(self, *, get_peering: PeeringGetter, identity: str | None, peering: str,
                 namespace: str | None, priority: int, clock: Callable[[], float],
                 cache_s: float = 2.0) -> None:
        self.get_peering, self.identity, self.peering = get_peering, identity, peering
        self.namespace, self.priority, self.clock, self.cache_s = namespace, priority, clock, cache_s
        self._cache: tuple[float, bool] = (-1e18, True)

    async def is_leader(self) -> bool:
        """True when standalone, or when no live peer has a priority >= ours (kopf's rule)."""
        if self.identity is None:
            return True
        now = self.clock()
        if now - self._cache[0] < self.cache_s:
            return self._cache[1]
        body = await self.get_peering(self.peering, self.namespace)
        leader = peering_leader(body, self.identity, self.priority, now)
        self._cache = (now, leader)
        return leader
