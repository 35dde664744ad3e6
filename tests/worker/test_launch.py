"""``heterotrain launch``: exact env per local rank, GPU pinning rules, failure and signal handling."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from waiting import wait_until

from hetero_worker.runtime.launch import LaunchError, _visible_gpus, child_envs
from heterotrain_common import contract as c
from heterotrain_common import envnames, nvml, procs

LAUNCH = [sys.executable, "-m", "hetero_operator.cli", "launch"]


def _pod(*, simulated: bool = True, product: str = "Tesla-T4", mig_profile: str = "",
         metrics_port: int = 9480, **extra: str) -> dict[str, str]:
    """Pod form for the pod hosting ranks 1 and 2 (group 1, two T4s) of a 3-rank job."""
    topology = (
        c.RankEntry(rank=0, group=0, node="node-a100", gpu_product="NVIDIA-A100-SXM4-40GB",
                    compute_capability="8.0", local_batch=8),
        c.RankEntry(rank=1, group=1, node="node-t4", gpu_product=product, compute_capability="7.5",
                    local_batch=3),
        c.RankEntry(rank=2, group=1, node="node-t4", gpu_product=product, compute_capability="7.5",
                    local_batch=2),
    )
    rank1 = c.Contract(
        dist=c.RankInfo(rank=1, world_size=3, local_rank=0, local_world_size=2,
                        master_addr="job-g0.job.ns.svc", master_port=29500, job_name="job", group=1,
                        group_rank=0, group_size=2),
        precision="fp16",
        comm=c.CommSettings(hierarchy="group"),
        device=c.DeviceProfile(product=product, compute_capability="7.5", memory_mib=15360,
                               relative_speed=0.25, simulated=simulated, mig_profile=mig_profile),
        topology=topology, run=c.RunSettings(metrics_port=metrics_port),
        checkpoint=c.CheckpointSettings(dir="/ckpt"))
    return {**c.pod_env(c.render_rank_env(rank1)), "OMP_NUM_THREADS": "2", **extra}


def test_each_local_rank_gets_exactly_its_rank_form_and_metrics_port():
    pod = _pod(PATH="/bin", HOME="/root")
    envs = child_envs(pod, visible_gpus=None)
    shared = {k: v for k, v in pod.items() if k != envnames.FIRST_RANK}
    assert envs == [
        {**shared, "RANK": "1", "LOCAL_RANK": "0", "HTJ_GROUP_RANK": "0", "HTJ_METRICS_PORT": "9480"},
        {**shared, "RANK": "2", "LOCAL_RANK": "1", "HTJ_GROUP_RANK": "1", "HTJ_METRICS_PORT": "9481"},
    ]
    assert [(c.parse_contract(e).dist.rank, c.parse_contract(e).local_batch) for e in envs] == [(1, 3), (2, 2)]


@pytest.mark.parametrize(
    ("pod_kwargs", "visible", "expected"),
    [({"simulated": False}, ["0", "1"], ["0", "1"]),
     ({"simulated": False}, ["GPU-aaa", "GPU-bbb", "GPU-ccc"], ["GPU-aaa", "GPU-bbb"]),
     ({"simulated": False}, None, [None, None]),
     ({"simulated": True}, ["0", "1"], [None, None]),
     ({"simulated": False, "product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "mig_profile": "1g.5gb"},
      ["MIG-a", "MIG-b"], [None, None])],
    ids=["whole gpus by index", "gpu uuids: the first two", "gpus unknown: leave unset",
         "simulated: never pinned", "mig slices: never remapped"])
def test_cuda_visible_devices_only_for_real_whole_gpus(pod_kwargs, visible, expected):
    envs = child_envs(_pod(**pod_kwargs), visible_gpus=visible)
    assert [e.get("CUDA_VISIBLE_DEVICES") for e in envs] == expected
    assert [e.get("CUDA_DEVICE_ORDER") for e in envs] == [None, None]  # never forced


def test_preset_cuda_visible_devices_kept_as_given_in_cuda_order():
    """Indices given in CUDA's own (fastest-first) order stay as they are: the launcher does not
    force PCI_BUS_ID over them, which would make "1" name another GPU."""
    pod = _pod(simulated=False, CUDA_VISIBLE_DEVICES="1,0", CUDA_DEVICE_ORDER="FASTEST_FIRST")
    envs = child_envs(pod, visible_gpus=_visible_gpus(pod))
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["1", "0"]
    assert [e["CUDA_DEVICE_ORDER"] for e in envs] == ["FASTEST_FIRST"] * 2


def test_without_preset_gpus_come_from_nvml_as_uuids(monkeypatch):
    gpus = [nvml.GpuInfo(index=i, uuid=f"GPU-{i}", product="Tesla-T4", compute_capability="7.5",
                         memory_mib=15360, mig_enabled=False) for i in (0, 1)]
    monkeypatch.setattr(nvml, "list_gpus", lambda: gpus)
    pod = _pod(simulated=False)
    assert _visible_gpus(pod) == ["GPU-0", "GPU-1"]
    envs = child_envs(pod, visible_gpus=_visible_gpus(pod))
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["GPU-0", "GPU-1"]
    assert "CUDA_DEVICE_ORDER" not in envs[0]


def test_fewer_gpus_than_local_ranks_fails_fast_naming_both():
    with pytest.raises(LaunchError, match=r"LOCAL_WORLD_SIZE=2 but 1 GPU\(s\) visible"):
        child_envs(_pod(simulated=False), visible_gpus=["0"])


def test_metrics_port_zero_stays_off_and_omp_threads_default():
    envs = child_envs({k: v for k, v in _pod(metrics_port=0).items() if k != "OMP_NUM_THREADS"},
                      visible_gpus=None)
    assert [e["HTJ_METRICS_PORT"] for e in envs] == ["0", "0"]
    assert [e["OMP_NUM_THREADS"] for e in envs] == [str(procs.threads_per_rank(2))] * 2


DUMP_ENV = "import os, json; json.dump(dict(os.environ), open(os.path.join(os.environ['OUT'], os.environ['LOCAL_RANK'] + '.json'), 'w'))"


@pytest.mark.timeout(60)
def test_launch_starts_one_process_per_local_rank_with_its_env(tmp_path: Path):
    pod = {**os.environ, **_pod(), "OUT": str(tmp_path)}
    pod = {k: v for k, v in pod.items() if k not in envnames.RANK_ONLY_VARS}
    done = subprocess.run([*LAUNCH, "--", sys.executable, "-c", DUMP_ENV], env=pod,
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    seen = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]
    expected = child_envs(pod, visible_gpus=None)
    contract_vars = set(envnames.REQUIRED_VARS) | set(envnames.OPTIONAL_VARS)
    for got, want in zip(seen, expected):
        assert {k: got.get(k) for k in contract_vars} == {k: want[k] for k in contract_vars}
        assert envnames.FIRST_RANK not in got and "CUDA_VISIBLE_DEVICES" not in got
        assert got["PATH"] == pod["PATH"] and got["OUT"] == str(tmp_path)
    assert [s["RANK"] for s in seen] == ["1", "2"]


SPLIT_WRITES = textwrap.dedent("""
    import os, time
    r, out = os.environ["RANK"], os.environ["OUT"]
    open(os.path.join(out, r), "w").close()
    while len(os.listdir(out)) < 2:  # both ranks write at once
        time.sleep(0.001)  # sync-ok: a start barrier between the two rank processes
    for i in range(1500):  # each line in two write calls, as an unbuffered print does
        os.write(1, f"rank {r} line {i}".encode())
        os.write(1, b" end\\n")
        os.write(2, f"rank {r} err {i}".encode())
        os.write(2, b" end\\n")
