"""bench/bench_pipeline.py's rows and figures, from fabricated runs (no benchmark is run here):
the target rows carry the names issue 30 asks for, a link that was not measured has no row, and
a run directory's figures are read as the module docstring says."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import bench_pipeline  # noqa: E402


def _fig(sps: float, ratio: float) -> dict:
    return {"samples_per_s": sps, "measured_over_predicted_step": ratio,
            "planned_bubble_fraction": 0.2, "wait_fraction": 0.1}


def _link(pipe_sps: float, full_sps: float) -> dict:
    return {"Pipeline": [_fig(pipe_sps, 1.0)] * 3, "Full": [_fig(full_sps, 1.2)] * 3}


def test_target_rows_are_named_as_the_issue_asks_and_judged_by_their_median() -> None:
    links = {"unshaped link": _link(300.0, 100.0), "100 Mbit/s link": _link(120.0, 20.0)}
    rows = {t.name: t.as_dict() for t in bench_pipeline.targets_of(links)}
    ratio = rows["Pipeline / Full samples/s, 100 Mbit/s link"]
    assert (ratio["op"], ratio["target"], ratio["median"], ratio["met"]) == (">=", 2.0, 6.0, True)
    assert rows["measured / predicted, Pipeline"]["met"] is True
    assert rows["... measured / predicted, Pipeline: upper end"]["met"] is True
    assert rows["measured / predicted, Full"]["met"] is True
    assert rows["... measured / predicted, Full: upper end"]["met"] is False  # 1.2 > 1.10
    assert "measured / predicted, Pipeline, 100 Mbit/s link" in rows


def test_without_the_slow_link_no_row_claims_it() -> None:
    rows = [t.name for t in bench_pipeline.targets_of({"unshaped link": _link(300.0, 100.0)})]
    assert rows and not any("100 Mbit/s" in name for name in rows)


def test_figures_of_a_pipelined_run_directory(tmp_path: Path) -> None:
    (tmp_path / "prediction.json").write_text(json.dumps({"measured_samples_per_s": 300.0,
                                                          "measured_steady_samples_per_s": 320.0}))
    (tmp_path / "plan.json").write_text(json.dumps({
        "world_size": 2, "ranks": [{"local_batch": 16}, {"local_batch": 16}],
        "pipeline": {"step_s": 0.08, "bubble_fraction": 0.2,
                     "stages": [{"gpu_type": "A100", "blocks": 3}, {"gpu_type": "T4", "blocks": 1}]}}))
    for r, wait in enumerate((0.1, 0.3)):
        (tmp_path / f"rank-{r}.json").write_text(json.dumps(
            {"comm_wait_seconds": wait, "step_seconds": 1.0, "steps": 10}))
    fig = bench_pipeline.figures(tmp_path)
    # 32 samples at 320 samples/s: the steady figure (the first step left out), not 300
    assert fig["measured_step_s"] == pytest.approx(0.1)
    assert fig["measured_over_predicted_step"] == pytest.approx(1.25)
    assert (fig["planned_bubble_fraction"], fig["wait_fraction"]) == (0.2, 0.3)


@pytest.mark.parametrize(("chosen", "median", "met"), [("Pipeline", 1.0, True),
                                                       ("Full", pytest.approx(1 / 3), False)])
def test_autos_row_compares_its_choice_with_the_faster_layout(chosen: str, median: object,
                                                               met: bool) -> None:
    links = {"unshaped link": _link(300.0, 100.0)}
    rows = {t.name: t.as_dict() for t in bench_pipeline.targets_of(
        links, {"unshaped link": {"chosen": chosen, "reasons": ["..."]}})}
    row = rows["Auto's choice / fastest measured samples/s, unshaped link"]
    assert (row["op"], row["target"], row["median"], row["met"]) == (">=", 0.95, median, met)


def _entry(gpu_type: str, precision: str, value: float, batch: float = 0.0) -> dict:
    now = time.time()
    return {"gpu_type": gpu_type, "precision": precision, "samples_per_s": value,
            "observations": 1, "first_unix_s": now, "updated_unix_s": now, "local_batch": batch}


@pytest.mark.parametrize(("full_ratio", "chosen"), [(0.2, "Pipeline"), (5.0, "Full")])
def test_auto_choice_plans_over_both_calibration_stores(tmp_path: Path, full_ratio: float,
                                                        chosen: str) -> None:
    """The real ``heterotrain plan`` over the two calibration runs' stores merged: Full's learned
    ratio decides between the layouts."""
    caches = {mode: tmp_path / mode for mode in ("Full", "Pipeline")}
    stores = {"Full": {"lm-large": {
        "NVIDIA-A100-SXM4-40GB/bf16/16-31": _entry("NVIDIA-A100-SXM4-40GB", "bf16", 160.0, 26.0),
        "layout/Full": _entry("layout", "Full", full_ratio)}},
        "Pipeline": {"lm-pipeline": {"layout/Pipeline": _entry("layout", "Pipeline", 1.0)}}}
    for mode, profiles in stores.items():
        (caches[mode] / "heterotrain").mkdir(parents=True)
        (caches[mode] / "heterotrain" / "profiles.json").write_text(
            json.dumps({"version": 1, "profiles": profiles}))
    auto = bench_pipeline.auto_choice(None, caches, tmp_path)
    assert auto["chosen"] == chosen
    full_line = next(r for r in auto["reasons"] if r.startswith("Full: predicted"))
    assert f"x {full_ratio:.3f}, the measured / predicted ratio learned over 1 run" in full_line
