"""Holds of planned pods until the pod index shows them (``hetero_operator.controller.reservations``)."""

from __future__ import annotations

from hetero_operator.controller.reservations import Reservations


def _pod(name: str, ns: str = "team-x") -> dict:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"nodeName": "node-a"}}


def test_a_hold_counts_for_other_jobs_until_the_index_has_every_pod() -> None:
    res = Reservations(hold_s=60)
    res.hold(("team-x", "a"), [_pod("a-g0"), _pod("a-g1")], now_s=0)
    assert [p["metadata"]["name"] for p in res.held_by_others(("team-x", "b"), [], now_s=1)] == [
        "a-g0", "a-g1"]
    assert res.held_by_others(("team-x", "a"), [], now_s=1) == []  # never against itself
    seen = [_pod("a-g0")]
    assert [p["metadata"]["name"] for p in res.held_by_others(("team-x", "b"), seen, now_s=2)] == [
        "a-g1"]  # only what the index does not show yet
    assert res.held_by_others(("team-x", "b"), seen + [_pod("a-g1")], now_s=3) == []
    assert res.held_by_others(("team-x", "b"), [], now_s=4) == []  # released for good


def test_a_hold_expires_and_a_pod_of_another_namespace_does_not_release_it() -> None:
    res = Reservations(hold_s=60)
    res.hold(("team-x", "a"), [_pod("a-g0")], now_s=0)
    assert len(res.held_by_others(("team-y", "b"), [_pod("a-g0", ns="team-y")], now_s=60)) == 1
    assert res.held_by_others(("team-y", "b"), [], now_s=61) == []


def test_release_drops_a_hold_at_once() -> None:
    """The job's own reconcile sees its pods through the API (or the job is deleted): its pods may
    have come and gone between two plans of other jobs, so the index alone would never release."""
    res = Reservations(hold_s=60)
    res.hold(("team-x", "a"), [_pod("a-g0")], now_s=0)
    res.release(("team-x", "a"))
    assert res.held_by_others(("team-x", "b"), [], now_s=1) == []
