"""A small real multi-rank run that exports worker metrics, for Prometheus-backed tests.

:func:`rank_envs` renders a consistent rank-form contract for N local ranks (free ports);
:class:`MetricsRun` starts ``ddp_metrics_worker.py`` in each (real ``torch.distributed`` over gloo,
a real gradient all-reduce per step, :class:`hetero_worker.metrics.WorkerMetrics` on its port) and
stops them all on exit. Use it where the full embedded job (``heterotrain run``) is more than a
test needs; :class:`EmbeddedRun` runs the full embedded job in the background and exposes its
metrics endpoints.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prom.prometheus_server import free_port
from waiting import wait_until

from heterotrain_common import contract as c
from heterotrain_common import envnames, procs

WORKER_SCRIPT = Path(__file__).with_name("ddp_metrics_worker.py")


def rank_envs(*, job: str, batches: Sequence[int], products: Sequence[str],
              speeds: Sequence[float] | None = None, groups: Sequence[int] | None = None,
              metrics_ports: Sequence[int] | None = None) -> list[dict[str, str]]:
    """Rank-form contract environments (no ``os.environ``) for one simulated local job.

    Args:
        job: job name (the ``job`` label).
        batches: local batch per rank; the global batch is their sum.
        products: GPU product per rank (simulated devices).
        speeds: relative speed per rank (default 1.0).
        groups: group per rank, contiguous (default: one group per rank).
        metrics_ports: metrics port per rank (default: free ports).

    Returns:
        One dict per rank, each accepted by :func:`contract.parse_contract`.
    """
    world = len(batches)
    groups = list(groups) if groups is not None else list(range(world))
    speeds = list(speeds) if speeds is not None else [1.0] * world
    ports = list(metrics_ports) if metrics_ports is not None else [free_port() for _ in range(world)]
    topology = tuple(c.RankEntry(rank=r, group=groups[r], node="localhost", gpu_product=products[r],
                                 compute_capability="8.0", local_batch=batches[r])
                     for r in range(world))
    master_port = free_port()
    envs = []
    for r in range(world):
        members = [e.rank for e in topology if e.group == groups[r]]
        contract = c.Contract(
            dist=c.RankInfo(rank=r, world_size=world, local_rank=r, local_world_size=world,
                            master_addr="127.0.0.1", master_port=master_port, job_name=job,
                            group=groups[r], group_rank=members.index(r), group_size=len(members)),
            precision="fp32", comm=c.CommSettings(hierarchy="flat"),
            device=c.DeviceProfile(product=products[r], compute_capability="8.0",
                                   relative_speed=speeds[r], simulated=True),
            topology=topology, run=c.RunSettings(metrics_port=ports[r]))
        envs.append(c.render_rank_env(contract))
    return envs


class MetricsRun:
    """Context manager: the ranks of :func:`rank_envs` running ``ddp_metrics_worker.py``.

    Args:
        envs: rank environments (from :func:`rank_envs`).
        workdir: where the stop file and per-rank logs go.
        step_sleep_s: pause per step, seconds (keeps the CPU free for the rest of the suite).
        max_s: each worker stops by itself after this many seconds.

    Attributes:
        targets: ``127.0.0.1:<port>`` per rank, for :meth:`PrometheusServer.set_targets`.
    """

    def __init__(self, envs: Sequence[dict[str, str]], workdir: Path, *, step_sleep_s: float = 0.05,
                 max_s: float = 90.0) -> None:
        self.envs = [dict(e) for e in envs]
        self.workdir = Path(workdir)
        self.stop_file = self.workdir / "stop"
        self.step_sleep_s = step_sleep_s
        self.max_s = max_s
        self.targets = [f"127.0.0.1:{e[envnames.METRICS_PORT]}" for e in self.envs]
        self.gang: procs.Gang | None = None
        self.logs = [self.workdir / f"rank-{i}.log" for i in range(len(self.envs))]

    def __enter__(self) -> MetricsRun:
        self.workdir.mkdir(parents=True, exist_ok=True)
        base = {k: v for k, v in os.environ.items() if k not in envnames.REQUIRED_VARS}
        envs = [{**base, **e, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"} for e in self.envs]
        files = [procs.open_log(p) for p in self.logs]
        try:
            self.gang = procs.Gang([sys.executable, str(WORKER_SCRIPT), str(self.stop_file),
                                    str(self.step_sleep_s), str(self.max_s)], envs,
                                   stdouts=files, stderrs=files)
        finally:
            for f in files:
                f.close()
        return self

    def finish(self, timeout_s: float = 60.0) -> procs.Outcome:
        """Ask the ranks to stop after their current step and wait; returns the outcome."""
        assert self.gang is not None
        self.stop_file.touch()
        outcome = self.gang.wait(poll_s=0.1) if _wait_all(self.gang, timeout_s) else None
        if outcome is None:
            self.gang.stop(grace_s=2)
            raise TimeoutError(f"ranks did not stop within {timeout_s:g}s; logs:\n{self.log_tails()}")
        return outcome

    def log_tails(self) -> str:
        """The end of every rank's log, for assertion messages."""
        return "\n".join(f"--- rank {i}\n{procs.tail(p)}" for i, p in enumerate(self.logs))

    def __exit__(self, *exc: object) -> None:
        if self.gang is not None and self.gang.running():
            self.stop_file.touch()
            self.gang.stop(grace_s=5)


