"""Learned pipeline-stage times (issue 30, item 2): a pipelined run's measured stage forward and
backward seconds become learned entries, and the entries become the planner's block times (the
same cut from its own measurement, another cut from scaled or modelled figures)."""

from __future__ import annotations

import pytest

from hetero_operator.api.pipelineplan import StageAssignment
from hetero_operator.local.valueview import steady_samples_per_s
from hetero_operator.planning import stagetimes
from hetero_operator.planning.profiles import merge
from hetero_operator.planning.stages import BlockCost, StageDevice

A100, T4 = "NVIDIA-A100-SXM4-40GB", "Tesla-T4"
STAGES = (StageAssignment(index=0, gpu_type=A100, ranks=(0,), first_block=0, blocks=3, slot_s=0.1,
                          memory_bytes=1),
          StageAssignment(index=1, gpu_type=T4, ranks=(1,), first_block=3, blocks=1, slot_s=0.1,
                          memory_bytes=1))


def _stats(forward_s: float, backward_s: float, optimizer_s: float, steps: int = 9) -> dict:
    return {"precision": "fp32", "stage_forward_seconds": forward_s,
            "stage_backward_seconds": backward_s, "stage_optimizer_seconds": optimizer_s,
            "stage_samples": 32 * steps, "stage_steps": steps}


def test_a_run_s_stage_times_become_entries_per_stage_and_part() -> None:
    # 9 steps of 32 samples (4 micro-batches of 8): A100 0.9 s forward, 1.8 s backward + 0.09 s
    # optimizer; T4 0.36 s and 0.72 s + 0.0 s
    found = stagetimes.observations(STAGES, [_stats(0.9, 1.8, 0.09), _stats(0.36, 0.72, 0.0)],
                                    micro_batches=4, unix_s=5.0, job="lm", namespace="ns")
    assert [(o.gpu_type, o.precision, o.samples_per_s, o.local_batch) for o in found] == [
        (A100, "fp32 blocks 0-3 forward", pytest.approx(288 / 0.9), 8.0),
        (A100, "fp32 blocks 0-3 backward", pytest.approx(288 / 1.89), 8.0),
        (T4, "fp32 blocks 3-4 forward", pytest.approx(288 / 0.36), 8.0),
        (T4, "fp32 blocks 3-4 backward", pytest.approx(288 / 0.72), 8.0)]
    assert {(o.job, o.namespace, o.unix_s) for o in found} == {("lm", "ns", 5.0)}


def test_a_stage_with_too_few_timed_steps_is_not_learned() -> None:
    found = stagetimes.observations(STAGES, [_stats(0.9, 1.8, 0.0, steps=2), {}], micro_batches=4)
    assert found == []


def test_entries_become_block_times_split_by_share_scaled_by_speed_or_modelled() -> None:
    # 4 blocks with modelled compute 1, 2, 2, 1 (x 1 ms per sample). Learned on the A100 (speed
    # 1.0): blocks 0-3 forward 100 samples/s (10 ms a sample), backward 50 (20 ms). Split by the
    # shares 1:2:2 -> forward 2, 4, 4 ms; backward 4, 8, 8 ms. Block 3 was measured on no type:
    # modelled on the A100 (1 ms: 1/3 forward, 2/3 backward). On the T4 (speed 0.25), which no
    # run measured, nothing is returned: the planner models it.
    blocks = [BlockCost(param_bytes=0, activation_bytes_per_sample=0, output_bytes_per_sample=0,
                        compute_s_per_sample=c * 1e-3) for c in (1, 2, 2, 1)]
    devices = [StageDevice(gpu_type=A100, speed=1.0, memory_bytes=1),
               StageDevice(gpu_type=T4, speed=0.25, memory_bytes=1)]
    entries = merge({}, [o for o in stagetimes.observations(
        STAGES, [_stats(2.88, 5.76, 0.0), {}], micro_batches=4, unix_s=1.0)], now_s=1.0)
    learned = {(e.gpu_type, e.precision): (e,) for e in entries.values()}
    times = stagetimes.block_times(learned, blocks, devices, precision="fp32", micro_batch=8)
    assert list(times) == [A100]
    assert [t.forward_s for t in times[A100]] == pytest.approx([2e-3, 4e-3, 4e-3, 1e-3 / 3])
    assert [t.backward_s for t in times[A100]] == pytest.approx([4e-3, 8e-3, 8e-3, 2e-3 / 3])
    # learned on the T4 too (block 3: 4 ms forward, 8 ms backward): the A100 keeps its own
    # figures for blocks 0-2 and takes block 3 from the T4 scaled by 0.25 / 1.0; the T4 takes
    # blocks 0-2 from the A100 scaled by 1.0 / 0.25
    entries = merge({}, stagetimes.observations(
        STAGES, [_stats(2.88, 5.76, 0.0), _stats(1.152, 2.304, 0.0)], micro_batches=4,
        unix_s=1.0), now_s=1.0)
    learned = {(e.gpu_type, e.precision): (e,) for e in entries.values()}
    times = stagetimes.block_times(learned, blocks, devices, precision="fp32", micro_batch=8)
    assert [t.forward_s for t in times[A100]] == pytest.approx([2e-3, 4e-3, 4e-3, 1e-3])
    assert [t.forward_s for t in times[T4]] == pytest.approx([8e-3, 16e-3, 16e-3, 4e-3])
    assert [t.backward_s for t in times[T4]] == pytest.approx([16e-3, 32e-3, 32e-3, 8e-3])
    # another precision's entries are not this plan's
    assert stagetimes.block_times(learned, blocks, devices, precision="bf16", micro_batch=8) == {}


@pytest.mark.parametrize("value, parsed", [
    ("fp32 blocks 0-3 forward", ("fp32", 0, 3, "forward")),
    ("bf16 blocks 3-4 backward", ("bf16", 3, 4, "backward")),
    ("fp32", None), ("Pipeline", None), ("fp32 blocks 3-3 forward", None),
    ("fp32 blocks a-3 forward", None), ("fp32 blocks 0-3 sideways", None)])
def test_stage_entry_names_round_trip(value: str, parsed: tuple | None) -> None:
    assert stagetimes.parse_stage_precision(value) == parsed
    if parsed:
        assert stagetimes.stage_precision(*parsed) == value


def test_steady_throughput_leaves_the_first_step_out() -> None:
    # rank 0: 10 steps of 16 in 2.5 s, the first 0.7 s; rank 1 likewise, its first 0.4 s:
    # 144 / 1.8 + 144 / 2.1
    stats = [{"steps": 10, "samples": 160, "step_seconds": 2.5, "first_step_seconds": 0.7,
              "first_step_samples": 16},
             {"steps": 10, "samples": 160, "step_seconds": 2.5, "first_step_seconds": 0.4,
              "first_step_samples": 16}]
    assert steady_samples_per_s(stats) == pytest.approx(144 / 1.8 + 144 / 2.1)
    assert steady_samples_per_s([{**stats[0], "steps": 1}]) is None
    assert steady_samples_per_s([{"steps": 10, "samples": 160, "step_seconds": 2.5}]) is None
