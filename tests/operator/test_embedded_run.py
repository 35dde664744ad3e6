"""``heterotrain run``: inputs, process environments, supervision and restarts (no training).

The worker here is a tiny ``python -c`` program, so these tests check the embedded launcher's own
behaviour in seconds; ``test_embedded_digits.py`` runs the real default job.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from hetero_operator.local import nodes as localnodes
from hetero_operator.local import run as embedded
from hetero_operator.local import supervise
from hetero_operator.local.report import RankRow, measured_speedup_over_equal
from heterotrain_common import contract as c
from heterotrain_common import envnames, procs, rundir
from heterotrain_common.nvml import GpuInfo

RUN = [sys.executable, "-m", "hetero_operator.cli", "run"]

# Rank program: records its contract, fails with code 5 on rank 1 while attempts < FAIL_TIMES.
FLAKY = textwrap.dedent("""
    import json, os, sys, time
    from heterotrain_common.contract import parse_contract
    from hetero_worker.metrics import WorkerMetrics
    ct = parse_contract(os.environ)
    out = os.environ["OUT"]
    attempt = len([f for f in os.listdir(out) if f.startswith(f"start-{ct.dist.rank}-")])
    m = WorkerMetrics(ct)
    m.set_total_steps(2)
    for _ in range(2):
        m.observe_step(0.01, 0.01, 0.0, ct.local_batch, 1.0)
    m.flush()
    open(os.path.join(out, f"start-{ct.dist.rank}-{attempt}"), "w").close()
    if attempt < int(os.environ["FAIL_TIMES"]):
        if ct.dist.rank == 1:  # fail once every rank of this attempt is up
            while len([f for f in os.listdir(out) if f.endswith(f"-{attempt}")]) < ct.dist.world_size:
                time.sleep(0.05)  # sync-ok: the workload polls for its peers' marker files
            sys.exit(5)
        time.sleep(60)  # sync-ok: the workload; stopped by the launcher when rank 1 fails
    if ct.dist.rank == 0:
        from heterotrain_common.rundir import write_result
        write_result({"accuracy": 0.5})
""")


def _job(tmp_path: Path, *, fail_times: int, checkpoint: bool, backoff_limit: int = 2) -> Path:
    doc = yaml.safe_load((Path(__file__).parents[2] / "examples" / "digits.yaml").read_text())
    doc["metadata"]["name"] = "flaky"
    doc["spec"]["worker"] = {"command": ["python", "-c", FLAKY],
                             "env": [{"name": "OUT", "value": str(tmp_path / "out")},
                                     {"name": "FAIL_TIMES", "value": str(fail_times)}]}
    doc["spec"]["training"]["precision"] = "FP32"
    if not checkpoint:
        del doc["spec"]["training"]["checkpoint"]
    doc["spec"]["runPolicy"]["backoffLimit"] = backoff_limit
    (tmp_path / "out").mkdir()
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _run(tmp_path: Path, job: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HTJ_BACKOFF_BASE_S": "0.2"}  # the restart backoff, short (default 10 s)
    return subprocess.run([*RUN, str(job), "--workdir", str(tmp_path / "work"), "--grace-s", "2",
                           "--metrics-port-base", "0", *extra],
                          cwd=Path(__file__).parents[2], capture_output=True, text=True, timeout=100,
                          env=env)


def _starts(tmp_path: Path) -> list[str]:
    return sorted(os.listdir(tmp_path / "out"))


@pytest.mark.timeout(120)
def test_a_failed_rank_restarts_all_ranks_from_the_checkpoint_until_success(tmp_path):
    done = _run(tmp_path, _job(tmp_path, fail_times=2, checkpoint=True, backoff_limit=2))
    assert done.returncode == 0, done.stdout + done.stderr
    # Three attempts of all four ranks: two failed on rank 1, the third succeeded.
    assert _starts(tmp_path) == sorted(f"start-{r}-{a}" for r in range(4) for a in range(3))
    # FLAKY saves no checkpoint, and the restart message says so
    assert done.stdout.count("Restarting all ranks from the start (no checkpoint saved yet)") == 2
    assert "rank 1 exited with code 5" in done.stdout
    assert "Result: accuracy 50.00%" in done.stdout and "Job succeeded" in done.stdout


@pytest.mark.timeout(120)
def test_backoff_limit_ends_the_job_with_the_ranks_exit_code(tmp_path):
    done = _run(tmp_path, _job(tmp_path, fail_times=9, checkpoint=True, backoff_limit=1))
    assert done.returncode == embedded.EXIT_RANK_FAILED == 3
    assert done.stdout.rstrip().splitlines()[-1] == "Job failed: rank 1 exited with code 5 (no output)"
    assert _starts(tmp_path) == sorted(f"start-{r}-{a}" for r in range(4) for a in range(2))
    assert "backoffLimit 1 reached" in done.stdout


@pytest.mark.timeout(120)
def test_without_checkpointing_a_failure_restarts_from_step_0_and_says_so(tmp_path):
    """The operator's policy (lifecycle.restart): no checkpoint is no reason not to restart."""
    done = _run(tmp_path, _job(tmp_path, fail_times=1, checkpoint=False))
    assert done.returncode == 0, done.stdout + done.stderr
    assert _starts(tmp_path) == sorted(f"start-{r}-{a}" for r in range(4) for a in range(2))
    assert ("Restarting all ranks from step 0 (the job does not checkpoint: "
            "spec.training.checkpoint.path is not set) (restart 1 of 2)") in " ".join(done.stdout.split())
    work = tmp_path / "work"
    # Every rank reported its statistics; the table shows the plan's split.
    stats = [json.loads((work / f"rank-{r}.json").read_text()) for r in range(4)]
    assert [s["local_batch"] for s in stats] == [70, 28, 15, 15]
    assert [s["steps"] for s in stats] == [2, 2, 2, 2]


