"""Which replica acts: kopf's peering rule, the new-replica handshake, one peering per namespace.

The peering objects here are written the way kopf writes them (``kopf``'s own ``Peer.as_dict``:
``{identity: {priority, lifetime, lastseen}}`` under ``status``), and the rule is checked against
kopf's own ``Peer`` liveness and priority comparison (shared/cases/26).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kopf._core.engines.peering import Peer

from hetero_operator.controller.leadership import Leadership, peering_leader

T0 = 1_800_000_000.0


def _entry(priority: int, seen_s: float, lifetime: int = 60) -> dict[str, Any]:
    """A kopf keep-alive, as ``kopf._core.engines.peering.touch`` writes it."""
    lastseen = dt.datetime.fromtimestamp(seen_s, dt.UTC).isoformat()
    return Peer(identity="x", priority=priority, lifetime=lifetime, lastseen=lastseen).as_dict()


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["me", "a", "b", "c"]),
                       st.tuples(st.integers(0, 5), st.integers(-120, 30), st.sampled_from([0, 10, 60])),
                       max_size=4),
       st.integers(0, 5))
def test_rule_agrees_with_kopfs_own_peer_objects(peers: dict, priority: int) -> None:
    """kopf pauses when a live other peer has a higher or the same priority
    (``kopf._core.engines.peering.process_peering_event``); ours says "not leader" exactly then."""
    now = dt.datetime.now(dt.UTC).timestamp()
    body = {"status": {pid: _entry(p, now + age, life) for pid, (p, age, life) in peers.items()}}
    kopf_peers = [Peer(identity=pid, **info) for pid, info in body["status"].items()]
    live_others = [p for p in kopf_peers if not p.is_dead and p.identity != "me"]
    kopf_pauses = any(p.priority >= priority for p in live_others)
    assert peering_leader(body, "me", priority, dt.datetime.now(dt.UTC).timestamp()) is (not kopf_pauses)


class PeeringStore:
    """Peering objects by namespace (None = the ClusterKopfPeering), counting reads."""

    def __init__(self) -> None:
        self.bodies: dict[str | None, dict[str, Any]] = {}
        self.reads: list[str | None] = []

    def touch(self, namespace: str | None, identity: str, priority: int, now_s: float) -> None:
        self.bodies.setdefault(namespace, {"status": {}})["status"][identity] = _entry(priority, now_s)

    def leave(self, namespace: str | None, identity: str) -> None:
        """kopf's last touch on exit (``lifetime=0`` deletes the entry)."""
        self.bodies.get(namespace, {"status": {}})["status"].pop(identity, None)

    async def get(self, name: str, namespace: str | None) -> dict[str, Any] | None:
        self.reads.append(namespace)
        return self.bodies.get(namespace)


def _leadership(store: PeeringStore, identity: str, priority: int, clock: list[float],
                **kwargs: Any) -> Leadership:
    return Leadership(get_peering=store.get, identity=identity, peering="heterotrain",
                      namespace=kwargs.pop("namespace", None), priority=priority,
                      clock=lambda: clock[0], **kwargs)


def test_a_new_replica_acts_only_after_its_keepalive_settled(caplog: pytest.LogCaptureFixture) -> None:
    store, clock = PeeringStore(), [T0]
    me = _leadership(store, "new", 5, clock)
    assert asyncio.run(me.is_leader()) is False          # no peering object: kopf would pause too
    assert "ClusterKopfPeering heterotrain not found: this replica does not act" in caplog.text
    store.touch(None, "new", 5, clock[0])
    clock[0] += 2.0
    assert asyncio.run(me.is_leader()) is False          # first sight of itself
    clock[0] += 2.0
    assert asyncio.run(me.is_leader()) is True           # settled: every peer has re-read by now
    store.leave(None, "new")
    clock[0] += 2.0
    assert asyncio.run(me.is_leader()) is False          # its keep-alive is gone: start over


def test_namespaced_mode_reads_the_peering_of_the_jobs_namespace() -> None:
    """kopf keeps one KopfPeering per watched namespace; a higher peer in team-b blocks team-b's
    jobs, not team-a's (the old check read only the first watched namespace)."""
    store, clock = PeeringStore(), [T0]
    me = _leadership(store, "me", 5, clock, namespace="team-a", per_job_namespace=True)
    for ns in ("team-a", "team-b"):
        store.touch(ns, "me", 5, clock[0])
    store.touch("team-b", "higher", 9, clock[0])
    asyncio.run(me.is_leader("team-a")), asyncio.run(me.is_leader("team-b"))
    clock[0] += 2.5
    for ns in ("team-a", "team-b"):
        store.touch(ns, "me", 5, clock[0])
    store.touch("team-b", "higher", 9, clock[0])
    assert asyncio.run(me.is_leader("team-a")) is True
    assert asyncio.run(me.is_leader("team-b")) is False
    assert set(store.reads) == {"team-a", "team-b"}


def test_rolling_upgrade_never_has_two_replicas_acting_at_once() -> None:
    """An old replica (priority 10) runs; a new one (20) starts, as in a RollingUpdate or with
    replicaCount 2; the old one exits later.  Both keep alive every 5 s like kopf.  At every 0.1 s
    tick at most one says it may act, and somebody acts before and after the hand-over."""
    store, clock = PeeringStore(), [T0]
    old = _leadership(store, "old", 10, clock)
    new = _leadership(store, "new", 20, clock)
    store.touch(None, "old", 10, clock[0])
    acting: list[tuple[bool, bool]] = []

    async def run() -> None:
        for tick in range(600):                               # 60 s
            t = tick / 10
            clock[0] = T0 + t
            if tick % 50 == 0 and t < 40:
                store.touch(None, "old", 10, clock[0])
            if tick >= 103 and tick % 50 == 3:
                store.touch(None, "new", 20, clock[0])        # the new pod starts at 10.3 s
            if t == 40:
                store.leave(None, "old")                      # the old pod exits at 40 s
            a = await old.is_leader() if t < 40 else False
            b = await new.is_leader() if tick >= 103 else False  # it asks from its start on
            acting.append((a, b))
            assert not (a and b), f"both act at {t:.1f} s"

    asyncio.run(run())
    assert any(a for a, _ in acting[:100]) and all(b for _, b in acting[-100:])
    handover = next(i for i, (_, b) in enumerate(acting) if b) / 10
    assert 10.3 + 2.0 <= handover <= 10.3 + 2 * 2.0 + 0.2     # settle, at most one more cache period
