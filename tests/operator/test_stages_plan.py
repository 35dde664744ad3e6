"""The pipeline stage planner (issue 30, item 2): GPU types to stages, contiguous blocks to
stages by speed and memory, the boundary link and the bubble in the predicted step. Every
expected split is worked out by hand in the test's comment."""

from __future__ import annotations

import pytest

from hetero_operator.planning.schedulesim import simulate
from hetero_operator.planning.stages import (BlockCost, BlockTime, StageDevice, StagePlanError,
                                             in_flight, plan_stages)
from heterotrain_common.linkcost import LinkModel

MIB = 2**20
FREE_LINK = LinkModel(intra_bw_bytes_per_s=1e12, inter_bw_bytes_per_s=1e12, intra_latency_s=0.0,
                      inter_latency_s=0.0)
BIG = 2**40


def blocks(n: int, *, param_bytes: int = 0, act: int = 0, out: int = 0,
           compute: float = 1.0) -> list[BlockCost]:
    return [BlockCost(param_bytes=param_bytes, activation_bytes_per_sample=act,
                      output_bytes_per_sample=out, compute_s_per_sample=compute)] * n


def three_types(a_mem: int = BIG, b_ranks: int = 1) -> list[StageDevice]:
    # given slowest first: the planner orders them itself
    return [StageDevice(gpu_type="C", speed=0.2, memory_bytes=BIG),
            StageDevice(gpu_type="B", speed=0.4, memory_bytes=BIG, ranks=b_ranks),
            StageDevice(gpu_type="A", speed=1.0, memory_bytes=a_mem)]


def test_three_types_twelve_equal_blocks_split_by_speed() -> None:
    # Speeds 1.0 / 0.4 / 0.2, 12 blocks of 1 s/sample, micro-batch 1: stage times k1/1, k2/0.4,
    # k3/0.2. k3 = 1 (5 s; 2 would be 10 s), k2 <= 3 (7.5 s; 4 would be 10 s), so k1 = 8 (8 s):
    # the slowest slot is 8 s, and no split does better (k1 = 7 forces k2 = 4 or k3 = 2).
    plan = plan_stages(blocks(12), three_types(), global_batch=4, micro_batches=4, link=FREE_LINK)
    assert [s.gpu_type for s in plan.stages] == ["A", "B", "C"]
    assert plan.block_counts == [8, 3, 1]
    assert [s.blocks for s in plan.stages] == [(0, 8), (8, 11), (11, 12)]
    assert [s.slot_s for s in plan.stages] == pytest.approx([8.0, 7.5, 5.0])
    assert plan.slowest_slot_s == pytest.approx(8.0)
    # The schedule played (1F1B, F = slot / 3, B = 2 slot / 3; A 8/3 + 16/3, B 2.5 + 5, C 5/3 +
    # 10/3): A runs its 3 warm-up forwards by 8; micro-batch 0 goes A, B, C forward and C, B back
    # (B's backward waits for B's own 2 warm-up forwards: 15.17); from then A alternates backward
    # and forward and waits for B's backwards: A's B0 15.17-20.5, F3 -23.17, B1 -28.5, B2 (B's
    # ends 30.67) -36.0, B3 (B's ends 35.67) -41.33 = 124/3 s. The closed form, (m + s - 1) =
    # 6 slots of the slowest 8 s (48 s), counts B and C as slow as A; the bubble stays 2 of 6
    assert plan.step_s == pytest.approx(124 / 3)
    assert plan.step_s < (4 + 3 - 1) * plan.slowest_slot_s
    assert plan.bubble_fraction == pytest.approx(2 / 6)


def test_a_stage_s_replicas_add_their_speed() -> None:
    # B has 2 ranks: aggregate 0.8. k3 = 1 (5 s); k1 = 6, k2 = 5 gives max(6, 6.25) = 6.25;
    # k1 = 7, k2 = 4 gives 7; k1 = 5, k2 = 6 gives 7.5. So (6, 5, 1) with 6.25 s.
    plan = plan_stages(blocks(12), three_types(b_ranks=2), global_batch=4, micro_batches=4,
                       link=FREE_LINK)
    assert [(s.gpu_type, s.ranks, s.block_count) for s in plan.stages] == [
        ("A", 1, 6), ("B", 2, 5), ("C", 1, 1)]
    assert plan.slowest_slot_s == pytest.approx(6.25)


