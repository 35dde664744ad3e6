"""The pipeline schedule played in simulated time (issue 30, item 2: the step-time model's
bubble and stage-boundary link). Every expected step is worked out by hand in the test."""

from __future__ import annotations

import pytest

from hetero_operator.planning.schedulesim import simulate


@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
def test_equal_stages_and_free_transfers_take_m_plus_s_minus_1_slots(schedule: str) -> None:
    # 3 stages of F 1 s + B 2 s, 4 micro-batches: the closed form (m + s - 1) x 3 s = 18 s for
    # both schedules (GPipe, Huang et al. 2019; 1F1B, PipeDream-Flush); every stage computes 12 s
    played = simulate([1.0] * 3, [2.0] * 3, [0.0, 0.0], 4, schedule)
    assert played.step_s == pytest.approx(18.0)
    assert played.busy_s == pytest.approx((12.0, 12.0, 12.0))
    assert played.idle_fraction == pytest.approx(1 - 12 / 18)


def test_one_stage_is_its_compute() -> None:
    assert simulate([1.0], [2.0], [], 4).step_s == pytest.approx(12.0)


def test_a_slow_first_stage_sets_the_pace() -> None:
    # Stage 0: F 17.5, B 32; stage 1: F 8, B 15.5 (ms, what lm-pipeline's stages measured on 2
    # CPUs). 1F1B: stage 0 runs F0, F1 (0-35); micro-batch 0 reaches stage 1 at 17.5, whose F0
    # and B0 end at 41; stage 0's B0 41-73, F2 -90.5, B1 -122.5, F3 -140, B2 -172; stage 1's B3
    # ends 148 + 15.5 = 163.5, so stage 0's B3 172-204. Stage 1's last gradient send ends only
    # when stage 0 posts its receive, after B2, at 172 (Gloo's rendezvous)
    played = simulate([17.5, 8.0], [32.0, 15.5], [0.0], 4)
    assert played.step_s == pytest.approx(204.0)
    assert played.finish_s == pytest.approx((204.0, 172.0))
    assert played.busy_s == pytest.approx((198.0, 94.0))


def test_a_slow_link_falls_between_the_last_stage_s_micro_batches() -> None:
    # Stage 0: F 6.67, B 13.33; stage 1: F 10.67, B 21.33; 21.07 each way (ms). Stage 1 asks for
    # the next activation only after a backward (PyTorch fuses that receive with the gradient's
    # send and waits for both), and Gloo moves the bytes once both sides posted: each of its
    # later 3 micro-batches waits one transfer. 6.67 + 21.07 + 4 x 32 + 3 x 21.07 + 21.07 (last
    # gradient back) + 13.33 (stage 0's last backward) = 253.35
    f0, b0, f1, b1, t = 20 / 3, 40 / 3, 32 / 3, 64 / 3, 21.07
    played = simulate([f0, f1], [b0, b1], [t], 4)
    assert played.step_s == pytest.approx(f0 + t + 4 * (f1 + b1) + 3 * t + t + b0)


def test_gpipe_runs_every_forward_before_any_backward() -> None:
    # 2 stages, F 1, B 2, transfer 0.5, 2 micro-batches. Stage 0: F0 0-1, F1 1-2. Stage 1: F0
    # arrives 1.5, F0 1.5-2.5; it posts F1's receive at 2.5, so F1 moves 2.5-3.0: F1 3-4; then
    # B0 4-6, B1 6-8. Stage 0 posts B0's receive at 3 (after its sends ended): B0's gradient
    # moves 6-6.5, stage 0's B0 6.5-8.5; B1's receive posted at 8.5 moves 8.5-9: B1 9-11
    assert simulate([1.0, 1.0], [2.0, 2.0], [0.5], 2, "GPipe").step_s == pytest.approx(11.0)


@pytest.mark.parametrize("args, message", [
    (([1.0, 1.0], [2.0], [0.0], 2), "2 stages need 2 backward times and 1 transfer times"),
    (([1.0, 1.0], [2.0, 2.0], [], 2), "2 stages need 2 backward times and 1 transfer times"),
    (([1.0], [2.0], [], 0), "micro_batches must be >= 1"),
    (([-1.0], [2.0], [], 2), "every time >= 0"),
])
def test_bad_inputs_are_refused(args: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        simulate(*args)
    with pytest.raises(ValueError, match="schedule must be one of 1F1B, GPipe"):
        simulate([1.0], [2.0], [], 2, "Interleaved")
