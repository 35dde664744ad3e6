"""``heterotrain run --profile-steps``: every rank writes one PyTorch Profiler Chrome trace of
exactly the asked steps; the end of the run says where; off by default."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hetero_worker import profiling
from heterotrain_common import contract as c
from heterotrain_common import envnames

ROOT = Path(__file__).resolve().parents[2]
JOB = {
    "apiVersion": "heterotrain.io/v1alpha1", "kind": "HeteroTrainingJob", "metadata": {"name": "prof"},
    "spec": {"worker": {"command": ["python", "-m", "hetero_worker.examples.digits"],
                        "args": ["--epochs", "1", "--max-steps", "6"]},
             "gpus": {"ranks": 2},
             "training": {"globalBatchSize": 32, "precision": "FP32", "hierarchy": "Flat"}}}


def _step_ranges(trace: Path) -> list[str]:
    data = json.loads(trace.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    return sorted({e["name"] for e in events if str(e.get("name", "")).startswith(profiling.STEP_RANGE_PREFIX)})


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_ranks_each_leave_one_trace_of_the_profiled_steps(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(JOB))
    work = tmp_path / "work"
    done = subprocess.run([sys.executable, "-m", "hetero_operator.cli", "run", str(job), "--workdir", str(work),
                           "--metrics-port-base", "0", "--profile-steps", "3-4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    traces = sorted((work / "profiles").iterdir())
    assert [t.name for t in traces] == ["rank-0-steps-3-4.trace.json", "rank-1-steps-3-4.trace.json"]
    for trace in traces:  # parses as JSON and holds exactly steps 3 and 4 (1-based)
        assert _step_ranges(trace) == ["heterotrain step 3", "heterotrain step 4"]
    out = " ".join(done.stdout.split())
    assert f"Profiler traces (Chrome trace JSON; open in https://ui.perfetto.dev or chrome://tracing): " \
           f"{traces[0]}, {traces[1]}" in out


def test_profiling_is_off_unless_asked_and_the_trace_goes_to_the_run_or_checkpoint_dir() -> None:
    base = c.Contract(dist=c.RankInfo(rank=1, world_size=2, local_rank=0, local_world_size=1, master_addr="x",
                                      master_port=1, job_name="j", group=1, group_rank=0, group_size=1),
                      precision="fp32", comm=c.CommSettings(hierarchy="flat"),
                      device=c.DeviceProfile(product="T4", compute_capability="7.5", memory_mib=1,
                                             relative_speed=1.0, simulated=True),
                      topology=(c.RankEntry(rank=0, group=0, node="n", gpu_product="T4", compute_capability="7.5",
                                            local_batch=1),
                                c.RankEntry(rank=1, group=1, node="n", gpu_product="T4", compute_capability="7.5",
                                            local_batch=1)))
    assert profiling.from_contract(base) is None  # the trainer's hook is then one `is None` per step
    from dataclasses import replace
    on = replace(base, run=c.RunSettings(profile_steps=(20, 25)), checkpoint=c.CheckpointSettings(dir="/ckpt"))
    assert profiling.trace_path(on) == Path("/ckpt/profiles/rank-1-steps-20-25.trace.json")
    assert profiling.trace_path(replace(on, run=replace(on.run, dir="/run"))) == Path("/run/profiles/rank-1-steps-20-25.trace.json")
    prof = profiling.from_contract(on)
    assert prof is not None and (prof.first, prof.last) == (20, 25)


def test_the_job_annotation_reaches_every_rank_through_the_contract() -> None:
    from hetero_operator.api.errors import SpecError
    from hetero_operator.api.spec import parse_job
    from hetero_operator.cluster.inventory import build_inventory
    from hetero_operator.local.plan import load_objects
    from hetero_operator.planning.plan import plan_job
    from hetero_operator.render.env import render_rank_envs

    manifest = yaml.safe_load(yaml.safe_dump(JOB))
    manifest["metadata"]["annotations"] = {"heterotrain.io/profile-steps": "20-25"}
    job = parse_job(manifest)
    assert job.profile_steps == (20, 25)
    plan = plan_job(job, build_inventory(load_objects(ROOT / "examples" / "clusters" / "mixed.yaml", "Node")))
    envs = render_rank_envs(plan, job, master_addr="h", master_port=1, simulated=True)
    assert [e[envnames.PROFILE_STEPS] for e in envs] == ["20-25", "20-25"]
    assert [c.parse_contract(e).run.profile_steps for e in envs] == [(20, 25), (20, 25)]
    # the pod form (what the operator puts in a pod) keeps it for `heterotrain launch`
    assert c.parse_contract(c.expand_pod_env(c.pod_env(envs[1]), 0)).run.profile_steps == (20, 25)
    manifest["metadata"]["annotations"] = {"heterotrain.io/profile-steps": "25-20"}
    with pytest.raises(SpecError, match=r"metadata.annotations\[heterotrain.io/profile-steps\]: must be "
                                        "FIRST-LAST with 1 <= FIRST <= LAST, got '25-20'"):
        parse_job(manifest)
    del manifest["metadata"]["annotations"]
    assert envnames.PROFILE_STEPS not in render_rank_envs(
        plan, parse_job(manifest), master_addr="h", master_port=1, simulated=True)[0]
