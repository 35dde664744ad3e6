"""The one ``>= minimum`` refusal of the worker (runtime/checks.py) and the messages its users
give: the argument, the bound, where the value comes from and the value given."""

from __future__ import annotations

import pytest

from hetero_worker.ckpt.saving import PeriodicSaves
from hetero_worker.runtime.checks import at_least
from hetero_worker.speed.powersgd import PowerSGDCompression


def test_at_least_returns_the_value_at_and_above_the_bound() -> None:
    assert (at_least(1, 1, "n"), at_least(7, 1, "n"), at_least(0, 0, "n")) == (1, 7, 0)


def test_at_least_names_the_argument_the_source_and_the_value() -> None:
    with pytest.raises(ValueError, match=r"^n must be >= 2, got 1$"):
        at_least(1, 2, "n")
    with pytest.raises(ValueError, match=r"^n must be >= 1 \(HTJ_N\), got -3$"):
        at_least(-3, 1, "n", source="HTJ_N")


def test_its_users_refuse_with_their_own_names() -> None:
    with pytest.raises(ValueError, match=r"^max_failures must be >= 1 \(HTJ_CHECKPOINT_MAX_FAILURES\), got 0$"):
        PeriodicSaves(max_failures=0)
    with pytest.raises(ValueError, match=r"^rank must be >= 1, got 0$"):
        PowerSGDCompression(rank=0)
    assert (PeriodicSaves(max_failures=2).max_failures, PowerSGDCompression(rank=3).rank) == (2, 3)
