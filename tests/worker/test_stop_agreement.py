"""The stop agreement's interval (runtime/preemption.py): how many steps one rank proposes until
the next agreement on a SIGTERM.  The agreement itself on real Gloo ranks: test_resilience.py."""

from __future__ import annotations

import pytest

from hetero_worker.runtime.preemption import agreement_interval_steps


@pytest.mark.parametrize(("step_s", "want"), [
    (None, 1),        # nothing measured yet: agree at the next step
    (0.0, 1),         # a clock that did not move: no division by zero
    (2.0, 1),         # steps longer than the period: every step
    (1.0, 1),
    (0.3, 3),         # floor(1 / 0.3)
    (0.005, 100),     # 200 steps in a period, capped at 100
    (0.0101, 99),
])
def test_a_rank_proposes_the_steps_of_one_period_between_1_and_the_cap(step_s, want) -> None:
    assert agreement_interval_steps(step_s, period_s=1.0, max_steps=100) == want


def test_the_defaults_are_one_second_and_100_steps() -> None:
    assert agreement_interval_steps(0.25) == 4
    assert agreement_interval_steps(1e-6) == 100