""")


@pytest.mark.timeout(60)
def test_two_local_ranks_never_cut_each_others_lines(tmp_path: Path):
    """Case from CI: ``kubectl logs`` of a 2-rank pod showed 'rank 3 of 4 says hellorank 2 ...'."""
    pod = {**os.environ, **_pod(), "OUT": str(tmp_path)}
    pod = {k: v for k, v in pod.items() if k not in envnames.RANK_ONLY_VARS}
    done = subprocess.run([*LAUNCH, "--", sys.executable, "-c", SPLIT_WRITES], env=pod,
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    for text, kind in ((done.stdout, "line"), (done.stderr, "err")):
        lines = text.splitlines()
        assert sorted(lines) == sorted(f"rank {r} {kind} {i} end" for r in (1, 2) for i in range(1500))


FAIL_ONE = textwrap.dedent("""
    import os, sys, time
    started = os.path.join(os.environ["OUT"], "rank0-started")
    if os.environ["LOCAL_RANK"] == "1":  # fail once rank 0 is surely up
        while not os.path.exists(started):
            time.sleep(0.01)  # sync-ok: poll for rank 0's file
        sys.exit(7)
    open(started, "w").close()
    time.sleep(60)  # sync-ok: a rank that would outlive the test unless the launcher stops it
    open(os.path.join(os.environ["OUT"], "rank0-survived"), "w").close()
