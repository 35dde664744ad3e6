"""Learned speeds that one bad run cannot poison (issue 21, shared case 43): figures per batch
band, a far-off observation held as a candidate until confirmed, runs too short or too small
not recorded, the job and namespace in every entry, and ``heterotrain plan`` pointing out a
learned figure more than 2x from the table.

Case 43's fixture: 10 runs at ~102 samples/s per T4 (fp16, +-2 %), A100 490 (bf16), V100 196
(fp16), then one run with the T4 at 45 (HW power-brake slowdown) in the file store that
``heterotrain run`` writes and ``heterotrain plan --learned-speeds FILE`` reads; the plan is
examples/digits.yaml on examples/clusters/mixed.yaml (global batch 128: the T4s get 15 each).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from hetero_operator.api import types as model
from hetero_operator.api.spec import parse_job, profile_key
from hetero_operator.cluster.inventory import build_inventory
from hetero_operator.cli import main
from hetero_operator.planning import profiles as p
from hetero_operator.planning.marginal import PlanInputs
from hetero_operator.planning.plan import plan_job

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "examples" / "digits.yaml"
MIXED = ROOT / "examples" / "clusters" / "mixed.yaml"
HOUR = 3600.0
T4, A100, V100 = "Tesla-T4", "NVIDIA-A100-SXM4-40GB", "Tesla-V100-SXM2-16GB"
BATCH = {T4: 15, A100: 70, V100: 28}  # the local batches of the table plan


def run(t4: float, at_s: float, *, job: str = "digits", batch: dict[str, int] | None = None) -> list[p.Observation]:
    """One run's observations (as observations_from_stats makes them)."""
    batch = batch or BATCH
    return [p.Observation(gpu_type=g, precision=pr, samples_per_s=sps, unix_s=at_s, local_batch=batch[g],
                          job=job, namespace="default")
            for g, pr, sps in ((A100, "bf16", 490.0), (V100, "fp16", 196.0), (T4, "fp16", t4))]


def ten_good_runs(store: p.FileStore, start_s: float = 0.0) -> None:
    for i, t4 in enumerate([102, 100, 104, 101, 103, 102, 100, 104, 102, 101]):  # +-2 %
        store.record("digits", run(t4, start_s + i * HOUR), now_s=start_s + i * HOUR)


def t4_entry(store: p.FileStore, now_s: float) -> p.LearnedSpeed:
    found = store.load("digits", now_s=now_s)[(T4, "fp16")]
    entry = p.for_batch(found, 15)
    assert entry is not None
    return entry


def plan_t4_batch(store: p.FileStore, now_s: float) -> int:
    job = parse_job(yaml.safe_load(DIGITS.read_text()))
    inventory = build_inventory(yaml.safe_load(MIXED.read_text())["items"])
    plan = plan_job(job, inventory, inputs=PlanInputs(learned=store.load(profile_key(job), now_s=now_s),
                                                      now_s=now_s))
    assert isinstance(plan, model.Plan)
    return max(r.local_batch for r in plan.ranks if r.gpu_type == T4)


def test_case43_one_throttled_run_does_not_replace_an_established_figure(tmp_path: Path) -> None:
    store = p.FileStore(tmp_path / "profiles.json")
    ten_good_runs(store)
    before = plan_t4_batch(store, 10 * HOUR)
    store.record("digits", run(45.0, 10 * HOUR, job="throttled"), now_s=10 * HOUR)
    entry = t4_entry(store, 11 * HOUR)
    assert abs(entry.samples_per_s - 102) <= 0.15 * 102, entry  # within 15 % of 102
    assert (entry.candidate_samples_per_s, entry.candidate_observations) == (45.0, 1)  # held, suspect
    assert (entry.candidate_job, entry.candidate_namespace) == ("throttled", "default")
    assert (entry.job, entry.namespace) == ("digits", "default")  # the figure's own last observer
    assert before == 15 and abs(plan_t4_batch(store, 11 * HOUR) - 15) <= 1  # not 8


def test_case43_a_persistent_change_three_runs_in_a_row_moves_the_figure(tmp_path: Path) -> None:
    store = p.FileStore(tmp_path / "profiles.json")
    ten_good_runs(store)
    for i, t4 in enumerate([45.0, 46.0, 44.0]):
        store.record("digits", run(t4, (10 + i) * HOUR, job=f"slow-{i}"), now_s=(10 + i) * HOUR)
    entry = t4_entry(store, 13 * HOUR)
    assert entry.samples_per_s == pytest.approx(45.0) and entry.observations == 3
    assert entry.candidate_observations == 0 and entry.job == "slow-2"
    assert plan_t4_batch(store, 13 * HOUR) < 12  # the learned table follows a model that changed


def test_a_good_run_between_two_slow_ones_ends_the_candidates_streak(tmp_path: Path) -> None:
    store = p.FileStore(tmp_path / "profiles.json")
    ten_good_runs(store)
    for i, t4 in enumerate([45.0, 101.0, 45.0, 45.0]):
        store.record("digits", run(t4, (10 + i) * HOUR), now_s=(10 + i) * HOUR)
    entry = t4_entry(store, 14 * HOUR)
    assert abs(entry.samples_per_s - 102) <= 2 and entry.candidate_observations == 2


