"""A batch split's step time (planning/batching.py); the split itself is tested with the one
splitter in tests/common/test_split.py."""

from __future__ import annotations

import pytest

from hetero_operator.planning.batching import step_time


def test_step_time_is_the_slowest_rank() -> None:
    assert step_time([70, 28, 15, 15], [1.0, 0.4, 0.2, 0.2]) == pytest.approx(75.0)
