"""Case 37: PowerSGD state survives a kill and resume, bound to the leaders' group.

Fixture ``tests/fixtures/cases/37-powersgd-state-lost-on-resume.yaml`` (copied from shared/cases):
4 Gloo rank processes as 2 nodes x 2 ranks, hierarchical sync with PowerSGD (rank 1, warm-up 2
steps, error feedback, warm start) on the leaders' hop, float64 MLP 32 -> 64 -> 8. The continuous
run trains 6 steps; the resumed run checkpoints after step 3, trains step 4, is killed (one rank
SIGKILLs itself, the others fail in their next collective: step 4 is lost work), and a fresh job
resumes from the checkpoint to step 6.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from rankproc import assert_ok, run_ranks

from hetero_worker.ckpt import checkpoint, files, store
from hetero_worker.runtime.simulation import free_port, local_rank_envs, simulated_cluster
from heterotrain_common.topology import build_layout

HERE = Path(__file__).parent
FIXTURE = HERE.parent / "fixtures" / "cases" / "37-powersgd-state-lost-on-resume.yaml"
PRODUCTS = {"a100-40gb": ("NVIDIA-A100-SXM4-40GB", "8.0", 1.0), "l4": ("NVIDIA-L4", "8.9", 0.5)}


def case() -> dict:
    return yaml.safe_load(FIXTURE.read_text())


def envs(scenario: dict, checkpoint_dir: str = "") -> list[dict[str, str]]:
    ranks = scenario["ranks"]
    entries, profiles = simulated_cluster(
        products=[PRODUCTS[r["gpu_class"]] for r in ranks], nodes=[r["node"] for r in ranks],
        local_batches=[r["local_batch"] for r in ranks])
    layout = build_layout(entries, "group")  # same node and GPU type
    assert [list(g) for g in layout.groups] == scenario["topology"]["intra_groups"]
    assert list(layout.leaders) == scenario["topology"]["inter_group"]
    return local_rank_envs(entries=entries, profiles=profiles, hierarchy="group",
                           master_port=free_port(), checkpoint_dir=checkpoint_dir)


def run(scenario: dict, out: Path, *extra: str, checkpoint_dir: str = "") -> list:
    steps = scenario["runs"][0]["steps"]
    global_batch = sum(r["local_batch"] for r in scenario["ranks"])
    compression = scenario["compression"]
    assert (compression["algorithm"], compression["matrix_approximation_rank"],
            compression["start_powerSGD_iter"]) == ("powersgd", 1, 2), "resume_ranks.py's codec"
    cmd = [sys.executable, str(HERE / "resume_ranks.py"), "--scenario", "case37",
           "--out", str(out), "--samples", str(global_batch * steps), "--steps", str(steps),
           "--seed", str(scenario["seed"]),
           "--layers", ",".join(map(str, scenario["model"]["layers"])), *extra]
    return run_ranks(cmd, envs(scenario, checkpoint_dir), timeout_s=150)


def reports(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_case37_killed_and_resumed_powersgd_run_equals_the_continuous_one(tmp_path: Path) -> None:
    scenario = case()
    expected = scenario["expected"]
    resumed_run = scenario["runs"][1]
    at = resumed_run["checkpoint_after_step"]
    world = len(scenario["ranks"])

    assert_ok(run(scenario, tmp_path / "continuous"))
    ckpt = tmp_path / "ckpt"
    killed = run(scenario, tmp_path / "killed", "--checkpoint-every", str(at),
                 "--kill-after", str(at + 1), "--kill-rank", str(world - 1),
                 checkpoint_dir=str(ckpt))
    assert killed[-1].returncode == -9 and all(r.returncode != 0 for r in killed)
    saved = files.load_file(store.newest_file(ckpt))  # weights_only=True
    assert saved["step"] == at
    assert set(saved["ranks"][0]["compression"]) == {"0"}  # leaders hold codec state ...
    assert saved["ranks"][1]["compression"] == {}  # ... the other ranks none
    assert_ok(run(scenario, tmp_path / "resumed", checkpoint_dir=str(ckpt)))

    continuous, resumed = reports(tmp_path / "continuous", world), reports(tmp_path / "resumed", world)
    for rank in range(world):
        a, b = continuous[rank]["params"], resumed[rank]["params"]
        diff = max(abs(x - y) for pa, pb in zip(a, b, strict=True)
                   for x, y in zip(pa, pb, strict=True))
        assert diff <= expected["param_max_abs_diff_continuous_vs_resumed"], (rank, diff)
        assert resumed[rank]["resumed_step"] == at
    leaders = scenario["topology"]["inter_group"]
    for rank in leaders:  # no second warm-up: the iteration counter continues
        assert resumed[rank]["iteration_after_resume"] == expected["compression_iter_after_resume_start"]
        assert resumed[rank]["iteration_end"] == expected["compression_iter_end"]
        assert continuous[rank]["iteration_end"] == expected["compression_iter_end"]
        assert resumed[rank]["leaders_members"] == expected["compression_group_members_rank0"]
    assert resumed[1]["leaders_members"] is None  # not a leader: no compression group
    # Negative control: torch's own state through pickle loses the leaders' group.
    control = resumed[0]["negative_control"]
    assert control["bound_group_size"] == len(leaders)
    assert control["group_size"] == world
    assert any("default group" in m for m in control["warnings"]), control["warnings"]