def test_a_tiny_batch_run_lands_in_its_own_band_and_leaves_the_planned_figure(tmp_path: Path) -> None:
    """Per-sample throughput at a local batch of 2 is mostly per-step cost: recorded in band 2-3,
    it is not the figure for the T4's 15 samples (band 8-15)."""
    store = p.FileStore(tmp_path / "profiles.json")
    ten_good_runs(store)
    store.record("digits", run(30.0, 10 * HOUR, batch={T4: 2, A100: 9, V100: 4}), now_s=10 * HOUR)
    found = store.load("digits", now_s=11 * HOUR)[(T4, "fp16")]
    assert sorted(e.key for e in found) == ["Tesla-T4/fp16/2-3", "Tesla-T4/fp16/8-15"]
    assert p.for_batch(found, 15).samples_per_s == pytest.approx(101.9, abs=1.0)
    assert p.for_batch(found, 2).samples_per_s == 30.0
    assert p.for_batch(found, 64) is None  # two bands from any measurement: the table decides
    assert plan_t4_batch(store, 11 * HOUR) == 15


def stats(steps: int, samples: int, compute_s: float) -> list[dict]:
    return [{"rank": 0, "gpu_product": T4, "precision": "fp16", "steps": steps, "samples": samples,
             "compute_seconds": compute_s}]


@pytest.mark.parametrize(("steps", "samples", "compute_s", "recorded"), [
    (40, 600, 5.9, True), (5, 75, 0.7, False), (40, 600, 0.2, False), (40, 80, 1.5, False)],
    ids=["a run long enough is recorded", "5 steps are too short to measure",
         "0.2 s of compute is too short to measure", "80 samples are too few to measure"])
def test_runs_too_short_or_too_small_are_not_recorded(steps, samples, compute_s, recorded) -> None:
    got = p.observations_from_stats(stats(steps, samples, compute_s), unix_s=1.0, job="j", namespace="ns")
    assert bool(got) is recorded
    if recorded:
        assert (got[0].job, got[0].namespace, got[0].local_batch) == ("j", "ns", 15.0)


def test_one_throttled_rank_of_three_does_not_decide_the_types_figure() -> None:
    ranks = [{"rank": r, "gpu_product": T4, "precision": "fp16", "steps": 40, "samples": 600,
              "compute_seconds": s} for r, s in enumerate([6.0, 5.9, 13.3])]
    (obs,) = p.observations_from_stats(ranks, unix_s=1.0)
    assert obs.samples_per_s == pytest.approx(100.0)  # the median, not the mean (~78)


def test_plan_points_out_a_learned_figure_more_than_2x_from_the_table(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    store = p.FileStore(tmp_path / "profiles.json")
    start = time.time() - 20 * HOUR  # heterotrain plan reads the file at the wall clock's now
    ten_good_runs(store, start)
    for i in range(3):  # the T4s really are slow now: 45 of the A100's 490, table says 0.208
        at = start + (10 + i) * HOUR
        store.record("digits", run(45.0, at, job="slow"), now_s=at)
    assert main(["plan", str(DIGITS), "--nodes", str(MIXED), "--learned-speeds", str(store.path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("Tesla-T4's learned speed 0.092 is 2.3x below the table's 0.208 (3 obs., last changed by "
            "job default/slow)") in out
    assert "NVIDIA-A100-SXM4-40GB's learned speed" not in out  # within 2x: nothing to say


def test_the_run_summary_names_each_figure_by_its_batch_band_and_which_one_plans_use():
    """Issue 22, point 7: an entry written before batch bands and the run's banded one printed
    alike (``NVIDIA-A100-SXM4-40GB/bf16 476.1 ... NVIDIA-A100-SXM4-40GB/bf16 486.7``)."""
    from hetero_operator.local.valueview import learned_summary
    old = p.LearnedSpeed(gpu_type=A100, precision="bf16", samples_per_s=476.1, observations=2,
                         first_unix_s=0.0, updated_unix_s=0.0)
    obs = [p.Observation(gpu_type=A100, precision="bf16", samples_per_s=486.7, unix_s=HOUR,
                         local_batch=70),
           p.Observation(gpu_type=p.JOB_EFFICIENCY[0], precision=p.JOB_EFFICIENCY[1],
                         samples_per_s=0.708, unix_s=HOUR)]
    entries = p.merge({old.key: old}, obs, now_s=HOUR)
    assert set(entries) == {p.entry_key(*p.JOB_EFFICIENCY), f"{A100}/bf16", f"{A100}/bf16/64-127"}
    assert learned_summary(entries, obs) == (
        f"{A100}/bf16 batch 64-127 486.7 samples/s (1 obs.), job efficiency 0.708 (1 obs.); plans "
        "take each rank's figure from the batch band nearest its local batch (at most one band "
        f"away), older figures without a batch band only where no band is that near: {A100}/bf16 "
        "476.1 samples/s (2 obs.)")
    assert learned_summary(entries, []) == "nothing measured"
