"""The planner's step-time model against hand computations; Throughput vs All; learned speeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from builders import make_job, make_node

from hetero_operator.api import types as model
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.cli import main
from hetero_operator.planning.marginal import PlanInputs, value_status
from hetero_operator.planning.plan import plan_job
from hetero_operator.planning.profiles import LearnedSpeed

T4 = 65 / 312  # NVIDIA T4 datasheet 65 TFLOPS / A100 312
NODES = [make_node("node-a"),
         make_node("node-b", product="Tesla-T4", count=2, cc="7.5", memory_mib=15360,
                   driver="570.124.06", runtime="12.8")]


def _job(**training: object) -> object:
    return make_job(ranks=3, min_ranks=1, global_batch=64,
                    training={"referenceSamplesPerSecond": 1000, "hierarchy": "Group", **training})


def test_compute_only_numbers_equal_the_hand_computation() -> None:
    """1x A100 + 2x T4, 64 samples, an A100 computes 1000 samples/s.

    Split 64 by speed 1 : 0.2083 : 0.2083 -> 45.18, 9.41, 9.41 -> [45, 10, 9] (largest remainder).
    Step = max(45 / 1000, 10 / 208.33, 9 / 208.33) = 0.048 s -> 1333.33 samples/s.
    Without the T4s: 64 / 1000 = 0.064 s -> 1000; without the A100: 32 / 208.33 = 0.1536 s -> 416.67.
    Prices 2.0 and 0.5 per hour: 3.0 per hour / (1333.33 * 3600) * 1e6 = 0.625 per million samples;
    the A100 processes 45/64 of it: 2.0 / (1333.33 * 0.703125 * 3600) * 1e6 = 0.592593.
    """
    inputs = PlanInputs(prices={"NVIDIA-A100-SXM4-40GB": 2.0, "Tesla-T4": 0.5})
    plan = plan_job(_job(), build_inventory(NODES), inputs=inputs)
    assert isinstance(plan, model.Plan)
    assert [r.local_batch for r in plan.ranks] == [45, 10, 9]
    v = plan.value
    assert v is not None and v.absolute and v.left_out == ()
    assert v.predicted_throughput == pytest.approx(64 / 0.048)
    assert (v.compute_s, v.communication_s) == (pytest.approx(0.048), 0.0)
    a100, t4 = v.types
    assert (a100.gpu_type, a100.devices, a100.speed_source, a100.share_of_step) == (
        "NVIDIA-A100-SXM4-40GB", 1, "table", pytest.approx(45 / 64))
    assert (t4.gpu_type, t4.devices, t4.share_of_step) == ("Tesla-T4", 2, pytest.approx(19 / 64))
    assert a100.samples_per_s_per_device == pytest.approx(1000)
    assert t4.samples_per_s_per_device == pytest.approx(1000 * T4)
    assert t4.throughput_added == pytest.approx(64 / 0.048 - 1000)
    assert t4.gain_percent == pytest.approx(100 / 3, abs=1e-5)
    assert a100.throughput_added == pytest.approx(64 / 0.048 - 64 / 0.1536)
    assert a100.gain_percent == pytest.approx(100 * (0.1536 / 0.048 - 1), abs=1e-5)
    assert v.cost_per_hour == pytest.approx(3.0)
    assert v.cost_per_million_samples == pytest.approx(0.625)
    assert a100.cost_per_million_samples == pytest.approx(2.0 / (64 / 0.048 * 45 / 64 * 3600) * 1e6)
    assert t4.cost_per_million_samples == pytest.approx(1.0 / (64 / 0.048 * 19 / 64 * 3600) * 1e6)


def test_communication_numbers_equal_the_hand_computation() -> None:
    """The same plan with 1 MiB of gradients over the Group layout, 100 Gbit/s inside a node and
    10 Gbit/s between nodes (latencies 20 us / 100 us).

    Reduce inside node-b's two T4s: 2 rounds of (524288 B / 12.5e9 B/s + 20 us) = 123.886 us;
    all-reduce of the two leaders across nodes: 2 rounds of (524288 / 1.25e9 + 100 us) = 1038.861 us;
    broadcast as the reduce.  Sync = 1286.633 us; step = 48 ms + 1.2866 ms.
    """
    plan = plan_job(_job(gradientMiB=1), build_inventory(NODES))
    v = plan.value
    intra = 2 * (524288 / 12.5e9 + 20e-6)
    inter = 2 * (524288 / 1.25e9 + 100e-6)
    assert v.communication_s == pytest.approx(2 * intra + inter, rel=1e-6)
    assert v.hierarchy == "group"
    assert v.predicted_throughput == pytest.approx(64 / (0.048 + 2 * intra + inter), rel=1e-6)
    t4 = v.types[1]
    assert t4.gain_percent == pytest.approx(100 * (v.predicted_throughput / 1000 - 1), abs=1e-4)
    assert t4.communication_added_percent is None  # nothing to compare: the A100 alone never syncs


def test_cheapest_mix_for_a_target_throughput() -> None:
    prices = {"NVIDIA-A100-SXM4-40GB": 2.0, "Tesla-T4": 0.5}
    plan = plan_job(_job(), build_inventory(NODES), inputs=PlanInputs(prices=prices, target_samples_per_s=900))
    mix = plan.value.cheapest_mix
    assert (mix.gpu_types, mix.devices, mix.cost_per_hour) == (("NVIDIA-A100-SXM4-40GB",), 1, 2.0)
    assert mix.predicted_samples_per_s == pytest.approx(1000)
    assert mix.cost_per_million_samples == pytest.approx(2.0 / 3600 / 1000 * 1e6)
    plan = plan_job(_job(), build_inventory(NODES), inputs=PlanInputs(prices=prices, target_samples_per_s=1200))
    assert plan.value.cheapest_mix.gpu_types == ("NVIDIA-A100-SXM4-40GB", "Tesla-T4")
    plan = plan_job(_job(), build_inventory(NODES), inputs=PlanInputs(prices=prices, target_samples_per_s=5000))
    assert plan.value.cheapest_mix.gpu_types == ()
    assert "no mix of the priced types reaches 5000 samples/s" in plan.value.cheapest_mix.message


# --- spec.gpus.selection ----------------------------------------------------------------------

K80_NODES = [make_node("node-a", count=2),
             make_node("node-k", product="Tesla-K80", count=4, cc="3.7", memory_mib=12288,
                       driver="470.239.06", runtime="11.4")]


def _k80_job(selection: str) -> object:
    return make_job(ranks=6, min_ranks=2, global_batch=256,
                    gpus={"selection": selection},
                    training={"referenceSamplesPerSecond": 1000, "gradientMiB": 100})


def test_throughput_leaves_out_what_does_not_pay_and_says_why() -> None:
    plan = plan_job(_k80_job("Throughput"), build_inventory(K80_NODES))
    assert isinstance(plan, model.Plan)
    assert [r.gpu_type for r in plan.ranks] == ["NVIDIA-A100-SXM4-40GB"] * 2
    (lo,) = plan.value.left_out
    assert (lo.gpu_type, lo.devices) == ("Tesla-K80", 4)
    assert lo.gain_percent < 5 and lo.communication_added_percent > 30
    assert lo.message.startswith(f"left out 4x Tesla-K80: {lo.gain_percent:+.1f} % throughput, "
                                 f"{lo.communication_added_percent:+.1f} % communication (below "
                                 "spec.gpus.minGainPercent 5")
    assert value_status(plan.value)["leftOut"] == [
        {"gpuType": "Tesla-K80", "devices": 4, "message": lo.message}]


def test_all_uses_everything_allowed() -> None:
    plan = plan_job(_k80_job("All"), build_inventory(K80_NODES))
    assert [r.gpu_type for r in plan.ranks].count("Tesla-K80") == 4
    assert plan.value.left_out == ()
    assert plan.value.types[1].gain_percent < 5  # it is still reported


def test_min_ranks_is_honoured_over_the_gain() -> None:
    job = make_job(ranks=6, min_ranks=6, global_batch=256, gpus={"selection": "Throughput"},
                   training={"referenceSamplesPerSecond": 1000, "gradientMiB": 100})
    plan = plan_job(job, build_inventory(K80_NODES))
    assert plan.world_size == 6 and plan.value.left_out == ()


def test_every_type_that_pays_is_kept_as_before() -> None:
    """The mixed example: every type adds more than 5 %: Throughput plans what All plans."""
    manifest = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "digits.yaml").read_text())
    nodes = list(yaml.safe_load_all((Path(__file__).resolve().parents[2] / "examples" / "clusters"
                                     / "mixed.yaml").read_text()))
    nodes = nodes[0]["items"] if "items" in nodes[0] else nodes
    from hetero_operator.api.spec import parse_job
    inv = build_inventory(nodes)
    throughput = plan_job(parse_job(manifest), inv)
    manifest["spec"]["gpus"]["selection"] = "All"
    everything = plan_job(parse_job(manifest), inv)
    assert throughput.ranks == everything.ranks and throughput.value.left_out == ()
    assert [t.gain_percent > 5 for t in throughput.value.types] == [True, True, True]


# --- learned speeds ---------------------------------------------------------------------------

def _learned(gpu_type: str, precision: str, sps: float, n: int = 3) -> LearnedSpeed:
    return LearnedSpeed(gpu_type=gpu_type, precision=precision, samples_per_s=sps, observations=n,
                        first_unix_s=1000.0, updated_unix_s=1600.0)


def test_learned_speeds_replace_the_table_and_the_plan_says_which() -> None:
    """The table says T4 = 0.208 of an A100; measurements say 0.5 (A100 1000/s, T4 500/s)."""
    learned = {("NVIDIA-A100-SXM4-40GB", "bf16"): _learned("NVIDIA-A100-SXM4-40GB", "bf16", 1000),
               ("Tesla-T4", "fp16"): _learned("Tesla-T4", "fp16", 500, n=2)}
    job = make_job(ranks=3, global_batch=64)
    plan = plan_job(job, build_inventory(NODES), inputs=PlanInputs(learned=learned, now_s=1660.0))
    assert [r.local_batch for r in plan.ranks] == [32, 16, 16]  # 1 : 0.5 : 0.5
    a100, t4 = plan.value.types
    assert (a100.speed_source, t4.speed_source, t4.observations, t4.age_s) == ("learned", "learned", 2, 60.0)
    assert t4.relative_speed == pytest.approx(0.5)
    assert plan.value.absolute and plan.value.predicted_throughput == pytest.approx(2000)
    # only the T4 learned: the reference is its learned / table ratio, the A100 stays "table"
    plan = plan_job(job, build_inventory(NODES),
                    inputs=PlanInputs(learned={("Tesla-T4", "fp16"): learned[("Tesla-T4", "fp16")]}))
    a100, t4 = plan.value.types
    assert (a100.speed_source, t4.speed_source) == ("table", "learned")
    assert a100.samples_per_s_per_device == pytest.approx(500 / T4)
    assert t4.relative_speed == pytest.approx(T4, abs=1e-6)
    # another precision is another figure
    plan = plan_job(make_job(ranks=3, global_batch=64, training={"precision": "FP32"}),
                    build_inventory(NODES), inputs=PlanInputs(learned=learned))
    assert {t.speed_source for t in plan.value.types} == {"table"}


def test_plan_cli_json_carries_marginal_values_and_costs(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    manifest = {"apiVersion": "heterotrain.io/v1alpha1", "kind": "HeteroTrainingJob",
                "metadata": {"name": "small"},
                "spec": {"worker": {"command": ["python", "train.py"]}, "gpus": {"ranks": 3, "minRanks": 1},
                         "training": {"globalBatchSize": 64, "referenceSamplesPerSecond": 1000,
                                      "hierarchy": "Group"}}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(manifest))
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump_all(NODES))
    (tmp_path / "prices.yaml").write_text("NVIDIA-A100-SXM4-40GB: 2.0\nTesla-T4: 0.5\n")
    args = ["plan", str(tmp_path / "job.yaml"), "--nodes", str(tmp_path / "nodes.yaml"),
            "--prices", str(tmp_path / "prices.yaml"), "--learned-speeds", "", "--target-throughput", "900"]
    assert main([*args, "-o", "json"]) == 0
    value = json.loads(capsys.readouterr().out)["value"]
    assert value["predicted_throughput"] == pytest.approx(64 / 0.048)
    assert value["cost_per_million_samples"] == pytest.approx(0.625)
    assert [(t["gpu_type"], round(t["throughput_added"], 2)) for t in value["types"]] == [
        ("NVIDIA-A100-SXM4-40GB", round(64 / 0.048 - 64 / 0.1536, 2)),
        ("Tesla-T4", round(64 / 0.048 - 1000, 2))]
    assert value["cheapest_mix"]["gpu_types"] == ["NVIDIA-A100-SXM4-40GB"]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Predicted throughput: 1333.3 samples/s" in out
    assert "Cost: 3.00 per hour, 0.625 per million samples" in out
    assert "Cheapest mix: cheapest mix for 900 samples/s: 1x NVIDIA-A100-SXM4-40GB" in out
    (tmp_path / "prices.yaml").write_text("Tesla-T4: cheap\n")
    assert main(args) == 1
    assert "Tesla-T4: price must be a number >= 0" in capsys.readouterr().err


def test_gradient_size_from_the_model_parameters_when_gradient_mib_is_unset() -> None:
    from dataclasses import fields, replace

    from hetero_operator.planning.plan import gradient_bytes
    job = _job()
    assert gradient_bytes(job) == 0 and gradient_bytes(_job(gradientMiB=3)) == 3 * 2**20
    if "model_parameters" not in {f.name for f in fields(job.training)}:
        pytest.skip("spec.training.model.parameters is not in this spec yet")
    with_params = replace(job, training=replace(job.training, model_parameters=262144))
    assert gradient_bytes(with_params) == 262144 * 4  # 1 MiB of fp32 gradients
    plan = plan_job(with_params, build_inventory(NODES))
    assert plan.value.communication_s == pytest.approx(
        2 * 2 * (524288 / 12.5e9 + 20e-6) + 2 * (524288 / 1.25e9 + 100e-6), rel=1e-6)


def test_learned_efficiency_scales_the_prediction_not_the_gains() -> None:
    """Earlier jobs turned 0.8 of the devices' standalone throughput into training: the compute
    model's 1333.33 samples/s becomes 1066.67; gains are ratios and stay; with a gradient size the
    model has its own communication and the efficiency (which contains it) is not applied."""
    learned = {("Tesla-T4", "fp16"): _learned("Tesla-T4", "fp16", 1000 * T4),
               ("job", "efficiency"): _learned("job", "efficiency", 0.8, n=2)}
    job = make_job(ranks=3, min_ranks=1, global_batch=64, training={"hierarchy": "Group"})
    v = plan_job(job, build_inventory(NODES), inputs=PlanInputs(learned=learned)).value
    assert v.predicted_throughput == pytest.approx(64 / 0.048 * 0.8, rel=1e-6)
    assert v.types[1].gain_percent == pytest.approx(100 / 3, abs=1e-5)
    assert "throughput x 0.800, the efficiency earlier jobs of this profileKey reached (2 obs." in (
        v.communication_note)
    with_comm = make_job(ranks=3, min_ranks=1, global_batch=64,
                         training={"hierarchy": "Group", "gradientMiB": 1})
    v = plan_job(with_comm, build_inventory(NODES), inputs=PlanInputs(learned=learned)).value
    assert v.predicted_throughput == pytest.approx(64 / (0.048 + v.communication_s), rel=1e-6)