@pytest.mark.timeout(120)
def test_a_deterministic_failure_before_any_step_stops_after_the_second_attempt(tmp_path):
    job = _job(tmp_path, fail_times=0, checkpoint=True, backoff_limit=3)
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["worker"]["command"] = ["python", "-m", "no_such_training_module"]
    job.write_text(yaml.safe_dump(doc))
    done = _run(tmp_path, job)
    assert done.returncode == 3, done.stdout + done.stderr
    out = " ".join(done.stdout.split())
    # the first restart starts over (nothing was saved), the second never happens
    assert out.count("Restarting all ranks from the start (no checkpoint saved yet) (restart 1 of 3)") == 1
    assert "Restarting all ranks from the last checkpoint" not in out
    assert "restart 2 of 3" not in out
    # every rank fails alike: which one the supervisor sees first varies under load
    assert re.search(rf"Job failed: rank [0-3] exited with code 1: {re.escape(sys.executable)}: No "
                     "module named no_such_training_module; it failed the same way twice before any "
                     "step completed", out), out
    assert "so the run stops here instead of retrying up to backoffLimit 3" in out
    logs = (tmp_path / "work" / "rank-0.log").read_text()
    assert logs.count("--- attempt ") == 2


def test_bad_input_and_unschedulable_exit_codes(tmp_path):
    missing = subprocess.run([*RUN, str(tmp_path / "nope.yaml")], capture_output=True, text=True,
                             timeout=60)
    assert missing.returncode == 1 and "no such file" in missing.stderr
    doc = yaml.safe_load((Path(__file__).parents[2] / "examples" / "digits.yaml").read_text())
    doc["spec"]["gpus"] = {"ranks": 6, "minRanks": 6}
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(doc))
    unschedulable = subprocess.run([*RUN, str(big)], capture_output=True, text=True, timeout=60,
                                   cwd=Path(__file__).parents[2])
    assert unschedulable.returncode == 2 and "Unschedulable" in unschedulable.stdout
    doc = yaml.safe_load((Path(__file__).parents[2] / "examples" / "digits.yaml").read_text())
    doc["spec"]["worker"]["command"] = ["no-such-program-here"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    not_found = subprocess.run([*RUN, str(bad), "--workdir", str(tmp_path / "w")],
                               capture_output=True, text=True, timeout=60)
    assert not_found.returncode == 1
    assert "spec.worker.command: program 'no-such-program-here' not found" in not_found.stderr
    assert not (tmp_path / "w").exists()  # nothing started, nothing written


@pytest.mark.parametrize(
    ("args", "overrides", "expected"),
    [(["--epochs", "12"], {"--epochs": 3, "--max-steps": None}, ["--epochs", "3"]),
     ([], {"--epochs": None, "--max-steps": 7}, []),
     (["--max-steps=9"], {"--epochs": None, "--max-steps": 7}, ["--max-steps=7"]),
     (["--lr", "0.1"], {"--epochs": None, "--max-steps": None}, ["--lr", "0.1"])],
    ids=["replace a flag", "a flag the args do not hold is never added", "replace --flag=value",
         "no override"])
def test_worker_argv_overrides_and_uses_this_interpreter(args, overrides, expected):
    argv = embedded.worker_argv(["python", "-m", "pkg"], args, overrides=overrides)
    assert argv == [sys.executable, "-m", "pkg", *expected]


def test_process_env_is_the_rank_contract_over_a_clean_base(tmp_path):
    rank_env = {envnames.RANK: "1", envnames.WORLD_SIZE: "2", envnames.METRICS_PORT: "9481"}
    base = {"PATH": "/usr/bin", "RANK": "7", "HTJ_FIRST_RANK": "3", "CUDA_VISIBLE_DEVICES": "5",
            "HOME": "/root", "OMP_NUM_THREADS": "3"}
    envs = supervise.process_envs([rank_env, rank_env], base_env=base, run_dir=tmp_path,
                                 worker_env=[{"name": "A", "value": "1"},
                                             {"name": "B", "valueFrom": {"fieldRef": {}}}],
                                 gpu_ids=None)
    bin_dir = str(Path(sys.executable).parent)
    assert envs[0] == {"PATH": f"{bin_dir}{os.pathsep}/usr/bin", "HOME": "/root",
                       "OMP_NUM_THREADS": "3", "A": "1", **rank_env,
                       rundir.RUN_DIR: str(tmp_path), "PYTHONUNBUFFERED": "1"}
    pinned = supervise.process_envs([rank_env, rank_env], base_env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"},
                                   run_dir=tmp_path, worker_env=[], gpu_ids=["GPU-3", "GPU-1"])
    assert [e["CUDA_VISIBLE_DEVICES"] for e in pinned] == ["GPU-3", "GPU-1"]
    assert {e["CUDA_DEVICE_ORDER"] for e in pinned} == {"FASTEST_FIRST"}  # left as given
    assert pinned[0]["OMP_NUM_THREADS"] == str(procs.threads_per_rank(2))


def test_free_port_range_is_free():
    import socket
    base = supervise.free_port_range(4)
    for port in range(base, base + 4):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def _gpu(index, product, cc, mem_mib, mig=False):
    return GpuInfo(index=index, uuid=f"GPU-{index}", product=product, compute_capability=cc,
                   memory_mib=mem_mib, mig_enabled=mig)


def test_real_gpus_become_one_node_per_product_and_plan_onto_their_indices(monkeypatch):
    """The NVML path of ``heterotrain run`` on a fake machine: 2x A100 (NVML 0, 2), 1x T4 (1),
    and a MIG-enabled A100 (3) that is left out."""
    from heterotrain_common import nvml
    gpus = [_gpu(0, "NVIDIA-A100-SXM4-40GB", "8.0", 40960), _gpu(1, "Tesla-T4", "7.5", 15360),
            _gpu(2, "NVIDIA-A100-SXM4-40GB", "8.0", 40960),
            _gpu(3, "NVIDIA-A100-SXM4-40GB", "8.0", 40960, mig=True)]
    nodes, indices = localnodes.nodes_from_gpus(gpus, host="box", driver_version="550.54.15",
                                                cuda_version="12.4")
    assert indices == {"box-nvidia-a100-sxm4-40gb": [0, 2], "box-tesla-t4": [1]}
    labels = nodes[0]["metadata"]["labels"]
    assert (labels["nvidia.com/gpu.count"], labels["nvidia.com/gpu.family"],
            labels["nvidia.com/cuda.runtime-version.full"]) == ("2", "ampere", "12.4")
    monkeypatch.setattr(nvml, "list_gpus", lambda: gpus)
    monkeypatch.setattr(nvml, "driver_versions", lambda: ("550.54.15", "12.4"))
    from rich.console import Console
    args = _run_args(str(Path(__file__).parents[2] / "examples" / "digits.yaml"))
    with open(os.devnull, "w") as sink:
        planned = embedded._plan(args, Console(file=sink))
    assert not planned.simulated
    by_rank = [(r.gpu_type, i) for r, i in zip(planned.plan.ranks, planned.gpu_ids)]
    assert sorted(by_rank) == [("NVIDIA-A100-SXM4-40GB", "GPU-0"), ("NVIDIA-A100-SXM4-40GB", "GPU-2"),
                               ("Tesla-T4", "GPU-1")]


_BOX = [_gpu(0, "NVIDIA-A100-SXM4-40GB", "8.0", 40960), _gpu(1, "Tesla-T4", "7.5", 15360),
        _gpu(2, "NVIDIA-A100-SXM4-40GB", "8.0", 40960)]


@pytest.mark.parametrize(("preset", "order", "visible"), [
    (None, None, [0, 1, 2]),
    ("GPU-2,GPU-0", None, [2, 0]),
    ("2,1", "PCI_BUS_ID", [2, 1]),
    ("GPU-1,GPU-9,GPU-0", None, [1]),  # CUDA stops at the first entry naming no GPU
    ("", None, []),
], ids=["no preset: every GPU", "UUIDs in the preset's order", "indices in PCI bus order",
        "the list ends at an unknown entry", "an empty preset hides every GPU"])
def test_a_preset_cuda_visible_devices_is_kept_as_given(preset, order, visible):
    got = localnodes.visible_gpus(_BOX, preset=preset, device_order=order)
    assert [g.index for g in got] == visible


def test_fastest_first_indices_on_a_mixed_machine_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="give GPU UUIDs .* or set CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        localnodes.visible_gpus(_BOX, preset="0,1", device_order=None)
    same = [_gpu(0, "Tesla-T4", "7.5", 15360), _gpu(1, "Tesla-T4", "7.5", 15360)]
    assert [g.index for g in localnodes.visible_gpus(same, preset="1", device_order=None)] == [1]


def _run_args(*argv: str) -> argparse.Namespace:
    """``heterotrain run`` arguments as the CLI parses them (every option at its default)."""
    parser = argparse.ArgumentParser()
    embedded.configure(parser)
    return parser.parse_args(list(argv))


def test_measured_speedup_over_equal_split():
    def row(t, b):
        return RankRow(rank=0, device="x", simulated=True, relative_speed=1.0, local_batch=b,
                       steps=1, samples_per_s=0.0, wait_share=0.0, compute_s_per_sample=t)
    # Speeds 1 : 1/3 -> split 3:1 of 8. Equal split (4 each): slow rank takes 4 * 3 = 12;
    # this split: max(6 * 1, 2 * 3) = 6 -> 2x.
    assert measured_speedup_over_equal([row(1.0, 6), row(3.0, 2)]) == pytest.approx(2.0)


@pytest.mark.timeout(60)
def test_active_deadline_stops_every_rank(tmp_path):
    job = _job(tmp_path, fail_times=0, checkpoint=True)
    doc = yaml.safe_load(job.read_text())
    doc["spec"]["worker"]["command"] = ["python", "-c", "import time; time.sleep(60)"]  # sync-ok: the workload
    doc["spec"]["runPolicy"]["activeDeadlineSeconds"] = 2
    job.write_text(yaml.safe_dump(doc))
    done = _run(tmp_path, job)
    assert done.returncode == 124
    assert "DeadlineExceeded (spec.runPolicy.activeDeadlineSeconds=2)" in done.stdout
    assert "Restarting" not in done.stdout


def test_too_few_real_gpus_fall_back_to_the_simulated_default(monkeypatch):
    """One real GPU cannot host digits.yaml (minRanks 2): the default node file is simulated."""
    from rich.console import Console

    from heterotrain_common import nvml
    monkeypatch.setattr(nvml, "list_gpus", lambda: [_gpu(0, "NVIDIA-H200", "9.0", 143771)])
    monkeypatch.setattr(nvml, "driver_versions", lambda: ("570.124.06", "12.8"))
    args = _run_args(str(Path(__file__).parents[2] / "examples" / "digits.yaml"))
    with open(os.devnull, "w") as sink:
        planned = embedded._plan(args, Console(file=sink))
    assert planned.simulated and planned.gpu_ids is None
    assert [r.gpu_type for r in planned.plan.ranks] == [
        "NVIDIA-A100-SXM4-40GB", "Tesla-V100-SXM2-16GB", "Tesla-T4", "Tesla-T4"]


@pytest.mark.parametrize(("exit_code", "verdict"), [
    (0, "succeeded"), (130, "interrupted (Ctrl-C, SIGINT)"), (143, "stopped (SIGTERM)"),
    (1, "failed (exit code 1)")], ids=["success", "Ctrl-C", "SIGTERM", "a rank failed"])
def test_the_last_line_says_interrupted_not_failed_after_ctrl_c(exit_code, verdict):
    from rich.text import Text

    from hetero_operator.local import report
    assert Text.from_markup(report.ending(exit_code)).plain == verdict
