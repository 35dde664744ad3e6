"""What a run directory says about its run: the plan it started with and its state (for
``heterotrain status`` and ``heterotrain logs -f``).

``heterotrain run`` writes ``plan.json`` (the plan, as ``heterotrain plan -o json`` prints it) and
``state.json`` when it starts the ranks (``Running`` with its pid) and again when the run ends
(``Succeeded``, ``Failed``, ``Interrupted`` or ``DeadlineExceeded`` with the exit code and the
reason).  Writes are atomic (:func:`heterotrain_common.rundir.write_json_atomic`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heterotrain_common import rundir
from heterotrain_common.procs import pid_alive

PLAN_FILE = "plan.json"
STATE_FILE = "state.json"
RUNNING, SUCCEEDED, FAILED = "Running", "Succeeded", "Failed"
INTERRUPTED, DEADLINE_EXCEEDED = "Interrupted", "DeadlineExceeded"
GONE = "Ended"
"""A ``Running`` record whose process is gone (killed with SIGKILL, the machine rebooted)."""
EXIT_DEADLINE = 124
"""``heterotrain run``'s exit code when ``--deadline-s`` ran out (as ``timeout(1)``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunState:
    """A run's state as its directory records it.

    Attributes:
        state: :data:`RUNNING`, :data:`SUCCEEDED`, :data:`FAILED`, :data:`INTERRUPTED`,
            :data:`DEADLINE_EXCEEDED`, :data:`GONE`, or ``"Unknown"`` (no ``state.json``: a run
            of an older version; ``finished.json`` still tells a success).
        pid: the ``heterotrain run`` process, 0 when unknown.
        exit_code: ``heterotrain run``'s exit code once ended, else None.
        reason: one sentence, e.g. ``rank 1 exited with code 2: ...``; ``""`` for none.
        started_unix_s / ended_unix_s: seconds since the epoch, None when unknown.
    """

    state: str
    pid: int = 0
    exit_code: int | None = None
    reason: str = ""
    started_unix_s: float | None = None
    ended_unix_s: float | None = None

    @property
    def running(self) -> bool:
        """True while the run's process lives."""
        return self.state == RUNNING


def write_started(workdir: Path, plan: Mapping[str, Any], *, pid: int | None = None) -> None:
    """Record the plan and ``Running`` (this process, now)."""
    rundir.write_json_atomic(workdir / PLAN_FILE, plan)
    rundir.write_json_atomic(workdir / STATE_FILE, {"state": RUNNING, "pid": pid or os.getpid(),
                                                    "started_unix_s": time.time()})


def write_ended(workdir: Path, *, exit_code: int, interrupted: bool, deadline: bool,
                reason: str = "") -> None:
    """Record how the run ended (the state follows the exit code: 0 succeeded; a signal
    ``interrupted``; ``deadline`` the deadline; else failed)."""
    state = (SUCCEEDED if exit_code == 0 else DEADLINE_EXCEEDED if deadline
             else INTERRUPTED if interrupted else FAILED)
    old = rundir.read_json(workdir / STATE_FILE) or {}
    rundir.write_json_atomic(workdir / STATE_FILE, {
        "state": state, "pid": old.get("pid", os.getpid()), "exit_code": exit_code, "reason": reason,
        "started_unix_s": old.get("started_unix_s"), "ended_unix_s": time.time()})


def read_state(workdir: Path, finished: bool = False) -> RunState:
    """The run's state; a ``Running`` record whose process is gone reads :data:`GONE`.

    Args:
        workdir: the run directory.
        finished: the run recorded a success (``finished.json``): the state without
            ``state.json``.
    """
    data = rundir.read_json(workdir / STATE_FILE)
    if data is None:
        return RunState(state=SUCCEEDED if finished else "Unknown")
    state = RunState(state=str(data.get("state") or "Unknown"), pid=int(data.get("pid") or 0),
                     exit_code=data.get("exit_code"), reason=str(data.get("reason") or ""),
                     started_unix_s=data.get("started_unix_s"), ended_unix_s=data.get("ended_unix_s"))
    if state.state == RUNNING and not pid_alive(state.pid):
        return RunState(state=GONE, pid=state.pid, started_unix_s=state.started_unix_s,
                        reason=f"its process {state.pid} is gone without recording how it ended "
                               "(killed, or the machine restarted)")
    return state


def read_plan(workdir: Path) -> dict[str, Any] | None:
    """The plan the run started with, None when not recorded."""
    return rundir.read_json(workdir / PLAN_FILE)
