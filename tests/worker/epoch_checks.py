"""Exact epoch coverage across a kill and a resume, from the rank scripts' per-step logs."""

from __future__ import annotations

from collections import Counter


def assert_every_sample_once(phase1: list[dict], phase2: list[dict], saved_step: int,
                             samples: int) -> None:
    """Steps up to ``saved_step`` of the killed run plus every step of the resumed one see each of
    ``samples`` sample indices exactly once (records: ``{"step": int, "idx": [int, ...]}``).

    Negative control: counting the killed run's lost steps too sees some sample twice.
    """
    assert any(r["step"] > saved_step for r in phase1), "nothing trained after the checkpoint"
    kept = [i for r in phase1 if r["step"] <= saved_step for i in r["idx"]]
    redone = [i for r in phase2 for i in r["idx"]]
    counts = Counter(kept + redone)
    assert sorted(counts) == list(range(samples)), "samples missing from the epoch"
    assert set(counts.values()) == {1}, {i: c for i, c in counts.items() if c != 1}
    assert max(Counter([i for r in phase1 for i in r["idx"]] + redone).values()) == 2