def _wait_all(gang: procs.Gang, timeout_s: float) -> bool:
    """True once every rank ended or one failed; False after ``timeout_s``."""
    try:
        wait_until(lambda: not gang.running() or gang.first_failure() is not None,
                   timeout_s=timeout_s, what="the ranks to end", poll_s=0.1)
    except AssertionError:
        return False
    return True


class EmbeddedRun:
    """Context manager: ``heterotrain run JOB.yaml`` in the background, for scraping.

    Args:
        job: manifest path (e.g. ``repo_root / "examples/digits.yaml"``).
        workdir: the run's ``--workdir``.
        extra_args: more ``heterotrain run`` arguments (e.g. ``["--epochs", "400"]`` for a run
            that outlives the test's queries).
        cwd: working directory (the repository root).

    Attributes:
        targets: ``127.0.0.1:<port>`` per rank, from the run's ``targets.json``.
    """

    def __init__(self, job: Path, workdir: Path, *, extra_args: Sequence[str] = (),
                 cwd: Path | None = None) -> None:
        self.job, self.workdir, self.extra_args, self.cwd = Path(job), Path(workdir), list(extra_args), cwd
        self.proc: Any = None
        self.targets: list[str] = []
        self.output = self.workdir.parent / f"{self.workdir.name}.out"

    def __enter__(self) -> EmbeddedRun:
        import json
        import subprocess
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.output, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hetero_operator.cli", "run", str(self.job), "--workdir",
                 str(self.workdir), *self.extra_args], cwd=self.cwd, stdout=out,
                stderr=subprocess.STDOUT)
        targets_file = self.workdir / "targets.json"
        try:
            wait_until(lambda: targets_file.exists() or self.proc.poll() is not None, timeout_s=60,
                       what="the run's targets.json", poll_s=0.1)
        except AssertionError:
            pass
        if not targets_file.exists():
            raise RuntimeError(f"heterotrain run did not start:\n{self.output.read_text()}")
        self.targets = [t for group in json.loads(targets_file.read_text()) for t in group["targets"]]
        return self

    def wait(self, timeout_s: float = 200.0) -> int:
        """Wait for the job to end by itself; returns its exit code."""
        return int(self.proc.wait(timeout=timeout_s))

    def __exit__(self, *exc: object) -> None:
        import signal
        import subprocess
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # forwarded to every rank
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
