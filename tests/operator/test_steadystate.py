"""A rank's figures over the steps after its first (issue 30): what the learned speeds and link
rates are taken from, as the measured throughput they are checked against."""

from __future__ import annotations

import pytest

from hetero_operator.planning import linklearning
from hetero_operator.planning.profiles import observations_from_stats
from hetero_operator.planning.steadystate import steady

# Group's slowest rank of the 7 Dec bench run (lm-large, bench/results/memory-steptime.json):
# 20 steps, its first 0.784 s of which 0.5 s waiting for the first collectives to connect
RANK = {"gpu_product": "NVIDIA-A100-SXM4-40GB", "precision": "fp32", "steps": 20, "samples": 440,
        "step_seconds": 4.313, "compute_seconds": 3.567, "comm_wait_seconds": 0.745,
        "first_step_seconds": 0.784, "first_step_samples": 22,
        "first_step_compute_seconds": 0.284, "first_step_comm_wait_seconds": 0.5}


def test_the_first_step_is_left_out_of_each_figure() -> None:
    assert steady(RANK, "compute_seconds") == (418.0, pytest.approx(3.283), 19)
    assert steady(RANK, "comm_wait_seconds") == (418.0, pytest.approx(0.245), 19)
    assert steady(RANK, "step_seconds") == (418.0, pytest.approx(3.529), 19)


@pytest.mark.parametrize("missing", ["first_step_samples", "first_step_compute_seconds"])
def test_without_the_first_steps_share_the_whole_run_counts(missing: str) -> None:
    older = {k: v for k, v in RANK.items() if k != missing}
    assert steady(older, "compute_seconds") == (440.0, 3.567, 20)


def test_one_step_is_its_own_steady_state() -> None:
    one = {**RANK, "steps": 1, "samples": 22, "compute_seconds": 0.284}
    assert steady(one, "compute_seconds") == (22.0, 0.284, 1)


def test_unknown_figure_is_refused() -> None:
    with pytest.raises(KeyError):
        steady(RANK, "loss")


def test_learned_speed_and_link_rate_leave_the_warm_up_out() -> None:
    speeds = observations_from_stats([RANK], unix_s=1.0)
    assert [(o.gpu_type, o.samples_per_s, o.local_batch) for o in speeds] == [
        ("NVIDIA-A100-SXM4-40GB", pytest.approx(418 / 3.283), pytest.approx(22.0))]
    # 1.88 MB a step over 0.245 s / 19 steps of waiting, not 0.745 s / 20
    link = linklearning.observation("Group", step_cross_type_bytes=1_882_112, stats=[RANK])
    assert link is not None and link.samples_per_s == pytest.approx(1_882_112 * 19 / 0.245)


def test_the_thresholds_take_the_whole_run() -> None:
    # the T4 of the same run: 100 samples in 20 steps (profiles.MIN_SAMPLES), 95 after the first
    t4 = {**RANK, "gpu_product": "Tesla-T4", "samples": 100, "first_step_samples": 5,
          "compute_seconds": 3.374, "first_step_compute_seconds": 0.47}
    speeds = observations_from_stats([t4], unix_s=1.0)
    assert [(o.gpu_type, o.samples_per_s) for o in speeds] == [
        ("Tesla-T4", pytest.approx(95 / 2.904))]