def test_a_stage_s_replicas_all_reduce_their_gradients_in_the_step() -> None:
    # As above, with 1 MiB of parameters per block: B's 5 blocks (5 MiB) are all-reduced between
    # its 2 ranks once per step: 2 rounds of 2.5 MiB at 1e9 B/s inside the node, 0.00524288 s;
    # A and C have one rank each and sync nothing. Step = the schedule played on the stages
    # (planning.schedulesim) + 0.00524288 s.
    link = LinkModel(intra_bw_bytes_per_s=1e9, inter_bw_bytes_per_s=1e12, intra_latency_s=0.0,
                     inter_latency_s=0.0)
    plan = plan_stages(blocks(12, param_bytes=MIB), three_types(b_ranks=2), global_batch=4,
                       micro_batches=4, link=link)
    assert plan.block_counts == [6, 5, 1]
    assert [s.sync_s for s in plan.stages] == pytest.approx([0.0, 0.00524288, 0.0])
    played = simulate([s.forward_s for s in plan.stages], [s.backward_s for s in plan.stages],
                      [0.0, 0.0], 4)
    assert [s.forward_s for s in plan.stages] == pytest.approx([2.0, 6.25 / 3, 5 / 3])
    assert plan.step_s == pytest.approx(played.step_s + 0.00524288)


def test_memory_caps_the_fast_stage() -> None:
    # 1 MiB of parameters per block = 4 MiB resident (parameter, gradient, two Adam moments); A
    # holds 24 MiB = 6 blocks. The rest, 6 blocks on B and C: k2 = 4 (10 s), k3 = 2 (10 s);
    # k2 = 5 would take 12.5 s. So (6, 4, 2) with 10 s.
    plan = plan_stages(blocks(12, param_bytes=MIB), three_types(a_mem=24 * MIB), global_batch=4,
                       micro_batches=4, link=FREE_LINK)
    assert plan.block_counts == [6, 4, 2]
    assert plan.stages[0].memory_bytes == 24 * MIB
    assert plan.slowest_slot_s == pytest.approx(10.0)


def test_the_boundary_transfer_moves_the_cut_and_enters_the_step() -> None:
    # Two equal types, 3 blocks of 1 s/sample; block 0's output is empty, block 1's is 1e6 bytes
    # per sample. Micro-batch 2 (8 samples, 4 micro-batches), link 1e8 B/s, latency 1 ms.
    # Cut after block 0: boundary = 2 x (0 + 1 ms) = 2 ms; slots 2 s + 2 ms and 4 s + 2 ms.
    # Cut after block 1: boundary = 2 x (2e6 / 1e8 + 1 ms) = 42 ms; slots 4.042 s and 2.042 s.
    # With every output empty the two cuts tie (4 s) and the earlier stage takes more (cut after 1).
    costs = [BlockCost(param_bytes=0, activation_bytes_per_sample=0, output_bytes_per_sample=out,
                       compute_s_per_sample=1.0) for out in (0, 10**6, 0)]
    devices = [StageDevice(gpu_type="X", speed=1.0, memory_bytes=BIG),
               StageDevice(gpu_type="Y", speed=1.0, memory_bytes=BIG)]
    link = LinkModel(intra_bw_bytes_per_s=1e9, inter_bw_bytes_per_s=1e8, inter_latency_s=1e-3)
    plan = plan_stages(costs, devices, global_batch=8, micro_batches=4, link=link)
    assert plan.block_counts == [1, 2]
    assert [s.transfer_s for s in plan.stages] == pytest.approx([0.002, 0.002])
    assert plan.slowest_slot_s == pytest.approx(4.002)
    # Played: X's F0 (2/3 s) and 1 ms to Y; Y runs its 4 micro-batches (4 s each), each next
    # activation reaching it 1 ms after it asks (X sent them long before; Gloo moves the bytes
    # once both sides posted); Y's last gradient reaches X 1 ms later, X's last backward 4/3 s:
    # 2/3 + 16 + 4/3 + 5 x 0.001 = 18.005 s (the closed form, 5 slots of 4.002 s, is 20.01 s)
    assert plan.step_s == pytest.approx(18.005)
    untimed = plan_stages(blocks(3), devices, global_batch=8, micro_batches=4, link=link)
    assert untimed.block_counts == [2, 1]


def test_1f1b_holds_fewer_micro_batches_than_gpipe() -> None:
    # 2 stages, 8 micro-batches of 1 sample, 1 MiB of activations per sample per block, 2 blocks
    # per stage: GPipe keeps all 8 in flight (16 MiB), 1F1B keeps s - i (2 on stage 0, 1 on 1).
    assert [in_flight(i, 2, 8, "GPipe") for i in (0, 1)] == [8, 8]
    assert [in_flight(i, 2, 8, "1F1B") for i in (0, 1)] == [2, 1]
    devices = [StageDevice(gpu_type="X", speed=1.0, memory_bytes=BIG),
               StageDevice(gpu_type="Y", speed=1.0, memory_bytes=BIG)]
    for schedule, expected in (("GPipe", [16 * MIB, 16 * MIB]), ("1F1B", [4 * MIB, 2 * MIB])):
        plan = plan_stages(blocks(4, act=MIB), devices, global_batch=8, micro_batches=8,
                           link=FREE_LINK, schedule=schedule)
        assert [s.memory_bytes for s in plan.stages] == expected