""")


@pytest.mark.timeout(60)
def test_one_failing_rank_stops_the_others_and_sets_the_exit_code(tmp_path: Path):
    pod = {**os.environ, **_pod(), "OUT": str(tmp_path)}
    done = subprocess.run([*LAUNCH, "--grace-s", "2", "--", sys.executable, "-c", FAIL_ONE], env=pod,
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 7
    assert "local rank 1 (rank 2) exited with code 7" in done.stderr
    # Rank 0 was stopped: it would have slept 60 s (past the timeout) and left "rank0-survived".
    assert (tmp_path / "rank0-started").exists() and not (tmp_path / "rank0-survived").exists()


TRAP_TERM = textwrap.dedent("""
    import os, signal, sys, time
    def bye(signum, frame):
        open(os.path.join(os.environ["OUT"], "term-" + os.environ["LOCAL_RANK"]), "w").close()
        sys.exit(0)
    signal.signal(signal.SIGTERM, bye)
    open(os.path.join(os.environ["OUT"], "up-" + os.environ["LOCAL_RANK"]), "w").close()
    time.sleep(60)  # sync-ok: runs until the forwarded SIGTERM
""")


@pytest.mark.timeout(60)
def test_sigterm_is_forwarded_to_every_rank(tmp_path: Path):
    pod = {**os.environ, **_pod(), "OUT": str(tmp_path)}
    proc = subprocess.Popen([*LAUNCH, "--", sys.executable, "-c", TRAP_TERM], env=pod,
                            stderr=subprocess.PIPE, text=True)
    wait_until(lambda: proc.poll() is not None or all((tmp_path / f"up-{i}").exists() for i in range(2)),
               timeout_s=40, what="both ranks up")
    assert proc.poll() is None, proc.stderr.read()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert (tmp_path / "term-0").exists() and (tmp_path / "term-1").exists()


@pytest.mark.parametrize(
    ("variable", "value", "needle"),
    [("HTJ_FIRST_RANK", None, "HTJ_FIRST_RANK: is required"),
     ("LOCAL_WORLD_SIZE", "two", "LOCAL_WORLD_SIZE: must be an integer >= 1"),
     ("HTJ_TOPOLOGY", "[{", "HTJ_TOPOLOGY: is not valid JSON"),
     ("HTJ_TOPOLOGY", _pod()["HTJ_TOPOLOGY"].replace('"local_batch":2', '"local_batch":0'),
      "HTJ_TOPOLOGY: rank 2 has local_batch 0; must be >= 1"),
     ("HTJ_FIRST_RANK", "2", "HTJ_FIRST_RANK: rank 3 has no entry in HTJ_TOPOLOGY"),
     ("HTJ_PRECISION", "fp8", "HTJ_PRECISION: must be one of bf16, fp16, fp32")],
    ids=["first rank missing", "local world not int", "topology not json", "a rank's batch below 1",
         "pod overflows topology", "unknown precision"])
@pytest.mark.timeout(30)
def test_bad_contract_is_one_clear_line_and_exit_1(variable, value, needle):
    pod = {**os.environ, **_pod()}
    if value is None:
        pod.pop(variable)
    else:
        pod[variable] = value
    done = subprocess.run([*LAUNCH, "--", sys.executable, "-c", "raise SystemExit(3)"], env=pod,
                          capture_output=True, text=True, timeout=25)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("heterotrain launch: ") and needle in lines[0]


def test_missing_command_is_an_error():
    done = subprocess.run([*LAUNCH, "--"], env={**os.environ, **_pod()}, capture_output=True,
                          text=True, timeout=25)
    assert done.returncode == 1 and "no command given" in done.stderr


WRITE_PID = textwrap.dedent("""
    import os, time
    open(os.path.join(os.environ["OUT"], "pid-" + os.environ["LOCAL_RANK"]), "w").write(str(os.getpid()))
    time.sleep(60)  # sync-ok: runs until its parent-death signal
""")


@pytest.mark.timeout(60)
def test_ranks_die_with_a_killed_launcher(tmp_path: Path):
    """SIGKILL cannot be forwarded: the ranks' parent-death signal must end them (no orphans)."""
    pod = {**os.environ, **_pod(), "OUT": str(tmp_path)}
    proc = subprocess.Popen([*LAUNCH, "--", sys.executable, "-c", WRITE_PID], env=pod)
    pid_files = [tmp_path / f"pid-{i}" for i in range(2)]
    wait_until(lambda: proc.poll() is not None or all(p.exists() and p.read_text() for p in pid_files),
               timeout_s=40, what="both ranks' pid files")
    assert proc.poll() is None
    pids = [int(p.read_text()) for p in pid_files]
    proc.kill()
    proc.wait()
    wait_until(lambda: not any(_alive(pid) for pid in pids), timeout_s=20, what=f"ranks {pids} to die")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by init) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
