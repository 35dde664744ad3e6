"""``spec.training.sharding Auto`` weighs a pipeline against no pipeline (issue 30, item 1):
the plan with the higher predicted throughput is kept, each layout's prediction calibrated by the
measured / predicted ratio earlier runs learned for it, and the reasons name each candidate's
figure or, per GPU type, why it does not fit."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s import crdcheck

from hetero_operator.api import types as model
from hetero_operator.api.spec import parse_job
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.lifecycle.status import plan_status
from hetero_operator.local.valueview import layout_observations, resumed_layout
from hetero_operator.planning import layoutchoice
from hetero_operator.planning.marginal import LinkSettings, PlanInputs
from hetero_operator.planning.plan import plan_job
from hetero_operator.planning.profiles import LearnedSpeed

ROOT = Path(__file__).resolve().parents[2]
NODES = yaml.safe_load((ROOT / "examples" / "clusters" / "scaled-memory.yaml").read_text())["items"]
REFERENCE_SPS = 300
SHORT = "does not fit (Tesla-T4 short by 2.3 MiB of 5.7 MiB usable)"


def _job(*, sharding: str = "Auto", reference: int | None = REFERENCE_SPS) -> Any:
    """examples/lm-pipeline.yaml with ``sharding``; ``Full`` leaves the pipeline out."""
    doc = yaml.safe_load((ROOT / "examples" / "lm-pipeline.yaml").read_text())
    doc["spec"]["training"]["sharding"] = sharding
    if sharding == "Full":
        del doc["spec"]["training"]["pipeline"]
    if reference:
        doc["spec"]["training"]["referenceSamplesPerSecond"] = reference
    return parse_job(doc)


def _plan(job: Any, gbps: float, learned: dict | None = None) -> model.Plan:
    plan = plan_job(job, build_inventory(NODES),
                    inputs=PlanInputs(link=LinkSettings(inter_node_gbps=gbps),
                                      learned=learned or {}))
    assert isinstance(plan, model.Plan), plan.message
    return plan


def _ratio(layout: str, ratio: float, runs: int = 1) -> LearnedSpeed:
    return LearnedSpeed(gpu_type=layoutchoice.LEARNED_LAYOUT, precision=layout,
                        samples_per_s=ratio, observations=runs, first_unix_s=0.0,
                        updated_unix_s=0.0)


def _full(plan: model.Plan) -> float:
    assert plan.memory is not None
    full = next(o for o in plan.memory.options if o.mode == "Full")
    assert full.predicted_samples_per_s is not None
    return full.predicted_samples_per_s


def test_on_a_slow_link_auto_keeps_the_pipeline_and_says_why_per_type() -> None:
    plan = _plan(_job(), 0.1)
    assert plan.pipeline is not None and plan.memory is None
    assert [r.stage for r in plan.ranks] == [0, 1]
    choice = plan.layout
    assert choice is not None and choice.chosen == "Pipeline"
    assert choice.pipeline_samples_per_s == pytest.approx(32 / plan.pipeline.step_s, rel=1e-12)
    flat = _plan(_job(sharding="Full"), 0.1)
    assert choice.flat_samples_per_s == pytest.approx(_full(flat), rel=1e-12)
    # The pipeline (4 blocks of 1/1200 s per sample; micro-batches of 8): A100 3 blocks (F 6.67,
    # B 13.33 ms), T4 1 block at speed 0.21 (F 10.67, B 21.33 ms); one activation of 8 x 32 KiB
    # at 0.1 Gbit/s + 0.1 ms = 21.07 ms each way. The T4 runs its 4 micro-batches in turn and
    # asks for the next activation only after a backward (1F1B's fused wait), so 3 transfers
    # fall between them: 6.67 + 21.07 + 4 x 32 + 3 x 21.07 + 21.07 (last gradient) + 13.33
    # (A100's last backward) = 253.4 ms, 126.3 samples/s. Full moves 6.2 MiB of parameters per
    # step at 0.1 Gbit/s (two all-gathers and Gloo's reduce-scatter, an all-reduce): 27.2
    # samples/s
    assert plan.pipeline.step_s == pytest.approx(0.25336, abs=1e-5)
    assert choice.pipeline_samples_per_s / choice.flat_samples_per_s == pytest.approx(4.639,
                                                                                      abs=1e-3)
    assert choice.reasons[0] == (f"Pipeline chosen: predicted {choice.pipeline_samples_per_s:.4g} "
                                 f"samples/s, 4.64x Full's (the best mode without a pipeline)")
    assert choice.reasons[2:4] == (f"None: {SHORT}", f"Group: {SHORT}")
    assert choice.reasons[4].startswith(f"Full: predicted {choice.flat_samples_per_s:.4g} "
                                        "samples/s (its model; no run of it measured yet)")


def test_on_a_fast_link_auto_drops_the_pipeline_for_full_sharding() -> None:
    plan = _plan(_job(), 100.0)
    assert plan.pipeline is None and plan.memory is not None and plan.memory.mode == "Full"
    assert [r.stage for r in plan.ranks] == [None, None]
    assert [r.precision for r in plan.ranks] == ["bf16", "fp16"]  # the flat plan's own precisions
    choice = plan.layout
    assert choice is not None and choice.chosen == "Full"
    assert choice.flat_samples_per_s == pytest.approx(_full(plan), rel=1e-12)
    piped = _plan(_job(sharding="None"), 100.0)
    assert choice.pipeline_samples_per_s == pytest.approx(32 / piped.pipeline.step_s, rel=1e-12)
    assert choice.flat_samples_per_s > choice.pipeline_samples_per_s
    assert choice.reasons[0].startswith(f"Full chosen: predicted {choice.flat_samples_per_s:.4g}")


def test_sharding_none_runs_the_pipeline_without_weighing() -> None:
    plan = _plan(_job(sharding="None"), 100.0)
    assert plan.pipeline is not None and plan.layout is None


def test_without_seconds_per_sample_the_pipeline_is_kept_and_the_reason_says_so() -> None:
    plan = _plan(_job(reference=None), 100.0)
    assert plan.pipeline is not None
    choice = plan.layout
    assert choice is not None and choice.chosen == "Pipeline"
    assert (choice.pipeline_samples_per_s, choice.flat_samples_per_s) == (None, None)
    assert choice.reasons[0].startswith("Pipeline: kept, not weighed: the planner has no seconds "
                                        "per sample (give spec.training.referenceSamplesPerSecond")
    assert choice.reasons[1:] == (f"None: {SHORT}", f"Group: {SHORT}",
                                  "Full: fits, 6.2 MiB per step across GPU types")


def test_a_learned_measured_over_predicted_ratio_turns_the_choice() -> None:
    raw = _plan(_job(), 100.0)
    assert raw.layout is not None and raw.layout.chosen == "Full"
    full_model = raw.layout.flat_samples_per_s
    learned = {(layoutchoice.LEARNED_LAYOUT, "Full"): (_ratio("Full", 0.4, runs=2),)}
    plan = _plan(_job(), 100.0, learned)
    choice = plan.layout
    assert choice is not None and choice.chosen == "Pipeline" and plan.pipeline is not None
    assert choice.flat_samples_per_s == pytest.approx(0.4 * full_model, rel=1e-12)
    assert choice.pipeline_samples_per_s == pytest.approx(raw.layout.pipeline_samples_per_s,
                                                          rel=1e-12)
    assert choice.reasons[-1].startswith(
        f"Full: predicted {0.4 * full_model:.4g} samples/s ({full_model:.4g} by its model x "
        "0.400, the measured / predicted ratio learned over 2 runs)")
    # a learned Pipeline ratio scales the pipeline's prediction the same way
    both = {**learned, (layoutchoice.LEARNED_LAYOUT, "Pipeline"): _ratio("Pipeline", 0.4)}
    scaled = _plan(_job(), 100.0, both).layout
    assert scaled is not None and scaled.chosen == "Full"
    assert scaled.pipeline_samples_per_s == pytest.approx(
        0.4 * raw.layout.pipeline_samples_per_s, rel=1e-12)


def test_layout_in_status_plan_is_declared_in_the_crd() -> None:
    plan = _plan(_job(), 0.1)
    status = plan_status("lm", plan, master_addr="lm-0", master_port=29500)
    assert status["layout"] == {"chosen": "Pipeline", "reasons": list(plan.layout.reasons)}
    schema = crdcheck.load_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    kept = crdcheck.prune(schema["properties"]["status"], {"plan": copy.deepcopy(status)})
    assert kept["plan"]["layout"] == status["layout"]  # declared, so not pruned


def test_a_run_learns_its_layouts_measured_over_predicted() -> None:
    piped = _plan(_job(sharding="None"), 0.1)
    assert piped.pipeline is not None and piped.pipeline.absolute
    [obs] = layout_observations(piped, 40.0, _job())
    predicted = 32 / piped.pipeline.step_s
    assert (obs.gpu_type, obs.precision) == ("layout", "Pipeline")
    assert obs.samples_per_s == pytest.approx(40.0 / predicted, rel=1e-12)
    flat = _plan(_job(sharding="Full"), 0.1)
    [obs] = layout_observations(flat, 20.0, _job())
    assert (obs.precision, obs.samples_per_s) == ("Full", pytest.approx(20.0 / _full(flat)))
    assert layout_observations(flat, 0.0, _job()) == []  # a rank without statistics
    relative = _plan(_job(sharding="None", reference=None), 0.1)
    assert layout_observations(relative, 40.0, _job()) == []  # no seconds to compare with


def test_a_resumed_checkpoints_layout_is_kept_not_weighed() -> None:
    inventory = build_inventory(NODES)
    fast = PlanInputs(link=LinkSettings(inter_node_gbps=100.0), layout_pin="Pipeline")
    kept = plan_job(_job(), inventory, inputs=fast)
    assert isinstance(kept, model.Plan) and kept.pipeline is not None  # Full would be predicted
    assert kept.layout is not None and kept.layout.chosen == "Pipeline"
    assert kept.layout.reasons == (
        "Pipeline: the run resumes a checkpoint written under Pipeline, which the other layout "
        "would refuse (a pipelined checkpoint holds each stage's optimizer state): kept, not "
        "weighed",)
    slow = PlanInputs(link=LinkSettings(inter_node_gbps=0.1), layout_pin="Full")
    flat = plan_job(_job(), inventory, inputs=slow)  # the pipeline would be predicted
    assert isinstance(flat, model.Plan) and flat.pipeline is None
    assert flat.memory is not None and flat.layout is not None
    assert (flat.memory.mode, flat.layout.chosen) == ("Full", "Full")


def test_resumed_layout_reads_the_run_it_continues(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "plan.json").write_text('{"pipeline": {"step_s": 0.1}, "memory": null}')
    assert resumed_layout(run) == ""  # no checkpoint in it: nothing to keep
    (run / "checkpoints" / "step-00000005-x").mkdir()
    assert resumed_layout(run) == "Pipeline"
    (run / "plan.json").write_text('{"pipeline": null, "memory": {"mode": "Full"}}')
    assert resumed_layout(run) == "Full"


def test_a_full_prediction_from_measured_speeds_and_link_is_weighed_without_its_ratio() -> None:
    # Every placed type's speed learned and Full's cross-type link rate learned: Full's
    # prediction is the measured figures' own, and the ratio learned against the model (0.4)
    # no longer scales it; with one of them missing it still does
    def entry(gpu_type: str, precision: str, value: float) -> LearnedSpeed:
        return LearnedSpeed(gpu_type=gpu_type, precision=precision, samples_per_s=value,
                            observations=1, first_unix_s=0.0, updated_unix_s=0.0)

    speeds = {("NVIDIA-A100-SXM4-40GB", "bf16"): (entry("NVIDIA-A100-SXM4-40GB", "bf16", 300.0),),
              ("Tesla-T4", "fp16"): (entry("Tesla-T4", "fp16", 60.0),)}
    ratio = {(layoutchoice.LEARNED_LAYOUT, "Full"): (_ratio("Full", 0.4),)}
    link = {("link", "Full"): (entry("link", "Full", 2e8),)}
    measured = _plan(_job(), 100.0, {**speeds, **ratio, **link})
    flat = _plan(_job(sharding="Full"), 100.0, {**speeds, **link})
    assert layoutchoice.measured_flat_modes(flat, {**speeds, **link}) == {"Full"}
    assert measured.layout is not None
    assert measured.layout.flat_samples_per_s == pytest.approx(_full(flat), rel=1e-12)
    unlinked = _plan(_job(), 100.0, {**speeds, **ratio})
    no_link = _plan(_job(sharding="Full"), 100.0, speeds)
    assert layoutchoice.measured_flat_modes(no_link, speeds) == frozenset()
    assert unlinked.layout.flat_samples_per_s == pytest.approx(0.4 * _full(no_link), rel=1e-12)
    # and a run so predicted records no ratio
    assert layout_observations(flat, 20.0, _job(), {**speeds, **link}) == []


@pytest.mark.parametrize("handed", [True, False])
def test_after_run_judges_the_layout_by_the_table_the_plan_used(tmp_path: Path,
                                                                handed: bool) -> None:
    # The plan's Full prediction came from learned speeds and a learned link; the store is empty
    # by the time the run ends (another run rewrote it, or --learned-speeds changed). Handed the
    # plan's table, after_run records no layout ratio; judged by the store, it would record one
    import argparse
    import io
    import json

    from rich.console import Console

    from hetero_operator.local.valueview import after_run
    from heterotrain_common import rundir

    def entry(gpu_type: str, precision: str, value: float) -> LearnedSpeed:
        return LearnedSpeed(gpu_type=gpu_type, precision=precision, samples_per_s=value,
                            observations=1, first_unix_s=0.0, updated_unix_s=0.0)

    table = {("NVIDIA-A100-SXM4-40GB", "bf16"): (entry("NVIDIA-A100-SXM4-40GB", "bf16", 300.0),),
             ("Tesla-T4", "fp16"): (entry("Tesla-T4", "fp16", 60.0),),
             ("link", "Full"): (entry("link", "Full", 2e8),)}
    job = _job(sharding="Full")
    plan = _plan(job, 100.0, table)
    for r in plan.ranks:
        rundir.write_json_atomic(rundir.rank_stats_path(tmp_path, r.rank), {
            "rank": r.rank, "gpu_product": r.gpu_type, "precision": "fp32", "steps": 12,
            "samples": 12 * r.local_batch, "step_seconds": 2.4, "compute_seconds": 1.2,
            "comm_wait_seconds": 1.2})
    store = tmp_path / "profiles.json"
    after_run(Console(file=io.StringIO()), args=argparse.Namespace(learned_speeds=str(store)),
              job=job, plan=plan, workdir=tmp_path, exit_code=0,
              learned=table if handed else None)
    recorded = json.loads(store.read_text())
    layouts = {k for k in json.dumps(recorded).split('"') if k.startswith("layout/")}
    assert layouts == (set() if handed else {"layout/Full"})
