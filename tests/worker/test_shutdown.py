"""Leaving the process group: every rank passes the barrier, the groups are destroyed, and the
barrier's Work stays referenced from the module (so Gloo's thread never drops its last reference
while Python finalises: torch 2.13's exit abort, see hetero_worker.runtime.shutdown)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys
import torch.distributed as dist
from hetero_worker.runtime import shutdown
dist.init_process_group("gloo")
shutdown.leave_process_group()
work = shutdown._LAST_WORK[-1]
print(dist.is_initialized(), len(shutdown._LAST_WORK), work.is_completed(), flush=True)
shutdown.leave_process_group()  # a second call with no group is a no-op
print(len(shutdown._LAST_WORK), flush=True)
"""


@pytest.mark.timeout(120)
def test_leave_process_group_destroys_the_group_and_keeps_the_barrier_work(free_port) -> None:
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(free_port))
        procs.append(subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=100) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err
        assert out.split() == ["False", "1", "True", "1"]
