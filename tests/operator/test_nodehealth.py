"""A NotReady mark without a time is dated from the operator's first sight of it (issue 22,
point 14): the grace period runs out, and "since" stays put across looks."""

from __future__ import annotations

from hetero_operator.cluster.nodehealth import FirstSeen, node_health

NOW = 1_800_000_000.0
GRACE_S = 30.0


def _node(ready: str, **extra: str) -> dict[str, object]:
    cond = {"type": "Ready", "status": ready, "reason": "NodeStatusUnknown", **extra}
    return {"metadata": {"name": "node-t4"}, "status": {"conditions": [cond]}}


def test_a_ready_condition_without_a_transition_time_is_lost_after_the_grace_from_first_sight():
    seen = FirstSeen()
    looks = [node_health(_node("Unknown"), NOW + dt, seen) for dt in (0.0, 1.0, 29.0, 31.0)]
    assert [h.unhealthy_since_s for h in looks] == [NOW] * 4  # not a new "since" each look
    assert [h.lost_at_s(GRACE_S) for h in looks] == [NOW + GRACE_S] * 4
    # without the memory the grace restarts at every look: the bug, kept for one-off reads
    assert node_health(_node("Unknown"), NOW + 31.0).lost_at_s(GRACE_S) == NOW + 31.0 + GRACE_S


def test_a_healthy_look_forgets_the_mark_and_a_time_on_the_object_wins():
    seen = FirstSeen()
    node_health(_node("Unknown"), NOW, seen)
    assert node_health(_node("True"), NOW + 5, seen).healthy and len(seen) == 0
    assert node_health(_node("Unknown"), NOW + 100, seen).unhealthy_since_s == NOW + 100
    dated = _node("False", lastTransitionTime="2027-01-15T08:00:00Z")
    assert node_health(dated, NOW + 200, seen).unhealthy_since_s == NOW  # 2027-01-15T08:00:00Z
    assert len(seen) == 0  # the dated mark needs no memory, the time-less one is gone
    node_health(_node("Unknown"), NOW, seen)
    seen.keep_nodes({"node-a100"})  # node-t4's Node object was deleted
    assert len(seen) == 0
