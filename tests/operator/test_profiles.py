"""Learned speeds: running mean with count and age, far-off figures held as candidates, stale aged
out (the batch bands and case 43: tests/operator/test_learned_speeds.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import make_job

from hetero_operator.api.jobnames import default_profile_key
from hetero_operator.api.spec import profile_key
from hetero_operator.planning import profiles as p

DAY = 86400.0


def _obs(sps: float, t: float, gpu: str = "Tesla-T4", precision: str = "fp16") -> p.Observation:
    return p.Observation(gpu_type=gpu, precision=precision, samples_per_s=sps, unix_s=t)


def test_running_mean_counts_and_ages() -> None:
    entries = p.merge({}, [_obs(100, 10.0)], now_s=10.0)
    entries = p.merge(entries, [_obs(120, 20.0)], now_s=20.0)
    entries = p.merge(entries, [_obs(140, 30.0)], now_s=30.0)
    (e,) = entries.values()
    assert (e.key, e.samples_per_s, e.observations, e.first_unix_s, e.updated_unix_s) == (
        "Tesla-T4/fp16", pytest.approx(120.0), 3, 10.0, 30.0)
    assert e.age_s(90.0) == 60.0


def test_weight_is_capped_so_the_figure_follows_change() -> None:
    entries = {}
    for i in range(30):
        entries = p.merge(entries, [_obs(100, float(i))], now_s=float(i))
    entries = p.merge(entries, [_obs(150, 31.0)], now_s=31.0)
    assert entries["Tesla-T4/fp16"].samples_per_s == pytest.approx(100 + (150 - 100) / p.MAX_WEIGHT)


def test_a_far_off_observation_waits_as_a_candidate_until_confirmed() -> None:
    entries = p.merge({}, [_obs(100, 1.0), _obs(110, 2.0)], now_s=2.0)
    entries = p.merge(entries, [_obs(250, 3.0)], now_s=3.0)  # 2.4x: another model under this key?
    e = entries["Tesla-T4/fp16"]
    assert (e.samples_per_s, e.observations, e.candidate_samples_per_s, e.candidate_observations) == (
        105, 2, 250, 1)
    entries = p.merge(entries, [_obs(240, 4.0), _obs(260, 5.0)], now_s=5.0)  # three in a row
    e = entries["Tesla-T4/fp16"]
    assert (e.samples_per_s, e.observations, e.first_unix_s, e.candidate_observations) == (250, 3, 5.0, 0)


def test_stale_entries_are_aged_out() -> None:
    entries = p.merge({}, [_obs(100, 0.0), _obs(300, 0.0, gpu="A100", precision="bf16")], now_s=0.0)
    entries = p.merge(entries, [_obs(100, 31 * DAY)], now_s=31 * DAY)
    assert list(entries) == ["Tesla-T4/fp16"] and entries["Tesla-T4/fp16"].observations == 1
    assert p.fresh(entries, now_s=62 * DAY) == {}


def test_observations_from_rank_statistics() -> None:
    stats = [
        {"gpu_product": "A100", "precision": "bf16", "samples": 700, "compute_seconds": 1.4, "steps": 10},
        {"gpu_product": "Tesla-T4", "precision": "fp16", "samples": 150, "compute_seconds": 1.5, "steps": 10},
        {"gpu_product": "Tesla-T4", "precision": "fp16", "samples": 150, "compute_seconds": 1.0, "steps": 10},
        {"gpu_product": "V100", "precision": "fp16", "samples": 20, "compute_seconds": 0.1, "steps": 2},
    ]
    got = p.observations_from_stats(stats, unix_s=5.0)
    assert [(o.gpu_type, o.precision, o.unix_s) for o in got] == [("A100", "bf16", 5.0),
                                                                  ("Tesla-T4", "fp16", 5.0)]
    assert [o.samples_per_s for o in got] == pytest.approx([500, (100 + 150) / 2])


def test_a_rank_that_recomputed_counts_at_its_speed_without_recomputation() -> None:
    # Under Full (or activation checkpointing) the compute seconds hold each block's forward
    # twice; the step-time model adds that 4/3 back for a rank that recomputes, so the figure is
    # kept without it: 400 samples in 1 s recomputing = 400 x 4/3 samples/s
    stats = [{"gpu_product": "A100", "precision": "fp32", "samples": 400, "compute_seconds": 1.0,
              "steps": 10, "recomputes": True}]
    (got,) = p.observations_from_stats(stats, unix_s=5.0)
    assert got.samples_per_s == pytest.approx(400 * 4 / 3)
    (plain,) = p.observations_from_stats([{**stats[0], "recomputes": False}], unix_s=5.0)
    assert plain.samples_per_s == pytest.approx(400)


def test_file_store_round_trip_and_other_keys_kept(tmp_path: Path) -> None:
    store = p.FileStore(tmp_path / "cache" / "profiles.json")
    assert store.load("digits", now_s=0.0) == {}
    store.record("digits", [_obs(100, 10.0)], now_s=10.0)
    store.record("lm", [_obs(40, 11.0, gpu="A100", precision="bf16")], now_s=11.0)
    store.record("digits", [_obs(110, 12.0)], now_s=12.0)
    (entry,) = store.load("digits", now_s=13.0)[("Tesla-T4", "fp16")]
    assert entry.observations == 2
    data = json.loads((tmp_path / "cache" / "profiles.json").read_text())
    assert data["version"] == 1 and set(data["profiles"]) == {"digits", "lm"}
    (tmp_path / "cache" / "profiles.json").write_text("not json")  # a damaged store is ignored
    assert store.load("digits", now_s=13.0) == {}


def test_configmap_codec() -> None:
    entries = p.merge({}, [_obs(100, 1.0)], now_s=1.0)
    data = p.configmap_data("digits", entries)
    assert p.configmap_entries({"data": data}, "digits") == entries
    assert p.configmap_entries({"data": {"digits": "{broken"}}, "digits") == {}
    assert p.configmap_entries(None, "digits") == {}


def test_default_path_follows_xdg(tmp_path: Path) -> None:
    assert p.default_path({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "heterotrain" / "profiles.json"


@pytest.mark.parametrize(("name", "key"), [
    ("digits", "digits"), ("digits-2", "digits"), ("lm-x7k2q", "lm"), ("lm-20261201-3", "lm"),
    ("my-model", "my-model"), ("resnet50", "resnet50"), ("123", "123")])
def test_default_profile_key_strips_run_suffixes(name: str, key: str) -> None:
    assert default_profile_key(name) == key


def test_profile_key_from_the_spec_wins() -> None:
    assert profile_key(make_job(name="run-7", training={"profileKey": "bert.base"})) == "bert.base"
    assert profile_key(make_job(name="run-7")) == "run"


def test_step_efficiency_keeps_overhead_and_leaves_the_splits_imbalance_out() -> None:
    """A100 0.002 s/sample with 70 samples, T4 0.01 s/sample with 15 (imbalanced: the A100 takes
    0.14 s, the T4 0.15 s). Job samples/s = eff * (500 + 100) = 0.8 * 600 = 480; the model says
    85 / 0.15 = 566.67; the ratio 0.847 is what the model lacks."""
    stats = [{"rank": 0, "gpu_product": "A100", "precision": "bf16", "samples": 700,
              "compute_seconds": 1.4, "steps": 10, "local_batch": 70, "job_efficiency_ratio": 0.8},
             {"rank": 1, "gpu_product": "Tesla-T4", "precision": "fp16", "samples": 150,
              "compute_seconds": 1.5, "steps": 10, "local_batch": 15}]
    assert p.step_efficiency(stats) == pytest.approx(480 / (85 / 0.15))
    got = p.observations_from_stats(stats, unix_s=5.0)
    assert (got[-1].gpu_type, got[-1].precision) == p.JOB_EFFICIENCY
    assert got[-1].samples_per_s == pytest.approx(480 / (85 / 0.15))
    stats[0]["job_efficiency_ratio"] = None  # none exported (short run): no entry
    assert [(o.gpu_type, o.precision) for o in p.observations_from_stats(stats, unix_s=5.0)] == [
        ("A100", "bf16"), ("Tesla-T4", "fp16")]