def test_a_block_no_type_can_hold_is_refused_naming_the_fix() -> None:
    costs = blocks(4, param_bytes=MIB)
    costs[2] = BlockCost(param_bytes=100 * MIB, activation_bytes_per_sample=0,
                         output_bytes_per_sample=0, compute_s_per_sample=1.0)
    devices = [StageDevice(gpu_type="X", speed=1.0, memory_bytes=64 * MIB),
               StageDevice(gpu_type="Y", speed=1.0, memory_bytes=32 * MIB)]
    with pytest.raises(StagePlanError) as err:
        plan_stages(costs, devices, global_batch=4, micro_batches=4, link=FREE_LINK)
    assert str(err.value).startswith("block 2 alone needs 400 MiB per rank on X")
    assert "spec.training.pipeline.microBatches" in str(err.value)


def test_a_model_larger_than_all_stages_is_refused_naming_the_fix() -> None:
    # 6 blocks of 4 MiB resident each = 24 MiB; two types of 8 MiB hold 4 blocks together
    devices = [StageDevice(gpu_type="X", speed=1.0, memory_bytes=8 * MIB),
               StageDevice(gpu_type="Y", speed=1.0, memory_bytes=8 * MIB)]
    with pytest.raises(StagePlanError, match=r"^the 6 blocks need more memory than 2 stages on X, Y"
                       r".*spec.training.sharding Full"):
        plan_stages(blocks(6, param_bytes=MIB), devices, global_batch=4, micro_batches=4,
                    link=FREE_LINK)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"schedule": "Interleaved"}, "spec.training.pipeline.schedule must be one of 1F1B, GPipe"),
    ({"micro_batches": 5}, r"spec.training.pipeline.microBatches must be 1..4"),
    ({"micro_batches": 0}, r"spec.training.pipeline.microBatches must be 1..4"),
], ids=["unknown schedule", "more micro-batches than samples", "no micro-batch"])
def test_bad_pipeline_settings_name_the_field(kwargs: dict, message: str) -> None:
    args = {"global_batch": 4, "micro_batches": 4, "link": FREE_LINK, **kwargs}
    with pytest.raises(ValueError, match=message):
        plan_stages(blocks(12), three_types(), **args)


def test_fewer_blocks_than_types_is_refused() -> None:
    with pytest.raises(ValueError, match="2 blocks cannot fill 3 stages"):
        plan_stages(blocks(2), three_types(), global_batch=4, micro_batches=4, link=FREE_LINK)


def test_measured_block_times_replace_the_speed_model() -> None:
    # Two types of equal speed, 4 equal blocks (1 s/sample, micro-batch 1, 4 micro-batches). The
    # model splits 2 + 2 (2 s each). Measured on Y: blocks 0 and 3 take 3 s/sample, 1 and 2 as
    # modelled (1 s). X first: 3 + 1 gives X 3 s, Y 3 s; 2 + 2 gives Y 4 s. Y first: 1 + 3 gives
    # 3 s and 3 s as well, and the tie keeps the order given (X, then Y by name): 3 + 1.
    devices = [StageDevice(gpu_type="X", speed=1.0, memory_bytes=BIG),
               StageDevice(gpu_type="Y", speed=1.0, memory_bytes=BIG)]
    modelled = plan_stages(blocks(4), devices, global_batch=4, micro_batches=4, link=FREE_LINK)
    assert modelled.block_counts == [2, 2]
    slow, as_modelled = BlockTime(forward_s=1.0, backward_s=2.0), BlockTime(forward_s=1 / 3,
                                                                            backward_s=2 / 3)
    on_y = [slow, as_modelled, as_modelled, slow]
    plan = plan_stages(blocks(4), devices, global_batch=4, micro_batches=4, link=FREE_LINK,
                       measured={"Y": on_y})
    assert [(s.gpu_type, s.block_count) for s in plan.stages] == [("X", 3), ("Y", 1)]
    assert [t for s in plan.stages for t in (s.forward_s, s.backward_s)] == pytest.approx(
        [1.0, 2.0, 1.0, 2.0])
    # equal stages of 3 s: (4 + 2 - 1) slots
    assert plan.step_s == pytest.approx(15.0)
    with pytest.raises(ValueError, match="Y: 3 measured block times for 4 blocks"):
        plan_stages(blocks(4), devices, global_batch=4, micro_batches=4, link=FREE_LINK,
                    measured={"Y": on_y[:3]})
